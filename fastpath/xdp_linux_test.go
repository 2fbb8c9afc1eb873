package fastpath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
	"github.com/google/go-cmp/cmp"

	"github.com/relayd/relayd/dataplane"
)

const (
	xdpAborted  = 0
	xdpDrop     = 1
	xdpPass     = 2
	xdpTx       = 3
	xdpRedirect = 4
)

var verdictName = map[uint32]string{0: "ABORTED", 1: "DROP", 2: "PASS", 3: "TX", 4: "REDIRECT"}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// TestCounterNames checks that counterInfo names the C enum relay_counter
// in order, and that the Go action values match enum flow_action.
func TestCounterNames(t *testing.T) {
	spec, err := loadRelay()
	if err != nil {
		t.Fatal(err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("relay_counter", &enum); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range enum.Values {
		if v.Name != "COUNTER_MAX" {
			got = append(got, v.Name)
		}
	}
	var want []string
	for _, ci := range counterInfo {
		want = append(want, "COUNTER_"+strings.ToUpper(ci.Verdict+"_"+ci.Reason))
	}
	if d := cmp.Diff(got, want); d != "" {
		t.Errorf("counterInfo does not match enum relay_counter (-C +Go):\n%s", d)
	}

	var actions *btf.Enum
	if err := spec.Types.TypeByName("flow_action", &actions); err != nil {
		t.Fatal(err)
	}
	for _, v := range actions.Values {
		if v.Name == "FLOW_ACTION_MAX" {
			continue
		}
		name := strings.ToLower(strings.TrimPrefix(v.Name, "FLOW_"))
		if a := dataplane.Action(v.Value); a.String() != name {
			t.Errorf("C %s = %d, Go action %d is %q", v.Name, v.Value, v.Value, a)
		}
	}
}

func TestXDPForward(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct {
		name      string
		flow      dataplane.Flow
		from      netip.AddrPort
		opts      frameOpts
		verdict   uint32
		counter   string
		wantSrc   netip.AddrPort
		wantDst   netip.AddrPort
		wantMAC   []byte // source MAC after rewrite
		wantZeroC bool
	}{
		{
			name:    "ipv4 redirect",
			flow:    dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000},
			from:    ap(caller4, 4000),
			verdict: xdpRedirect, counter: "forward/redirect",
			wantSrc: ap(relay4, 30002), wantDst: ap(callee4, 5000), wantMAC: e.outMAC,
		},
		{
			name:    "ipv6 redirect",
			flow:    dataplane.Flow{Match: ap(relay6, 30000), SendFrom: ap(relay6, 30002), SendTo: ap(callee6, 5000), ClockRate: 8000},
			from:    ap(caller6, 4000),
			verdict: xdpRedirect, counter: "forward/redirect",
			wantSrc: ap(relay6, 30002), wantDst: ap(callee6, 5000), wantMAC: e.outMAC,
		},
		{
			name:    "ipv4 tx back out of the ingress device",
			flow:    dataplane.Flow{Match: ap(relay4, 30004), SendFrom: ap(relay4, 30006), SendTo: ap(near4, 7000), ClockRate: 8000},
			from:    ap(caller4, 4000),
			verdict: xdpTx, counter: "forward/tx",
			wantSrc: ap(relay4, 30006), wantDst: ap(near4, 7000), wantMAC: e.inMAC,
		},
		{
			name:    "ipv4 zero checksum stays zero",
			flow:    dataplane.Flow{Match: ap(relay4, 30008), SendFrom: ap(relay4, 30010), SendTo: ap(callee4, 5002), ClockRate: 8000},
			from:    ap(caller4, 4002),
			opts:    frameOpts{zeroCsum: true},
			verdict: xdpRedirect, counter: "forward/redirect",
			wantSrc: ap(relay4, 30010), wantDst: ap(callee4, 5002), wantMAC: e.outMAC, wantZeroC: true,
		},
		{
			name:    "ipv4 reflect",
			flow:    dataplane.Flow{Match: ap(relay4, 30012), Action: dataplane.Reflect},
			from:    ap(caller4, 4004),
			verdict: xdpTx, counter: "forward/reflect",
			wantSrc: ap(relay4, 30012), wantDst: ap(caller4, 4004), wantMAC: e.inMAC,
		},
		{
			name:    "ipv6 reflect",
			flow:    dataplane.Flow{Match: ap(relay6, 30012), Action: dataplane.Reflect},
			from:    ap(caller6, 4004),
			verdict: xdpTx, counter: "forward/reflect",
			wantSrc: ap(relay6, 30012), wantDst: ap(caller6, 4004), wantMAC: e.inMAC,
		},
		{
			name:    "ipv4 rtcp flow without clock rate",
			flow:    dataplane.Flow{Match: ap(relay4, 30001), SendFrom: ap(relay4, 30003), SendTo: ap(callee4, 5001)},
			from:    ap(caller4, 4001),
			verdict: xdpRedirect, counter: "forward/redirect",
			wantSrc: ap(relay4, 30003), wantDst: ap(callee4, 5001), wantMAC: e.outMAC,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := e.fp.Install(tc.flow); err != nil {
				t.Fatal(err)
			}
			payload := rtpPacket(0x11223344, 100, 16000, 160)
			in := buildFrame(tc.from, tc.flow.Match, payload, tc.opts)
			before := e.counters(t)
			verdict, out := e.run(t, in)
			if verdict != tc.verdict {
				t.Fatalf("verdict %s, want %s", verdictName[verdict], verdictName[tc.verdict])
			}
			p, err := parseFrame(out)
			if err != nil {
				t.Fatalf("output frame invalid: %v", err)
			}
			if p.src != tc.wantSrc || p.dst != tc.wantDst {
				t.Errorf("rewritten %s -> %s, want %s -> %s", p.src, p.dst, tc.wantSrc, tc.wantDst)
			}
			if p.ttl != 63 {
				t.Errorf("TTL %d, want 63", p.ttl)
			}
			if !bytes.Equal(p.payload, payload) {
				t.Error("payload changed")
			}
			if !bytes.Equal(p.dstMAC[:], e.neighMAC) || !bytes.Equal(p.srcMAC[:], tc.wantMAC) {
				t.Errorf("MACs %x -> %x, want %x -> %x", p.srcMAC, p.dstMAC, tc.wantMAC, e.neighMAC)
			}
			if (p.udpCsum == 0) != tc.wantZeroC {
				t.Errorf("UDP checksum %#04x, want zero: %v", p.udpCsum, tc.wantZeroC)
			}
			after := e.counters(t)
			assertOnlyCounter(t, before, after, tc.counter)
			st, err := e.fp.Stats(tc.flow.Match)
			if err != nil {
				t.Fatal(err)
			}
			if st.Packets != 1 || st.Bytes != uint64(len(in)-14) || st.LastSeen.IsZero() {
				t.Errorf("flow stats %+v, want 1 packet of %d bytes", st, len(in)-14)
			}
			if tc.flow.ClockRate != 0 && (st.SSRC != 0x11223344 || st.Received != 1) {
				t.Errorf("RTP stats %+v, want ssrc 0x11223344 and 1 received", st)
			}
			if tc.flow.ClockRate == 0 && st.Received != 0 {
				t.Errorf("RTP stats on a flow without clock rate: %+v", st)
			}
		})
	}
}

func assertOnlyCounter(t *testing.T, before, after map[string]uint64, name string) {
	t.Helper()
	for k, v := range after {
		want := before[k]
		if k == name {
			want++
		}
		if v != want {
			t.Errorf("counter %s: %d -> %d, want %d", k, before[k], v, want)
		}
	}
	if _, ok := after[name]; !ok {
		t.Errorf("no counter %s", name)
	}
}

// TestXDPComputedZeroChecksum sends an IPv4 packet whose rewritten UDP
// checksum computes to zero: it must go out as 0xffff (RFC 768), for IPv6
// too.
func TestXDPComputedZeroChecksum(t *testing.T) {
	e := newTestEnv(t)
	for _, v6 := range []bool{false, true} {
		var fl dataplane.Flow
		from := ap(caller4, 4000)
		if v6 {
			fl = dataplane.Flow{Match: ap(relay6, 31000), SendFrom: ap(relay6, 31002), SendTo: ap(callee6, 6000), ClockRate: 8000}
			from = ap(caller6, 4000)
		} else {
			fl = dataplane.Flow{Match: ap(relay4, 31000), SendFrom: ap(relay4, 31002), SendTo: ap(callee4, 6000), ClockRate: 8000}
		}
		if err := e.fp.Install(fl); err != nil {
			t.Fatal(err)
		}
		// Choose the last two payload bytes so that the checksum of the
		// rewritten segment is zero before the 0 -> 0xffff rule.
		payload := rtpPacket(1, 1, 1, 20)
		found := false
		for x := 0; x < 1<<16 && !found; x++ {
			binary.BigEndian.PutUint16(payload[len(payload)-2:], uint16(x))
			seg := make([]byte, 8+len(payload))
			binary.BigEndian.PutUint16(seg[0:], fl.SendFrom.Port())
			binary.BigEndian.PutUint16(seg[2:], fl.SendTo.Port())
			binary.BigEndian.PutUint16(seg[4:], uint16(len(seg)))
			copy(seg[8:], payload)
			var sum uint32
			sum = csumAdd(sum, fl.SendFrom.Addr().AsSlice())
			sum = csumAdd(sum, fl.SendTo.Addr().AsSlice())
			sum += 17 + uint32(len(seg))
			sum = csumAdd(sum, seg)
			found = ^csumFold(sum) == 0
		}
		if !found {
			t.Fatal("no payload gives a zero checksum")
		}
		verdict, out := e.run(t, buildFrame(from, fl.Match, payload, frameOpts{}))
		if verdict != xdpRedirect {
			t.Fatalf("verdict %s", verdictName[verdict])
		}
		p, err := parseFrame(out)
		if err != nil {
			t.Fatal(err)
		}
		if p.udpCsum != 0xffff {
			t.Errorf("v6=%v: UDP checksum %#04x, want 0xffff", v6, p.udpCsum)
		}
	}
}

func TestXDPPuntAndDrop(t *testing.T) {
	e := newTestEnv(t)
	flows := []dataplane.Flow{
		{Match: ap(relay4, 32000), SendFrom: ap(relay4, 32002), SendTo: ap(callee4, 5000), ClockRate: 8000},
		{Match: ap(relay6, 32000), SendFrom: ap(relay6, 32002), SendTo: ap(callee6, 5000), ClockRate: 8000},
		{Match: ap(relay4, 32004), SendFrom: ap(relay4, 32006), SendTo: ap(callee4, 5000), Action: dataplane.Userspace},
		{Match: ap(relay4, 32008), SendFrom: ap(relay4, 32010), SendTo: ap(unres4, 5000), ClockRate: 8000},
		{Match: ap(relay4, 32012), SendFrom: ap(relay4, 32014), SendTo: ap(noroute4, 5000), ClockRate: 8000},
		{Match: ap(relay4, 32016), SendFrom: ap(relay4, 32018), SendTo: ap(nox4, 5000), ClockRate: 8000},
		{Match: ap(relay4, 32020), SendFrom: ap(relay6, 32022), SendTo: ap(callee6, 5000), ClockRate: 8000},
		{Match: ap(relay4, 32024), ExpectSource: ap(caller4, 4000), SendFrom: ap(relay4, 32026), SendTo: ap(callee4, 5000), ClockRate: 8000},
		{Match: ap(relay4, 32028), ExpectSource: ap(caller4, 0), SendFrom: ap(relay4, 32030), SendTo: ap(callee4, 5000), ClockRate: 8000},
		{Match: ap(relay4, 32032), Action: dataplane.Drop},
		{Match: ap(relay6, 32024), ExpectSource: ap(caller6, 4000), SendFrom: ap(relay6, 32026), SendTo: ap(callee6, 5000), ClockRate: 8000},
		// Loops: toward its own match, toward another flow's match.
		{Match: ap(relay4, 32036), SendFrom: ap(relay4, 32038), SendTo: ap(relay4, 32036), ClockRate: 8000},
		{Match: ap(relay4, 32040), SendFrom: ap(relay4, 32042), SendTo: ap(relay4, 32000), ClockRate: 8000},
		{Match: ap(relay6, 32040), SendFrom: ap(relay6, 32042), SendTo: ap(relay6, 32000), ClockRate: 8000},
		{Match: ap(relay4, 32044), Action: dataplane.Reflect},
		// A relay address, but no flow's match: the kernel's to deliver.
		{Match: ap(relay4, 32048), SendFrom: ap(relay4, 32050), SendTo: ap(relay4, 39998), ClockRate: 8000},
	}
	for _, fl := range flows {
		if err := e.fp.Install(fl); err != nil {
			t.Fatal(err)
		}
	}
	rtp := rtpPacket(7, 1, 160, 160)
	big := rtpPacket(7, 1, 160, 1400)
	stun := append([]byte{0x00, 0x01, 0x00, 0x00, 0x21, 0x12, 0xa4, 0x42}, make([]byte, 12)...)
	dtls := append([]byte{22, 0xfe, 0xfd}, make([]byte, 20)...)
	v4 := func(from netip.AddrPort, port uint16, payload []byte, o frameOpts) []byte {
		return buildFrame(from, ap(relay4, port), payload, o)
	}
	corrupt := func(f []byte, off int) []byte { f[off] ^= 0xff; return f }
	arp := append(make([]byte, 12), 0x08, 0x06)
	arp = append(arp, make([]byte, 28)...)

	for _, tc := range []struct {
		name    string
		frame   []byte
		verdict uint32
		counter string
		dropped netip.AddrPort // flow whose dropped counter must rise
	}{
		{"no flow", v4(ap(caller4, 4000), 40000, rtp, frameOpts{}), xdpPass, "pass/no_flow", netip.AddrPort{}},
		{"userspace flow", v4(ap(caller4, 4000), 32004, rtp, frameOpts{}), xdpPass, "punt/userspace", netip.AddrPort{}},
		{"vlan", v4(ap(caller4, 4000), 32000, rtp, frameOpts{vlan: true}), xdpPass, "punt/vlan", netip.AddrPort{}},
		{"ip options", v4(ap(caller4, 4000), 32000, rtp, frameOpts{ipOptions: true}), xdpPass, "punt/ip_options", netip.AddrPort{}},
		{"more fragments", v4(ap(caller4, 4000), 32000, rtp, frameOpts{fragOff: 0x2000}), xdpPass, "punt/fragment", netip.AddrPort{}},
		{"fragment offset", v4(ap(caller4, 4000), 32000, rtp, frameOpts{fragOff: 0x0010}), xdpPass, "punt/fragment", netip.AddrPort{}},
		{"ipv6 fragment header", buildFrame(ap(caller6, 4000), ap(relay6, 32000), rtp, frameOpts{ipv6Ext: 44, hasExt: true}), xdpPass, "punt/fragment", netip.AddrPort{}},
		{"ipv6 hop-by-hop", buildFrame(ap(caller6, 4000), ap(relay6, 32000), rtp, frameOpts{ipv6Ext: 0, hasExt: true}), xdpPass, "punt/ipv6_ext", netip.AddrPort{}},
		{"ipv6 destination options", buildFrame(ap(caller6, 4000), ap(relay6, 32000), rtp, frameOpts{ipv6Ext: 60, hasExt: true}), xdpPass, "punt/ipv6_ext", netip.AddrPort{}},
		{"ipv6 hop-by-hop then icmpv6 (MLD)", func() []byte {
			f := buildFrame(ap(caller6, 4000), ap(relay6, 32000), rtp, frameOpts{ipv6Ext: 0, hasExt: true})
			f[14+40] = 58
			return f
		}(), xdpPass, "pass/not_udp", netip.AddrPort{}},
		{"ipv6 truncated extension header", buildFrame(ap(caller6, 4000), ap(relay6, 32000), nil, frameOpts{ipv6Ext: 60, hasExt: true})[:14+40+4], xdpPass, "pass/malformed", netip.AddrPort{}},
		{"stun", v4(ap(caller4, 4000), 32000, stun, frameOpts{}), xdpPass, "punt/not_rtp", netip.AddrPort{}},
		{"dtls", v4(ap(caller4, 4000), 32000, dtls, frameOpts{}), xdpPass, "punt/not_rtp", netip.AddrPort{}},
		{"empty payload", v4(ap(caller4, 4000), 32000, nil, frameOpts{}), xdpPass, "punt/not_rtp", netip.AddrPort{}},
		{"ttl 1", v4(ap(caller4, 4000), 32000, rtp, frameOpts{ttl: 1}), xdpPass, "punt/ttl", netip.AddrPort{}},
		{"hop limit 1", buildFrame(ap(caller6, 4000), ap(relay6, 32000), rtp, frameOpts{ttl: 1}), xdpPass, "punt/ttl", netip.AddrPort{}},
		{"over mtu", v4(ap(caller4, 4000), 32000, big, frameOpts{}), xdpPass, "punt/over_mtu", netip.AddrPort{}},
		{"unresolved neighbour", v4(ap(caller4, 4000), 32008, rtp, frameOpts{}), xdpPass, "punt/fib_no_neigh", netip.AddrPort{}},
		{"no route", v4(ap(caller4, 4000), 32012, rtp, frameOpts{}), xdpPass, "punt/fib_other", netip.AddrPort{}},
		{"egress not in devmap", v4(ap(caller4, 4000), 32016, rtp, frameOpts{}), xdpPass, "punt/no_egress", netip.AddrPort{}},
		{"family change", v4(ap(caller4, 4000), 32020, rtp, frameOpts{}), xdpPass, "punt/family", netip.AddrPort{}},
		{"wrong source port", v4(ap(caller4, 4001), 32024, rtp, frameOpts{}), xdpDrop, "drop/wrong_source", ap(relay4, 32024)},
		{"wrong source address", v4(ap(near4, 4000), 32024, rtp, frameOpts{}), xdpDrop, "drop/wrong_source", ap(relay4, 32024)},
		{"wrong source address any port", v4(ap(near4, 4000), 32028, rtp, frameOpts{}), xdpDrop, "drop/wrong_source", ap(relay4, 32028)},
		{"ipv6 wrong source", buildFrame(ap(caller6, 4009), ap(relay6, 32024), rtp, frameOpts{}), xdpDrop, "drop/wrong_source", ap(relay6, 32024)},
		{"drop action", v4(ap(caller4, 4000), 32032, rtp, frameOpts{}), xdpDrop, "drop/flow", ap(relay4, 32032)},
		{"loop to its own match", v4(ap(caller4, 4000), 32036, rtp, frameOpts{}), xdpDrop, "drop/loop", ap(relay4, 32036)},
		{"loop to another flow", v4(ap(caller4, 4000), 32040, rtp, frameOpts{}), xdpDrop, "drop/loop", ap(relay4, 32040)},
		{"ipv6 loop to another flow", buildFrame(ap(caller6, 4000), ap(relay6, 32040), rtp, frameOpts{}), xdpDrop, "drop/loop", ap(relay6, 32040)},
		{"reflect to a flow's match", v4(ap(relay4, 32000), 32044, rtp, frameOpts{}), xdpDrop, "drop/loop", ap(relay4, 32044)},
		{"relay address without a flow", v4(ap(caller4, 4000), 32048, rtp, frameOpts{}), xdpPass, "punt/fib_other", netip.AddrPort{}},
		{"bad ip checksum", corrupt(v4(ap(caller4, 4000), 32000, rtp, frameOpts{}), 14+10), xdpPass, "pass/malformed", netip.AddrPort{}},
		{"truncated ip", v4(ap(caller4, 4000), 32000, rtp, frameOpts{})[:30], xdpPass, "pass/malformed", netip.AddrPort{}},
		{"ip total length beyond frame", v4(ap(caller4, 4000), 32000, rtp, frameOpts{})[:100], xdpPass, "pass/malformed", netip.AddrPort{}},
		{"udp length mismatch", corrupt(v4(ap(caller4, 4000), 32000, rtp, frameOpts{}), 14+20+5), xdpPass, "pass/malformed", netip.AddrPort{}},
		{"ipv6 zero udp checksum", func() []byte {
			f := buildFrame(ap(caller6, 4000), ap(relay6, 32000), rtp, frameOpts{})
			f[14+40+6], f[14+40+7] = 0, 0
			return f
		}(), xdpPass, "pass/malformed", netip.AddrPort{}},
		{"arp", arp, xdpPass, "pass/not_ip", netip.AddrPort{}},
		{"tcp", func() []byte {
			f := v4(ap(caller4, 4000), 32000, rtp, frameOpts{})
			f[14+9] = 6
			return f
		}(), xdpPass, "pass/not_udp", netip.AddrPort{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var droppedBefore uint64
			if tc.dropped.IsValid() {
				st, err := e.fp.Stats(tc.dropped)
				if err != nil {
					t.Fatal(err)
				}
				droppedBefore = st.Dropped
			}
			in := append([]byte(nil), tc.frame...)
			before := e.counters(t)
			verdict, out := e.run(t, in)
			if verdict != tc.verdict {
				t.Fatalf("verdict %s, want %s", verdictName[verdict], verdictName[tc.verdict])
			}
			if verdict == xdpPass && !bytes.Equal(out, tc.frame) {
				t.Error("a passed frame was modified")
			}
			assertOnlyCounter(t, before, e.counters(t), tc.counter)
			if tc.dropped.IsValid() {
				st, err := e.fp.Stats(tc.dropped)
				if err != nil {
					t.Fatal(err)
				}
				if st.Dropped != droppedBefore+1 || st.Packets != 0 {
					t.Errorf("flow %s: dropped %d packets %d, want dropped %d and no packets", tc.dropped, st.Dropped, st.Packets, droppedBefore+1)
				}
			}
		})
	}
}

// TestXDPForwardingDisabled turns forwarding off on the ingress device:
// the fib lookup fails and packets are punted with their own reason.
func TestXDPForwardingDisabled(t *testing.T) {
	e := newTestEnv(t)
	fl := dataplane.Flow{Match: ap(relay4, 33000), SendFrom: ap(relay4, 33002), SendTo: ap(callee4, 5000), ClockRate: 8000}
	if err := e.fp.Install(fl); err != nil {
		t.Fatal(err)
	}
	set := func(v string) {
		if err := inNS(e.ns, func() error {
			return osWrite("/proc/sys/net/ipv4/conf/in0/forwarding", v)
		}); err != nil {
			t.Fatal(err)
		}
	}
	set("0")
	defer set("1")
	before := e.counters(t)
	frame := buildFrame(ap(caller4, 4000), fl.Match, rtpPacket(1, 1, 1, 160), frameOpts{})
	if v, _ := e.run(t, frame); v != xdpPass {
		t.Fatalf("verdict %s, want PASS", verdictName[v])
	}
	assertOnlyCounter(t, before, e.counters(t), "punt/fib_fwd_disabled")
}
