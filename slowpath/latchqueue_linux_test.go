package slowpath

import (
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/dataplane"
)

// TestLatchEventsNotLost: when the pool's queue is full (thousands of
// calls latching at once) a worker keeps the events and hands them on,
// in order, as room appears; none is dropped, so no flow is left latching
// in userspace.
func TestLatchEventsNotLost(t *testing.T) {
	ch := make(chan latchEvent, 2)
	w := &worker{latched: ch}
	events := make([]latchEvent, 7)
	for i := range events {
		events[i] = latchEvent{match: netip.AddrPortFrom(netip.MustParseAddr("198.18.1.1"), uint16(30000+i)),
			source: netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), uint16(4000+i)), locked: i%2 == 1}
		w.notifyLatched(events[i].match, events[i].source, events[i].locked)
	}
	if len(w.latchBacklog) != 5 {
		t.Fatalf("backlog %d events, want 5 (queue of 2 full)", len(w.latchBacklog))
	}
	var got []latchEvent
	for len(got) < len(events) {
		for len(ch) > 0 {
			got = append(got, <-ch)
		}
		more := w.flushLatched()
		if more != (len(w.latchBacklog) > 0) {
			t.Fatalf("flushLatched says %v with %d left", more, len(w.latchBacklog))
		}
		if len(got) < len(events) && len(ch) == 0 {
			t.Fatalf("stuck after %d of %d events", len(got), len(events))
		}
	}
	for i := range events {
		if got[i] != events[i] {
			t.Errorf("event %d: %+v, want %+v (order kept)", i, got[i], events[i])
		}
	}
	// A new event while a backlog remains queues behind it, not ahead.
	w.latchBacklog = append(w.latchBacklog[:0], events[0])
	w.notifyLatched(events[1].match, events[1].source, events[1].locked)
	if len(ch) != 0 || len(w.latchBacklog) != 2 {
		t.Errorf("new event jumped the backlog: queue %d, backlog %d", len(ch), len(w.latchBacklog))
	}
}

// TestLockHeldUntilCaughtUp: a worker that locks a flow while behind its
// queue refuses other sources at once but reports the lock (which hands
// an XDP flow back to XDP) only when a read finds the queue drained
// (releaseLocks), counting the wait; one window after the window ended it
// reports it anyway. A worker not behind reports at its next drained read
// and counts nothing.
func TestLockHeldUntilCaughtUp(t *testing.T) {
	ch := make(chan latchEvent, 16)
	w := &worker{log: zaptest.NewLogger(t), latched: ch, latchWindow: 1e9, flows: map[netip.AddrPort]*flowState{},
		tcFlows: map[*flowState]struct{}{}, relays: &relaySet{}}
	w.tx4 = newTxBatch(-1, false)
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	other := netip.MustParseAddrPort("198.18.0.2:4002")
	flow := func(port uint16) (*flowState, netip.AddrPort) {
		match := netip.AddrPortFrom(netip.MustParseAddr("198.18.1.1"), port)
		f := &flowState{flow: dataplane.Flow{Match: match, ExpectSource: src, Latch: true,
			SendFrom: netip.MustParseAddrPort("198.18.1.1:30100"), SendTo: netip.MustParseAddrPort("198.18.2.2:5000")}}
		w.flows[match] = f
		return f, match
	}
	rx := newRxBatch()
	type pkt = struct {
		from netip.AddrPort
		ts   int64
	}
	batch := func(match netip.AddrPort, pkts ...pkt) {
		for i, p := range pkts {
			fillRx(rx, i, rtpPayload(1, uint16(i), uint32(i)*160), p.from, match, p.ts)
		}
		w.relayBatch(rx, len(pkts), w.tx4, nil)
	}
	locked := func() int {
		n := 0
		for len(ch) > 0 {
			if ev := <-ch; ev.locked {
				n++
			}
		}
		return n
	}

	// Behind by 4 s: the packet after the window locks the flow; held.
	base := time.Now().UnixNano() - 5e9
	f, m := flow(30000)
	batch(m, pkt{src, base}, pkt{src, base + 1.1e9}, pkt{other, base + 1.2e9})
	if !f.locked || !f.lockHeld || f.dropped != 1 {
		t.Fatalf("after the window, behind: locked %v held %v dropped %d; want locked, held, the other source dropped", f.locked, f.lockHeld, f.dropped)
	}
	if n := locked(); n != 0 {
		t.Fatalf("%d lock events while behind, want none", n)
	}
	w.releaseLocks()
	if n := locked(); n != 1 || f.lockHeld || w.lockWaits.Load() != 1 {
		t.Fatalf("queue drained: %d lock events, held %v, lock waits %d; want 1, no, 1", n, f.lockHeld, w.lockWaits.Load())
	}
	w.releaseLocks()
	if n := locked(); n != 0 {
		t.Fatalf("%d lock events at the next drained read, want none (reported once)", n)
	}

	// Never caught up: reported at a packet one window past the window.
	f, m = flow(30010)
	batch(m, pkt{src, base}, pkt{src, base + 1.5e9}, pkt{src, base + 1.9e9})
	if n := locked(); n != 0 || !f.lockHeld {
		t.Fatalf("%d lock events (held %v) before the window's second window ended, want none", n, f.lockHeld)
	}
	batch(m, pkt{src, base + 2.1e9})
	if n := locked(); n != 1 || f.lockHeld {
		t.Fatalf("%d lock events (held %v) one window past the window, want 1", n, f.lockHeld)
	}

	// Not behind: held only until the drained read, no wait counted.
	waits := w.lockWaits.Load()
	now := time.Now().UnixNano()
	_, m = flow(30020)
	batch(m, pkt{src, now - 1.2e9}, pkt{src, now - 1e6})
	w.releaseLocks()
	if n := locked(); n != 1 || w.lockWaits.Load() != waits {
		t.Fatalf("not behind: %d lock events, lock waits %d; want 1 and %d", n, w.lockWaits.Load(), waits)
	}

	// A flow removed while its lock was held is not reported.
	_, m = flow(30030)
	batch(m, pkt{src, base}, pkt{src, base + 1.1e9})
	delete(w.flows, m)
	w.releaseLocks()
	if n := locked(); n != 0 || len(w.heldLocks) != 0 {
		t.Fatalf("removed flow: %d lock events, %d held; want none", n, len(w.heldLocks))
	}
}
