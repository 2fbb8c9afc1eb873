package fwtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// needLab skips (fails in CI) without what Run needs.
func needLab(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedCommand(t, "keepalived", "keepalived")
	testenv.NeedCommand(t, "conntrackd", "conntrackd")
	testenv.NeedCommand(t, "nft", "nftables")
}

func failoverConfig(conntrackd bool, failures ...FailureKind) Config {
	return Config{Calls: 20, Codec: "pcmu", Ptime: 20 * time.Millisecond, Failures: failures,
		VRRP: []VRRPSetting{{Version: 3, Advert: 100 * time.Millisecond}}, Conntrackd: []bool{conntrackd},
		Streams: []string{Bidirectional, OneWayWANLAN}, Reps: 1, Quick: true, Trial: time.Second, Transport: "raw", Threads: 1}
}

func run(t *testing.T, cfg Config) *Report {
	t.Helper()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cfg.Progress = &log
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Logf("progress:\n%s", log.String())
	return rep
}

// TestFailoverConntrackd fails the master administratively and by
// cutting its links, with conntrackd and VRRPv3 0.1 s adverts: every
// stream of every call recovers, within 100 ms and 500 ms; moving back
// to fw1 recovers every stream too; each stream's gap agrees with a
// capture taken at the receiving host within two ptimes; and every call's
// SIP dialog, set up through the pair before the failure, ends with a BYE
// after the recovery.
func TestFailoverConntrackd(t *testing.T) {
	needLab(t)
	testenv.NeedCommand(t, "tcpdump", "tcpdump")
	testenv.NeedCommand(t, "tshark", "tshark")
	cfg := failoverConfig(true, AdminStop, CrashLinks)
	cfg.Capture = t.TempDir()
	cfg.SIP = true
	rep := run(t, cfg)
	if len(rep.Failovers) != 8 {
		t.Fatalf("%d failover rows, want 8 (2 failures x 2 stream kinds, each with its recovery)", len(rep.Failovers))
	}
	limit := map[FailureKind]Ms{AdminStop: 100, CrashLinks: 500, RecoveryPreempt: 100}
	captures, compared := 0, 0
	for _, row := range rep.Failovers {
		c, f := row.Case, row.Analysis
		want := cfg.Calls
		if c.Streams == Bidirectional {
			want *= 2
		}
		if f.Recovered != want || row.NeverRecovered != 0 || row.SilentBefore != 0 {
			t.Errorf("%s: %d of %d streams recovered, %d never, %d silent before", c, f.Recovered, want, row.NeverRecovered, row.SilentBefore)
		}
		for _, s := range f.Streams {
			if s.GlitchMs >= limit[c.Kind] {
				t.Errorf("%s: stream %s glitch %v, want under %v ms", c, s.Name, s.GlitchMs, float64(limit[c.Kind]))
			}
		}
		if row.VRRPMs == nil || *row.VRRPMs <= 0 || row.SyncMs == nil {
			t.Errorf("%s: VRRP %v ms, conntrackd %v ms: want both from the logs", c, row.VRRPMs, row.SyncMs)
		}
		// A crash waits out the master-down interval (3 adverts): the
		// outage shows it, so the failure really happened.
		if c.Kind == CrashLinks && (f.OutageMs < 200 || math.IsInf(float64(f.OutageMs), 1)) {
			t.Errorf("%s: outage %v ms, want the master-down interval (about 300 ms)", c, f.OutageMs)
		}
		if c.Kind != RecoveryPreempt {
			captures++
			if agreeWithCapture(t, cfg, row) {
				compared++
			}
			// Every call's SIP dialog survived both moves: its BYE, after
			// the recovery, was answered.
			if s := row.SIP; s == nil || s.Established != cfg.Calls || s.Ended != cfg.Calls {
				t.Errorf("%s: SIP %+v, want %d calls answered and ended by BYE", c, s, cfg.Calls)
			}
		}
	}
	if compared == 0 {
		t.Errorf("tcpdump dropped packets in every one of the %d captures: no gap checked against a capture", captures)
	}
}

// TestFailoverNoConntrackd: without state replication the new master drops
// a one-way WAN to LAN stream as a new connection from the WAN, so those
// calls never recover, while calls whose LAN end keeps sending do; the
// report tells the cases apart.
func TestFailoverNoConntrackd(t *testing.T) {
	needLab(t)
	cfg := failoverConfig(false, AdminStop)
	rep := run(t, cfg)
	var oneWay, bidir *FailoverSummary
	sums := rep.Summaries()
	for i, s := range sums {
		if s.Case.Kind != AdminStop {
			continue
		}
		switch s.Case.Streams {
		case OneWayWANLAN:
			oneWay = &sums[i]
		case Bidirectional:
			bidir = &sums[i]
		}
	}
	if oneWay == nil || bidir == nil {
		t.Fatalf("summaries %+v", sums)
	}
	if oneWay.NeverRecovered != cfg.Calls {
		t.Errorf("one-way: %d calls never recovered, want all %d", oneWay.NeverRecovered, cfg.Calls)
	}
	if bidir.NeverRecovered != 0 || bidir.Max >= 100 {
		t.Errorf("bidirectional: %d streams never recovered, glitch max %v: want all back within 100 ms", bidir.NeverRecovered, bidir.Max)
	}
	var text bytes.Buffer
	rep.WriteText(&text)
	rows := 0
	for _, line := range strings.Split(text.String(), "\n") {
		if strings.HasPrefix(line, "admin-stop ") && strings.Contains(line, "one-way") {
			rows++
			if !strings.Contains(line, " "+strconv.Itoa(cfg.Calls)+" ") {
				t.Errorf("the text report does not show the %d calls that never recovered:\n%s", cfg.Calls, line)
			}
		}
	}
	if rows == 0 {
		t.Errorf("the text report has no one-way admin-stop row:\n%s", text.String())
	}
}

// TestThroughputSearch runs a short search through the kernel's stateful
// forwarding and the XDP forwarder: both forward a few thousand packets
// per second without loss, and every trial's sender offered its rate.
func TestThroughputSearch(t *testing.T) {
	needLab(t)
	cfg := Config{Forwarders: []string{"kernel", "xdp"}, Sizes: []string{"g711"}, Trial: time.Second,
		Search: SearchConfig{Lo: 1000, Hi: 4000, Resolution: 1000, Trials: 1}, Transport: "raw", Threads: 1,
		Calls: 1, Reps: 1, Ptime: 20 * time.Millisecond}
	rep := run(t, cfg)
	if len(rep.Throughput) != 2 {
		t.Fatalf("%d throughput rows, want 2", len(rep.Throughput))
	}
	for _, row := range rep.Throughput {
		if row.AtLeast != 4000 || row.SenderBound || len(row.Search.Steps) == 0 {
			t.Errorf("%s: %s (at least %d pps, sender-bound %v, %d steps): want 4000 pps lossless", row.Case, row.Result, row.AtLeast, row.SenderBound, len(row.Search.Steps))
		}
		for _, s := range row.Search.Steps {
			for _, tr := range s.Trials {
				if tr.Sent == 0 || tr.Lost != 0 || tr.Received < tr.Sent*99/100 {
					t.Errorf("%s at %d pps: sent %d, lost %d, received %d", row.Case, s.PPS, tr.Sent, tr.Lost, tr.Received)
				}
			}
		}
		if row.Calls != row.AtLeast/100 {
			t.Errorf("%s: %d calls for %d pps, want pps / 100", row.Case, row.Calls, row.AtLeast)
		}
	}
}

// agreeWithCapture checks each stream's gap around the failure against
// the capture tcpdump took at its receiving host: the longest
// inter-arrival gap of its packets between the failure and the recovery.
//
// A capture that tcpdump says dropped packets is not compared: the result
// says whether the row was.
func agreeWithCapture(t *testing.T, cfg Config, row FailoverRow) bool {
	t.Helper()
	f := row.Analysis
	arrivals := map[string][]float64{} // "wan->lan ADDR:PORT" -> capture times, s
	for _, host := range []struct{ file, dir string }{{"lan", "wan->lan"}, {"wan", "lan->wan"}} {
		file := filepath.Join(cfg.Capture, slug(row.Case.String())+"-rep"+strconv.Itoa(row.Rep)+"-"+host.file+".pcap")
		if n, err := captureDropped(file + ".stats"); err != nil {
			t.Errorf("%s: %v", row.Case, err)
		} else if n > 0 {
			// The capture, not the media, lost these packets: it cannot
			// tell a gap from its own loss. The other rows are checked.
			t.Logf("%s: tcpdump dropped %d packets at the %s host: its capture is not compared", row.Case, n, host.file)
			return false
		}
		out, err := exec.Command("tshark", "-r", file, "-T", "fields", "-E", "separator=,",
			"-e", "frame.time_epoch", "-e", "ip.dst", "-e", "udp.dstport", "-Y", "udp && !icmp").Output()
		if err != nil {
			if host.file == "wan" && row.Case.Streams == OneWayWANLAN {
				continue
			}
			t.Fatalf("tshark %s: %v", file, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			p := strings.Split(sc.Text(), ",")
			if len(p) != 3 {
				continue
			}
			ts, err := strconv.ParseFloat(p[0], 64)
			if err != nil {
				continue
			}
			k := host.dir + " " + p[1] + ":" + p[2]
			arrivals[k] = append(arrivals[k], ts)
		}
	}
	// The same window as voipgen's analysis: gaps that end after the
	// failure (from the stream's last packet at or before it) and by the
	// end of the failover's analysis, when the recovery starts. The
	// capture goes on through the recovery: a gap that straddles its start
	// belongs to the recovery's row (voipgen's arrivals for this row stop
	// there), and one that ended before the failure was not the
	// failover's.
	from, to := float64(f.FailAt)/1e9, float64(f.End)/1e9
	tol := 2 * float64(cfg.Ptime/time.Millisecond)
	checked := 0
	for _, s := range f.Streams {
		ts := arrivals[s.Name]
		if len(ts) == 0 {
			t.Errorf("%s: no packet of %s in the capture", row.Case, s.Name)
			continue
		}
		sort.Float64s(ts)
		var gap float64
		for i := 1; i < len(ts); i++ {
			if ts[i] > from && ts[i] <= to {
				gap = max(gap, (ts[i]-ts[i-1])*1e3)
			}
		}
		if math.Abs(gap-float64(s.GapMs)) > tol {
			t.Errorf("%s: stream %s: voipgen saw a %.1f ms gap, the capture %.1f ms: want within %.0f ms", row.Case, s.Name, float64(s.GapMs), gap, tol)
		}
		checked++
	}
	if checked == 0 {
		t.Errorf("%s: no stream checked against the capture", row.Case)
	}
	return true
}

// captureDropped reads the packets tcpdump said the kernel dropped, from
// its closing statistics.
func captureDropped(statsFile string) (int, error) {
	b, err := os.ReadFile(statsFile)
	if err != nil {
		return 0, fmt.Errorf("tcpdump's statistics: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if n, ok := strings.CutSuffix(strings.TrimSpace(l), " packets dropped by kernel"); ok {
			return strconv.Atoi(n)
		}
	}
	return 0, fmt.Errorf("tcpdump's statistics %s: no line of packets dropped by kernel in %q", statsFile, b)
}

// BenchmarkThroughput searches the zero-loss rate of the pair b.N times
// per forwarder and reports the median, the spread over the searches and
// the search's own tolerance (its last bracket), so a rerun shows whether
// the search is repeatable within it:
//
//	go test -run '^$' -bench Throughput -benchtime 3x ./voipgen/fwtest/
func BenchmarkThroughput(b *testing.B) {
	testenv.NeedRoot(b)
	for _, fwd := range []string{"kernel", "xdp"} {
		b.Run(fwd, func(b *testing.B) {
			cfg := Config{Forwarders: []string{fwd}, Sizes: []string{"g711"}, Trial: 2 * time.Second,
				Search: SearchConfig{Lo: 5000, Hi: 200000, Resolution: 2000, Trials: 3}, Transport: "raw", Threads: 2,
				Calls: 1, Reps: 1, Ptime: 20 * time.Millisecond}
			var found, tol []float64
			senderBound := 0
			for b.Loop() {
				rep, err := Run(context.Background(), cfg)
				if err != nil || len(rep.Throughput) != 1 {
					b.Fatalf("%v (%d rows)", err, len(rep.Throughput))
				}
				row := rep.Throughput[0]
				found = append(found, float64(row.AtLeast))
				tol = append(tol, float64(row.Hi-row.Lo))
				if row.SenderBound {
					senderBound++
				}
			}
			sort.Float64s(found)
			b.ReportMetric(found[len(found)/2], "pps")
			b.ReportMetric(found[len(found)-1]-found[0], "spread-pps")
			b.ReportMetric(slices.Max(tol), "tolerance-pps")
			b.ReportMetric(float64(senderBound), "sender-bound")
		})
	}
}
