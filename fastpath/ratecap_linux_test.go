package fastpath

import (
	"math"
	"testing"
	"time"

	"github.com/cilium/ebpf"

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
	// monotonic times of the first and the last forwarded packet: just
	// before and just after its run
	firstPre, firstPost, lastPre, lastPost uint64
}

func (e *testEnv) sendRate(t *testing.T, f *rateFlow) {
	t.Helper()
	f.seq++
	frame := buildFrame(ap(caller4, 4000), f.fl.Match, rtpPacket(uint32(f.fl.Match.Port()), f.seq, uint32(f.seq)*80, 80), frameOpts{})
	pre := monoNow()
	v, _ := e.run(t, frame)
	post := monoNow()
	f.sent++
	switch v {
	case xdpRedirect:
		if f.forwarded == 0 {
			f.firstPre, f.firstPost = pre, post
		}
		f.lastPre, f.lastPost = pre, post
		f.lastSeq = f.seq
		f.forwarded++
	case xdpDrop:
	default:
		t.Fatalf("flow %s: verdict %s", f.fl.Match, verdictName[v])
	}
}

// TestXDPRateCap floods one flow at 20 times the packet rate of a 20 ms
// stream while a second flow carries a legitimate 10 ms stream with a
// burst of RFC 4733 events, each with the cap the control plane gives it
// (4 times the codec's packet rate, a second's worth of burst). The
// flooded flow forwards its burst plus its cap over the time it was
// flooded, to within rounding (bounds below); the excess is dropped and
// counted, and is no loss to the other flow.
func TestXDPRateCap(t *testing.T) {
	e := newTestEnv(t)
	flood := &rateFlow{fl: dataplane.Flow{Match: ap(relay4, 31000), SendFrom: ap(relay4, 31002), SendTo: ap(callee4, 5000),
		ClockRate: 8000, RateCap: dataplane.RateCap{PPS: 200, Burst: 200}}}
	legit := &rateFlow{fl: dataplane.Flow{Match: ap(relay4, 31004), SendFrom: ap(relay4, 31006), SendTo: ap(callee4, 5002),
		ClockRate: 8000, RateCap: dataplane.RateCap{PPS: 400, Burst: 400}}}
	for _, f := range []*rateFlow{flood, legit} {
		if err := e.fp.Install(f.fl); err != nil {
			t.Fatal(err)
		}
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
	// The first forwarded packet finds the bucket full; each forwarded
	// after takes a token refilled since. A flood leaves under one token
	// plus a millisecond's refill unused at the end.
	cap := flood.fl.RateCap
	secs := func(a, b uint64) float64 { return float64(b-a) / 1e9 }
	lo := float64(cap.Burst) + float64(cap.PPS)*secs(flood.firstPost, flood.lastPre) - 2
	hi := float64(cap.Burst) + float64(cap.PPS)*secs(flood.firstPre, flood.lastPost) + 1
	t.Logf("flood: %d sent, %d forwarded (bounds %.1f to %.1f); legitimate: %d sent, %d forwarded",
		flood.sent, flood.forwarded, lo, hi, legit.sent, legit.forwarded)
	if f := float64(flood.forwarded); f < lo || f > hi {
		t.Errorf("flood: %d forwarded, want %.1f to %.1f", flood.forwarded, lo, hi)
	}
	if flood.sent < 1000 {
		t.Fatalf("flood: only %d packets sent", flood.sent)
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

// TestXDPRateCapIdle: a flow refused for want of tokens gets them back
// over time and after a quiet spell has its whole burst again, and a
// cap set by Update applies to the running flow.
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
	f.forwarded, f.sent = 0, 0
	for range 20 {
		e.sendRate(t, f)
	}
	if f.forwarded > 1 {
		t.Errorf("empty bucket: %d of 20 forwarded at once", f.forwarded)
	}
	// Three tokens in 30 ms at 100/s, or what the time really slept gives
	// (and under the burst of 10, which 100 ms refill).
	time.Sleep(30 * time.Millisecond)
	pre := monoNow()
	for range 20 {
		e.sendRate(t, f)
	}
	post := monoNow()
	lo := min(math.Floor(float64(pre-t0)*100/1e9), 10)
	hi := float64(post-t0)*100/1e9 + 1
	if n := float64(f.forwarded); n < lo || n > hi {
		t.Errorf("%.1f ms after an empty bucket at 100/s: %d forwarded, want %.0f to %.1f", float64(pre-t0)/1e6, f.forwarded, lo, hi)
	}
	time.Sleep(150 * time.Millisecond) // more than the burst refills
	f.forwarded, f.sent = 0, 0
	for range 20 {
		e.sendRate(t, f)
	}
	if f.forwarded < 10 || f.forwarded > 11 {
		t.Errorf("after a quiet spell: %d of 20 forwarded, want the burst of 10 (11 with a refill)", f.forwarded)
	}
}
