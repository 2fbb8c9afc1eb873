package slowpath

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/testenv"
)

// TestShadowStats: ShadowStats gathers, from every worker, the shadows
// that carried or dropped a packet, and leaves out the silent ones and
// the flows that are not shadows; EachStats gives every flow that is not
// a shadow, silent or not.
func TestShadowStats(t *testing.T) {
	testenv.NeedRoot(t) // raw sockets
	var ws []*worker
	for i := range 2 {
		w, err := newWorker(i, 0, zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	flow := func(port uint16) dataplane.Flow {
		return dataplane.Flow{Match: netip.AddrPortFrom(netip.MustParseAddr("198.18.1.1"), port),
			SendFrom: netip.MustParseAddrPort("198.18.1.1:40000"), SendTo: netip.MustParseAddrPort("198.18.2.2:5000")}
	}
	seen := time.Unix(1700000000, 0)
	// The workers do not run yet: their flows may be set up directly.
	for _, c := range []struct {
		w       *worker
		port    uint16
		shadow  bool
		packets uint64
		dropped uint64
	}{
		{ws[0], 30000, true, 5, 0},  // punted traffic: reported
		{ws[0], 30002, true, 0, 0},  // silent shadow: left out
		{ws[1], 30004, true, 0, 2},  // dropped only: reported
		{ws[1], 30006, false, 7, 0}, // a userspace flow, not a shadow
		{ws[0], 30008, false, 0, 0}, // a silent one
	} {
		if r := c.w.handleCtrl(ctrl{op: opAdd, flow: flow(c.port), shadow: c.shadow}); r.err != nil {
			t.Fatal(r.err)
		}
		f := c.w.flows[flow(c.port).Match]
		f.packets, f.bytes, f.dropped = c.packets, 100*c.packets, c.dropped
		if c.packets+c.dropped > 0 {
			f.lastSeen = seen.UnixNano()
		}
	}
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(w.run)
	}
	t.Cleanup(func() {
		for _, w := range ws {
			w.close()
		}
		wg.Wait()
	})
	p := &Pool{workers: ws}
	got, err := p.ShadowStats()
	if err != nil {
		t.Fatal(err)
	}
	want := map[netip.AddrPort]dataplane.Stats{
		flow(30000).Match: {Packets: 5, Bytes: 500, LastSeen: seen},
		flow(30004).Match: {Dropped: 2, LastSeen: seen},
	}
	if len(got) != len(want) {
		t.Fatalf("ShadowStats = %v, want %v", got, want)
	}
	for m, w := range want {
		g, ok := got[m]
		if !ok || g.Packets != w.Packets || g.Bytes != w.Bytes || g.Dropped != w.Dropped || !g.LastSeen.Equal(w.LastSeen) {
			t.Errorf("ShadowStats[%s] = %+v (present %v), want %+v", m, g, ok, w)
		}
	}
	each := map[netip.AddrPort]dataplane.Stats{}
	if err := p.EachStats(func(m netip.AddrPort, st dataplane.Stats) { each[m] = st }); err != nil {
		t.Fatal(err)
	}
	if len(each) != 2 || each[flow(30006).Match].Packets != 7 || each[flow(30008).Match] != (dataplane.Stats{}) {
		t.Errorf("EachStats gave %v, want the two userspace flows, 7 packets and none", each)
	}
}

// TestShadowPostedBeforePackets: a shadow install does not wait for the
// worker, yet a packet sent the moment it returns finds the shadow: the
// worker serves its queue before the packets it received (a shadow is
// dormant until then, see TestDormantShadows). The removal of a shadow
// never punted to does not wait either.
func TestShadowPostedBeforePackets(t *testing.T) {
	enterTestNS(t, "198.18.1.1/32", "198.18.0.2/32")
	p, err := New(Config{Workers: 1}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(198, 18, 0, 2), Port: 4000})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 20 {
		match := netip.AddrPortFrom(netip.MustParseAddr("198.18.1.1"), uint16(30000+2*i))
		if err := p.InstallShadow(&dataplane.Flow{Match: match, Action: dataplane.Drop}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteToUDPAddrPort(rtpPayload(1, uint16(i), 160), match); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			st, err := p.ShadowStat(match)
			if err != nil {
				t.Fatal(err)
			}
			if st.Packets+st.Dropped > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("shadow %d: the packet sent after its install never reached it", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	cs, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Reason == "userspace_no_flow" && c.Packets != 0 {
			t.Errorf("%d packets found no flow", c.Packets)
		}
	}
	// Removed, a shadow that was punted to returns its counters; one
	// that never was returns none, without waiting for its worker, and is
	// gone all the same.
	punted := netip.MustParseAddrPort("198.18.1.1:30000")
	if st, err := p.RemoveShadow(punted); err != nil || st.Packets+st.Dropped != 1 {
		t.Errorf("RemoveShadow of a shadow punted to: %+v, %v; want its packet", st, err)
	}
	silent := netip.MustParseAddrPort("198.18.1.1:31000")
	if err := p.InstallShadow(&dataplane.Flow{Match: silent, Action: dataplane.Drop}); err != nil {
		t.Fatal(err)
	}
	// Only the shadows punted to are the worker's flows; silent waits
	// dormant.
	if awake, err := p.list(true); err != nil || len(awake) != 19 {
		t.Errorf("the worker has %d shadows (%v), want the 19 punted to and not removed", len(awake), err)
	}
	if st, err := p.RemoveShadow(silent); err != nil || st != (dataplane.Stats{}) {
		t.Errorf("RemoveShadow of a silent shadow: %+v, %v; want nothing", st, err)
	}
	for _, m := range []netip.AddrPort{punted, silent} {
		if _, err := p.ShadowStat(m); !errors.Is(err, dataplane.ErrNotFound) {
			t.Errorf("ShadowStat of removed %s: %v, want ErrNotFound", m, err)
		}
	}
	if err := p.InstallShadow(&dataplane.Flow{Match: silent, Action: dataplane.Drop}); err != nil {
		t.Errorf("install again after the removal: %v", err)
	}
}

// TestDormantShadows: a shadow waits as its flow alone until the first
// packet XDP punts to it, which makes it a flow of the worker's with the
// flow of its last update; an update of the reverse flow's latching
// reaches a dormant shadow too; a packet to no flow, dormant or awake,
// is counted as such; relaying allocates nothing with dormant shadows
// about.
func TestDormantShadows(t *testing.T) {
	w := &worker{log: zaptest.NewLogger(t), flows: map[netip.AddrPort]*flowState{}, relays: &relaySet{}}
	relay := netip.MustParseAddr("198.18.1.1")
	flow := func(port uint16, to string) *dataplane.Flow {
		return &dataplane.Flow{Match: netip.AddrPortFrom(relay, port), SendFrom: netip.AddrPortFrom(relay, port+100),
			SendTo: netip.MustParseAddrPort(to), ClockRate: 8000}
	}
	a, b := flow(30000, "198.18.2.2:5000"), flow(30002, "198.18.2.2:5002")
	w.sleep(a)
	w.sleep(b)
	a2 := flow(30000, "198.18.2.2:6000")
	if !w.resleep(a2) {
		t.Fatal("resleep of a dormant shadow: false")
	}
	if w.resleep(flow(30004, "198.18.2.2:6004")) {
		t.Fatal("resleep of no shadow: true")
	}
	w.dormantSendTo(b.Match, netip.MustParseAddrPort("198.18.2.2:7002"))
	if len(w.flows) != 0 || w.dormantN.Load() != 2 || !w.dormantHas(a.Match) || !w.dormantHas(b.Match) {
		t.Fatalf("%d flows, %d dormant; want 0 and 2", len(w.flows), w.dormantN.Load())
	}
	// A dormant shadow keeps the caller's flow, no copy of its own; the
	// latching change is made on a copy: the caller's is never changed.
	w.dormantMu.Lock()
	sharedA, bNow := w.dormant[a.Match], w.dormant[b.Match]
	w.dormantMu.Unlock()
	if sharedA != a2 || b.SendTo != netip.MustParseAddrPort("198.18.2.2:5002") || bNow == b ||
		bNow.SendTo != netip.MustParseAddrPort("198.18.2.2:7002") {
		t.Errorf("dormant flows: a %p (the update's %p), b's send_to %s (the caller's %s)", sharedA, a2, bNow.SendTo, b.SendTo)
	}

	rx := newRxBatch()
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	fillRx(rx, 0, rtpPayload(1, 1, 160), src, a.Match, int64(1e18))
	fillRx(rx, 1, rtpPayload(2, 1, 160), src, netip.AddrPortFrom(relay, 30006), int64(1e18)) // no flow
	// The shadow's second packet in the same batch finds the flow the
	// first one woke.
	fillRx(rx, 2, rtpPayload(1, 2, 160), src, a.Match, int64(1e18)+20e6)
	tx := newTxBatch(-1, false)
	w.relayBatch(rx, 3, tx, nil)
	f := w.flows[a.Match]
	switch {
	case f == nil:
		t.Fatal("the punted packet's shadow was not woken")
	case !f.shadow || f.packets != 2 || f.flow.SendTo != netip.MustParseAddrPort("198.18.2.2:6000"):
		t.Errorf("woken shadow: shadow %v, %d packets, send_to %s; want a shadow, 2 packets, the updated 198.18.2.2:6000",
			f.shadow, f.packets, f.flow.SendTo)
	}
	if got := w.counters[vSend].Load(); got != 2 {
		t.Errorf("%d packets relayed, want 2", got)
	}
	if got := w.noFlow.Load(); got != 1 {
		t.Errorf("%d packets found no flow, want 1", got)
	}
	if w.dormantHas(a.Match) || w.dormantN.Load() != 1 {
		t.Errorf("after the wake-up: dormant %v, %d dormant; want false, 1", w.dormantHas(a.Match), w.dormantN.Load())
	}
	if fb := w.awaken(b.Match); fb == nil || fb.flow.SendTo != netip.MustParseAddrPort("198.18.2.2:7002") {
		t.Errorf("dormant reverse shadow after latching: %+v, want send_to 198.18.2.2:7002", fb)
	}
	w.sleep(flow(30008, "198.18.2.2:5008"))
	if !w.unsleep(netip.AddrPortFrom(relay, 30008)) || w.unsleep(netip.AddrPortFrom(relay, 30008)) || w.dormantN.Load() != 0 {
		t.Errorf("unsleep: twice true or %d left", w.dormantN.Load())
	}
	w.sleep(flow(30010, "198.18.2.2:5010")) // a miss now looks in dormant
	if allocs := testing.AllocsPerRun(100, func() { w.relayBatch(rx, 2, tx, nil) }); allocs != 0 {
		t.Errorf("%v allocations per batch, want 0", allocs)
	}
}
