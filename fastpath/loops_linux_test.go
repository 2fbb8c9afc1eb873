package fastpath

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/relayd/relayd/dataplane"
)

// TestXDPLoopFlags follows a flow toward another flow's match as that
// match comes and goes, and the flows' updates: its packets are dropped as
// a loop exactly while the match is installed, and the flag relayd keeps
// for it says so.
func TestXDPLoopFlags(t *testing.T) {
	e := newTestEnv(t)
	a := dataplane.Flow{Match: ap(relay4, 37000), SendFrom: ap(relay4, 37002), SendTo: ap(relay4, 37004), ClockRate: 8000}
	b := dataplane.Flow{Match: ap(relay4, 37004), SendFrom: ap(relay4, 37006), SendTo: ap(callee4, 5000), ClockRate: 8000}
	toA := buildFrame(ap(caller4, 4000), a.Match, rtpPacket(1, 1, 160, 160), frameOpts{})
	check := func(when string, verdict uint32, counter string, flagged bool) {
		t.Helper()
		before := e.counters(t)
		if v, _ := e.run(t, toA); v != verdict {
			t.Fatalf("%s: verdict %s, want %s", when, verdictName[v], verdictName[verdict])
		}
		assertOnlyCounter(t, before, e.counters(t), counter)
		var v relayFlowValue
		if err := e.fp.objs.Flows.Lookup(keyOf(a.Match), &v); err != nil {
			t.Fatal(err)
		}
		if got := v.Flags&loopFlag != 0; got != flagged {
			t.Errorf("%s: loop flag %v, want %v", when, got, flagged)
		}
	}
	install := func(fl dataplane.Flow) {
		t.Helper()
		if err := e.fp.Install(fl); err != nil {
			t.Fatal(err)
		}
	}
	remove := func(fl dataplane.Flow) {
		t.Helper()
		if _, err := e.fp.Remove(fl.Match); err != nil {
			t.Fatal(err)
		}
	}

	// Toward a relay address that is no flow's match: the kernel's.
	install(a)
	check("before the match is installed", xdpPass, "punt/fib_other", false)
	install(b)
	check("with the match installed", xdpDrop, "drop/loop", true)
	remove(b)
	check("after the match is removed", xdpPass, "punt/fib_other", false)

	// The match first, then the flow toward it.
	install(b)
	remove(a)
	install(a)
	check("installed toward an installed match", xdpDrop, "drop/loop", true)

	// Updates move the destination.
	away := a
	away.SendTo = ap(callee4, 5000)
	if err := e.fp.Update(away); err != nil {
		t.Fatal(err)
	}
	check("updated away from the match", xdpRedirect, "forward/redirect", false)
	self := a
	self.SendTo = a.Match
	if err := e.fp.Update(self); err != nil {
		t.Fatal(err)
	}
	check("updated toward its own match", xdpDrop, "drop/loop", true)
	remove(b) // not the match a loops to now
	check("another flow removed", xdpDrop, "drop/loop", true)

	// An adopted flow gets the flag it should have, whatever it had.
	if err := e.fp.Update(away); err != nil {
		t.Fatal(err)
	}
	var v relayFlowValue
	k := keyOf(a.Match)
	if err := e.fp.objs.Flows.Lookup(k, &v); err != nil {
		t.Fatal(err)
	}
	v.Flags |= loopFlag
	if err := e.fp.objs.Flows.Update(k, v, ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
	flows, err := e.fp.dumpFlows()
	if err != nil {
		t.Fatal(err)
	}
	e.fp.adoptLoops(flows)
	check("adopted with a stale flag", xdpRedirect, "forward/redirect", false)
}

// TestLoopIndex checks the index of who sends where against a plain
// model through random sets and removals over a few destinations, so
// that several flows share one (the set's rare case) as well as none.
func TestLoopIndex(t *testing.T) {
	key := func(port uint16) flowKey { return keyOf(ap(relay4, port)) }
	value := func(dst uint16) relayFlowValue {
		return valueOf(&dataplane.Flow{Match: ap(relay4, 1), SendFrom: ap(relay4, 1), SendTo: ap(relay4, dst)}, 0)
	}
	var x loopIndex
	model := map[flowKey]flowKey{} // flow -> destination
	rng := rand.New(rand.NewPCG(14, 14))
	for i := range 5000 {
		k := key(uint16(20000 + rng.IntN(12)))
		if rng.IntN(3) == 0 {
			x.remove(k)
			delete(model, k)
		} else {
			dst := uint16(20000 + rng.IntN(6)) // often a flow's own match, or another's
			v := value(dst)
			x.set(k, &v)
			model[k] = key(dst)
		}
		for d := range uint16(12) {
			dk := key(20000 + d)
			var want []flowKey
			for f, to := range model {
				if to == dk && f != dk {
					want = append(want, f)
				}
			}
			got := x.senders(dk)
			sortKeys := func(s []flowKey) {
				slices.SortFunc(s, func(a, b flowKey) int { return cmp.Compare(a.Port, b.Port) })
			}
			sortKeys(want)
			sortKeys(got)
			if !slices.Equal(got, want) {
				t.Fatalf("step %d: senders to %d = %v, want %v", i, 20000+d, got, want)
			}
		}
	}
	for k := range model {
		x.remove(k)
	}
	if len(x.dest) != 0 || len(x.to) != 0 {
		t.Errorf("all removed: %d destinations, %d sender sets left", len(x.dest), len(x.to))
	}
}
