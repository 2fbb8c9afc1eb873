package slowpath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// TestRelayBatchLoop: a packet whose flow sends it back into relayd (its
// own match, another relay port, loopback, a reflecting flow's source on
// a relay address) is dropped and counted as a loop, not sent; other
// flows in the batch are relayed. Nothing is allocated.
func TestRelayBatchLoop(t *testing.T) {
	w := &worker{log: zaptest.NewLogger(t), flows: map[netip.AddrPort]*flowState{}, relays: &relaySet{}}
	relays := []netip.Addr{netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.3.1")}
	w.relays.p.Store(&relays)
	from := netip.MustParseAddrPort("198.18.1.1:30100")
	add := func(port uint16, to string, action dataplane.Action) netip.AddrPort {
		m := netip.AddrPortFrom(relays[0], port)
		fl := dataplane.Flow{Match: m, SendFrom: from, Action: action, ClockRate: 8000}
		if to != "" {
			fl.SendTo = netip.MustParseAddrPort(to)
		}
		w.flows[m] = &flowState{flow: fl}
		return m
	}
	self := add(30000, "198.18.1.1:30000", dataplane.Forward)
	other := add(30002, "198.18.1.1:30010", dataplane.Forward)
	otherIface := add(30004, "198.18.3.1:40000", dataplane.Forward)
	loopback := add(30006, "127.0.0.1:5000", dataplane.Forward)
	good := add(30010, "198.18.2.2:5000", dataplane.Forward)
	reflect := add(30012, "", dataplane.Reflect)

	rx := newRxBatch()
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	dsts := []netip.AddrPort{self, other, otherIface, loopback, good}
	for i, d := range dsts {
		fillRx(rx, i, rtpPayload(1, uint16(i), 0), src, d, int64(1e18))
	}
	// Reflected toward its source: a relay address (packets of a flow
	// pointing here) would come back.
	fillRx(rx, len(dsts), rtpPayload(1, 9, 0), netip.MustParseAddrPort("198.18.1.1:30100"), reflect, int64(1e18))
	n := len(dsts) + 1
	tx := newTxBatch(-1, false)
	w.relayBatch(rx, n, tx, nil)
	if got := w.counters[vDropLoop].Load(); got != uint64(n-1) {
		t.Errorf("%d loops dropped, want %d", got, n-1)
	}
	if got := w.counters[vSend].Load(); got != 1 {
		t.Errorf("%d packets relayed, want 1 (to %s)", got, w.flows[good].flow.SendTo)
	}
	for _, m := range []netip.AddrPort{self, other, otherIface, loopback, reflect} {
		if f := w.flows[m]; f.dropped != 1 || f.packets != 0 {
			t.Errorf("flow %s: %d dropped, %d packets; want the packet dropped", m, f.dropped, f.packets)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { w.relayBatch(rx, n, tx, nil) }); allocs != 0 {
		t.Errorf("%v allocations per batch, want 0", allocs)
	}
}

// TestPoolLoopGuard: in a network namespace with the relay address on
// lo, a flow whose send_to is its own match gets one packet. Without the
// guard the worker sends it to itself through its raw socket, receives
// it again at once and loops at full speed until the flow goes; with it
// the packet is dropped once and counted. The pool's relay addresses
// follow its flows.
func TestPoolLoopGuard(t *testing.T) {
	enterTestNS(t, "198.18.1.1/32")
	p, err := New(Config{Workers: 1}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	match := netip.MustParseAddrPort("198.18.1.1:30000")
	if p.relays.has(match.Addr()) {
		t.Fatal("relay address known before any flow")
	}
	if err := p.Install(dataplane.Flow{Match: match, SendFrom: netip.MustParseAddrPort("198.18.1.1:30002"), SendTo: match}); err != nil {
		t.Fatal(err)
	}
	if !p.relays.has(match.Addr()) {
		t.Fatal("relay address of the flow not known")
	}
	c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(198, 18, 1, 1), Port: 4000}, net.UDPAddrFromAddrPort(match))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(rtpPayload(1, 1, 160)); err != nil {
		t.Fatal(err)
	}
	counter := func(reason string) uint64 {
		cs, err := p.Counters()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if c.Reason == reason {
				return c.Packets
			}
		}
		t.Fatalf("no counter %s", reason)
		return 0
	}
	deadline := time.Now().Add(5 * time.Second)
	for counter("userspace_loop") == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a loop would go on meanwhile
	if loops, sent := counter("userspace_loop"), counter("userspace_send"); loops != 1 || sent != 0 {
		t.Errorf("loop guard: %d dropped as loops, %d sent; want 1 and 0", loops, sent)
	}
	if _, err := p.Remove(match); err != nil {
		t.Fatal(err)
	}
	if p.relays.has(match.Addr()) {
		t.Error("relay address still known after its last flow went")
	}
}

// TestTranscodeLoop: a transcoding flow's output and relayd's own RTCP
// report are not sent toward a relay address either.
func TestTranscodeLoop(t *testing.T) {
	if !g729.Available {
		testenv.Skip(t, "built without bcg729")
	}
	w := &worker{log: zaptest.NewLogger(t), flows: map[netip.AddrPort]*flowState{}, tcFlows: map[*flowState]struct{}{}, relays: &relaySet{}}
	relays := []netip.Addr{netip.MustParseAddr("198.18.1.1")}
	w.relays.p.Store(&relays)
	match := netip.MustParseAddrPort("198.18.1.1:30000")
	f := &flowState{flow: dataplane.Flow{
		Match: match, SendFrom: netip.MustParseAddrPort("198.18.1.1:30002"),
		SendTo: netip.MustParseAddrPort("198.18.2.2:5000"), ClockRate: 8000,
		Transcode: &dataplane.Transcode{
			In:       dataplane.Codec{Name: "PCMU", PT: 0, Ptime: 20},
			Out:      dataplane.Codec{Name: "G729", PT: 18, Ptime: 20},
			RTCPFrom: netip.MustParseAddrPort("198.18.1.1:30003"),
			RTCPTo:   netip.MustParseAddrPort("198.18.2.2:5001"),
		},
	}}
	if err := w.setTranscode(f, f.flow.Transcode); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.setTranscode(f, nil) })
	w.flows[match] = f
	w.tx4 = newTxBatch(-1, false)
	rx := newRxBatch()
	for i := range 4 {
		fillRx(rx, i, rtpPayload(1, uint16(i), uint32(i)*160), netip.MustParseAddrPort("198.18.0.2:4000"), match, int64(1e18)+int64(i)*20e6)
	}
	w.relayBatch(rx, 4, w.tx4, nil)
	if got := w.counters[vSend].Load(); got != 4 {
		t.Fatalf("%d packets sent, want 4", got)
	}
	var counts [vMax]uint64
	now := int64(1e18) + 100e6
	w.sendReport(f, now, &counts)
	if f.rtcpSent != 1 {
		t.Fatalf("%d reports sent toward the peer, want 1", f.rtcpSent)
	}
	f.flow.Transcode.RTCPTo = netip.MustParseAddrPort("198.18.1.1:30001")
	w.sendReport(f, now+1e9, &counts)
	if f.rtcpSent != 1 || counts[vDropLoop] != 1 {
		t.Errorf("report toward the relay: %d sent, %d dropped as loops; want 1 and 1", f.rtcpSent, counts[vDropLoop])
	}
	// Output toward the relay: the engine is drained, nothing sent.
	f.flow.SendTo = netip.MustParseAddrPort("198.18.1.1:30010")
	for i := range 4 {
		fillRx(rx, i, rtpPayload(1, uint16(4+i), uint32(4+i)*160), netip.MustParseAddrPort("198.18.0.2:4000"), match, int64(1e18)+int64(4+i)*20e6)
	}
	w.relayBatch(rx, 4, w.tx4, nil)
	if got := w.counters[vSend].Load(); got != 4 {
		t.Errorf("%d packets sent after send_to moved onto the relay, want still 4", got)
	}
}
