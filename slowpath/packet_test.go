package slowpath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/pktio"
	"github.com/relayd/relayd/rtp"
)

func rtpPayload(ssrc uint32, seq uint16, ts uint32) []byte {
	b := make([]byte, 172)
	b[0] = 0x80
	binary.BigEndian.PutUint16(b[2:], seq)
	binary.BigEndian.PutUint32(b[4:], ts)
	binary.BigEndian.PutUint32(b[8:], ssrc)
	for i := 12; i < len(b); i++ {
		b[i] = byte(i * 3)
	}
	return b
}

// checkPacket validates an IP packet built by process from scratch.
func checkPacket(t *testing.T, pkt []byte, from, to netip.AddrPort, payload []byte) {
	t.Helper()
	var src, dst netip.Addr
	var udp []byte
	if to.Addr().Is4() {
		if pkt[0] != 0x45 || int(binary.BigEndian.Uint16(pkt[2:])) != len(pkt) || pkt[9] != 17 || pkt[8] != defaultTTL {
			t.Fatalf("bad IPv4 header % x", pkt[:20])
		}
		src, dst = netip.AddrFrom4([4]byte(pkt[12:16])), netip.AddrFrom4([4]byte(pkt[16:20]))
		udp = pkt[20:]
	} else {
		if pkt[0]>>4 != 6 || int(binary.BigEndian.Uint16(pkt[4:])) != len(pkt)-40 || pkt[6] != 17 || pkt[7] != defaultTTL {
			t.Fatalf("bad IPv6 header % x", pkt[:40])
		}
		src, dst = netip.AddrFrom16([16]byte(pkt[8:24])), netip.AddrFrom16([16]byte(pkt[24:40]))
		udp = pkt[40:]
	}
	if got := netip.AddrPortFrom(src, binary.BigEndian.Uint16(udp)); got != from {
		t.Errorf("source %s, want %s", got, from)
	}
	if got := netip.AddrPortFrom(dst, binary.BigEndian.Uint16(udp[2:])); got != to {
		t.Errorf("destination %s, want %s", got, to)
	}
	if int(binary.BigEndian.Uint16(udp[4:])) != len(udp) {
		t.Errorf("UDP length %d, want %d", binary.BigEndian.Uint16(udp[4:]), len(udp))
	}
	// From scratch: the sum over pseudo-header and segment, checksum
	// included, folds to 0xffff.
	var sum uint32
	for _, b := range [][]byte{src.AsSlice(), dst.AsSlice(), udp} {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	sum += 17 + uint32(len(udp))
	if pktio.Fold(uint64(sum)) != 0xffff {
		t.Errorf("bad UDP checksum %#04x", binary.BigEndian.Uint16(udp[6:]))
	}
	if string(udp[8:]) != string(payload) {
		t.Error("payload changed")
	}
}

func TestProcess(t *testing.T) {
	m4 := netip.MustParseAddrPort("198.18.1.1:30000")
	f4 := netip.MustParseAddrPort("198.18.1.1:30002")
	callee4 := netip.MustParseAddrPort("198.18.2.2:5000")
	caller4 := netip.MustParseAddrPort("198.18.0.2:4000")
	m6 := netip.MustParseAddrPort("[2001:2:0:1::1]:30000")
	f6 := netip.MustParseAddrPort("[2001:2:0:1::1]:30002")
	callee6 := netip.MustParseAddrPort("[2001:2:0:2::2]:5000")
	caller6 := netip.MustParseAddrPort("[2001:2::2]:4000")
	payload := rtpPayload(7, 100, 16000)
	for _, tc := range []struct {
		name     string
		flow     dataplane.Flow
		src      netip.AddrPort
		want     verdict
		from, to netip.AddrPort
	}{
		{"ipv4 forward", dataplane.Flow{Match: m4, SendFrom: f4, SendTo: callee4, ClockRate: 8000}, caller4, vSend, f4, callee4},
		{"ipv6 forward", dataplane.Flow{Match: m6, SendFrom: f6, SendTo: callee6, ClockRate: 8000}, caller6, vSend, f6, callee6},
		{"ipv4 reflect", dataplane.Flow{Match: m4, Action: dataplane.Reflect}, caller4, vSend, m4, caller4},
		{"ipv6 reflect", dataplane.Flow{Match: m6, Action: dataplane.Reflect}, caller6, vSend, m6, caller6},
		{"ipv4 in, ipv6 out", dataplane.Flow{Match: m4, SendFrom: f6, SendTo: callee6, ClockRate: 8000}, caller4, vSend, f6, callee6},
		{"expected source", dataplane.Flow{Match: m4, ExpectSource: caller4, SendFrom: f4, SendTo: callee4}, caller4, vSend, f4, callee4},
		{"wrong source port", dataplane.Flow{Match: m4, ExpectSource: caller4, SendFrom: f4, SendTo: callee4}, netip.AddrPortFrom(caller4.Addr(), 4001), vDropSource, netip.AddrPort{}, netip.AddrPort{}},
		{"wrong source address any port", dataplane.Flow{Match: m4, ExpectSource: netip.AddrPortFrom(caller4.Addr(), 0), SendFrom: f4, SendTo: callee4}, netip.MustParseAddrPort("198.18.0.3:4000"), vDropSource, netip.AddrPort{}, netip.AddrPort{}},
		{"drop", dataplane.Flow{Match: m4, Action: dataplane.Drop}, caller4, vDropFlow, netip.AddrPort{}, netip.AddrPort{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := &flowState{flow: tc.flow}
			out := make([]byte, maxPacket)
			n, to, v := fs.process(out, payload, tc.src, 1e9)
			if v != tc.want {
				t.Fatalf("verdict %s, want %s", verdictNames[v], verdictNames[tc.want])
			}
			st := fs.stats()
			if v != vSend {
				if st.Dropped != 1 || st.Packets != 0 {
					t.Errorf("stats %+v, want 1 dropped", st)
				}
				return
			}
			if to != tc.to {
				t.Errorf("sent to %s, want %s", to, tc.to)
			}
			checkPacket(t, out[:n], tc.from, tc.to, payload)
			if st.Packets != 1 || st.Dropped != 0 || st.LastSeen.UnixNano() != 1e9 {
				t.Errorf("stats %+v", st)
			}
			if tc.flow.ClockRate != 0 && (st.SSRC != 7 || st.Received != 1) {
				t.Errorf("RTP stats %+v", st)
			}
		})
	}
}

// TestProcessRTPStats checks the userspace statistics are rtp.ReceiverStats
// fed with arrival times the way the XDP program computes them.
func TestProcessRTPStats(t *testing.T) {
	fs := &flowState{flow: dataplane.Flow{
		Match: netip.MustParseAddrPort("198.18.1.1:30000"), SendFrom: netip.MustParseAddrPort("198.18.1.1:30002"),
		SendTo: netip.MustParseAddrPort("198.18.2.2:5000"), ClockRate: 8000,
	}}
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	var ref rtp.ReceiverStats
	out := make([]byte, maxPacket)
	base := int64(1_700_000_000_000_000_000)
	seqs := []uint16{1, 2, 4, 3, 3, 5, 9, 10}
	for i, seq := range seqs {
		now := base + int64(i)*20_000_000 + int64(i%3)*1_300_000
		ts := uint32(seq) * 160
		if _, _, v := fs.process(out, rtpPayload(42, seq, ts), src, now); v != vSend {
			t.Fatal(verdictNames[v])
		}
		ref.Update(42, seq, ts, dataplane.ArrivalTicks(uint64(now-base), dataplane.TicksMult(8000)))
	}
	st := fs.stats()
	if st.Received != ref.Received || st.Lost != ref.Lost() || st.Jitter != ref.Jitter() || st.ExtHighestSeq != ref.ExtendedMax() {
		t.Errorf("stats %+v, reference received %d lost %d jitter %d", st, ref.Received, ref.Lost(), ref.Jitter())
	}
	// 1..10 expected, 8 received counting the duplicate 3: 2 lost.
	if st.Lost != 2 || st.Received != 8 {
		t.Errorf("lost %d received %d, want 2 and 8", st.Lost, st.Received)
	}
}

func TestProcessAllocs(t *testing.T) {
	fs := &flowState{flow: dataplane.Flow{
		Match: netip.MustParseAddrPort("198.18.1.1:30000"), SendFrom: netip.MustParseAddrPort("198.18.1.1:30002"),
		SendTo: netip.MustParseAddrPort("198.18.2.2:5000"), ClockRate: 8000,
	}}
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	out := make([]byte, maxPacket)
	payload := rtpPayload(1, 1, 160)
	now := int64(1e9)
	allocs := testing.AllocsPerRun(1000, func() {
		now += 20e6
		binary.BigEndian.PutUint16(payload[2:], binary.BigEndian.Uint16(payload[2:])+1)
		fs.process(out, payload, src, now)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per packet, want 0", allocs)
	}
}

func BenchmarkProcess(b *testing.B) {
	fs := &flowState{flow: dataplane.Flow{
		Match: netip.MustParseAddrPort("198.18.1.1:30000"), SendFrom: netip.MustParseAddrPort("198.18.1.1:30002"),
		SendTo: netip.MustParseAddrPort("198.18.2.2:5000"), ClockRate: 8000,
	}}
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	out := make([]byte, maxPacket)
	payload := rtpPayload(1, 1, 160)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	now := int64(1e9)
	for range b.N {
		now += 20e6
		fs.process(out, payload, src, now)
	}
}
