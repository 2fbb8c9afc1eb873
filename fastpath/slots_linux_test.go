package fastpath

import (
	"container/heap"
	"net/netip"
	"testing"

	"github.com/relayd/relayd/dataplane"
)

// TestSlotsLowestFirst: released stats slots are reused lowest first,
// whatever order they were released in, so that the slots in use stay at
// the bottom of the array the reads of every flow's statistics go up to.
func TestSlotsLowestFirst(t *testing.T) {
	f := &Fastpath{cfg: Config{MaxFlows: 8}}
	for want := range uint32(6) {
		if s, err := f.allocSlot(); err != nil || s != want {
			t.Fatalf("slot %d, %v; want %d", s, err, want)
		}
	}
	for _, s := range []uint32{4, 1, 5, 2} {
		heap.Push(&f.free, s)
	}
	for _, want := range []uint32{1, 2, 4, 5, 6, 7} {
		if s, err := f.allocSlot(); err != nil || s != want {
			t.Fatalf("slot %d, %v; want %d", s, err, want)
		}
	}
	if _, err := f.allocSlot(); err == nil {
		t.Error("a slot past MaxFlows")
	}
}

// TestEachStatsBatches: EachStats reads every flow when the flow map
// takes several batches, and the statistics slots up to the highest in
// use after lower ones were freed.
func TestEachStatsBatches(t *testing.T) {
	e := newTestEnv(t)
	const n = 700
	for i := range n {
		fl := dataplane.Flow{Match: ap(relay4, uint16(20000+2*i)), SendFrom: ap(relay4, 40000), SendTo: ap(callee4, 5000)}
		if err := e.fp.Install(fl); err != nil {
			t.Fatal(err)
		}
	}
	// Free the low slots: the flows left have the high ones.
	for i := range n / 2 {
		if _, err := e.fp.Remove(ap(relay4, uint16(20000+2*i))); err != nil {
			t.Fatal(err)
		}
	}
	// Batches of the smallest size: as if few flows were known.
	e.fp.mu.Lock()
	installed := e.fp.installed
	e.fp.installed = map[flowKey]installedFlow{}
	e.fp.mu.Unlock()
	seen := map[netip.AddrPort]bool{}
	err := e.fp.EachStats(func(m netip.AddrPort, _ dataplane.Stats) { seen[m] = true })
	e.fp.mu.Lock()
	e.fp.installed = installed
	e.fp.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != n-n/2 || !seen[ap(relay4, uint16(20000+2*(n-1)))] {
		t.Errorf("EachStats saw %d flows, want the %d left", len(seen), n-n/2)
	}
	// A new flow takes the lowest free slot.
	fl := dataplane.Flow{Match: ap(relay4, 10000), SendFrom: ap(relay4, 40000), SendTo: ap(callee4, 5000)}
	if err := e.fp.Install(fl); err != nil {
		t.Fatal(err)
	}
	var v relayFlowValue
	if err := e.fp.objs.Flows.Lookup(keyOf(fl.Match), &v); err != nil || v.StatsIdx != 0 {
		t.Errorf("new flow in slot %d (%v), want 0", v.StatsIdx, err)
	}
}
