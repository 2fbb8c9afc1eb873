package gen

import (
	"context"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/pktio"
	"github.com/relayd/relayd/voipgen/analyze"
	"github.com/relayd/relayd/voipgen/payload"

	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/rtp/g711"
)

func TestPacketBuildNoAlloc(t *testing.T) {
	for name := range payload.Codecs {
		c, err := payload.LookupAny(name, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		s := payload.NewStream(c, 20*time.Millisecond, 3, 0x11223344, 65534, 0xfffffff0)
		if n := testing.AllocsPerRun(1000, func() { s.Next() }); n != 0 {
			t.Errorf("%s: %v allocs per packet, want 0", name, n)
		}
	}
}

func TestPacketContents(t *testing.T) {
	c, _ := payload.Lookup("pcmu", 20*time.Millisecond)
	s := payload.NewStream(c, 20*time.Millisecond, 6, 0xcafe, 65535, 100) // stream 6: 1000 Hz
	var h rtp.Header
	for i := 0; i < 3; i++ {
		b := s.Next()
		off, err := h.Unmarshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(b)-off != 160 || h.PayloadType != 0 || h.SSRC != 0xcafe || h.Marker != (i == 0) ||
			h.SequenceNumber != uint16(65535+i) || h.Timestamp != 100+uint32(i)*160 {
			t.Fatalf("packet %d: %+v len %d", i, h, len(b))
		}
		// 1 kHz at 8 kHz: period 8 samples, so the decoded payload repeats
		// every 8 samples and swings to about +-10000.
		p := b[off:]
		lo, hi := int16(0), int16(0)
		for j := range p {
			v := g711.DecodeUlaw(p[j])
			lo, hi = min(lo, v), max(hi, v)
			if j >= 8 && absDiff(v, g711.DecodeUlaw(p[j-8])) > 400 {
				t.Fatalf("sample %d = %d, 8 samples earlier %d: not a 1 kHz tone", j, v, g711.DecodeUlaw(p[j-8]))
			}
		}
		if hi < 9000 || lo > -9000 {
			t.Fatalf("tone range %d..%d", lo, hi)
		}
	}

	g, _ := payload.Lookup("g729", 20*time.Millisecond)
	s = payload.NewStream(g, 20*time.Millisecond, 0, 1, 0, 0)
	b := s.Next()
	if len(b) != 12+20 || b[1] != 0x80|18 {
		t.Fatalf("g729 packet % x", b)
	}
	for f := 0; f < 2; f++ { // P0 (bit 26) is the parity of P1's 6 MSBs (bits 18-23)
		fr := b[12+10*f:]
		bit := func(n int) int { return int(fr[n/8]>>(7-n%8)) & 1 }
		par := 0
		for n := 18; n < 24; n++ {
			par ^= bit(n)
		}
		if bit(26) != par {
			t.Fatalf("frame %d: parity bit %d, want %d", f, bit(26), par)
		}
	}
	if _, err := payload.Lookup("g729", 25*time.Millisecond); err == nil {
		t.Fatal("g729 accepted a 25 ms ptime")
	}
}

func absDiff(a, b int16) int {
	d := int(a) - int(b)
	if d < 0 {
		return -d
	}
	return d
}

// TestLoad checks the load of G.711 and G.729 streams at each level, and
// that 10,504 G.711 streams (525,200 pps) just fit in 1 Gbit/s.
func TestLoad(t *testing.T) {
	for _, tc := range []struct {
		codec                  string
		ip, frame, wire        int
		bitsPerStream, streams float64
	}{
		{"pcmu", 200, 218, 238, 95200, 1},
		{"g729", 60, 78, 98, 39200, 1},
	} {
		c, _ := payload.Lookup(tc.codec, 20*time.Millisecond)
		cfg := SenderConfig{Dst: netip.MustParseAddrPort("127.0.0.1:4000"), Codec: c, Ptime: 20 * time.Millisecond, Streams: 10504}
		l := cfg.Load()
		if l.IPBytes != tc.ip || l.FrameBytes != tc.frame || l.WireBytes != tc.wire || l.PerStreamBP != tc.bitsPerStream {
			t.Errorf("%s: %+v", tc.codec, l)
		}
		if tc.codec == "pcmu" && (l.PPS != 525200 || l.WireBitsPS > 1e9 || l.WireBitsPS < 0.99e9) {
			t.Errorf("10504 G.711 streams: %.0f pps %.0f bit/s, want 525200 pps just under 1 Gbit/s", l.PPS, l.WireBitsPS)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--dst", "nonsense"},
		{"--dst", "127.0.0.1:65530", "--streams", "4"},
		{"--dst", "127.0.0.1:4000", "--codec", "speex"},
		{"--dst", "127.0.0.1:4000", "--streams", "0"},
		{"--dst", "127.0.0.1:4000", "--src", "::1"},
		{"--dst", "127.0.0.1:4000", "--duration", "1ms"},
	} {
		if _, err := ParseSender(args, io.Discard); err == nil {
			t.Errorf("parseSend(%q) succeeded", args)
		}
	}
	for _, l := range []string{"127.0.0.1", "127.0.0.1:5-4", "x:1-2", "127.0.0.1:0-10"} {
		if _, err := analyze.Parse([]string{"--listen", l}, io.Discard); err == nil {
			t.Errorf("parseRecv(%q) succeeded", l)
		}
	}
	cfg, err := analyze.Parse([]string{"--listen", "[::1]:4000-4010"}, io.Discard)
	if err != nil || cfg.PortLo != 4000 || cfg.PortHi != 4010 || !cfg.Addr.Is6() {
		t.Fatalf("parseRecv: %+v %v", cfg, err)
	}
}

// loopback sends streams for 1 s on loopback and returns the receiver's report.
func loopback(t *testing.T, addr string, streams int, shared bool) (analyze.Report, SenderResult) {
	t.Helper()
	var rc *analyze.Receiver
	var base int
	var err error
	for base = 42000; base < 60000; base += 1000 { // find a free range
		rc, err = analyze.New(analyze.Config{Addr: netip.MustParseAddr(addr), PortLo: base, PortHi: base + 2*streams - 1,
			Duration: 10 * time.Second, Idle: 300 * time.Millisecond, ClockRate: 8000, Batch: 64, MaxSSRCsPerPort: 4})
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Skipf("no free port range on %s: %v", addr, err)
	}
	done := make(chan analyze.Report)
	go func() { done <- rc.Run(context.Background()) }()

	c, _ := payload.Lookup("pcma", 20*time.Millisecond)
	s, err := NewSender(SenderConfig{Dst: netip.AddrPortFrom(netip.MustParseAddr(addr), uint16(base)), Streams: streams,
		Codec: c, Ptime: 20 * time.Millisecond, Duration: time.Second, SharedSocket: shared})
	if err != nil {
		t.Fatal(err)
	}
	res := s.Run(context.Background())
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	return <-done, res
}

func TestLoopback(t *testing.T) {
	for _, tc := range []struct {
		name   string
		addr   string
		shared bool
	}{
		{"ipv4 socket per stream", "127.0.0.1", false},
		{"ipv4 shared socket", "127.0.0.1", true},
		{"ipv6 shared socket", "::1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const streams = 20
			rep, res := loopback(t, tc.addr, streams, tc.shared)
			if res.Packets != streams*50 || res.Errors != 0 || res.Bytes != streams*50*172 {
				t.Fatalf("sent %+v, want %d packets of 172 bytes", res, streams*50)
			}
			if len(rep.Streams) != streams {
				t.Fatalf("received %d streams, want %d", len(rep.Streams), streams)
			}
			base := rep.Streams[0].Port
			for i, s := range rep.Streams {
				if s.Port != base+2*i || s.Packets != 50 || s.Expected != 50 || s.Lost != 0 ||
					s.Duplicates != 0 || s.Reordered != 0 || s.PayloadType != 8 || s.Bytes != 50*172 {
					t.Errorf("stream %d: %+v", i, s)
				}
				// Kernel receive timestamps on loopback are taken in the
				// sender's context, so jitter and gaps are bounded by the
				// sender's own lateness (large when the machine is busy).
				lateMs := res.LateMaxus / 1e3
				if s.JitterMs > lateMs+1 || s.MaxGapMs > 20+lateMs+2 || s.MaxGapMs < 15 {
					t.Errorf("stream %d: jitter %.2f ms, max gap %.1f ms, sender max lateness %.1f ms", i, s.JitterMs, s.MaxGapMs, lateMs)
				}
			}
			if tt := rep.Totals; tt.Packets != streams*50 || tt.Lost != 0 || tt.OtherPackets != 0 || tt.Streams != streams {
				t.Errorf("totals %+v", tt)
			}
			t.Logf("sender lateness p50 %.0f us p99 %.0f us max %.0f us; max jitter %.3f ms", res.LateP50us, res.LateP99us, res.LateMaxus, rep.Totals.MaxJitterMs)
		})
	}
}

func TestRxTimestamp(t *testing.T) {
	if pktio.TimestampOOBSize == 0 {
		t.Skip("no kernel timestamps on this system")
	}
	rep, res := loopback(t, "127.0.0.1", 1, false)
	s := rep.Streams[0]
	first, _ := time.Parse(time.RFC3339Nano, s.FirstArrival)
	last, _ := time.Parse(time.RFC3339Nano, s.LastArrival)
	slack := time.Duration(res.LateMaxus)*time.Microsecond + 2*time.Millisecond
	if d := last.Sub(first); d < 980*time.Millisecond-slack || d > 980*time.Millisecond+slack {
		t.Fatalf("first to last arrival %v, want 980 ms +- %v", d, slack)
	}
	if time.Since(last) > 5*time.Second {
		t.Fatalf("arrival timestamp %v not recent", last)
	}
}

func BenchmarkPacketBuild(b *testing.B) {
	c, _ := payload.Lookup("pcmu", 20*time.Millisecond)
	s := payload.NewStream(c, 20*time.Millisecond, 0, 1, 0, 0)
	b.ReportAllocs()
	b.SetBytes(172)
	for b.Loop() {
		s.Next()
	}
}
func FuzzParseEndpoints(f *testing.F) {
	for _, s := range []string{"198.18.0.2:4000", "198.18.0.2-198.18.0.9:4000", "[2001:2::1-2001:2::3]:5000", "[::1]", "1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEndpoints(s, false)
		if err != nil {
			return
		}
		if e.N < 1 || e.N > 1<<16 || !e.Lo.IsValid() || e.Port < 0 || e.Port > 65535 {
			t.Fatalf("%q: %+v", s, e)
		}
		if a := e.At(e.N - 1).Addr(); a.Less(e.Lo) || a.Is4() != e.Lo.Is4() {
			t.Fatalf("%q: last address %v", s, a)
		}
	})
}
