package fastpath

import (
	"net/netip"
	"slices"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/dataplane"
)

// slotOf returns the statistics slot the flow's value names.
func slotOf(tb testing.TB, f *Fastpath, fl dataplane.Flow) uint32 {
	tb.Helper()
	var v relayFlowValue
	if err := f.objs.Flows.Lookup(keyOf(fl.Match), &v); err != nil {
		tb.Fatal(err)
	}
	return v.StatsIdx
}

// TestSlotsByPort: a flow takes its port's statistics slot (the port
// less PortMin), which the program loads before it has read the flow; a
// second flow on the port takes another. The program's early load is
// only that: each packet is accounted to the slot its own flow names,
// whichever flow holds the port's entry and whichever holds the port's
// slot, and a port below the range (no slot of its own) changes nothing.
func TestSlotsByPort(t *testing.T) {
	e := newTestEnvConfig(t, Config{MaxFlows: 64, PortMin: 30000, PortMax: 30031})
	fl4 := dataplane.Flow{Match: ap(relay4, 30010), SendFrom: ap(relay4, 30012), SendTo: ap(callee4, 5000), ClockRate: 8000}
	fl6 := dataplane.Flow{Match: ap(relay6, 30010), SendFrom: ap(relay6, 30012), SendTo: ap(callee6, 5000), ClockRate: 8000}
	low := dataplane.Flow{Match: ap(relay4, 20000), SendFrom: ap(relay4, 30012), SendTo: ap(callee4, 5000), ClockRate: 8000}
	for _, fl := range []dataplane.Flow{fl4, fl6, low} {
		if err := e.fp.Install(fl); err != nil {
			t.Fatal(err)
		}
	}
	// The range's 32 ports have slots 0-31; the others start at 32.
	for _, c := range []struct {
		fl   dataplane.Flow
		slot uint32
	}{{fl4, 10}, {fl6, 32}, {low, 33}} {
		if got := slotOf(t, e.fp, c.fl); got != c.slot {
			t.Errorf("flow %s in slot %d, want %d", c.fl.Match, got, c.slot)
		}
	}
	var sent [3]uint64
	for i := range 3 {
		for k, c := range []struct {
			fl  dataplane.Flow
			src netip.AddrPort
		}{{fl4, ap(caller4, 4000)}, {fl6, ap(caller6, 4000)}, {low, ap(caller4, 4000)}} {
			if k > i {
				continue // unequal counts: a packet counted twice, or to another flow, shows
			}
			frame := buildFrame(c.src, c.fl.Match, rtpPacket(1, uint16(1+i), uint32(i)*160, 160), frameOpts{})
			if v, _ := e.run(t, frame); v != xdpRedirect {
				t.Fatalf("%s: verdict %s, want redirect", c.fl.Match, verdictName[v])
			}
			sent[k]++
		}
	}
	// Read alone, with every flow (List) and with every flow's
	// statistics (EachStats): 3 slots of 34 in use, which those two read
	// one at a time.
	listed, err := e.fp.List()
	if err != nil {
		t.Fatal(err)
	}
	each := map[netip.AddrPort]dataplane.Stats{}
	if err := e.fp.EachStats(func(m netip.AddrPort, st dataplane.Stats) { each[m] = st }); err != nil {
		t.Fatal(err)
	}
	for k, fl := range []dataplane.Flow{fl4, fl6, low} {
		st, err := e.fp.Stats(fl.Match)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(listed, func(fs dataplane.FlowStats) bool { return fs.Flow.Match == fl.Match })
		if i < 0 {
			t.Fatalf("flow %s not listed", fl.Match)
		}
		for _, got := range []struct {
			how string
			st  dataplane.Stats
		}{{"Stats", st}, {"List", listed[i].Stats}, {"EachStats", each[fl.Match]}} {
			if got.st.Packets != sent[k] || got.st.Received != sent[k] {
				t.Errorf("flow %s by %s: %d packets (%d RTP), want %d", fl.Match, got.how, got.st.Packets, got.st.Received, sent[k])
			}
		}
	}
}

// TestSlotsAdopted: flows adopted from a previous run keep their slots;
// a new flow whose port's slot one of them holds takes another.
func TestSlotsAdopted(t *testing.T) {
	requireBPF(t)
	log := zaptest.NewLogger(t)
	pins := bpffsT(t)
	cfg := Config{PinPath: pins, MaxFlows: 16, PortMin: 30000, PortMax: 30007}
	f, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	var fls []dataplane.Flow
	for i := range uint16(3) {
		fl := dataplane.Flow{Match: ap(relay4, 30000+2*i), SendFrom: ap(relay4, 40000), SendTo: ap(callee4, 5000)}
		if err := f.Install(fl); err != nil {
			t.Fatal(err)
		}
		fls = append(fls, fl)
	}
	if _, err := f.Remove(fls[0].Match); err != nil {
		t.Fatal(err)
	}
	fls = fls[1:]
	f.Close()

	// The next run's range starts lower: the adopted flows' slots are
	// other ports' now.
	cfg.PortMin = 29998
	f, err = New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, fl := range fls {
		want := uint32(2 + 2*i)
		if slot := slotOf(t, f, fl); slot != want {
			t.Errorf("adopted flow %s in slot %d, want %d (the previous run's)", fl.Match, slot, want)
		}
		// The port table is the program's own (not pinned): filled again.
		if v, ok := f.ports.holds(new(keyOf(fl.Match))); portTableSupported && (!ok || v.StatsIdx != want) {
			t.Errorf("port %d's entry: holds the flow %v, slot %d; want slot %d", fl.Match.Port(), ok, v.StatsIdx, want)
		}
	}
	// Port 30000's slot is 2 now, which the flow adopted on 30002 holds.
	fl := dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 40000), SendTo: ap(callee4, 5000)}
	if err := f.Install(fl); err != nil {
		t.Fatal(err)
	}
	if slot := slotOf(t, f, fl); slot != 2+8 {
		t.Errorf("new flow on port 30000 (slot 2 adopted) in slot %d, want 10", slot)
	}
	if f.slots.inUse != 3 {
		t.Errorf("%d slots in use, want 3", f.slots.inUse)
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
