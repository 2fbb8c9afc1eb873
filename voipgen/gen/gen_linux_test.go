package gen

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/voipgen/analyze"
	"github.com/relayd/relayd/voipgen/payload"

	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

func needRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t)
}

// freeRange starts a receiver on a free range of n ports on addr.
func freeRange(t *testing.T, addr string, n int, clockRate uint32) (*analyze.Receiver, int) {
	t.Helper()
	for base := 42000; base < 60000; base += 1000 + n {
		rc, err := analyze.New(analyze.Config{Addr: netip.MustParseAddr(addr), PortLo: base, PortHi: base + n - 1,
			Duration: 20 * time.Second, ClockRate: clockRate, Batch: 16, MaxSSRCsPerPort: 64})
		if err == nil {
			return rc, base
		}
	}
	t.Skipf("no free range of %d ports on %s", n, addr)
	return nil, 0
}

func genCfg(t testing.TB, args ...string) Config {
	t.Helper()
	cfg, err := Parse(args, io.Discard)
	if err != nil {
		t.Fatalf("parseGen(%q): %v", args, err)
	}
	cfg.Progress = false
	return cfg
}

// runGenRecv runs a generator against rc and returns both results.
func runGenRecv(t *testing.T, cfg Config, rc *analyze.Receiver) (Result, analyze.Report) {
	t.Helper()
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan analyze.Report)
	go func() { done <- rc.Run(ctx) }()
	res := g.Run(context.Background())
	time.Sleep(100 * time.Millisecond)
	cancel()
	return res, <-done
}

func TestGenTransports(t *testing.T) {
	for _, tc := range []struct {
		transport string
		addr      string
		root      bool
	}{
		{"udp", "127.0.0.1", false},
		{"shared", "127.0.0.1", false},
		{"raw", "127.0.0.1", true},
		{"udp", "::1", false},
		{"raw", "::1", true},
	} {
		t.Run(tc.transport+" "+tc.addr, func(t *testing.T) {
			if tc.root {
				needRoot(t)
			}
			const streams = 30
			rc, base := freeRange(t, tc.addr, 2*streams, 8000)
			dst := netip.AddrPortFrom(netip.MustParseAddr(tc.addr), uint16(base)).String()
			cfg := genCfg(t, "--dst", dst, "--streams", "30", "--codec", "pcma", "--duration", "1s",
				"--transport", tc.transport, "--threads", "2", "--rtcp")
			res, rep := runGenRecv(t, cfg, rc)
			if res.Packets != streams*50 || res.Errors != 0 || res.Bytes != streams*50*172 || res.Calls != streams {
				t.Fatalf("sent %+v, want %d packets of 172 bytes", res, streams*50)
			}
			// The rate is over the second the schedule spans, stretched
			// only by the lateness of the last packets: not by how long
			// the caller took to wake up after them.
			if res.Elapsed < 1 || res.Elapsed > 1+res.LateMaxus/1e6+0.002 || res.PPS > streams*50 {
				t.Errorf("elapsed %.4f s, %.1f pps, lateness max %.0f us: want 1 s or its lateness more, %d pps or less",
					res.Elapsed, res.PPS, res.LateMaxus, streams*50)
			}
			if len(rep.Streams) != streams {
				t.Fatalf("received %d streams, want %d", len(rep.Streams), streams)
			}
			for i, s := range rep.Streams {
				if s.Port != base+2*i || s.Packets != 50 || s.Lost != 0 || s.PayloadType != 8 || s.Glitches != 0 ||
					s.MOS == nil || *s.MOS < 4.4 {
					t.Errorf("stream %d: %+v", i, s)
				}
			}
			t.Logf("lateness p50 %.0f us p99 %.0f us max %.0f us; max jitter %.3f ms, max gap %.1f ms",
				res.LateP50us, res.LateP99us, res.LateMaxus, rep.Totals.MaxJitterMs, rep.Totals.MaxGapMs)
		})
	}
}

// TestGenFiveTuples checks that every call has its own source port (udp and
// raw) and that address ranges spread streams over addresses.
func TestGenFiveTuples(t *testing.T) {
	for _, transport := range []string{"udp", "raw"} {
		t.Run(transport, func(t *testing.T) {
			if transport == "raw" {
				needRoot(t)
			}
			sink, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close()
			port := sink.LocalAddr().(*net.UDPAddr).Port
			// Four destination addresses, one port each: 127.0.0.1 is the
			// only one listening, so stream 0, 4, 8 ... arrive.
			cfg := genCfg(t, "--dst", "127.0.0.1-127.0.0.4:"+itoa(port), "--src", "127.0.0.1:31000",
				"--streams", "8", "--duration", "200ms", "--transport", transport)
			if cfg.Dst.At(5) != netip.MustParseAddrPort("127.0.0.2:"+itoa(port+2)) {
				t.Fatalf("stream 5 goes to %v", cfg.Dst.At(5))
			}
			g, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			done := make(chan map[netip.AddrPort]int)
			go func() {
				from := map[netip.AddrPort]int{}
				buf := make([]byte, 2048)
				sink.SetReadDeadline(time.Now().Add(2 * time.Second))
				for {
					_, a, err := sink.ReadFromUDPAddrPort(buf)
					if err != nil {
						done <- from
						return
					}
					from[a]++
				}
			}()
			g.Run(context.Background())
			sink.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			from := <-done
			want := map[netip.AddrPort]int{
				netip.MustParseAddrPort("127.0.0.1:31000"): 10,
			}
			if len(from) != 1 || from[netip.MustParseAddrPort("127.0.0.1:31000")] != 10 {
				t.Fatalf("sources %v, want %v", from, want)
			}
		})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestGenCalls checks the call model: calls of 200 ms on 10 channels for 1 s
// give 5 calls per channel, each its own SSRC starting with the marker bit,
// and a ramp of 20 calls/s starts channel i at i/20 s.
func TestGenCalls(t *testing.T) {
	rc, base := freeRange(t, "127.0.0.1", 20, 8000)
	cfg := genCfg(t, "--dst", "127.0.0.1:"+itoa(base), "--streams", "10", "--duration", "1s",
		"--call-duration", "200ms", "--transport", "udp")
	res, rep := runGenRecv(t, cfg, rc)
	if res.Calls != 50 || res.Packets != 500 {
		t.Fatalf("sent %+v, want 50 calls and 500 packets", res)
	}
	if len(rep.Streams) != 50 {
		t.Fatalf("received %d streams, want 50 (5 calls x 10 channels)", len(rep.Streams))
	}
	for _, s := range rep.Streams {
		if s.Packets != 10 || s.Lost != 0 {
			t.Errorf("call %+v: want 10 packets", s)
		}
	}

	rc, base = freeRange(t, "127.0.0.1", 20, 8000)
	cfg = genCfg(t, "--dst", "127.0.0.1:"+itoa(base), "--streams", "10", "--duration", "1s",
		"--rate", "20", "--transport", "udp")
	res, rep = runGenRecv(t, cfg, rc)
	// Channel i starts at i*50 ms: 50 - 2.5i packets, 387 or so in all.
	if res.Calls != 10 || len(rep.Streams) != 10 {
		t.Fatalf("ramp: %d calls, %d streams", res.Calls, len(rep.Streams))
	}
	for i, s := range rep.Streams {
		want := 50 - int(float64(i)*2.5)
		if d := int(s.Packets) - want; d < -1 || d > 1 {
			t.Errorf("ramp: channel %d sent %d packets, want %d", i, s.Packets, want)
		}
	}

	// Exponential durations: many short calls, mean near the configured one.
	cfg = genCfg(t, "--dst", "127.0.0.1:9", "--streams", "50", "--duration", "2s",
		"--call-duration", "100ms", "--call-duration-dist", "exp", "--transport", "udp")
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	res = g.Run(context.Background())
	// 50 channels x 2 s / (mean 100 ms, at least one 20 ms packet, rounded
	// up to the ptime grid) is about 700 to 1000 calls.
	if res.Calls < 500 || res.Calls > 1100 {
		t.Errorf("exponential: %d calls, want about 800", res.Calls)
	}
}

func TestGenNoAlloc(t *testing.T) {
	for _, transport := range []string{"udp", "raw", "raw-srtp"} {
		t.Run(transport, func(t *testing.T) {
			args := []string{"--dst", "127.0.0.1:9", "--streams", "64", "--duration", "1h", "--rtcp", "--transport", transport}
			if transport == "raw-srtp" {
				args = append(args[:len(args)-1], "raw", "--srtp-suite", "AEAD_AES_128_GCM", "--srtp-key", strings.Repeat("A", 38))
			}
			if strings.HasPrefix(transport, "raw") {
				needRoot(t)
			}
			g, err := New(genCfg(t, args...))
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			th := g.threads[0]
			start := MonoNow() - int64(time.Hour) // every deadline has passed: no sleeping
			cycle := 0
			send := func() {
				base := time.Duration(cycle) * g.cfg.Ptime
				for k := range th.slots {
					g.sendSlot(th, start, base, &th.slots[k])
				}
				cycle++
			}
			send() // SRTP contexts learn each SSRC once
			if n := testing.AllocsPerRun(500, send); n != 0 {
				t.Errorf("%v allocs per cycle of 64 packets, want 0", n)
			}
			if th.res.rtcp == 0 {
				t.Error("no RTCP sent in 500 cycles")
			}
		})
	}
}

// TestGenRawPackets checks the raw frames: IPv4 and IPv6 headers, the UDP
// checksum against one computed from scratch, DSCP EF.
func TestGenRawPackets(t *testing.T) {
	for _, tc := range [][2]string{{"198.18.2.2:4000", "198.18.0.2:6000"}, {"[2001:2::2]:4000", "[2001:2::9]:6000"}} {
		dst := tc[0]
		cfg := genCfg(t, "--dst", dst, "--src", tc[1],
			"--streams", "3", "--transport", "raw", "--codec", "g729")
		src, d := cfg.Src.At(2), cfg.Dst.At(2)
		hlen := 28
		if !d.Addr().Is4() {
			hlen = 48
		}
		frame := make([]byte, hlen+32)
		sum0 := BuildHeaders(frame[:hlen], src, d, 32, 46)
		for i := range frame[hlen:] {
			frame[hlen+i] = byte(i * 7)
		}
		SetUDPChecksum(frame, hlen, 32, sum0)
		var want uint16
		if d.Addr().Is4() {
			if frame[0] != 0x45 || frame[1] != 46<<2 || binary.BigEndian.Uint16(frame[2:]) != 60 || frame[9] != 17 {
				t.Errorf("IPv4 header % x", frame[:20])
			}
			want = refChecksum(frame[12:16], frame[16:20], frame[20:])
		} else {
			if frame[0]>>4 != 6 || binary.BigEndian.Uint32(frame)>>20&0xff != 46<<2 || binary.BigEndian.Uint16(frame[4:]) != 40 || frame[6] != 17 {
				t.Errorf("IPv6 header % x", frame[:40])
			}
			want = refChecksum(frame[8:24], frame[24:40], frame[40:])
		}
		u := frame[hlen-8:]
		if got := binary.BigEndian.Uint16(u[6:]); got != want || binary.BigEndian.Uint16(u) != src.Port() ||
			binary.BigEndian.Uint16(u[2:]) != d.Port() || binary.BigEndian.Uint16(u[4:]) != 40 {
			t.Errorf("%s: UDP header % x, checksum want %04x", dst, u[:8], want)
		}
	}
}

// refChecksum is RFC 768 checksum the slow way, 16 bits at a time.
func refChecksum(src, dst, udp []byte) uint16 {
	var b []byte
	b = append(b, src...)
	b = append(b, dst...)
	b = append(b, 0, 17, byte(len(udp)>>8), byte(len(udp)))
	u := append([]byte(nil), udp...)
	u[6], u[7] = 0, 0
	b = append(b, u...)
	if len(b)%2 == 1 {
		b = append(b, 0)
	}
	var s uint32
	for i := 0; i < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	c := ^uint16(s)
	if c == 0 {
		c = 0xffff
	}
	return c
}

// TestGenSRTP sends SRTP and decrypts what arrives with the relay's
// Decrypter: the encrypted load is real SRTP with the given key.
func TestGenSRTP(t *testing.T) {
	for _, suite := range []string{"AES_CM_128_HMAC_SHA1_80", "AEAD_AES_128_GCM"} {
		t.Run(suite, func(t *testing.T) {
			s, _ := sdes.ParseSuite(suite)
			keySalt := make([]byte, s.KeyLen()+s.SaltLen())
			for i := range keySalt {
				keySalt[i] = byte(i + 1)
			}
			c, err := sdes.Generate(1, s)
			if err != nil {
				t.Fatal(err)
			}
			b64 := strings.TrimPrefix(c.InlineKey(), "inline:")
			key, salt, err := sdes.DecodeKey(s, b64)
			if err != nil {
				t.Fatal(err)
			}
			sink, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close()
			port := sink.LocalAddr().(*net.UDPAddr).Port
			cfg := genCfg(t, "--dst", "127.0.0.1:"+itoa(port), "--streams", "1", "--duration", "200ms",
				"--transport", "udp", "--srtp-suite", suite, "--srtp-key", b64)
			if l := cfg.Load(); l.RTPBytes != 172+s.RTPTagLen() {
				t.Errorf("load counts %d RTP bytes, want %d", l.RTPBytes, 172+s.RTPTagLen())
			}
			g, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			go g.Run(context.Background())
			dec, err := srtpflow.NewDecrypter(srtpflow.Config{Suite: s, Key: key, Salt: salt})
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 2048)
			sink.SetReadDeadline(time.Now().Add(2 * time.Second))
			for i := 0; i < 10; i++ {
				n, err := sink.Read(buf)
				if err != nil {
					t.Fatal(err)
				}
				if n != 172+s.RTPTagLen() {
					t.Fatalf("packet of %d bytes, want %d", n, 172+s.RTPTagLen())
				}
				out, err := dec.DecryptRTP(make([]byte, 0, 2048), buf[:n])
				if err != nil {
					t.Fatalf("packet %d: %v", i, err)
				}
				var h rtp.Header
				if _, err := h.Unmarshal(out); err != nil || len(out) != 172 || h.Marker != (i == 0) {
					t.Fatalf("decrypted packet %d: %+v %v", i, h, err)
				}
			}
		})
	}
}

// TestGenBidir runs two endpoints with swapped addresses: each receives
// and analyses the other's streams on its sending sockets.
func TestGenBidir(t *testing.T) {
	for _, transport := range []string{"udp", "raw"} {
		t.Run(transport, func(t *testing.T) {
			if transport == "raw" {
				needRoot(t)
			}
			// Ports below the kernel's ephemeral range (32768-60999 by
			// default), where any process's sockets may hold one.
			a := genCfg(t, "--src", "127.0.0.1:21000", "--dst", "127.0.0.2:22000", "--streams", "20", "--duration", "1s",
				"--bidir", "--grace", "300ms", "--transport", transport, "--rtcp")
			b := genCfg(t, "--src", "127.0.0.2:22000", "--dst", "127.0.0.1:21000", "--streams", "20", "--duration", "1s",
				"--bidir", "--grace", "300ms", "--transport", transport, "--rtcp")
			ga, err := New(a)
			if err != nil {
				t.Fatal(err)
			}
			defer ga.Close()
			gb, err := New(b)
			if err != nil {
				t.Fatal(err)
			}
			defer gb.Close()
			type out struct {
				res Result
				rep *analyze.Report
			}
			ca, cb := make(chan out), make(chan out)
			go func() { r, p := ga.RunAndReceive(context.Background(), nil); ca <- out{r, p} }()
			go func() { r, p := gb.RunAndReceive(context.Background(), nil); cb <- out{r, p} }()
			for _, o := range []out{<-ca, <-cb} {
				if o.rep == nil || o.res.Packets != 1000 {
					t.Fatalf("%+v", o)
				}
				tt := o.rep.Totals
				// The peer starts within a few ms: a packet or two of its
				// stream can precede this side's sockets' readers.
				if tt.Streams != 20 || tt.Packets < 980 || tt.Lost != 0 {
					t.Errorf("received %+v", tt)
				}
			}
		})
	}
}

func TestOpusPackets(t *testing.T) {
	for _, tc := range []struct {
		ptime time.Duration
		kbps  int
		toc   byte
		size  int
	}{
		{20 * time.Millisecond, 32, 0xf8, 1 + 80},
		{10 * time.Millisecond, 24, 0xf0, 1 + 30},
		{60 * time.Millisecond, 16, 0xfb, 2 + 120},
		{30 * time.Millisecond, 32, 0xf3, 2 + 120},
	} {
		c, err := payload.LookupAny("opus", tc.ptime)
		if err != nil {
			t.Fatal(err)
		}
		if c, err = c.WithKbps(tc.kbps); err != nil {
			t.Fatal(err)
		}
		s := payload.NewStream(c, tc.ptime, 0, 1, 0, 0)
		b := s.Next()
		if len(b) != 12+tc.size || b[12] != tc.toc || b[1]&0x7f != payload.OpusPT || s.TSStep != uint32(48*tc.ptime/time.Millisecond) {
			t.Errorf("%v %d kbit/s: %d bytes, TOC %02x, step %d; want %d bytes, TOC %02x", tc.ptime, tc.kbps, len(b), b[12], s.TSStep, 12+tc.size, tc.toc)
		}
		if tc.toc&3 == 3 && int(b[13]) != int(tc.ptime/(time.Duration(map[byte]int{0xfb: 20, 0xf3: 10}[tc.toc])*time.Millisecond)) {
			t.Errorf("%v: frame count %d", tc.ptime, b[13])
		}
	}
}

func TestParseGen(t *testing.T) {
	for _, args := range [][]string{
		{"--dst", "nonsense:1"},
		{"--dst", "127.0.0.1"},
		{"--dst", "127.0.0.1:65530", "--streams", "4"},
		{"--dst", "127.0.0.1:4000", "--codec", "speex"},
		{"--dst", "127.0.0.1:4000", "--src", "::1"},
		{"--dst", "127.0.0.1:4000", "--call-duration", "5ms"},
		{"--dst", "127.0.0.1:4000", "--threads", "0"},
		{"--dst", "127.0.0.1:4000", "--transport", "carrier-pigeon"},
		{"--dst", "127.0.0.1:4000", "--srtp-suite", "AES_CM_128_HMAC_SHA1_80", "--srtp-key", "short"},
		{"--dst", "127.0.0.5-127.0.0.1:4000"},
		{"--dst", "127.0.0.1:4000", "--bidir", "--transport", "shared"},
		{"--dst", "127.0.0.1:4000", "--codec", "opus", "--opus-kbps", "1000"},
	} {
		if _, err := Parse(args, io.Discard); err == nil {
			t.Errorf("parseGen(%q) succeeded", args)
		}
	}
	cfg := genCfg(t, "--dst", "[2001:2::1-2001:2::3]:5000", "--calls", "7")
	if cfg.Dst.N != 3 || cfg.Streams != 7 || cfg.Dst.At(4) != netip.MustParseAddrPort("[2001:2::2]:5002") {
		t.Fatalf("%+v", cfg.Dst)
	}
	l := cfg.Load()
	if l.IPBytes != 220 || l.PPS != 350 {
		t.Fatalf("IPv6 load %+v", l)
	}
}

// TestSendErrorKinds: a packet the kernel refuses is counted as an error by
// its errno (UDP to port 0 is EINVAL), not as sent: a receiver sees its
// sequence number missing, and the report says why.
func TestSendErrorKinds(t *testing.T) {
	for _, transport := range []string{"udp", "shared"} {
		cfg := genCfg(t, "--dst", "127.0.0.1:9", "--streams", "2", "--duration", "200ms", "--transport", transport)
		cfg.Dst.Port = 0 // the flag refuses it
		g, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		res := g.Run(context.Background())
		g.Close()
		if res.Packets != 0 || res.Errors < 2 || res.ErrorKinds["EINVAL"] != res.Errors || len(res.ErrorKinds) != 1 {
			t.Errorf("%s: sent %d packets, %d errors of kinds %v; want none sent, every error EINVAL", transport, res.Packets, res.Errors, res.ErrorKinds)
		}
	}
}

func TestErrnoTally(t *testing.T) {
	var tally errnoTally
	for _, e := range []error{unix.EAGAIN, unix.ENOBUFS, unix.EAGAIN, errors.New("short"), unix.EPERM, unix.EACCES, unix.EINVAL} {
		tally.add(e, 1)
	}
	tally.add(fmt.Errorf("wrapped: %w", unix.ENOBUFS), 3)
	got := map[string]uint64{}
	tally.into(got)
	want := map[string]uint64{"EAGAIN": 2, "ENOBUFS": 4, "EPERM": 1, "EACCES": 1, "other": 2}
	if !maps.Equal(got, want) {
		t.Errorf("tally %v, want %v", got, want)
	}
}

// TestGenReceiveBuffer: a bidirectional stream's socket holds seconds of
// the peer's packets while its reader is late (SO_RCVBUFFORCE past
// rmem_max: the kernel reports twice the 1 MiB asked).
func TestGenReceiveBuffer(t *testing.T) {
	needRoot(t)
	cfg := genCfg(t, "--src", "127.0.0.1:22200", "--dst", "127.0.0.2:22100", "--streams", "1", "--duration", "1s", "--bidir")
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	conns := g.Conns()
	if len(conns) == 0 {
		t.Fatal("no socket")
	}
	rc, err := conns[0].SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var size int
	var gerr error
	rc.Control(func(fd uintptr) { size, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) })
	if gerr != nil || size < 2<<20 {
		t.Errorf("SO_RCVBUF %d (%v), want at least 2 MiB", size, gerr)
	}
}
