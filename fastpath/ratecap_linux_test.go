package fastpath

import (
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/dataplane"
)

func TestRateMult(t *testing.T) {
	for pps := uint32(1); pps <= dataplane.MaxRatePPS; pps++ {
		m := rateMult(pps)
		if got := rateOf(m); got != pps {
			t.Fatalf("rateOf(rateMult(%d)) = %d", pps, got)
		}
		// The refill over one second, as the program computes it, is pps
		// packets to within the rounding of m (half a step of 2^40/1e9
		// per second) and of the tokens (2^-16 packet).
		refill := float64((uint64(1e9)*uint64(m))>>24) / (1 << 16)
		if d := math.Abs(refill - float64(pps)); d > 0.5/(1<<40/1e9)+1.0/(1<<16) {
			t.Fatalf("%d pps: refill over 1 s is %f packets", pps, refill)
		}
	}
	fl := dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000),
		RateCap: dataplane.RateCap{PPS: 400, Burst: 400}}
	if got := flowOf(keyOf(fl.Match), valueOf(&fl, 0)); got.RateCap != fl.RateCap {
		t.Errorf("rate cap %+v read back as %+v", fl.RateCap, got.RateCap)
	}
}

// rateFlow is one flow of TestXDPRateCap and what it was sent.
type rateFlow struct {
	fl        dataplane.Flow
	seq       uint16
	sent      int
	forwarded int
	lastSeq   uint16 // of the last forwarded packet
	log       []sentPacket

	// With model set, sendRate checks the program's bucket after every
	// packet against the same bucket computed here from the program's
	// own timestamps (last_seen_ns of each forwarded packet).
	model       bool
	slot        uint32
	last        relayFlowStats // the slot after the previous packet
	mult, full  uint64
	lostRefill  float64 // packets of refill a full bucket could not hold
	modelErrors int
}

// sentPacket is one packet of a rateFlow: the monotonic clock just before
// and just after its run (the program's clock read lies between), and
// whether it was forwarded.
type sentPacket struct {
	pre, post uint64
	forwarded bool
}

// avail is the program's bucket (police() in bpf/relay.c) at now, before
// the packet takes its token, and what refill the depth cut off.
func (f *rateFlow) avail(now uint64) (uint64, float64) {
	elapsed := int64(now - f.last.LastSeenNs)
	if elapsed < 0 {
		elapsed = 0
	}
	if elapsed >= 1<<32 {
		return f.full, 0
	}
	a := uint64(f.last.RateTokens) + (uint64(elapsed)*f.mult)>>24
	if a > f.full {
		return f.full, float64(a-f.full) / (1 << 16)
	}
	return a, 0
}

func (e *testEnv) sendRate(t *testing.T, f *rateFlow) {
	t.Helper()
	f.seq++
	frame := buildFrame(ap(caller4, 4000), f.fl.Match, rtpPacket(uint32(f.fl.Match.Port()), f.seq, uint32(f.seq)*80, 80), frameOpts{})
	pre := monoNow()
	v, _ := e.run(t, frame)
	post := monoNow()
	f.sent++
	f.log = append(f.log, sentPacket{pre, post, v == xdpRedirect})
	switch v {
	case xdpRedirect:
		f.lastSeq = f.seq
		f.forwarded++
	case xdpDrop:
	default:
		t.Fatalf("flow %s: verdict %s", f.fl.Match, verdictName[v])
	}
	if f.model {
		e.checkBucket(t, f, v == xdpRedirect, pre, post)
	}
}

// checkBucket compares the program's bucket after a packet with the
// model's: a forwarded packet found a token at its own timestamp and left
// exactly the model's remainder; a refused one found none at any time
// before its run ended and left the bucket alone.
func (e *testEnv) checkBucket(t *testing.T, f *rateFlow, forwarded bool, pre, post uint64) {
	t.Helper()
	var now relayFlowStats
	if err := e.fp.objs.Stats.LookupWithFlags(f.slot, &now, ebpf.LookupLock); err != nil {
		t.Fatal(err)
	}
	bad := func(format string, args ...any) {
		if f.modelErrors++; f.modelErrors <= 5 {
			t.Errorf("packet %d: "+format, append([]any{f.sent}, args...)...)
		}
	}
	if forwarded {
		ts := now.LastSeenNs
		if ts < pre || ts > post {
			bad("program's timestamp %d outside its run, %d to %d", ts, pre, post)
		}
		a, lost := f.avail(ts)
		switch {
		case a < 1<<16:
			bad("forwarded with %d/65536 tokens", a)
		case uint64(now.RateTokens) != a-1<<16:
			bad("%d tokens left, the model %d", now.RateTokens, a-1<<16)
		}
		f.lostRefill += lost
	} else {
		if now.LastSeenNs != f.last.LastSeenNs || now.RateTokens != f.last.RateTokens {
			bad("refused, and the bucket changed")
		}
		if a, _ := f.avail(pre); a >= 1<<16 {
			bad("refused with %d/65536 tokens by %d", a, pre)
		}
	}
	f.last = now
}

// policeBounds bounds what a flow forwarded between its first and its last
// refused packet, when each found its bucket under one token: the refill
// over that time (its ends known to within a run), to within a token, less
// the refill a full bucket could not hold (the model's count: with the
// flood here none, but a busy machine may leave gaps longer than the
// burst takes to refill).
func policeBounds(f *rateFlow) (first int, lo, hi float64, in int, ok bool) {
	first, last := -1, -1
	for i, p := range f.log {
		if !p.forwarded {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 || first == last {
		return 0, 0, 0, 0, false
	}
	for _, p := range f.log[first:last] {
		if p.forwarded {
			in++
		}
	}
	pps := float64(f.fl.RateCap.PPS)
	span := func(a, b uint64) float64 { return pps * float64(int64(b-a)) / 1e9 }
	lo = span(f.log[first].post, f.log[last].pre) - f.lostRefill - 1
	hi = span(f.log[first].pre, f.log[last].post) + 1
	return first, lo, hi, in, true
}

// TestXDPRateCap floods one flow at 20 times the packet rate of a 20 ms
// stream while a second flow carries a legitimate 10 ms stream with a
// burst of RFC 4733 events, each with the cap the control plane gives it
// (4 times the codec's packet rate, a second's worth of burst). The
// flooded flow forwards its burst plus its cap over the time it was
// flooded, to within rounding (bounds below); the excess is dropped and
// counted, and is no loss to the other flow. The flows are open to any
// source (the program polices them under the slot's spin lock) or take
// the one source the packets come from (policed without it).
func TestXDPRateCap(t *testing.T) {
	bothStatsPaths(t, func(t *testing.T, j int, expect netip.AddrPort) {
		testXDPRateCap(t, uint16(31000+50*j), expect)
	})
}

func testXDPRateCap(t *testing.T, port0 uint16, expect netip.AddrPort) {
	e := newTestEnv(t)
	flood := &rateFlow{fl: dataplane.Flow{Match: ap(relay4, port0), SendFrom: ap(relay4, port0+2), SendTo: ap(callee4, 5000),
		ExpectSource: expect, ClockRate: 8000, RateCap: dataplane.RateCap{PPS: 200, Burst: 200}}}
	legit := &rateFlow{fl: dataplane.Flow{Match: ap(relay4, port0+4), SendFrom: ap(relay4, port0+6), SendTo: ap(callee4, 5002),
		ExpectSource: expect, ClockRate: 8000, RateCap: dataplane.RateCap{PPS: 400, Burst: 400}}}
	for _, f := range []*rateFlow{flood, legit} {
		if err := e.fp.Install(f.fl); err != nil {
			t.Fatal(err)
		}
		var v relayFlowValue
		if err := e.fp.objs.Flows.Lookup(keyOf(f.fl.Match), &v); err != nil {
			t.Fatal(err)
		}
		checkStatsPath(t, v.Flags, expect)
		f.model, f.slot, f.mult, f.full = true, v.StatsIdx, uint64(v.RateMult), uint64(v.RateBurst)<<16
	}
	before := e.counters(t)

	// 1.2 s: the flood every millisecond (1,000 packets/s, 20 times a
	// 20 ms stream's 50), the legitimate stream every 10 ms. From 300 ms
	// to 800 ms it carries an event besides its audio, as some endpoints
	// send them: an event packet every 10 ms, its first sent three times
	// at once and its end three times (RFC 4733 2.5.1.4). A late loop
	// (the machine is busy) catches up at once, as a burst.
	const (
		duration = 1200 * time.Millisecond
		tick     = time.Millisecond
	)
	start := time.Now()
	for i := 0; ; i++ {
		at := time.Duration(i) * tick
		if at >= duration {
			break
		}
		if d := time.Until(start.Add(at)); d > 0 {
			time.Sleep(d)
		}
		e.sendRate(t, flood)
		if i%10 != 0 {
			continue
		}
		e.sendRate(t, legit)
		switch ms := at.Milliseconds(); {
		case ms == 300 || ms == 800:
			for range 3 {
				e.sendRate(t, legit)
			}
		case ms > 300 && ms < 800:
			e.sendRate(t, legit)
		}
	}

	if legit.forwarded != legit.sent {
		t.Errorf("legitimate stream: %d of %d packets forwarded", legit.forwarded, legit.sent)
	}
	// Unloaded, the flood's packets are a millisecond apart: the burst
	// and what refills meanwhile pass (about 250 packets), then one every
	// 5 ms (190 more), 439 in all. Under emulation (lab/vm) the runs are
	// slower, and the bounds follow the times they took.
	first, lo, hi, in, ok := policeBounds(flood)
	t.Logf("flood: %d sent, %d forwarded: %d before the first refused, %d after it (bounds %.1f to %.1f, refill lost to a full bucket %.1f); legitimate: %d sent, %d forwarded",
		flood.sent, flood.forwarded, first, in, lo, hi, flood.lostRefill, legit.sent, legit.forwarded)
	if !ok {
		t.Fatalf("flood: %d of %d forwarded, not two refused", flood.forwarded, flood.sent)
	}
	// Before the first refused packet: the burst, and what refilled.
	burst := float64(flood.fl.RateCap.Burst)
	bhi := burst + float64(flood.fl.RateCap.PPS)*float64(flood.log[first].post-flood.log[0].pre)/1e9 + 1
	if f := float64(first); f < burst || f > bhi {
		t.Errorf("flood: the first refused packet came after %d forwarded, want %.0f to %.1f", first, burst, bhi)
	}
	if f := float64(in); f < lo || f > hi {
		t.Errorf("flood: %d forwarded between the first and the last refused, want %.1f to %.1f", in, lo, hi)
	}

	st, err := e.fp.Stats(flood.fl.Match)
	if err != nil {
		t.Fatal(err)
	}
	policed := uint64(flood.sent - flood.forwarded)
	if st.Packets != uint64(flood.forwarded) || st.Dropped != policed {
		t.Errorf("flood stats: %d packets %d dropped, want %d and %d", st.Packets, st.Dropped, flood.forwarded, policed)
	}
	// Refused packets never reach the RTP statistics: they are loss (up
	// to the last packet forwarded, the highest the statistics saw).
	if lost := int64(flood.lastSeq) - int64(flood.forwarded); st.Received != uint64(flood.forwarded) || st.Lost != lost {
		t.Errorf("flood RTP stats: received %d lost %d, want %d and %d", st.Received, st.Lost, flood.forwarded, lost)
	}
	lst, err := e.fp.Stats(legit.fl.Match)
	if err != nil {
		t.Fatal(err)
	}
	if lst.Dropped != 0 || lst.Lost != 0 || lst.Packets != uint64(legit.sent) {
		t.Errorf("legitimate stats: %+v", lst)
	}
	after := e.counters(t)
	if d := after["drop/rate"] - before["drop/rate"]; d != policed {
		t.Errorf("drop/rate counter moved by %d, want %d", d, policed)
	}
	fwd := after["forward/redirect"] - before["forward/redirect"]
	if fwd != uint64(flood.forwarded+legit.forwarded) {
		t.Errorf("forward/redirect moved by %d, want %d", fwd, flood.forwarded+legit.forwarded)
	}
}

// TestXDPRateCapIdle: a cap set by Update applies to the running flow, and
// a flow whose bucket was empty has its whole burst again after a quiet
// spell, no more.
func TestXDPRateCapIdle(t *testing.T) {
	e := newTestEnv(t)
	f := &rateFlow{fl: dataplane.Flow{Match: ap(relay4, 31100), SendFrom: ap(relay4, 31102), SendTo: ap(callee4, 5000),
		ClockRate: 8000}}
	if err := e.fp.Install(f.fl); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		e.sendRate(t, f)
	}
	if f.forwarded != 50 {
		t.Fatalf("uncapped: %d of 50 forwarded", f.forwarded)
	}
	f.fl.RateCap = dataplane.RateCap{PPS: 100, Burst: 10}
	if err := e.fp.Update(f.fl); err != nil {
		t.Fatal(err)
	}
	var v relayFlowValue
	if err := e.fp.objs.Flows.Lookup(keyOf(f.fl.Match), &v); err != nil {
		t.Fatal(err)
	}
	// The bucket of a flow that had no cap is empty but for what refills
	// from its last packet: set it to zero tokens as of now for a known
	// start.
	var raw relayFlowStats
	if err := e.fp.objs.Stats.LookupWithFlags(v.StatsIdx, &raw, ebpf.LookupLock); err != nil {
		t.Fatal(err)
	}
	t0 := monoNow()
	raw.LastSeenNs, raw.RateTokens = t0, 0
	if err := e.fp.objs.Stats.Update(v.StatsIdx, raw, ebpf.UpdateLock); err != nil {
		t.Fatal(err)
	}
	// 20 packets at once from an empty bucket: no more than refills
	// meanwhile (under one packet here; the runs take longer under
	// emulation).
	f.forwarded, f.sent = 0, 0
	for range 20 {
		e.sendRate(t, f)
	}
	if hi := float64(monoNow()-t0)*100/1e9 + 1; float64(f.forwarded) > hi {
		t.Errorf("empty bucket: %d of 20 forwarded at once, want at most %.1f", f.forwarded, hi)
	}
	// A quiet spell longer than the burst takes to refill (100 ms): 20
	// packets at once find the burst of 10, and what refills while they
	// are sent.
	time.Sleep(150 * time.Millisecond)
	f.forwarded, f.sent = 0, 0
	pre := monoNow()
	for range 20 {
		e.sendRate(t, f)
	}
	hi := 10 + float64(monoNow()-pre)*100/1e9 + 1
	if n := float64(f.forwarded); n < 10 || n > hi {
		t.Errorf("after a quiet spell: %d of 20 forwarded, want the burst of 10 (at most %.1f with a refill)", f.forwarded, hi)
	}
}

// TestRateCapSurvivesRestart: the cap is in the pinned flow map, so a
// relayd started again finds its flows capped as they were; a flow an older
// relayd installed (no cap: zero in what was padding) is adopted uncapped,
// and an Update caps it.
func TestRateCapSurvivesRestart(t *testing.T) {
	requireBPF(t)
	log := zaptest.NewLogger(t)
	pins := bpffsT(t)
	cfg := Config{PinPath: pins, MaxFlows: 16, NeighbourWait: -1}
	f, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	capped := dataplane.Flow{ID: 1, Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000),
		ClockRate: 8000, RateCap: dataplane.RateCap{PPS: 400, Burst: 400}}
	old := dataplane.Flow{ID: 2, Match: ap(relay4, 30004), SendFrom: ap(relay4, 30006), SendTo: ap(callee4, 5002), ClockRate: 8000}
	for _, fl := range []dataplane.Flow{capped, old} {
		if err := f.Install(fl); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	f, err = New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	caps := func() map[netip.AddrPort]dataplane.RateCap {
		fs, err := f.List()
		if err != nil {
			t.Fatal(err)
		}
		m := map[netip.AddrPort]dataplane.RateCap{}
		for _, x := range fs {
			m[x.Flow.Match] = x.Flow.RateCap
		}
		return m
	}
	if got := caps(); got[capped.Match] != capped.RateCap || got[old.Match] != (dataplane.RateCap{}) {
		t.Errorf("after the restart: caps %v", got)
	}
	old.RateCap = dataplane.RateCap{PPS: 200, Burst: 200}
	if err := f.Update(old); err != nil {
		t.Fatal(err)
	}
	if got := caps(); got[old.Match] != old.RateCap {
		t.Errorf("after the update: caps %v", got)
	}
}
