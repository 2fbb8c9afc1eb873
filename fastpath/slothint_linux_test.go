package fastpath

import (
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/dataplane"
)

// portSlot returns the program's statistics slot hint for port.
func portSlot(tb testing.TB, f *Fastpath, port uint16) uint32 {
	tb.Helper()
	var slot uint32
	if err := f.objs.PortSlots.Lookup(uint32(port), &slot); err != nil {
		tb.Fatal(err)
	}
	return slot
}

// installFlows installs the flows in turn.
func installFlows(tb testing.TB, f *Fastpath, fls ...dataplane.Flow) {
	tb.Helper()
	for _, fl := range fls {
		if err := f.Install(fl); err != nil {
			tb.Fatal(err)
		}
	}
}

// slotOf returns the statistics slot the flow's value names.
func slotOf(tb testing.TB, f *Fastpath, fl dataplane.Flow) uint32 {
	tb.Helper()
	var v relayFlowValue
	if err := f.objs.Flows.Lookup(keyOf(fl.Match), &v); err != nil {
		tb.Fatal(err)
	}
	return v.StatsIdx
}

// TestSlotHintWrongIsHarmless: the port's slot hint is only a hint. Two
// flows on one port (IPv4 and IPv6 relay addresses) share it, so it names
// the slot of the last installed; a hint naming another flow's slot, or
// one past the flows, changes nothing the program forwards or counts:
// each packet is accounted to the slot its own flow names.
func TestSlotHintWrongIsHarmless(t *testing.T) {
	e := newTestEnv(t)
	fl4 := dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000}
	fl6 := dataplane.Flow{Match: ap(relay6, 30000), SendFrom: ap(relay6, 30002), SendTo: ap(callee6, 5000), ClockRate: 8000}
	installFlows(t, e.fp, fl4, fl6)
	s4, s6 := slotOf(t, e.fp, fl4), slotOf(t, e.fp, fl6)
	if s4 == s6 {
		t.Fatalf("both flows in slot %d", s4)
	}
	if got := portSlot(t, e.fp, 30000); got != s6 {
		t.Fatalf("hint for port 30000: slot %d, want %d (the last installed)", got, s6)
	}
	frame := buildFrame(ap(caller4, 4000), fl4.Match, rtpPacket(1, 1, 160, 160), frameOpts{})
	send := func(want uint64) {
		t.Helper()
		if v, _ := e.run(t, frame); v != xdpRedirect {
			t.Fatalf("verdict %s, want redirect", verdictName[v])
		}
		st4, err := e.fp.Stats(fl4.Match)
		if err != nil {
			t.Fatal(err)
		}
		st6, err := e.fp.Stats(fl6.Match)
		if err != nil {
			t.Fatal(err)
		}
		if st4.Packets != want || st4.Received != want || st6.Packets != 0 {
			t.Errorf("IPv4 flow %d packets (%d RTP), IPv6 flow %d; want %d, %d and 0", st4.Packets, st4.Received, st6.Packets, want, want)
		}
	}
	send(1)
	// A hint past every flow's slot, and past the statistics array.
	for i, bad := range []uint32{s6 + 100, 1 << 30} {
		if err := e.fp.objs.PortSlots.Put(uint32(30000), bad); err != nil {
			t.Fatal(err)
		}
		frame = buildFrame(ap(caller4, 4000), fl4.Match, rtpPacket(1, uint16(2+i), uint32(2+i)*160, 160), frameOpts{})
		send(uint64(2 + i))
	}
}

// TestSlotHintAdopted: the hints and the port table are the program's
// own (not pinned); a relayd taking over pinned flows writes them again
// for the flows it adopts.
func TestSlotHintAdopted(t *testing.T) {
	requireBPF(t)
	log := zaptest.NewLogger(t)
	pins := bpffsT(t)
	f, err := New(Config{PinPath: pins, MaxFlows: 16}, log)
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
	// The first flow gone: the adopted flows' slots are not 0, 1, 2 from
	// the bottom, and the hints must name them.
	if _, err := f.Remove(fls[0].Match); err != nil {
		t.Fatal(err)
	}
	fls = fls[1:]
	f.Close()

	f, err = New(Config{PinPath: pins, MaxFlows: 16}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, fl := range fls {
		slot := slotOf(t, f, fl)
		if slot == 0 {
			t.Errorf("flow %s in slot 0, want the slot of the previous run", fl.Match)
		}
		if got := portSlot(t, f, fl.Match.Port()); got != slot {
			t.Errorf("hint for port %d: slot %d, want %d", fl.Match.Port(), got, slot)
		}
		// The port table is the program's own too.
		if v, ok := f.ports.holds(new(keyOf(fl.Match))); portTableSupported && (!ok || v.StatsIdx != slot) {
			t.Errorf("port %d's entry: holds the flow %v, slot %d; want slot %d", fl.Match.Port(), ok, v.StatsIdx, slot)
		}
	}
}

// TestSlotHintMapped: a flow's slot hint is written through relayd's
// mapping of port_slots, and the program's map holds it.
func TestSlotHintMapped(t *testing.T) {
	if !portTableSupported {
		t.Skip("port_flows and port_slots are mapped on amd64 only")
	}
	e := newTestEnv(t)
	fl := dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000}
	other := dataplane.Flow{Match: ap(relay4, 30004), SendFrom: ap(relay4, 30006), SendTo: ap(callee4, 5002), ClockRate: 8000}
	installFlows(t, e.fp, other, fl)
	slot := slotOf(t, e.fp, fl)
	if slot == 0 {
		t.Fatal("the second flow in slot 0")
	}
	if got := e.fp.ports.hints[30000].slot; got != slot {
		t.Errorf("mapped hint for port 30000: %d, want %d", got, slot)
	}
	if got := portSlot(t, e.fp, 30000); got != slot {
		t.Errorf("port_slots[30000] by lookup: %d, want %d", got, slot)
	}
}
