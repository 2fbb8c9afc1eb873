package cmmsg

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/internal/pktio"
	"github.com/relayd/relayd/lab"
)

func TestFlowLine(t *testing.T) {
	ap := netip.MustParseAddrPort
	f := Flow{Match: ap("198.18.1.1:30000"), From: ap("198.18.1.1:30001"), To: ap("198.18.2.2:5000")}
	if l, err := f.line(); err != nil || l != "198.18.1.1:30000 - 198.18.1.1:30001 198.18.2.2:5000\n" {
		t.Errorf("any source: %q, %v", l, err)
	}
	f.Source = ap("198.18.0.2:0")
	if l, err := f.line(); err != nil || l != "198.18.1.1:30000 198.18.0.2:0 198.18.1.1:30001 198.18.2.2:5000\n" {
		t.Errorf("source: %q, %v", l, err)
	}
	for _, bad := range []Flow{
		{Match: ap("[2001:2::1]:30000"), From: f.From, To: f.To},
		{Match: f.Match, From: f.From, To: ap("[2001:2::2]:5000")},
		{Match: f.Match, To: f.To},
	} {
		if _, err := bad.line(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// rawUDP opens a raw socket in ns that receives a copy of every UDP
// datagram delivered there, IP header included, whatever its checksum.
func rawUDP(t *testing.T, ns *lab.NS) int {
	t.Helper()
	fd := -1
	err := ns.Do(func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP); err != nil {
			return err
		}
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// checkPacket checks that pkt, an IPv4 packet as the callee received it,
// is payload sent from from to to with valid IP and UDP checksums.
func checkPacket(pkt []byte, from, to netip.AddrPort, payload []byte) error {
	if len(pkt) < 28 || pkt[0] != 0x45 {
		return fmt.Errorf("not a 20-byte-header IPv4 packet: % x", pkt[:min(len(pkt), 28)])
	}
	ip, udp := pkt[:20], pkt[20:]
	switch {
	case int(binary.BigEndian.Uint16(ip[2:])) != len(pkt):
		return fmt.Errorf("IP total length %d, packet %d bytes", binary.BigEndian.Uint16(ip[2:]), len(pkt))
	case ip[8] != 64 || ip[9] != unix.IPPROTO_UDP:
		return fmt.Errorf("TTL %d protocol %d, want 64 and UDP", ip[8], ip[9])
	case pktio.Fold(pktio.Sum(0, ip)) != 0xffff:
		return fmt.Errorf("bad IP header checksum %#04x", binary.BigEndian.Uint16(ip[10:]))
	case netip.AddrFrom4([4]byte(ip[12:16])) != from.Addr() || netip.AddrFrom4([4]byte(ip[16:20])) != to.Addr():
		return fmt.Errorf("IP %v -> %v, want %v -> %v", netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])), from.Addr(), to.Addr())
	case binary.BigEndian.Uint16(udp[0:]) != from.Port() || binary.BigEndian.Uint16(udp[2:]) != to.Port():
		return fmt.Errorf("UDP ports %d -> %d, want %d -> %d", binary.BigEndian.Uint16(udp[0:]), binary.BigEndian.Uint16(udp[2:]), from.Port(), to.Port())
	case int(binary.BigEndian.Uint16(udp[4:])) != len(udp):
		return fmt.Errorf("UDP length %d, datagram %d bytes", binary.BigEndian.Uint16(udp[4:]), len(udp))
	case !bytes.Equal(udp[8:], payload):
		return fmt.Errorf("payload of %d bytes, want the %d sent", len(udp)-8, len(payload))
	}
	// Over the pseudo header and the datagram a valid checksum sums to
	// 0xffff; 0 would mean none was computed.
	sum := pktio.Sum(0, ip[12:20]) + unix.IPPROTO_UDP + uint64(len(udp))
	if c := binary.BigEndian.Uint16(udp[6:]); c == 0 || pktio.Fold(pktio.Sum(sum, udp)) != 0xffff {
		return fmt.Errorf("bad UDP checksum %#04x", c)
	}
	return nil
}

// TestRelay runs the C relay in the lab's relay namespace with four flows
// and sends it datagrams of several sizes, odd ones too, from the caller:
// each must reach the callee rewritten to its flow's From and To with
// valid checksums, and those from a source other than the flow's must
// not. The relay's socket is bound to an ephemeral port: what reaches it
// was steered to it.
func TestRelay(t *testing.T) {
	l := lab.NewT(t)
	ap := netip.AddrPortFrom
	src := ap(l.CallerAddr4, 4000)
	var flows []Flow
	for i := range 4 {
		f := Flow{Match: ap(l.RelayMedia4, uint16(31000+i)), Source: src,
			From: ap(l.RelayMedia4, uint16(32000+i)), To: ap(l.CalleeAddr4, uint16(7000+i))}
		if i == 3 {
			f.Source = netip.AddrPort{} // any source
		}
		flows = append(flows, f)
	}
	r, err := Start(l.Relay, 0, flows)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "Cpus_allowed_list:\t0\n") {
		t.Errorf("the relay is not pinned to CPU 0:\n%s", status)
	}

	raw := rawUDP(t, l.Callee)
	for _, f := range flows {
		c, err := l.Callee.ListenUDP("udp4", f.To.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	dial := func(from netip.AddrPort) *net.UDPConn {
		c, err := l.Caller.ListenUDP("udp4", from.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	good, other := dial(src), dial(ap(l.CallerAddr4, 4001))

	type sent struct {
		flow    int
		payload []byte
	}
	var want []sent
	send := func(c *net.UDPConn, flow int, payload []byte) {
		t.Helper()
		if _, err := c.WriteToUDPAddrPort(payload, flows[flow].Match); err != nil {
			t.Fatal(err)
		}
	}
	for i, size := range []int{1, 2, 12, 171, 172, 1400} {
		for fl := range flows {
			p := bytes.Repeat([]byte{byte(0x80 + i), byte(fl)}, (size+1)/2)[:size]
			send(good, fl, p)
			want = append(want, sent{fl, p})
		}
	}
	send(other, 0, []byte("from the wrong source"))
	anyPayload := []byte("from any source")
	send(other, 3, anyPayload)
	want = append(want, sent{3, anyPayload})

	// Per flow, packets arrive in the order they were sent.
	next := map[int]int{} // flow -> index in want of its next packet
	byFlow := map[int][]sent{}
	for _, w := range want {
		byFlow[w.flow] = append(byFlow[w.flow], w)
	}
	buf := make([]byte, 2048)
	got := 0
	for got < len(want) {
		n, _, err := unix.Recvfrom(raw, buf, 0)
		if err != nil {
			t.Fatalf("received %d of %d packets: %v", got, len(want), err)
		}
		pkt := buf[:n]
		if n < 28 || netip.AddrFrom4([4]byte(pkt[12:16])) != l.RelayMedia4 {
			continue // not the relay's
		}
		fl := int(binary.BigEndian.Uint16(pkt[20:])) - 32000
		if fl < 0 || fl >= len(flows) {
			t.Fatalf("a packet from port %d: no flow's", fl+32000)
		}
		if next[fl] >= len(byFlow[fl]) {
			t.Fatalf("flow %d: more packets than sent", fl)
		}
		w := byFlow[fl][next[fl]]
		next[fl]++
		if err := checkPacket(pkt, flows[fl].From, flows[fl].To, w.payload); err != nil {
			t.Errorf("flow %d, packet %d: %v", fl, next[fl], err)
		}
		got++
	}
	// Nothing more comes: the wrong source's datagram was dropped.
	unix.SetsockoptTimeval(raw, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000})
	for {
		n, _, err := unix.Recvfrom(raw, buf, 0)
		if err != nil {
			break
		}
		if n >= 28 && netip.AddrFrom4([4]byte(buf[12:16])) == l.RelayMedia4 {
			t.Errorf("an unexpected packet from the relay: % x", buf[:n])
		}
	}
	deadline := time.Now().Add(time.Second)
	var c Counters
	for {
		c = r.Counters()
		if c.Received == uint64(len(want)+1) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c.Received != uint64(len(want)+1) || c.Forwarded != uint64(len(want)) || c.WrongSource != 1 || c.Dropped() != 1 || c.Batches == 0 {
		t.Errorf("counters %+v: want %d received, %d forwarded, 1 from a wrong source", c, len(want)+1, len(want))
	}
}
