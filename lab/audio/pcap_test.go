package audio

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/relayd/relayd/internal/testenv"
)

// testStreams are three RTP streams, IPv4, IPv6 (the benchmarking
// ranges) and telephone-event, with random payloads of payload sizes: one wraps its sequence
// number.
func testStreams(t *testing.T) (pkts []UDPPacket, want []Packet) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	streams := []struct {
		s    RTPStream
		size int
	}{
		{RTPStream{
			Src: netip.MustParseAddrPort("198.18.0.1:40000"), Dst: netip.MustParseAddrPort("198.18.0.2:40002"),
			SSRC: 0x11223344, PT: 18, Seq: 65530, Timestamp: 0xfffffff0, Samples: 160, Interval: 20 * time.Millisecond, Marker: true,
		}, 20},
		{RTPStream{
			Src: netip.MustParseAddrPort("[2001:2::1]:30000"), Dst: netip.MustParseAddrPort("[2001:2::2]:30002"),
			SSRC: 0xdeadbeef, PT: 0, Seq: 100, Timestamp: 5000, Samples: 160, Interval: 20 * time.Millisecond, Start: 5 * time.Millisecond,
		}, 160},
		{RTPStream{ // telephone-event: its dissector must not take the payload
			Src: netip.MustParseAddrPort("198.18.0.1:40000"), Dst: netip.MustParseAddrPort("198.18.0.2:40002"),
			SSRC: 0x11223344, PT: 101, Seq: 10, Timestamp: 8000, Interval: 50 * time.Millisecond, Start: 7 * time.Millisecond,
		}, 4},
	}
	for _, st := range streams {
		var payloads [][]byte
		for range 12 {
			p := make([]byte, st.size)
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			payloads = append(payloads, p)
		}
		for i, p := range payloads {
			want = append(want, Packet{
				SSRC: st.s.SSRC, Seq: st.s.Seq + uint16(i), Timestamp: st.s.Timestamp + uint32(i)*st.s.Samples,
				PT: st.s.PT, Marker: st.s.Marker && i == 0, Payload: p,
			})
		}
		pkts = append(pkts, RTPPackets(st.s, payloads)...)
	}
	return pkts, want
}

func TestPcapTshark(t *testing.T) {
	tshark := testenv.NeedCommand(t, "tshark", "tshark")
	pkts, want := testStreams(t)
	path := filepath.Join(t.TempDir(), "rtp.pcap")
	if err := WritePcap(path, pkts); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	got, err := RTPFromPcap(ctx, path, "")
	if err != nil {
		t.Fatal(err)
	}
	// Capture order is time order: the streams interleave.
	byKey := func(ps []Packet) map[[2]uint32]Packet {
		m := map[[2]uint32]Packet{}
		for _, p := range ps {
			m[[2]uint32{p.SSRC, uint32(p.Seq)}] = p
		}
		return m
	}
	if diff := cmp.Diff(byKey(want), byKey(got)); diff != "" || len(got) != len(want) {
		t.Errorf("RTPFromPcap: %d packets, want %d (-want +got):\n%s", len(got), len(want), diff)
	}
	v6, err := RTPFromPcap(ctx, path, "ipv6 && udp.dstport == 30002")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want[12:24], v6); diff != "" {
		t.Errorf("RTPFromPcap of the IPv6 stream (-want +got):\n%s", diff)
	}
	if _, err := RTPFromPcap(ctx, path, "no_such_field == 1"); err == nil {
		t.Error("a bad filter: no error")
	}
	// tshark verifies every checksum and the times.
	out, err := exec.CommandContext(ctx, tshark, "-n", "-r", path, "-o", "udp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE",
		"-T", "fields", "-e", "frame.time_relative", "-e", "ip.checksum.status", "-e", "udp.checksum.status").Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(pkts) {
		t.Fatalf("tshark reads %d packets, want %d", len(lines), len(pkts))
	}
	for i, l := range lines {
		f := strings.Split(l, "\t")
		v4 := pkts[i].Src.Addr().Is4()
		wantTime := (pkts[i].Time - pkts[0].Time).Seconds()
		var tm float64
		if _, err := fmt.Sscan(f[0], &tm); err != nil || tm < wantTime-1e-6 || tm > wantTime+1e-6 {
			t.Errorf("packet %d: time %q, want %.6f", i, f[0], wantTime)
		}
		// Wireshark's checksum status: 1 is good.
		if (v4 && f[1] != "1") || f[2] != "1" {
			t.Errorf("packet %d (IPv4 %v): checksum status ip %q udp %q, want good", i, v4, f[1], f[2])
		}
	}
}

// TestWritePcapBytes checks the file's headers against the pcap format
// without a tool.
func TestWritePcapBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "one.pcap")
	p := UDPPacket{Time: 1500 * time.Millisecond, Src: netip.MustParseAddrPort("198.18.0.1:1000"),
		Dst: netip.MustParseAddrPort("198.18.0.2:2000"), Payload: []byte("hello")}
	if err := WritePcap(path, []UDPPacket{p}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	if len(b) != 24+16+14+20+8+5 || le.Uint32(b) != 0xa1b2c3d4 || le.Uint32(b[20:]) != 1 {
		t.Fatalf("%d bytes, magic %#x, link type %d", len(b), le.Uint32(b), le.Uint32(b[20:]))
	}
	if sec, usec := le.Uint32(b[24:]), le.Uint32(b[28:]); int64(sec) != PcapEpoch.Unix()+1 || usec != 500000 {
		t.Errorf("timestamp %d.%06d", sec, usec)
	}
	frame := b[40:]
	if !bytes.Equal(frame[12:14], []byte{8, 0}) || !bytes.Equal(frame[len(frame)-5:], []byte("hello")) {
		t.Errorf("frame % x", frame)
	}
	if err := WritePcap(path, []UDPPacket{{Src: p.Src, Dst: netip.MustParseAddrPort("[2001:2::1]:1")}}); err == nil {
		t.Error("IPv4 to IPv6: no error")
	}
}

func TestPayloads(t *testing.T) {
	p := func(seq uint16, pt uint8) Packet {
		return Packet{Seq: seq, PT: pt, Payload: []byte{byte(seq), byte(seq >> 8)}}
	}
	// Out of order across the wrap, a duplicate, another payload type.
	pkts := []Packet{p(65534, 0), p(0, 0), p(65535, 0), p(101, 101), p(1, 0), p(0, 0), p(3, 0), p(2, 0)}
	got := Payloads(pkts, 0)
	want := [][]byte{{0xfe, 0xff}, {0xff, 0xff}, {0, 0}, {1, 0}, {2, 0}, {3, 0}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Payloads (-want +got):\n%s", diff)
	}
	if got := Payloads(pkts, 101); len(got) != 1 {
		t.Errorf("Payloads of 101: %d", len(got))
	}
}

func TestChunk(t *testing.T) {
	got := Chunk([]byte("abcdefg"), 3)
	if diff := cmp.Diff([][]byte{[]byte("abc"), []byte("def"), []byte("g")}, got); diff != "" {
		t.Error(diff)
	}
}
