package fastpath

import (
	"errors"
	"math"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
)

// routeEntry mirrors struct route_entry.
type routeEntry struct {
	Gen                   uint32
	InIfindex, OutIfindex uint16
	Tos                   uint32
	Sport, Dport          uint16
	Src, Dst              [16]byte
	Dmac, Smac            [6]byte
	OkLen                 uint16
	Family, Pad           uint8
}

// routeEntries returns the route cache entries of the flow in statistics
// slot idx that hold a lookup, one per CPU that made it.
func (e *testEnv) routeEntries(tb testing.TB, idx uint32) []routeEntry {
	tb.Helper()
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		tb.Fatal(err)
	}
	var out []routeEntry
	for cpu := range uint32(cpus) {
		var r routeEntry
		if err := e.fp.objs.Routes.Lookup(cpu*e.fp.routeSlots+idx&(e.fp.routeSlots-1), &r); err != nil {
			tb.Fatal(err)
		}
		if r.Gen != 0 {
			out = append(out, r)
		}
	}
	return out
}

// manualRoutes stops the watch and sets the route generation by hand:
// nothing but the test moves it, and the lease never runs out.
func (e *testEnv) manualRoutes(tb testing.TB) {
	tb.Helper()
	if err := e.fp.routes.close(); err != nil {
		tb.Fatal(err)
	}
	e.fp.routes = nil
	e.bumpRoutes(tb)
}

func (e *testEnv) bumpRoutes(tb testing.TB) {
	tb.Helper()
	if err := e.fp.rgen.bump(); err != nil {
		tb.Fatal(err)
	}
	if err := e.fp.rgen.until.Set(uint64(math.MaxUint64)); err != nil {
		tb.Fatal(err)
	}
}

func (e *testEnv) setNeighMAC(tb testing.TB, link int, ip net.IP, mac net.HardwareAddr) {
	tb.Helper()
	if err := inNS(e.ns, func() error {
		return netlink.NeighSet(&netlink.Neigh{LinkIndex: link, State: netlink.NUD_PERMANENT, IP: ip, HardwareAddr: mac})
	}); err != nil {
		tb.Fatal(err)
	}
}

// sendTo runs frame through the program and returns the verdict and the
// destination MAC it left.
func (e *testEnv) sendTo(tb testing.TB, frame []byte) (uint32, net.HardwareAddr) {
	tb.Helper()
	v, out := e.run(tb, frame)
	return v, net.HardwareAddr(out[:6])
}

// TestXDPRouteCache checks what the program takes from its route cache and
// what it looks up again, with the generation moved by hand: a cached
// result serves its flow's next packets until the generation moves or the
// lease runs out, and never a packet that differs in what the lookup
// depends on.
func TestXDPRouteCache(t *testing.T) {
	e := newTestEnv(t)
	e.manualRoutes(t)
	fl := dataplane.Flow{Match: ap(relay4, 36000), SendFrom: ap(relay4, 36002), SendTo: ap(callee4, 5000), ClockRate: 8000}
	if err := e.fp.Install(fl); err != nil {
		t.Fatal(err)
	}
	var val relayFlowValue
	if err := e.fp.objs.Flows.Lookup(keyOf(fl.Match), &val); err != nil {
		t.Fatal(err)
	}
	small := buildFrame(ap(caller4, 4000), fl.Match, rtpPacket(1, 1, 160, 160), frameOpts{})
	mac1, mac2 := e.neighMAC, net.HardwareAddr{0x02, 0xbb, 0, 0, 0, 0x02}
	defer e.setNeighMAC(t, e.out, callee4.AsSlice(), mac1)
	expect := func(frame []byte, verdict uint32, mac net.HardwareAddr) {
		t.Helper()
		v, got := e.sendTo(t, frame)
		if v != verdict {
			t.Fatalf("verdict %s, want %s", verdictName[v], verdictName[verdict])
		}
		if mac != nil && got.String() != mac.String() {
			t.Fatalf("sent to %s, want %s", got, mac)
		}
	}

	expect(small, xdpRedirect, mac1)
	rs := e.routeEntries(t, val.StatsIdx)
	if len(rs) != 1 || rs[0].OutIfindex != uint16(e.out) || rs[0].OkLen != uint16(len(small)-14) {
		t.Fatalf("route cache entries %+v, want one for out0 and %d bytes", rs, len(small)-14)
	}
	// A new MAC the generation does not announce: the cached one serves.
	e.setNeighMAC(t, e.out, callee4.AsSlice(), mac2)
	expect(small, xdpRedirect, mac1)
	e.bumpRoutes(t)
	expect(small, xdpRedirect, mac2)

	t.Run("lease", func(t *testing.T) {
		defer e.bumpRoutes(t)
		if err := e.fp.rgen.until.Set(uint64(0)); err != nil {
			t.Fatal(err)
		}
		e.setNeighMAC(t, e.out, callee4.AsSlice(), mac1)
		expect(small, xdpRedirect, mac1)
	})

	t.Run("longer packets", func(t *testing.T) {
		e.bumpRoutes(t)
		expect(small, xdpRedirect, nil)
		// Over the egress MTU: looked up, and punted.
		before := e.counters(t)
		expect(buildFrame(ap(caller4, 4000), fl.Match, rtpPacket(1, 2, 320, 1400), frameOpts{}), xdpPass, nil)
		assertOnlyCounter(t, before, e.counters(t), "punt/over_mtu")
		// Under it but over the length a path MTU exception may come down
		// to: forwarded, not cached.
		expect(buildFrame(ap(caller4, 4000), fl.Match, rtpPacket(1, 3, 480, 600), frameOpts{}), xdpRedirect, nil)
		for _, r := range e.routeEntries(t, val.StatsIdx) {
			if r.OkLen != uint16(len(small)-14) {
				t.Errorf("cached for %d bytes, want %d", r.OkLen, len(small)-14)
			}
		}
	})

	t.Run("another ingress device", func(t *testing.T) {
		expect(small, xdpRedirect, nil)
		set := func(v string) {
			if err := inNS(e.ns, func() error { return osWrite("/proc/sys/net/ipv4/conf/nox0/forwarding", v) }); err != nil {
				t.Fatal(err)
			}
		}
		set("0")
		defer set("1")
		v, _ := e.runOn(t, small, e.nox)
		if v != xdpPass {
			t.Fatalf("from nox0 (forwarding off): verdict %s, want PASS", verdictName[v])
		}
	})

	t.Run("another TOS", func(t *testing.T) {
		// TOS 0x10 is routed through nox0, which is no egress.
		rule := netlink.NewRule()
		rule.Tos, rule.Table, rule.Family = 0x10, 100, unix.AF_INET
		route := &netlink.Route{Table: 100, LinkIndex: e.nox, Gw: nox4.AsSlice()}
		if err := inNS(e.ns, func() error {
			if err := netlink.RouteAdd(route); err != nil {
				return err
			}
			return netlink.RuleAdd(rule)
		}); err != nil {
			t.Fatal(err)
		}
		defer inNS(e.ns, func() error { return netlink.RuleDel(rule) })
		e.bumpRoutes(t)
		expect(small, xdpRedirect, nil)
		before := e.counters(t)
		expect(buildFrame(ap(caller4, 4000), fl.Match, rtpPacket(1, 4, 640, 160), frameOpts{tos: 0x10}), xdpPass, nil)
		assertOnlyCounter(t, before, e.counters(t), "punt/no_egress")
	})

	t.Run("flow updated", func(t *testing.T) {
		expect(small, xdpRedirect, nil)
		up := fl
		up.SendTo = ap(unres4, 5000)
		if err := e.fp.Update(up); err != nil {
			t.Fatal(err)
		}
		defer e.fp.Update(fl)
		before := e.counters(t)
		expect(small, xdpPass, nil)
		assertOnlyCounter(t, before, e.counters(t), "punt/fib_no_neigh")
	})

	t.Run("slot reused", func(t *testing.T) {
		expect(small, xdpRedirect, nil)
		if _, err := e.fp.Remove(fl.Match); err != nil {
			t.Fatal(err)
		}
		again := fl
		again.SendTo = ap(noroute4, 5000)
		if err := e.fp.Install(again); err != nil {
			t.Fatal(err)
		}
		var v relayFlowValue
		if err := e.fp.objs.Flows.Lookup(keyOf(again.Match), &v); err != nil || v.StatsIdx != val.StatsIdx {
			t.Fatalf("reinstalled in slot %d (%v), want %d", v.StatsIdx, err, val.StatsIdx)
		}
		before := e.counters(t)
		expect(small, xdpPass, nil)
		assertOnlyCounter(t, before, e.counters(t), "punt/fib_other")
	})
}

// TestXDPNoRouteCache runs forwarding with the cache compiled out, as on a
// realtime kernel.
func TestXDPNoRouteCache(t *testing.T) {
	realtime := isRealtime
	isRealtime = func() bool { return true }
	defer func() { isRealtime = realtime }()
	e := newTestEnv(t)
	if e.fp.routeSlots != 0 || e.fp.routes != nil {
		t.Fatalf("route cache of %d entries per CPU, watched: %v", e.fp.routeSlots, e.fp.routes != nil)
	}
	fl := dataplane.Flow{Match: ap(relay4, 36000), SendFrom: ap(relay4, 36002), SendTo: ap(callee4, 5000), ClockRate: 8000}
	if err := e.fp.Install(fl); err != nil {
		t.Fatal(err)
	}
	small := buildFrame(ap(caller4, 4000), fl.Match, rtpPacket(1, 1, 160, 160), frameOpts{})
	mac2 := net.HardwareAddr{0x02, 0xbb, 0, 0, 0, 0x02}
	defer e.setNeighMAC(t, e.out, callee4.AsSlice(), e.neighMAC)
	for _, mac := range []net.HardwareAddr{e.neighMAC, mac2} {
		e.setNeighMAC(t, e.out, callee4.AsSlice(), mac)
		if v, got := e.sendTo(t, small); v != xdpRedirect || got.String() != mac.String() {
			t.Fatalf("verdict %s to %s, want REDIRECT to %s", verdictName[v], got, mac)
		}
	}
}

// TestRouteWatch checks which changes of the namespace's routing state move
// the route generation on, and that the watch keeps the lease and turns
// the cache off when it stops.
func TestRouteWatch(t *testing.T) {
	e := newTestEnv(t)
	e.watchRoutes(t, time.Hour) // no refresh but on events
	gen := func() uint32 {
		var g uint32
		if err := e.fp.objs.RouteGen.Get(&g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	// The namespace's own events first: the links' IPv6 link-local
	// addresses are announced when their duplicate detection ends, a
	// second or two after the links went up (more on an emulated
	// machine). Then only the test's changes move the generation.
	deadline := time.Now().Add(30 * time.Second)
	for tentative := true; tentative; {
		if time.Now().After(deadline) {
			t.Fatal("IPv6 addresses still tentative")
		}
		time.Sleep(50 * time.Millisecond)
		tentative = false
		if err := inNS(e.ns, func() error {
			as, err := netlink.AddrList(nil, netlink.FAMILY_V6)
			if errors.Is(err, netlink.ErrDumpInterrupted) {
				// The addresses changed during the dump (duplicate
				// detection ending): ask again.
				tentative = true
				return nil
			}
			for _, a := range as {
				tentative = tentative || a.Flags&unix.IFA_F_TENTATIVE != 0
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	for g, quiet := gen(), time.Now(); time.Since(quiet) < 300*time.Millisecond; time.Sleep(20 * time.Millisecond) {
		if n := gen(); n != g {
			g, quiet = n, time.Now()
		}
	}
	do := func(what string, change func() error, moves bool) {
		t.Helper()
		before := gen()
		if err := inNS(e.ns, change); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		// Events arrive within milliseconds; a change that does not
		// move the generation is given as long.
		deadline := time.Now().Add(2 * time.Second)
		if !moves {
			deadline = time.Now().Add(300 * time.Millisecond)
		}
		for time.Now().Before(deadline) && gen() == before {
			time.Sleep(5 * time.Millisecond)
		}
		if moved := gen() != before; moved != moves {
			t.Errorf("%s: generation moved %v, want %v", what, moved, moves)
		}
	}
	out, nox := netlink.NewLinkAttrs(), netlink.NewLinkAttrs()
	out.Index, nox.Index = e.out, e.nox
	neigh := func(ip string, state int, mac net.HardwareAddr) func() error {
		return func() error {
			return netlink.NeighSet(&netlink.Neigh{LinkIndex: e.out, State: state, IP: net.ParseIP(ip), HardwareAddr: mac})
		}
	}
	other := net.HardwareAddr{0x02, 0xcc, 0, 0, 0, 0x02}
	dst := &net.IPNet{IP: net.ParseIP("198.18.96.0"), Mask: net.CIDRMask(24, 32)}

	do("a new neighbour", neigh("198.18.2.9", netlink.NUD_PERMANENT, other), false)
	do("a neighbour's MAC", neigh("198.18.2.9", netlink.NUD_PERMANENT, e.neighMAC), true)
	do("a neighbour gone stale, same MAC", neigh("198.18.2.9", netlink.NUD_STALE, e.neighMAC), false)
	do("a neighbour failed", neigh("198.18.2.9", netlink.NUD_FAILED, nil), true)
	do("a neighbour resolved", neigh("198.18.2.9", netlink.NUD_REACHABLE, other), false)
	do("a neighbour deleted", func() error {
		return netlink.NeighDel(&netlink.Neigh{LinkIndex: e.out, IP: net.ParseIP("198.18.2.9")})
	}, true)
	do("a route added", func() error {
		return netlink.RouteAdd(&netlink.Route{LinkIndex: e.out, Dst: dst, Gw: callee4.AsSlice()})
	}, true)
	do("a route deleted", func() error {
		return netlink.RouteDel(&netlink.Route{LinkIndex: e.out, Dst: dst, Gw: callee4.AsSlice()})
	}, true)
	do("a policy rule", func() error {
		r := netlink.NewRule()
		r.Tos, r.Table, r.Family = 0x08, 101, unix.AF_INET
		return netlink.RuleAdd(r)
	}, true)
	do("an MTU", func() error { return netlink.LinkSetMTU(&netlink.Dummy{LinkAttrs: nox}, 1400) }, true)
	do("an address", func() error { return addAddr(&netlink.Dummy{LinkAttrs: nox}, "198.18.5.1/24") }, true)
	do("forwarding", func() error { return osWrite("/proc/sys/net/ipv4/conf/nox0/forwarding", "0") }, true)

	var until uint64
	if err := e.fp.objs.RouteUntil.Get(&until); err != nil {
		t.Fatal(err)
	}
	if now := monoNow(); until <= now || until > now+uint64(routeLease) {
		t.Errorf("lease until %d, want within %v of now (%d)", until, routeLease, now)
	}

	// Without events the generation still moves, every refresh.
	e.watchRoutes(t, 50*time.Millisecond)
	do("nothing, with a refresh of 50 ms", func() error { return nil }, true)

	if err := e.fp.routes.close(); err != nil {
		t.Fatal(err)
	}
	e.fp.routes = nil
	if err := e.fp.objs.RouteUntil.Get(&until); err != nil {
		t.Fatal(err)
	}
	if g := gen(); g != 0 || until != 0 {
		t.Errorf("after the watch stopped: generation %d, lease until %d; want the cache off", g, until)
	}
}

// TestRouteWatchNeighbours follows one neighbour through the events the
// kernel sends: only a valid entry that goes away or changes MAC counts.
func TestRouteWatchNeighbours(t *testing.T) {
	w := &routeWatch{neigh: map[neighKey]string{}}
	ip := net.ParseIP("198.18.2.9")
	mac1, mac2 := net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 2}
	ev := func(state int, mac net.HardwareAddr) *netlink.Neigh {
		return &netlink.Neigh{Family: unix.AF_INET, LinkIndex: 5, IP: ip, State: state, HardwareAddr: mac}
	}
	for i, step := range []struct {
		what    string
		n       *netlink.Neigh
		deleted bool
		want    bool
	}{
		{"incomplete", ev(netlink.NUD_INCOMPLETE, nil), false, false},
		{"resolved", ev(netlink.NUD_REACHABLE, mac1), false, false},
		{"stale", ev(netlink.NUD_STALE, mac1), false, false},
		{"delay", ev(netlink.NUD_DELAY, mac1), false, false},
		{"probe", ev(netlink.NUD_PROBE, mac1), false, false},
		{"confirmed", ev(netlink.NUD_REACHABLE, mac1), false, false},
		{"another MAC", ev(netlink.NUD_STALE, mac2), false, true},
		{"failed", ev(netlink.NUD_FAILED, nil), false, true},
		{"failed again", ev(netlink.NUD_FAILED, nil), false, false},
		{"resolved again", ev(netlink.NUD_REACHABLE, mac1), false, false},
		{"deleted", ev(netlink.NUD_REACHABLE, mac1), true, true},
		{"deleted again", ev(netlink.NUD_FAILED, nil), true, false},
		{"a bridge's forwarding entry", &netlink.Neigh{Family: unix.AF_BRIDGE, LinkIndex: 5, HardwareAddr: mac1, State: netlink.NUD_REACHABLE}, false, false},
		{"a proxy entry", &netlink.Neigh{Family: unix.AF_INET, LinkIndex: 5, IP: ip, Flags: unix.NTF_PROXY}, true, false},
	} {
		if got := w.neighbour(step.n, step.deleted); got != step.want {
			t.Errorf("%d %s: changes %v, want %v", i, step.what, got, step.want)
		}
	}
	// Beyond what it follows, any event of an unknown neighbour counts.
	for i := range maxNeighbours {
		w.neigh[neighKey{1, netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}] = ""
	}
	if !w.neighbour(ev(netlink.NUD_REACHABLE, mac1), false) {
		t.Error("a neighbour it cannot follow: no change")
	}
}

func TestRouteSlots(t *testing.T) {
	for _, tc := range []struct {
		flows, cpus int
		realtime    bool
		want        uint32
	}{
		{1024, 2, false, 1024},
		{1000, 2, false, 1024},
		{65536, 2, false, 65536},
		{65536, 64, false, 16384}, // 64 MiB over 64 CPUs
		{1 << 22, 1, false, 1 << 20},
		{65536, 4096, false, 256},
		{65536, 2, true, 0},
	} {
		if got := routeSlots(tc.flows, tc.cpus, tc.realtime); got != tc.want {
			t.Errorf("routeSlots(%d flows, %d CPUs, realtime %v) = %d, want %d", tc.flows, tc.cpus, tc.realtime, got, tc.want)
		}
	}
}

// TestRouteWatchWithoutSysAdmin starts the watch as relayd's unit does: in
// the namespace it watches, without CAP_SYS_ADMIN (so without setns). The
// watch must start, and follow the namespace's changes.
func TestRouteWatchWithoutSysAdmin(t *testing.T) {
	e := newTestEnv(t)
	if err := e.fp.routes.close(); err != nil {
		t.Fatal(err)
	}
	e.fp.routes = nil
	type started struct {
		w   *routeWatch
		err error
	}
	done := make(chan started)
	go func() {
		// The thread is left locked: it ends with the goroutine, and
		// its namespace and capabilities with it.
		runtime.LockOSThread()
		if err := netns.Set(e.ns); err != nil {
			done <- started{err: err}
			return
		}
		if err := dropEffectiveCap(unix.CAP_SYS_ADMIN); err != nil {
			done <- started{err: err}
			return
		}
		if err := netns.Set(e.ns); err == nil {
			done <- started{err: errors.New("setns still allowed: CAP_SYS_ADMIN not dropped")}
			return
		}
		w, err := startRouteWatch(e.fp.rgen, e.ns, time.Hour, e.fp.log)
		done <- started{w, err}
	}()
	s := <-done
	if s.err != nil {
		t.Fatalf("route watch in its own namespace without CAP_SYS_ADMIN: %v", s.err)
	}
	defer s.w.close()
	var before uint32
	if err := e.fp.objs.RouteGen.Get(&before); err != nil {
		t.Fatal(err)
	}
	if before == 0 {
		t.Fatal("route cache off after the watch started")
	}
	// A change of the namespace's routes moves the generation on.
	if err := inNS(e.ns, func() error {
		_, dst, _ := net.ParseCIDR("198.19.250.0/24")
		return netlink.RouteAdd(&netlink.Route{Dst: dst, LinkIndex: e.out})
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var g uint32
		if err := e.fp.objs.RouteGen.Get(&g); err != nil {
			t.Fatal(err)
		}
		if g != before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("route generation still %d 10 s after a route was added", g)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dropEffectiveCap removes c from the calling thread's effective set.
func dropEffectiveCap(c int) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[c/32].Effective &^= 1 << (c % 32)
	return unix.Capset(&hdr, &data[0])
}
