package slowpath

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
)

// BenchmarkRelayBatch: a worker's whole batch path, 64 G.711 packets of
// 1,000 flows: control messages parsed, flows looked up, RFC 3550
// statistics, headers written, and one sendmmsg on a raw socket in a
// namespace of its own, out of a veth whose peer drops the frames (so
// the figure is relayd's and the kernel's send path, not a receiver's).
// ns/pkt is per packet.
//
//	go test -run '^$' -bench RelayBatch ./slowpath/
func BenchmarkRelayBatch(b *testing.B) {
	enterTestNS(b)
	// out0's peer takes the frames and drops them (no address, no
	// forwarding); a permanent neighbour entry spares ARP.
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "out0"}, PeerName: "sink0"}
	if err := netlink.LinkAdd(v); err != nil {
		b.Fatal(err)
	}
	a, _ := netlink.ParseAddr("198.18.2.1/24")
	if err := netlink.AddrAdd(v, a); err != nil {
		b.Fatal(err)
	}
	peer, err := netlink.LinkByName("sink0")
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range []netlink.Link{v, peer} {
		if err := netlink.LinkSetUp(l); err != nil {
			b.Fatal(err)
		}
	}
	out, err := netlink.LinkByName("out0")
	if err != nil {
		b.Fatal(err)
	}
	if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: out.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: netip.MustParseAddr("198.18.2.2").AsSlice(), HardwareAddr: peer.Attrs().HardwareAddr}); err != nil {
		b.Fatal(err)
	}
	raw, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(raw)

	const flows = 1000
	w := &worker{log: zap.NewNop(), flows: map[netip.AddrPort]*flowState{}, relays: &relaySet{}}
	relay := netip.MustParseAddr("198.18.1.1")
	for i := range flows {
		m := netip.AddrPortFrom(relay, uint16(30000+2*i))
		w.flows[m] = &flowState{flow: dataplane.Flow{Match: m, SendFrom: netip.AddrPortFrom(relay, uint16(40000+2*i)),
			SendTo: netip.AddrPortFrom(netip.MustParseAddr("198.18.2.2"), uint16(5000+2*i)), ClockRate: 8000}}
	}
	rx := newRxBatch()
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	seq := uint16(0)
	fill := func(k int) {
		for i := range batchSize {
			f := (k*batchSize + i) % flows
			fillRx(rx, i, rtpPayload(uint32(f), seq, uint32(seq)*160), src, netip.AddrPortFrom(relay, uint16(30000+2*f)), int64(seq)*20e6)
		}
		seq++
	}
	tx := newTxBatch(raw, false)
	fill(0)
	w.relayBatch(rx, batchSize, tx, nil)
	if got := w.counters[vSend].Load(); got != batchSize || w.sendFailed.Load() != 0 {
		b.Fatalf("%d packets relayed, %d sends failed; want %d and 0", got, w.sendFailed.Load(), batchSize)
	}
	b.ResetTimer()
	for k := range b.N {
		b.StopTimer()
		fill(k + 1)
		b.StartTimer()
		w.relayBatch(rx, batchSize, tx, nil)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batchSize), "ns/pkt")
	if w.sendFailed.Load() != 0 {
		b.Fatalf("%d sends failed", w.sendFailed.Load())
	}
}
