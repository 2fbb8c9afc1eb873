package slowpath

import (
	"context"
	"encoding/binary"
	"math"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// fillRx writes a received packet into slot i of rx as recvmmsg would:
// payload, source address and the control messages the worker asks for.
func fillRx(rx *rxBatch, i int, payload []byte, src, dst netip.AddrPort, ts int64) {
	copy(rx.bufs[i][:], payload)
	rx.hdrs[i].Len = uint32(len(payload))
	sa := &rx.names[i]
	*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: netip.AddrFrom16(src.Addr().As16()).As16()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], src.Port())
	oob := rx.oobs[i][:]
	n := 0
	put := func(level, typ int32, data []byte) {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[n]))
		h.Level, h.Type = level, typ
		h.SetLen(unix.CmsgLen(len(data)))
		copy(oob[n+unix.SizeofCmsghdr:], data)
		n += unix.CmsgSpace(len(data))
	}
	var tsb [16]byte
	binary.NativeEndian.PutUint64(tsb[:], uint64(ts/1e9))
	binary.NativeEndian.PutUint64(tsb[8:], uint64(ts%1e9))
	put(unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, tsb[:])
	var od [16]byte
	binary.NativeEndian.PutUint16(od[0:], unix.AF_INET)
	binary.BigEndian.PutUint16(od[2:], dst.Port())
	a := dst.Addr().As4()
	copy(od[4:8], a[:])
	put(unix.SOL_IP, unix.IP_ORIGDSTADDR, od[:])
	rx.hdrs[i].Hdr.SetControllen(n)
}

// TestRelayBatch runs a full batch through the worker's packet path: control
// messages parsed, flows looked up, packets built into the send batch. It
// allocates nothing.
func TestRelayBatch(t *testing.T) {
	w := &worker{log: zaptest.NewLogger(t), flows: map[netip.AddrPort]*flowState{}}
	match := netip.MustParseAddrPort("198.18.1.1:30000")
	w.flows[match] = &flowState{flow: dataplane.Flow{
		Match: match, SendFrom: netip.MustParseAddrPort("198.18.1.1:30002"),
		SendTo: netip.MustParseAddrPort("198.18.2.2:5000"), ClockRate: 8000,
	}}
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	rx := newRxBatch()
	for i := range batchSize {
		dst := match
		if i%8 == 7 {
			dst = netip.MustParseAddrPort("198.18.1.1:39998") // no flow
		}
		fillRx(rx, i, rtpPayload(1, uint16(i), uint32(i)*160), src, dst, int64(1e18)+int64(i)*20e6)
	}
	payload, gotSrc, gotDst, ts := rx.packet(0)
	if len(payload) != 172 || gotSrc != src || gotDst != match || ts != 1e18 {
		t.Fatalf("packet 0: %d bytes from %s to %s at %d", len(payload), gotSrc, gotDst, ts)
	}
	// fd -1: sendmmsg fails and every packet counts as a send failure,
	// which exercises the whole path without a socket.
	tx := newTxBatch(-1, false)
	w.relayBatch(rx, batchSize, tx, nil)
	if got := w.counters[vSend].Load(); got != batchSize*7/8 {
		t.Errorf("%d packets relayed, want %d", got, batchSize*7/8)
	}
	if got := w.noFlow.Load(); got != batchSize/8 {
		t.Errorf("%d packets without flow, want %d", got, batchSize/8)
	}
	allocs := testing.AllocsPerRun(100, func() { w.relayBatch(rx, batchSize, tx, nil) })
	if allocs != 0 {
		t.Errorf("%v allocations per batch, want 0", allocs)
	}
}

// TestPing: Ping answers while every worker runs its loop, and names the
// worker that does not (here one that was never started: the same as one
// stuck in a batch).
func TestPing(t *testing.T) {
	testenv.NeedRoot(t) // raw sockets
	var ws []*worker
	for i := range 2 {
		w, err := newWorker(i, 0, zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	raiseProcs(t, len(ws))
	var wg sync.WaitGroup
	start := func(w *worker) {
		wg.Add(1)
		go func() { defer wg.Done(); w.run() }()
	}
	t.Cleanup(func() {
		for _, w := range ws {
			w.close()
		}
		wg.Wait()
	})
	p := &Pool{workers: ws}
	start(ws[0])
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err := p.Ping(ctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "worker 1 did not answer") || strings.Contains(err.Error(), "worker 0") {
		t.Fatalf("Ping with worker 1 stopped: %v, want worker 1 (only) named", err)
	}
	start(ws[1])
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("Ping with both workers running: %v", err)
	}
	t.Logf("ping round trip %v", time.Since(t0))
}

// TestRelayBatchTranscode: a batch of PCMU packets of a transcoding flow
// goes through the engine and out as G.729 in the send batch, and the
// worker's path allocates nothing per batch.
func TestRelayBatchTranscode(t *testing.T) {
	if !g729.Available {
		testenv.Skip(t, "built without bcg729")
	}
	w := &worker{log: zaptest.NewLogger(t), flows: map[netip.AddrPort]*flowState{}, tcFlows: map[*flowState]struct{}{}}
	match := netip.MustParseAddrPort("198.18.1.1:30000")
	f := &flowState{flow: dataplane.Flow{
		Match: match, SendFrom: netip.MustParseAddrPort("198.18.1.1:30002"),
		SendTo: netip.MustParseAddrPort("198.18.2.2:5000"), ClockRate: 8000,
		Transcode: &dataplane.Transcode{
			In:  dataplane.Codec{Name: "PCMU", PT: 0, Ptime: 20},
			Out: dataplane.Codec{Name: "G729", PT: 18, Ptime: 20},
		},
	}}
	if err := w.setTranscode(f, f.flow.Transcode); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.setTranscode(f, nil) })
	w.flows[match] = f
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	rx := newRxBatch()
	seq := 0
	fill := func() {
		for i := range batchSize {
			// rtpPayload's PT is 0: PCMU, 160 bytes of payload.
			fillRx(rx, i, rtpPayload(1, uint16(seq), uint32(seq)*160), src, match, int64(1e18)+int64(seq)*20e6)
			seq++
		}
	}
	w.tx4 = newTxBatch(-1, false)
	fill()
	w.relayBatch(rx, batchSize, w.tx4, nil)
	if got := w.counters[vSend].Load(); got != batchSize {
		t.Errorf("%d G.729 packets sent for %d PCMU packets, want as many", got, batchSize)
	}
	if st := f.stats(); st.FramesIn != 2*batchSize || st.FramesOut != 2*batchSize {
		t.Errorf("frames in %d, out %d; want %d each", st.FramesIn, st.FramesOut, 2*batchSize)
	}
	// The next batches: the same packets with the following sequence
	// numbers and timestamps, written in place.
	next := func() {
		for i := range batchSize {
			binary.BigEndian.PutUint16(rx.bufs[i][2:], uint16(seq))
			binary.BigEndian.PutUint32(rx.bufs[i][4:], uint32(seq)*160)
			seq++
		}
	}
	allocs := testing.AllocsPerRun(20, func() {
		next()
		w.relayBatch(rx, batchSize, w.tx4, nil)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per batch of transcoded packets, want 0", allocs)
	}
}

// TestRelayBatchRateCap: a worker's flow flooded at 20 times a 20 ms
// stream's packet rate forwards its burst and its cap over the flood's
// time, within one packet, and drops the rest as "rate", while in the same
// batches a 10 ms stream with a burst of RFC 4733 events (the same pattern
// as the XDP test's) loses nothing, and a flood from a wrong source takes
// nothing of a third flow's rate. The receive timestamps are the test's:
// no real time passes.
func TestRelayBatchRateCap(t *testing.T) {
	w := &worker{log: zaptest.NewLogger(t), flows: map[netip.AddrPort]*flowState{}}
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	mk := func(port uint16, rc dataplane.RateCap, expect netip.AddrPort) netip.AddrPort {
		m := netip.AddrPortFrom(netip.MustParseAddr("198.18.1.1"), port)
		w.flows[m] = &flowState{flow: dataplane.Flow{
			Match: m, SendFrom: netip.MustParseAddrPort("198.18.1.1:30100"),
			SendTo: netip.MustParseAddrPort("198.18.2.2:5000"), ClockRate: 8000, RateCap: rc, ExpectSource: expect,
		}}
		return m
	}
	flood := mk(30000, dataplane.RateCap{PPS: 200, Burst: 200}, netip.AddrPort{})
	legit := mk(30002, dataplane.RateCap{PPS: 400, Burst: 400}, netip.AddrPort{})
	guarded := mk(30004, dataplane.RateCap{PPS: 200, Burst: 200}, src)
	stranger := netip.MustParseAddrPort("198.18.0.9:4000")

	type pkt struct {
		src, dst netip.AddrPort
		ts       int64
	}
	var pkts []pkt
	var sent = map[netip.AddrPort]int{}
	t0 := int64(1e18)
	for ms := int64(0); ms < 1200; ms++ {
		ts := t0 + ms*1e6
		pkts = append(pkts, pkt{src, flood, ts}, pkt{stranger, guarded, ts})
		if ms%10 != 0 {
			continue
		}
		n := 1
		switch {
		case ms == 300 || ms == 800:
			n = 4
		case ms > 300 && ms < 800:
			n = 2
		}
		for range n {
			pkts = append(pkts, pkt{src, legit, ts})
		}
		if ms%20 == 0 {
			pkts = append(pkts, pkt{src, guarded, ts})
		}
	}
	for _, p := range pkts {
		sent[p.dst]++
	}
	rx := newRxBatch()
	tx := newTxBatch(-1, false)
	seq := map[netip.AddrPort]uint16{}
	for i := 0; i < len(pkts); i += batchSize {
		n := min(batchSize, len(pkts)-i)
		for j := range n {
			p := pkts[i+j]
			seq[p.dst]++
			fillRx(rx, j, rtpPayload(1, seq[p.dst], uint32(seq[p.dst])*80), p.src, p.dst, p.ts)
		}
		w.relayBatch(rx, n, tx, nil)
	}

	// The flood's first packet finds the bucket full (200), and one more
	// is due every 5 ms after it: 1,199 ms of flood.
	fs := w.flows[flood].stats()
	want := 200 + 1199/5
	if d := int(fs.Packets) - want; d < -1 || d > 1 {
		t.Errorf("flood: %d of %d forwarded, want %d (±1)", fs.Packets, sent[flood], want)
	}
	if fs.Packets+fs.Dropped != uint64(sent[flood]) {
		t.Errorf("flood: %d forwarded and %d dropped of %d", fs.Packets, fs.Dropped, sent[flood])
	}
	if ls := w.flows[legit].stats(); ls.Packets != uint64(sent[legit]) || ls.Dropped != 0 {
		t.Errorf("legitimate stream: %d of %d forwarded, %d dropped", ls.Packets, sent[legit], ls.Dropped)
	}
	// 60 from the expected source, 1,200 from a stranger.
	if gs := w.flows[guarded].stats(); gs.Packets != 60 || gs.Dropped != 1200 {
		t.Errorf("guarded flow: %d forwarded, %d dropped; want 60 and 1200 (the stranger's)", gs.Packets, gs.Dropped)
	}
	if got, want := w.counters[vDropRate].Load(), fs.Dropped; got != want {
		t.Errorf("rate counter %d, want %d", got, want)
	}
	if got := w.counters[vDropSource].Load(); got != 1200 {
		t.Errorf("wrong_source counter %d, want 1200", got)
	}
	t.Logf("flood: %d sent, %d forwarded, %d dropped", sent[flood], fs.Packets, fs.Dropped)

	// A wall clock stepped back an hour does not shut the flow.
	fillRx(rx, 0, rtpPayload(1, 9999, 0), src, flood, t0-3600e9)
	w.relayBatch(rx, 1, tx, nil)
	if st := w.flows[flood].stats(); st.Packets != fs.Packets+1 {
		t.Errorf("after the clock stepped back: %d forwarded, want %d", st.Packets, fs.Packets+1)
	}
	allocs := testing.AllocsPerRun(100, func() { w.relayBatch(rx, 1, tx, nil) })
	if allocs != 0 {
		t.Errorf("%v allocations per batch, want 0", allocs)
	}
}

// TestWorkerCoalesces: with coalescing, a worker receiving packets faster
// than one per nap naps between reads and is woken by the socket far less
// often than once per packet; when the packets stop, it stops napping (an
// idle worker costs nothing). Without coalescing it never naps. Every
// packet is read either way.
func TestWorkerCoalesces(t *testing.T) {
	testenv.NeedRoot(t)
	for _, tc := range []struct {
		name     string
		coalesce time.Duration
	}{{"off", 0}, {"2ms", 2 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := newWorker(0, 0, zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			w.coalesce = int64(tc.coalesce)
			raiseProcs(t, 1)
			done := make(chan struct{})
			go func() { defer close(done); w.run() }()
			defer func() { w.close(); <-done }()
			fd, to := udpSocket(t), workerAddr(t, w)
			// 400 packets, one every 250 us: 8 per 2 ms nap.
			const sent = 400
			next := time.Now()
			for range sent {
				if err := unix.Sendto(fd, []byte("not a flow's"), 0, to); err != nil {
					t.Fatal(err)
				}
				next = next.Add(250 * time.Microsecond)
				time.Sleep(time.Until(next))
			}
			deadline := time.Now().Add(5 * time.Second)
			for w.noFlow.Load() < sent && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := w.noFlow.Load(); got != sent {
				t.Fatalf("worker read %d packets, want %d", got, sent)
			}
			wakes, naps := w.wakes.Load(), w.naps.Load()
			st := (&Pool{workers: []*worker{w}}).WorkerStats()
			var counted, within uint64
			// A nap's delay, and a loaded machine's slack; under
			// emulation (the 6.1 guest under TCG, beside another guest)
			// a wake-up alone takes milliseconds.
			bound := 10e-3
			if testenv.Emulated() {
				bound = 50e-3
			}
			for b, c := range st.Delay {
				counted += c
				if b < len(dataplane.DelayBounds) && dataplane.DelayBounds[b] <= bound {
					within += c
				}
			}
			t.Logf("%d packets: %d socket wake-ups, %d naps, %d batches; delays %v (mean %v)", sent, wakes, naps, st.Batches, st.Delay, st.DelaySum/time.Duration(max(counted, 1)))
			if counted != sent || st.Wakeups != wakes || st.Naps != naps || st.Batches == 0 {
				t.Errorf("WorkerStats %+v: want %d packets' delays, %d wake-ups, %d naps", st, sent, wakes, naps)
			}
			if within < sent*9/10 {
				t.Errorf("%d of %d packets read within %v of their arrival", within, sent, time.Duration(bound*1e9))
			}
			if tc.coalesce == 0 {
				if naps != 0 {
					t.Errorf("%d naps without coalescing", naps)
				}
				return
			}
			if naps == 0 || wakes+naps > sent/3 {
				t.Errorf("%d socket wake-ups and %d naps for %d packets, want naps and at most %d in all", wakes, naps, sent, sent/3)
			}
			// Idle: at most the one empty nap that ends polling.
			time.Sleep(20 * time.Millisecond)
			before := w.naps.Load()
			time.Sleep(50 * time.Millisecond)
			if after := w.naps.Load(); after != before {
				t.Errorf("an idle worker napped %d times in 50 ms", after-before)
			}
		})
	}
}

// TestIdleWorkerSleeps: a worker without packets waits where the Go
// runtime does not preempt it: past idleWait, signals stop ending its
// wait (with its P kept they ended it every 10-20 ms), and a packet still
// wakes it at once.
func TestIdleWorkerSleeps(t *testing.T) {
	testenv.NeedRoot(t)
	w, err := newWorker(0, 0, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	raiseProcs(t, 1)
	done := make(chan struct{})
	go func() { defer close(done); w.run() }()
	defer func() { w.close(); <-done }()
	fd, to := udpSocket(t), workerAddr(t, w)
	for round := range 2 {
		// Busy, then idle: a packet every 2 ms for 200 ms.
		for range 100 {
			if err := unix.Sendto(fd, []byte("not a flow's"), 0, to); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(time.Duration(idleWait) + 50*time.Millisecond)
		before := w.interrupts.Load()
		// The garbage collector stops the world: a worker the runtime
		// thinks is running must be preempted for it, an idle one not.
		runtime.GC()
		time.Sleep(time.Second)
		runtime.GC()
		if n := w.interrupts.Load() - before; n > 2 {
			t.Errorf("round %d: an idle worker's wait ended %d times in a second without a packet, want at most 2", round, n)
		}
		deadline := time.Now().Add(5 * time.Second)
		for w.noFlow.Load() < uint64(100*(round+1)) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if got := w.noFlow.Load(); got != uint64(100*(round+1)) {
			t.Fatalf("round %d: worker read %d packets, want %d", round, got, 100*(round+1))
		}
	}
}

// TestProcsFollowBusyWorkers: GOMAXPROCS is the program's own count plus
// one per worker that had packets within idleWait (it keeps its P while it
// waits), and comes back down when they go idle and when the pool closes.
func TestProcsFollowBusyWorkers(t *testing.T) {
	testenv.NeedRoot(t)
	base := runtime.GOMAXPROCS(0)
	g := newProcGauge()
	var ws []*worker
	var tos []*unix.SockaddrInet4
	for i := range 2 {
		w, err := newWorker(i, 0, zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		w.procs = g
		ws = append(ws, w)
		tos = append(tos, workerAddr(t, w))
	}
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(w.run)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		for _, w := range ws {
			w.close()
		}
		wg.Wait()
		g.close()
	}
	defer stop()
	fd := udpSocket(t)
	// expect waits for GOMAXPROCS to be want while packets go to the
	// workers in to, one each every 2 ms.
	expect := func(what string, want int, to ...*unix.SockaddrInet4) {
		t.Helper()
		deadline := time.Now().Add(time.Duration(idleWait) + 5*time.Second)
		for {
			for _, a := range to {
				if err := unix.Sendto(fd, []byte("not a flow's"), 0, a); err != nil {
					t.Fatal(err)
				}
			}
			got := runtime.GOMAXPROCS(0)
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: GOMAXPROCS %d, want %d (base %d)", what, got, want, base)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	expect("idle workers", base)
	time.Sleep(50 * time.Millisecond)
	expect("idle workers, later", base)
	expect("one busy worker", base+1, tos[0])
	// Still one while only that worker has packets.
	for range 50 {
		expect("one busy worker, later", base+1, tos[0])
		time.Sleep(2 * time.Millisecond)
	}
	expect("two busy workers", base+2, tos...)
	expect("idle again", base)
	expect("busy again", base+1, tos[1])
	stop()
	if got := runtime.GOMAXPROCS(0); got != base {
		t.Errorf("GOMAXPROCS %d after the workers stopped, want %d", got, base)
	}
	if ws[0].noFlow.Load() == 0 || ws[1].noFlow.Load() == 0 {
		t.Errorf("workers read %d and %d packets", ws[0].noFlow.Load(), ws[1].noFlow.Load())
	}
}

// TestBusyWorkerKeepsItsP: a worker that naps between reads for longer
// than idleWait (coalescing under load) is busy, not idle, when a pause of
// a few milliseconds makes it wait: it keeps its P, and GOMAXPROCS does not
// go down and up again at every pause.
func TestBusyWorkerKeepsItsP(t *testing.T) {
	testenv.NeedRoot(t)
	// A run in which the sender itself stalled for half an idleWait
	// (a loaded or emulated machine) says nothing: it is run again.
	for attempt := 1; ; attempt++ {
		changes, naps, stall := busyWorkerChanges(t)
		if stall > time.Duration(idleWait)/2 && attempt < 5 {
			t.Logf("attempt %d: the sender stalled for %v; again", attempt, stall)
			continue
		}
		if naps == 0 {
			t.Fatal("the worker never napped: the test did not load it")
		}
		// One change: busy at the first packets.
		if changes != 1 {
			t.Errorf("the worker started or stopped holding its P %d times, want once (%d naps; sender's longest stall %v)", changes, naps, stall)
		}
		return
	}
}

// busyWorkerChanges sends a worker three spells of 1.5 idleWaits with a
// packet every 250 us (it naps), 10 ms apart (it waits), and returns how
// often it started or stopped holding its P, its naps, and the longest the
// sender was late.
func busyWorkerChanges(t *testing.T) (changes, naps uint64, stall time.Duration) {
	g := newProcGauge()
	w, err := newWorker(0, 0, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	w.procs = g
	w.coalesce = int64(2 * time.Millisecond)
	done := make(chan struct{})
	go func() { defer close(done); w.run() }()
	defer func() { w.close(); <-done; g.close() }()
	fd, to := udpSocket(t), workerAddr(t, w)
	sent := 0
	for range 3 {
		next := time.Now()
		for end := next.Add(time.Duration(idleWait) * 3 / 2); next.Before(end); sent++ {
			if err := unix.Sendto(fd, []byte("not a flow's"), 0, to); err != nil {
				t.Fatal(err)
			}
			stall = max(stall, time.Since(next))
			next = next.Add(250 * time.Microsecond)
			time.Sleep(time.Until(next))
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.noFlow.Load() < uint64(sent) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := w.noFlow.Load(); got != uint64(sent) {
		t.Fatalf("worker read %d packets, want %d", got, sent)
	}
	return g.changes.Load(), w.naps.Load(), stall
}

// TestDelayBuckets: the worker's buckets are dataplane.DelayBounds, and a
// delay goes to the first bucket whose bound holds it.
func TestDelayBuckets(t *testing.T) {
	if len(delayBoundsNS) != len(dataplane.DelayBounds) || len(dataplane.WorkerStats{}.Delay) != len(delayBoundsNS)+1 {
		t.Fatalf("%d bounds in ns, %d in dataplane, %d buckets", len(delayBoundsNS), len(dataplane.DelayBounds), len(dataplane.WorkerStats{}.Delay))
	}
	for i, b := range dataplane.DelayBounds {
		if ns := int64(math.Round(b * 1e9)); ns != delayBoundsNS[i] {
			t.Errorf("bound %d: %d ns, dataplane says %v s", i, delayBoundsNS[i], b)
		}
	}
	for _, c := range []struct {
		d    int64
		want int
	}{{0, 0}, {5000, 0}, {5001, 1}, {1e6, 9}, {1e6 + 1, 10}, {50e6, 13}, {1e9, 14}} {
		if got := delayBucket(c.d); got != c.want {
			t.Errorf("delayBucket(%d) = %d, want %d", c.d, got, c.want)
		}
	}
}

// workerAddr is the loopback address of w's socket.
func workerAddr(t *testing.T, w *worker) *unix.SockaddrInet4 {
	t.Helper()
	sa, err := unix.Getsockname(w.rxFD)
	if err != nil {
		t.Fatal(err)
	}
	return &unix.SockaddrInet4{Port: sa.(*unix.SockaddrInet6).Port, Addr: [4]byte{127, 0, 0, 1}}
}

// udpSocket opens a UDP socket, closed when the test ends.
func udpSocket(t *testing.T) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// raiseProcs raises GOMAXPROCS by n until the test ends, as a pool does
// for its workers: a running worker keeps its P while it waits, and on
// one CPU the test's goroutines would run only when it is preempted.
func raiseProcs(tb testing.TB, n int) {
	procs := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(procs + n)
	tb.Cleanup(func() { runtime.GOMAXPROCS(procs) })
}
