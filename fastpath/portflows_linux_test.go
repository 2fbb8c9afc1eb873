package fastpath

import (
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/relayd/relayd/dataplane"
)

// requirePortTable skips where relayd does not write the port table (not
// x86: see portTable).
func requirePortTable(tb testing.TB, f *Fastpath) {
	tb.Helper()
	if !portTableSupported {
		tb.Skip("the port table is written on x86 only")
	}
	if f.ports == nil {
		tb.Fatal("port table not mapped")
	}
}

// forwardedTo runs frame and returns where the program sent it, failing
// unless it was redirected as a valid frame.
func forwardedTo(tb testing.TB, e *testEnv, frame []byte) (src, dst netip.AddrPort) {
	tb.Helper()
	v, out := e.run(tb, frame)
	if v != xdpRedirect {
		tb.Fatalf("verdict %s, want redirect", verdictName[v])
	}
	p, err := parseFrame(out)
	if err != nil {
		tb.Fatal(err)
	}
	return p.src, p.dst
}

// TestPortTable: the program takes a flow from its port's entry when the
// entry holds it whole, and from the flow map otherwise; relayd keeps the
// entry in step with the flow map through installs, updates and removals,
// with two flows on one port.
func TestPortTable(t *testing.T) {
	e := newTestEnv(t)
	requirePortTable(t, e.fp)
	fl4 := dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000}
	fl6 := dataplane.Flow{Match: ap(relay6, 30000), SendFrom: ap(relay6, 30002), SendTo: ap(callee6, 5000), ClockRate: 8000}
	k4, k6 := keyOf(fl4.Match), keyOf(fl6.Match)
	frame4 := buildFrame(ap(caller4, 4000), fl4.Match, rtpPacket(1, 1, 160, 160), frameOpts{})
	frame6 := buildFrame(ap(caller6, 4000), fl6.Match, rtpPacket(2, 1, 160, 160), frameOpts{})
	wantDst := func(frame []byte, want netip.AddrPort) {
		t.Helper()
		if _, dst := forwardedTo(t, e, frame); dst != want {
			t.Fatalf("sent to %s, want %s", dst, want)
		}
	}

	if err := e.fp.Install(fl4); err != nil {
		t.Fatal(err)
	}
	held, ok := e.fp.ports.holds(&k4)
	if !ok || held.DstPort != htons(5000) {
		t.Fatalf("port 30000's entry: holds %v, destination port %d", ok, ntohs(held.DstPort))
	}
	wantDst(frame4, fl4.SendTo)
	wantByPort := func(want int) {
		t.Helper()
		if got := e.fp.PortTableFlows(); got != want {
			t.Fatalf("%d flows in the port table, want %d", got, want)
		}
	}
	wantByPort(1)

	// The program reads the entry, not the flow map: an entry that
	// disagrees with the map decides.
	e.fp.mu.Lock()
	other := held
	other.DstPort = htons(5002)
	e.fp.ports.write(&e.fp.ports.entries[30000], &k4, &other)
	e.fp.mu.Unlock()
	wantDst(frame4, ap(callee4, 5002))

	// An entry being written (odd seq) is not read: the flow map decides.
	entry := &e.fp.ports.entries[30000]
	atomic.AddUint32(&entry.seq, 1)
	wantDst(frame4, fl4.SendTo)
	atomic.AddUint32(&entry.seq, 1)
	wantDst(frame4, ap(callee4, 5002))

	// An update rewrites the entry with the map.
	fl4.SendTo = ap(callee4, 5004)
	if err := e.fp.Update(fl4); err != nil {
		t.Fatal(err)
	}
	wantDst(frame4, fl4.SendTo)

	// A second flow on the port takes the entry; the first is found in
	// the flow map, and its update leaves the entry alone.
	if err := e.fp.Install(fl6); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.fp.ports.holds(&k6); !ok {
		t.Fatal("port 30000's entry does not hold the last installed flow")
	}
	wantByPort(1)
	wantDst(frame6, fl6.SendTo)
	wantDst(frame4, fl4.SendTo)
	fl4.SendTo = ap(callee4, 5006)
	if err := e.fp.Update(fl4); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.fp.ports.holds(&k6); !ok {
		t.Fatal("another flow's update took the entry")
	}
	wantDst(frame4, fl4.SendTo)

	// Removing the entry's flow gives the entry to the other flow on the
	// port, with its value and its statistics slot.
	if _, err := e.fp.Remove(fl6.Match); err != nil {
		t.Fatal(err)
	}
	if held, ok := e.fp.ports.holds(&k4); !ok || held.DstPort != htons(5006) || held.StatsIdx != e.fp.installed[k4].slot {
		t.Fatalf("port 30000's entry after its flow went: holds the other flow %v, destination port %d, slot %d; want 5006, slot %d",
			ok, ntohs(held.DstPort), held.StatsIdx, e.fp.installed[k4].slot)
	}
	wantByPort(1)
	if v, _ := e.run(t, frame6); v != xdpPass {
		t.Fatalf("removed flow's packet: verdict %s, want pass", verdictName[v])
	}
	wantDst(frame4, fl4.SendTo)
	if _, err := e.fp.Remove(fl4.Match); err != nil {
		t.Fatal(err)
	}
	if *entry != (portEntry{seq: entry.seq}) {
		t.Fatalf("entry of a removed flow: %+v", *entry)
	}
	if v, _ := e.run(t, frame4); v != xdpPass {
		t.Fatalf("removed flow's packet: verdict %s, want pass", verdictName[v])
	}
	wantByPort(0)
	if err := e.fp.Install(fl4); err != nil {
		t.Fatal(err)
	}
	wantByPort(1)

	// A flow waiting for the entry that goes first leaves the entry as it
	// is, and is not given it later.
	if err := e.fp.Install(fl6); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fp.Remove(fl4.Match); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.fp.ports.holds(&k6); !ok {
		t.Fatal("removing a flow found in the flow map changed the port's entry")
	}
	if _, err := e.fp.Remove(fl6.Match); err != nil {
		t.Fatal(err)
	}
	if *entry != (portEntry{seq: entry.seq}) {
		t.Fatalf("entry after its port's last flow went: %+v", *entry)
	}
	wantByPort(0)
	if len(e.fp.ports.others) != 0 {
		t.Fatalf("flows still waiting for entries: %v", e.fp.ports.others)
	}
}

// TestPortTableNeverTorn: packets run through the program while another
// thread rewrites their flow's entry as fast as it can, alternating two
// values that differ in the source and destination ports. Every packet
// leaves with one value's pair, never one port of each: a read that
// overlapped a write falls back to the flow map (a third pair). Without
// the sequence check a run here sent 94 of 640,906 packets torn.
func TestPortTableNeverTorn(t *testing.T) {
	e := newTestEnv(t)
	requirePortTable(t, e.fp)
	fl := dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000)}
	if err := e.fp.Install(fl); err != nil {
		t.Fatal(err)
	}
	k := keyOf(fl.Match)
	base, _ := e.fp.ports.holds(&k)
	values := [2]relayFlowValue{base, base}
	values[0].SrcPort, values[0].DstPort = htons(31000), htons(6000)
	values[1].SrcPort, values[1].DstPort = htons(32000), htons(7000)
	pairs := map[[2]uint16]int{{30002, 5000}: 0, {31000, 6000}: 0, {32000, 7000}: 0}

	var stop atomic.Bool
	var wg sync.WaitGroup
	var writes int
	wg.Go(func() {
		entry := &e.fp.ports.entries[30000]
		for i := 0; !stop.Load(); i++ {
			e.fp.ports.write(entry, &k, &values[i&1])
			writes++
		}
	})
	frame := buildFrame(ap(caller4, 4000), fl.Match, rtpPacket(1, 1, 160, 160), frameOpts{})
	out := make([]byte, len(frame)+256)
	var torn, packets int
	err := inNS(e.ns, func() error {
		defer stop.Store(true)
		for end := time.Now().Add(time.Second); time.Now().Before(end); packets++ {
			v, err := e.fp.objs.RelayXdp.Run(&ebpf.RunOptions{
				Data: frame, DataOut: out,
				Context: xdpMd{DataEnd: uint32(len(frame)), IngressIfindex: uint32(e.in)},
			})
			if err != nil {
				return err
			}
			if v != xdpRedirect {
				t.Errorf("verdict %s, want redirect", verdictName[v])
				return nil
			}
			p, err := parseFrame(out[:len(frame)])
			if err != nil {
				t.Errorf("packet %d: %v", packets, err)
				return nil
			}
			pair := [2]uint16{p.src.Port(), p.dst.Port()}
			if _, ok := pairs[pair]; !ok {
				torn++
				continue
			}
			pairs[pair]++
		}
		return nil
	})
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d packets, %d entry writes; by value: %v", packets, writes, pairs)
	if torn > 0 {
		t.Fatalf("%d of %d packets left with a torn flow (one port of each value)", torn, packets)
	}
	if pairs[[2]uint16{31000, 6000}] == 0 || pairs[[2]uint16{32000, 7000}] == 0 {
		t.Errorf("the program read neither or only one of the entry's values: %v", pairs)
	}
}

// TestCallsAfterClose: a Fastpath closed under a caller (relayd's
// shutdown) answers each flow call with an error and does not touch the
// port table it unmapped.
func TestCallsAfterClose(t *testing.T) {
	e := newTestEnv(t)
	fl := dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000)}
	if err := e.fp.Install(fl); err != nil {
		t.Fatal(err)
	}
	if err := e.fp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.fp.Install(dataplane.Flow{Match: ap(relay4, 30004), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000)}); err == nil {
		t.Error("install after Close: no error")
	}
	fl.SendTo = ap(callee4, 5002)
	if err := e.fp.Update(fl); err == nil {
		t.Error("update after Close: no error")
	}
	if _, err := e.fp.Remove(fl.Match); err == nil {
		t.Error("remove after Close: no error")
	}
}

// TestPortTableChurn: flows on a few ports of three relay addresses come
// and go in random order. After every step each port with flows has an
// entry holding one of them with the flow map's value, the others are
// found in the flow map, and the gauge counts the ports with flows.
func TestPortTableChurn(t *testing.T) {
	e := newTestEnv(t)
	requirePortTable(t, e.fp)
	addrs := []netip.Addr{relay4, relay6, netip.MustParseAddr("198.18.1.9")}
	ports := []uint16{30000, 30002, 30004}
	var all []dataplane.Flow
	for _, a := range addrs {
		for i, p := range ports {
			to := ap(callee4, 5000+uint16(i))
			if a.Is6() {
				to = ap(callee6, 5000+uint16(i))
			}
			all = append(all, dataplane.Flow{Match: ap(a, p), SendFrom: ap(a, p+1000), SendTo: to})
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	up := make(map[netip.AddrPort]bool)
	for step := range 600 {
		fl := all[rng.IntN(len(all))]
		if up[fl.Match] {
			if _, err := e.fp.Remove(fl.Match); err != nil {
				t.Fatalf("step %d: remove %s: %v", step, fl.Match, err)
			}
			delete(up, fl.Match)
		} else {
			if err := e.fp.Install(fl); err != nil {
				t.Fatalf("step %d: install %s: %v", step, fl.Match, err)
			}
			up[fl.Match] = true
		}
		withFlows := 0
		for _, p := range ports {
			var on []netip.AddrPort
			for m := range up {
				if m.Port() == p {
					on = append(on, m)
				}
			}
			entry := &e.fp.ports.entries[p]
			if len(on) == 0 {
				if *entry != (portEntry{seq: entry.seq}) {
					t.Fatalf("step %d: port %d has no flow, its entry holds %+v", step, p, entry.key)
				}
				continue
			}
			withFlows++
			k := entry.key
			var v relayFlowValue
			if err := e.fp.objs.Flows.Lookup(&k, &v); err != nil || !up[flowOf(k, v).Match] {
				t.Fatalf("step %d: port %d's entry holds %+v, not one of its flows %v (%v)", step, p, k, on, err)
			}
			if v != entry.value {
				t.Fatalf("step %d: port %d's entry holds a value the flow map does not", step, p)
			}
			if got := len(e.fp.ports.others[p]); got != len(on)-1 {
				t.Fatalf("step %d: port %d: %d flows wait for the entry, want %d", step, p, got, len(on)-1)
			}
		}
		if got := e.fp.PortTableFlows(); got != withFlows {
			t.Fatalf("step %d: gauge %d, want %d ports with flows", step, got, withFlows)
		}
	}
}
