package slowpath

import (
	"net/netip"
	"testing"
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
