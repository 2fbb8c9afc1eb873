package xdpsink

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/relayd/relayd/internal/testenv"
)

const (
	xdpDrop = 1
	xdpPass = 2
)

// frame is an Ethernet+IPv4+UDP frame to port with an RTP header of ssrc
// and payload bytes after it.
func frame(port uint16, ssrc uint32, payload int) []byte {
	b := make([]byte, 14+20+8+12+payload)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	copy(ip[12:], []byte{198, 18, 0, 2, 198, 18, 64, 1})
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:], 4000)
	binary.BigEndian.PutUint16(udp[2:], port)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	rtp := udp[8:]
	rtp[0] = 0x80
	binary.BigEndian.PutUint32(rtp[8:], ssrc)
	return b
}

// TestSinkCounts runs the program on frames (BPF_PROG_TEST_RUN): RTP to
// either sink port is counted per stream and per run and dropped; a short
// datagram to a sink port is dropped and counted in the total only;
// everything else passes and is not counted.
func TestSinkCounts(t *testing.T) {
	testenv.NeedRoot(t)
	s, err := Load(5000, 4000)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	run := func(name string, data []byte, want uint32) {
		t.Helper()
		ret, err := s.Program().Run(&ebpf.RunOptions{Data: data})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if ret != want {
			t.Errorf("%s: action %d, want %d", name, ret, want)
		}
	}
	for range 3 {
		run("stream 7 run 2", frame(5000, 2<<16|7, 160), xdpDrop)
	}
	run("stream 9 run 2 to the other port", frame(4000, 2<<16|9, 160), xdpDrop)
	run("stream 7 run 5", frame(5000, 0xab000000|5<<16|7, 0), xdpDrop) // bits 24-31 are ignored
	run("stream 65535 run 255", frame(5000, 0xffffffff, 10), xdpDrop)
	short := frame(5000, 0, 0)[:14+20+8+11]
	binary.BigEndian.PutUint16(short[14+2:], 20+8+11)
	binary.BigEndian.PutUint16(short[14+20+4:], 8+11)
	run("short datagram", short, xdpDrop)

	run("other port", frame(5060, 2<<16|1, 160), xdpPass)
	arp := frame(5000, 2<<16|1, 160)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	run("ARP", arp, xdpPass)
	frag := frame(5000, 2<<16|1, 160)
	frag[14+6] = 0x20 // more fragments
	run("fragment", frag, xdpPass)
	opts := frame(5000, 2<<16|1, 160)
	opts[14] = 0x46
	run("IP options", opts, xdpPass)
	tcp := frame(5000, 2<<16|1, 160)
	tcp[14+9] = 6
	run("TCP", tcp, xdpPass)
	run("truncated UDP header", frame(5000, 2<<16|1, 0)[:14+20+4], xdpPass)

	counts := make([]uint64, Streams)
	if err := s.Streams(counts); err != nil {
		t.Fatal(err)
	}
	want := map[int]uint64{7: 4, 9: 1, 65535: 1}
	for i, c := range counts {
		if c != want[i] {
			t.Errorf("stream %d: %d datagrams, want %d", i, c, want[i])
		}
	}
	for tag, w := range map[uint8]uint64{2: 4, 5: 1, 255: 1, 0: 0, 1: 0} {
		n, err := s.Run(tag)
		if err != nil {
			t.Fatal(err)
		}
		if n != w {
			t.Errorf("run %d: %d datagrams, want %d", tag, n, w)
		}
	}
	if n, err := s.Total(); err != nil || n != 7 {
		t.Errorf("total %d (%v), want 7", n, err)
	}
	// A prefix of the streams.
	few := make([]uint64, 8)
	if err := s.Streams(few); err != nil {
		t.Fatal(err)
	}
	if few[7] != 4 {
		t.Errorf("stream 7 in a prefix read: %d, want 4", few[7])
	}
}
