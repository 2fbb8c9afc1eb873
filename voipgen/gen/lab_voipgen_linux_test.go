package gen

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/voipgen/analyze"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/lab"
)

// labStreams sends n streams from the caller straight to the callee's
// address through the relay namespace's kernel forwarding, with a receiver
// in the callee on ports 40000+2i. During the run, during (if set) is
// called in its own goroutine after settle. It returns what the sender and
// the receiver report.
func labStreams(t testing.TB, l *lab.Lab, n int, dur time.Duration, args []string, during func()) (Result, analyze.Report) {
	t.Helper()
	const port = 40000
	eps := make([]netip.AddrPort, n)
	for i := range eps {
		eps[i] = netip.AddrPortFrom(l.CalleeAddr4, uint16(port+2*i))
	}
	var rc *analyze.Receiver
	if err := l.Callee.Do(func() (err error) {
		rc, err = analyze.NewOn(analyze.Config{Addr: l.CalleeAddr4, PortLo: port, PortHi: port + 2*(n-1),
			Duration: dur + 20*time.Second, ClockRate: 8000, Batch: 8, MaxSSRCsPerPort: 16, Direction: "caller->callee"}, eps)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cfg := genCfg(t, append([]string{"--dst", fmt.Sprintf("%s:%d", l.CalleeAddr4, port), "--src", l.CallerAddr4.String() + ":20000",
		"--streams", strconv.Itoa(n), "--duration", dur.String()}, args...)...)
	var g *Generator
	if err := l.Caller.Do(func() (err error) { g, err = New(cfg); return err }); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan analyze.Report)
	go func() { done <- rc.Run(ctx) }()
	if during != nil {
		go during()
	}
	res := g.Run(context.Background())
	time.Sleep(200 * time.Millisecond)
	cancel()
	return res, <-done
}

// TestLabThousandStreams sends 1,000 G.711 streams (50,000 pps) through
// the lab's forwarding namespace: zero loss; then takes the relay's link
// to the callee down for 300 ms: every stream reports one glitch of the
// time the link was down, within two ptimes.
func TestLabThousandStreams(t *testing.T) {
	l := lab.NewT(t)
	const n = 1000
	t.Run("zero loss", func(t *testing.T) {
		res, rep := labStreams(t, l, n, 3*time.Second, nil, nil)
		tt := rep.Totals
		t.Logf("sent %d packets at %.0f pps, lateness p50 %.0f us p99 %.0f us max %.0f us; received %d, lost %d, jitter max %.3f ms, max gap %.1f ms, MOS %v",
			res.Packets, res.PPS, res.LateP50us, res.LateP99us, res.LateMaxus, tt.Packets, tt.Lost, tt.MaxJitterMs, tt.MaxGapMs, tt.MOSDist)
		if res.Packets != n*150 || res.Errors != 0 {
			t.Fatalf("sent %+v, want %d packets", res, n*150)
		}
		if tt.Streams != n || tt.Packets != n*150 || tt.Lost != 0 || tt.Glitches != 0 || rep.Failover != nil {
			t.Fatalf("received %+v, want %d streams, %d packets, no loss", tt, n, n*150)
		}
	})
	t.Run("link down 300ms", func(t *testing.T) {
		var down time.Duration
		downErr := make(chan error, 1)
		flap := func() {
			// The flap itself must keep time on a busy machine too.
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			_ = unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: 60}, 0)
			time.Sleep(1500 * time.Millisecond)
			t0 := time.Now()
			if err := l.Relay.SetLinkDown(lab.RelayCalleeIfName); err != nil {
				downErr <- err
				return
			}
			time.Sleep(300*time.Millisecond - time.Since(t0))
			err := l.Relay.SetLinkUp(lab.RelayCalleeIfName)
			// Taking r1 down flushed its neighbours. Re-resolving the
			// callee would wait for e0's carrier, which the kernel's link
			// watch may apply up to a second later (ARP then retries after
			// a second): restore the entry so that forwarding resumes when
			// the link does, and the glitch is the link's. Through netlink:
			// a fork and exec of ip(8) took 60 ms on a loaded machine, and
			// the outage lasts until the entry is back.
			if err == nil {
				err = l.Relay.SetNeighbor(lab.RelayCalleeIfName, l.CalleeAddr4, l.CalleeIf.HardwareAddr)
			}
			down = time.Since(t0)
			downErr <- err
		}
		// The sender runs SCHED_FIFO: a sender starved by other work
		// on the machine falls behind, sends its backlog in bursts after
		// the link returns, and the glitch would be the sender's.
		res, rep := labStreams(t, l, n, 4*time.Second, []string{"--rt-priority", "50"}, flap)
		if err := <-downErr; err != nil {
			t.Fatal(err)
		}
		const ptime = 20.0
		f := rep.Failover
		if f == nil {
			t.Fatalf("no glitch reported: %+v", rep.Totals)
		}
		t.Logf("link down %v; sender lateness p99 %.0f us max %.0f us; glitch per stream ms %v; gap ms %v; outage %.1f ms (resolution %.3f ms)",
			down, res.LateP99us, res.LateMaxus, f.GlitchMs, f.GapMs, f.OutageMs, f.ResolutionMs)
		downMs := float64(down) / 1e6
		bad := 0
		for _, s := range rep.Streams {
			if s.Glitches != 1 || len(s.LossPeriods) != 1 || math.Abs(s.LossPeriods[0].DurationMs-downMs) > 2*ptime {
				if bad++; bad <= 5 {
					t.Errorf("stream %d: %d glitches %+v, want one of %.0f ms +- %.0f", s.Port, s.Glitches, s.LossPeriods, downMs, 2*ptime)
				}
			}
		}
		if bad > 0 || f.Streams != n || rep.Totals.Streams != n {
			t.Fatalf("%d of %d streams without the expected glitch; %d streams saw one", bad, rep.Totals.Streams, f.Streams)
		}
		if math.Abs(f.OutageMs-downMs) > 2*ptime || f.ResolutionMs > 0.05 {
			t.Errorf("outage %.1f ms at resolution %.3f ms, link was down %.1f ms", f.OutageMs, f.ResolutionMs, downMs)
		}
	})
}

// TestLabTshark captures voipgen's output in the callee namespace and has
// tshark decode it: its rtp,streams analysis must list every stream with
// the right payload type, all packets, and no sequence errors.
func TestLabTshark(t *testing.T) {
	testenv.NeedCommand(t, "tshark", "tshark")
	l := lab.NewT(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		codec, payload string
		args           []string
	}{
		{"pcmu", "g711U", nil},
		{"pcma", "g711A", []string{"--rtcp"}},
		{"g729", "g729", []string{"--call-duration", "500ms"}},
	} {
		t.Run(tc.codec, func(t *testing.T) {
			capFile := filepath.Join(dir, tc.codec+".pcapng")
			// dumpcap drops root privileges to write as its group unless
			// told otherwise; a capture file in a fresh directory is fine.
			cmd := l.Callee.Command("dumpcap", "-q", "-i", lab.CalleeIfName, "-f", "udp", "-w", capFile)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			if !waitFile(capFile, 5*time.Second) {
				t.Fatal("dumpcap did not start")
			}
			time.Sleep(300 * time.Millisecond)
			const n = 10
			dur := 2 * time.Second
			if tc.codec == "pcma" {
				dur = 3 * time.Second // the first RTCP SR leaves after 2.5 s
			}
			res, rep := labStreams(t, l, n, dur, append([]string{"--codec", tc.codec}, tc.args...), nil)
			if rep.Totals.Lost != 0 {
				t.Fatalf("lost %d", rep.Totals.Lost)
			}
			time.Sleep(300 * time.Millisecond)
			cmd.Process.Signal(os.Interrupt)
			cmd.Wait()
			out, err := exec.Command("tshark", "-r", capFile, "-q", "-o", "rtp.heuristic_rtp:TRUE", "-z", "rtp,streams").CombinedOutput()
			if err != nil {
				t.Fatalf("tshark: %v\n%s", err, out)
			}
			streams := parseTsharkStreams(t, string(out))
			wantPkts := int(res.Packets) / n
			calls := int(res.Calls)
			if len(streams) != calls {
				t.Fatalf("tshark lists %d RTP streams, want %d:\n%s", len(streams), calls, out)
			}
			total := 0
			for _, s := range streams {
				if s.payload != tc.payload || s.lost != 0 || s.problem || s.dst.Addr() != l.CalleeAddr4 || s.src.Addr() != l.CallerAddr4 {
					t.Errorf("stream %+v, want payload %s, no loss, no problem", s, tc.payload)
				}
				total += s.packets
			}
			if total != int(res.Packets) {
				t.Errorf("tshark counts %d RTP packets, voipgen sent %d (%d per stream)", total, res.Packets, wantPkts)
			}
			t.Logf("tshark: %d streams, %d packets, payload %s", len(streams), total, tc.payload)
			if res.RTCP > 0 {
				// Every SR decodes as RTCP (decode-as for the odd ports),
				// with the SSRC of an RTP stream and its SDES CNAME.
				args := []string{"-r", capFile, "-Y", "rtcp.pt == 200", "-T", "fields", "-e", "rtcp.senderssrc", "-e", "rtcp.sdes.text"}
				for i := 0; i < n; i++ {
					args = append(args, "-d", fmt.Sprintf("udp.port==%d,rtcp", 40001+2*i))
				}
				out, err := exec.Command("tshark", args...).Output() // stderr warns about running as root
				if err != nil {
					t.Fatalf("tshark: %v\n%s", err, out)
				}
				lines := strings.Split(strings.TrimSpace(string(out)), "\n")
				ssrcs := map[string]bool{}
				for _, s := range streams {
					ssrcs[strings.ToLower(s.ssrc)] = true
				}
				if len(lines) != int(res.RTCP) {
					t.Fatalf("tshark decodes %d sender reports, voipgen sent %d:\n%s", len(lines), res.RTCP, out)
				}
				for _, ln := range lines {
					f := strings.Fields(ln)
					if len(f) < 2 || !ssrcs[strings.ToLower(f[0])] || !strings.HasPrefix(f[1], "voipgen-") {
						t.Errorf("sender report %q: want an RTP stream's SSRC and a voipgen CNAME", ln)
					}
				}
				t.Logf("tshark: %d RTCP sender reports with SDES CNAME", len(lines))
			}
		})
	}
}

func waitFile(p string, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

type tsharkStream struct {
	src, dst netip.AddrPort
	ssrc     string
	payload  string
	packets  int
	lost     int
	problem  bool
}

// parseTsharkStreams parses tshark's "RTP Streams" table:
//
//	[Start time  End time]  Src IP addr  Port  Dest IP addr  Port  SSRC  Payload  Pkts  Lost  Min Delta(ms) ... Max Jitter(ms)  Problem?
func parseTsharkStreams(t *testing.T, out string) []tsharkStream {
	t.Helper()
	var ss []tsharkStream
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// tshark 4.0 starts rows with the start and end times; find the
		// SSRC and take the addresses before it.
		k := 0
		for k < len(f) && !strings.HasPrefix(f[k], "0x") {
			k++
		}
		if k < 4 || k+3 >= len(f) {
			continue
		}
		f = f[k-4:]
		var s tsharkStream
		sp, _ := strconv.Atoi(f[1])
		dp, _ := strconv.Atoi(f[3])
		sa, err1 := netip.ParseAddr(f[0])
		da, err2 := netip.ParseAddr(f[2])
		if err1 != nil || err2 != nil {
			continue
		}
		s.src, s.dst = netip.AddrPortFrom(sa, uint16(sp)), netip.AddrPortFrom(da, uint16(dp))
		s.ssrc, s.payload = f[4], f[5]
		// Payload names may contain spaces in other versions: find the
		// packet count as the first integer after the SSRC.
		i := 6
		for ; i < len(f); i++ {
			if _, err := strconv.Atoi(f[i]); err == nil {
				break
			}
			s.payload += " " + f[i]
		}
		if i+1 >= len(f) {
			continue
		}
		s.packets, _ = strconv.Atoi(f[i])
		lost := strings.SplitN(f[i+1], "(", 2)[0]
		s.lost, _ = strconv.Atoi(lost)
		s.problem = f[len(f)-1] == "X"
		ss = append(ss, s)
	}
	return ss
}

// TestLabXDPSender sends through the AF_XDP transport (copy mode on the
// caller's veth, no XDP program): every packet arrives, the kernel
// forwarding in the relay namespace accepting the frames voipgen built
// (IPv4 header checksum, UDP checksum, next hop's MAC).
func TestLabXDPSender(t *testing.T) {
	l := lab.NewT(t)
	res, rep := labStreams(t, l, 200, 2*time.Second, []string{"--transport", "xdp"}, nil)
	tt := rep.Totals
	t.Logf("AF_XDP: sent %d at %.0f pps (%d errors), lateness p99 %.0f us; received %d, lost %d, max gap %.1f ms",
		res.Packets, res.PPS, res.Errors, res.LateP99us, tt.Packets, tt.Lost, tt.MaxGapMs)
	if res.Packets != 200*100 || res.Errors != 0 || res.Transport != "xdp" {
		t.Fatalf("sent %+v", res)
	}
	if tt.Streams != 200 || tt.Packets != 200*100 || tt.Lost != 0 {
		t.Fatalf("received %+v", tt)
	}
	// Allocation-free through AF_XDP too.
	cfg := genCfg(t, "--dst", l.CalleeAddr4.String()+":41000", "--src", l.CallerAddr4.String()+":21000",
		"--streams", "64", "--duration", "1h", "--transport", "xdp")
	var g *Generator
	if err := l.Caller.Do(func() (err error) { g, err = New(cfg); return err }); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	th := g.threads[0]
	start := MonoNow() - int64(time.Hour)
	cycle := 0
	send := func() {
		base := time.Duration(cycle) * g.cfg.Ptime
		for k := range th.slots {
			g.sendSlot(th, start, base, &th.slots[k])
		}
		cycle++
	}
	send()
	if n := testing.AllocsPerRun(200, send); n != 0 {
		t.Errorf("AF_XDP: %v allocs per cycle, want 0", n)
	}
}
