package bench

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseBench(t *testing.T) {
	c, err := Parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.calls; len(got) != 6 || got[0] != 250 || got[5] != 5000 {
		t.Errorf("default calls %v", got)
	}
	if strings.Join(c.modes, ",") != "xdp,userspace,srtp" || c.rtpengine || len(c.sipCalls) != 1 || c.sipCalls[0] != 200 {
		t.Errorf("modes %v rtpengine %v", c.modes, c.rtpengine)
	}
	if c, err := Parse([]string{"--sip-calls", "0"}, io.Discard); err != nil || len(c.sipCalls) != 0 {
		t.Errorf("--sip-calls 0: %v %v", c.sipCalls, err)
	}
	c, err = Parse([]string{"--calls", "1k,20,20", "--modes", "userspace,xdp", "--with-rtpengine", "--server-price", "5000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.calls) != 2 || c.calls[0] != 20 || c.calls[1] != 1000 || strings.Join(c.modes, ",") != "userspace,xdp" || !c.rtpengine || c.price != 5000 {
		t.Errorf("%+v", c)
	}
	c, err = Parse([]string{"--modes", "transcode", "--with-rtpengine", "--transcode-calls", "50,10,50"}, io.Discard)
	if err != nil || strings.Join(c.modes, ",") != "transcode" || len(c.transcodeCalls) != 2 || c.transcodeCalls[0] != 10 || c.transcodeCalls[1] != 50 {
		t.Errorf("transcode: %+v %v", c, err)
	}
	c, err = Parse([]string{"--calls", "7000,13k", "--sender", "xdp", "--sink", "xdp"}, io.Discard)
	if err != nil || len(c.calls) != 2 || c.calls[0] != 7000 || c.calls[1] != 13000 || c.sender != benchEndXDP || c.sink != benchEndXDP {
		t.Errorf("xdp ends, 13k calls: %+v %v", c, err)
	}
	if c, err := Parse(nil, io.Discard); err != nil || c.sender != benchEndMmsg || c.sink != benchEndMmsg {
		t.Errorf("default ends %q %q (%v), want mmsg", c.sender, c.sink, err)
	}
	for _, bad := range [][]string{{"--calls", "14000"}, {"--calls", "6000", "--static-flows"}, {"--sender", "raw"}, {"--sink", "socket"},
		{"--modes", "transcode", "--sink", "xdp"}, {"--modes", "xdp,transcode", "--sender", "xdp"}, {"--calls", "0"}, {"--modes", "kernel"}, {"--step", "10ms"}, {"--transcode-calls", "0"},
		{"--server-price", "0"}, {"--sip-calls", "-1"}, {"--sip-calls", "6000"}, {"--out", ""}, {"extra"}} {
		if _, err := Parse(bad, io.Discard); err == nil {
			t.Errorf("parseBench(%q) succeeded", bad)
		}
	}
}

func TestTHPMode(t *testing.T) {
	for in, want := range map[string]string{
		"always [madvise] never\n": "madvise",
		"[always] madvise never\n": "always",
		"always madvise [never]":   "never",
		"always madvise never\n":   "",
		"":                         "",
		"[] x":                     "",
	} {
		if got := thpMode([]byte(in)); got != want {
			t.Errorf("thpMode(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCPUGHz(t *testing.T) {
	in := "processor\t: 0\ncpu MHz\t\t: 2000.000\nprocessor\t: 1\ncpu MHz\t\t: 2200.500\n"
	if got := cpuGHz(strings.NewReader(in)); got < 2.1 || got > 2.1003 {
		t.Errorf("cpuGHz = %v, want 2.10025", got)
	}
	if got := cpuGHz(strings.NewReader("model name: x\n")); got != 0 {
		t.Errorf("cpuGHz without MHz = %v", got)
	}
}

func f64(v float64) *float64 { return &v }

// benchRuns makes a step's four runs: direct, relay, relay, direct.
func benchRuns(mode string, sent uint64, lost int64, relayNs float64) []fwdStep {
	relay := func() fwdStep {
		return fwdStep{Mode: mode, Sent: sent, Received: uint64(int64(sent) - lost), Lost: lost, Relayed: int64(sent) - lost,
			SentPPS: float64(sent), Comparable: true, RelayTaskNsPerPkt: f64(relayNs), RelayBusyNsPerPkt: f64(relayNs * 1.1)}
	}
	d := fwdStep{Mode: "direct", Sent: sent, Received: sent, SentPPS: float64(sent)}
	return []fwdStep{d, relay(), relay(), d}
}

func testBenchReport() *Report {
	rep := &Report{Config: map[string]any{"cpus": 2, "cpu_ghz": "2.00", "server_price_usd": 2000}}
	for _, s := range []struct {
		relay string
		calls int
		lost  int64
		ns    float64
	}{{"xdp", 1000, 0, 1000}, {"xdp", 2000, 0, 1200}, {"userspace", 1000, 0, 4000}, {"userspace", 2000, 10, 5000}, {"rtpengine", 1000, 0, 9000}} {
		rep.Rows = append(rep.Rows, benchRowFromRuns(s.relay, benchMediaStatic, s.calls, benchRuns(s.relay, uint64(100*s.calls), s.lost, s.ns), 2))
	}
	// A step the sender could not offer in full does not count as carried.
	short := benchRowFromRuns("xdp", benchMediaStatic, 4000, benchRuns("xdp", 300000, 0, 1000), 2)
	short.SenderLimited, short.Comparable = true, false
	rep.Rows = append(rep.Rows, short)
	summarizeBench(rep, []string{"xdp", "userspace", "rtpengine"}, 2, 2, 2000)
	return rep
}

func TestBenchSummary(t *testing.T) {
	rep := testBenchReport()
	r := rep.Rows[0]
	if r.Sent != 200000 || r.Received != 200000 || r.Relayed != 200000 || r.Lost != 0 || !r.Comparable || r.TaskNsPerPkt != 1000 {
		t.Errorf("row %+v", r)
	}
	// 1000 ns x 100,000 pps = 0.1 CPU of 2: 5%.
	if r.TaskCPUPct < 4.99 || r.TaskCPUPct > 5.01 {
		t.Errorf("CPU %% %v, want 5", r.TaskCPUPct)
	}
	byRelay := map[string]benchSummary{}
	for _, s := range rep.Summaries {
		byRelay[s.Relay] = s
	}
	x, u, e := byRelay["xdp"], byRelay["userspace"], byRelay["rtpengine"]
	if x.MaxZeroLossCalls != 2000 || u.MaxZeroLossCalls != 1000 || u.FirstLossCalls != 2000 || e.MaxZeroLossCalls != 1000 {
		t.Errorf("zero-loss calls: xdp %+v userspace %+v rtpengine %+v", x, u, e)
	}
	if x.TaskNsPerPkt != 1100 || u.TaskNsPerPkt != 4000 || u.Steps != 1 {
		t.Errorf("ns/pkt: xdp %v userspace %v (%d steps)", x.TaskNsPerPkt, u.TaskNsPerPkt, u.Steps)
	}
	// 1e9 / (1100 ns x 100 pps) / 2 GHz = 4545 calls per GHz; 4 GHz in all.
	if x.CallsPerGHz < 4545 || x.CallsPerGHz > 4546 || x.ProjectedCalls < 18181 || x.ProjectedCalls > 18182 {
		t.Errorf("xdp calls/GHz %v projected %v", x.CallsPerGHz, x.ProjectedCalls)
	}
	if x.CostPerPortMeasured != 1 || x.CostPerPortProjected < 0.11 || x.CostPerPortProjected > 0.111 {
		t.Errorf("cost per port %v %v", x.CostPerPortMeasured, x.CostPerPortProjected)
	}
	// Ratios over the steps both relays completed: xdp's 2000-call step
	// has no lossless userspace partner, so only 1000 calls count (1000 /
	// 4000 ns), not the medians over different steps (1100 / 4000).
	if len(rep.Ratios) != 3 || rep.Ratios[0].What != "xdp / userspace (CPU per packet)" || rep.Ratios[0].Task != 1000.0/4000 ||
		len(rep.Ratios[0].Steps) != 1 || rep.Ratios[0].Steps[0].Calls != 1000 {
		t.Errorf("ratios %+v", rep.Ratios)
	}
}

func TestBenchOutputs(t *testing.T) {
	rep := testBenchReport()
	dir := t.TempDir()
	if err := rep.WriteOutputs(dir); err != nil {
		t.Fatal(err)
	}
	checkBenchOutputs(t, dir, rep)
	var buf bytes.Buffer
	rep.WriteText(&buf)
	for _, want := range []string{"CPU sweep", "xdp / userspace", "plots: "} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestIdleBelowZero: an idle cross-check figure below zero (the machine's
// other work varied more than the relay cost) prints as "<0", never as a
// negative CPU figure, and a ratio of such figures as "-".
func TestIdleBelowZero(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{-250.4, "<0"}, {0, "0"}, {812.6, "813"}, {math.NaN(), "-"}} {
		if got := fmtIdle(c.v, "%.0f"); got != c.want {
			t.Errorf("fmtIdle(%v) = %q, want %q", c.v, got, c.want)
		}
	}
	for _, c := range []struct {
		v    float64
		want string
	}{{-0.4, "-"}, {0, "-"}, {math.NaN(), "-"}, {1.234, "1.23"}} {
		if got := fmtIdleRatio(c.v); got != c.want {
			t.Errorf("fmtIdleRatio(%v) = %q, want %q", c.v, got, c.want)
		}
	}
	rep := testBenchReport()
	rep.Rows[0].IdleNsPerPkt, rep.Rows[0].IdleCPUPct = -250.4, -1.25
	rep.Summaries[0].IdleNsPerPkt = -97
	var buf bytes.Buffer
	rep.WriteText(&buf)
	text := buf.String()
	for _, bad := range []string{"-250", "-1.2", "-97"} {
		if strings.Contains(text, bad) {
			t.Errorf("text shows the negative idle figure %s:\n%s", bad, text)
		}
	}
	if strings.Count(text, "<0") < 4 { // the legend, the row twice, the summary
		t.Errorf("text shows <0 fewer than 4 times:\n%s", text)
	}
}

// TestRelaydRatio: srtp / userspace is given over relayd's own threads
// too, from the relay runs' relayd label minus the direct runs', over the
// steps both modes carried; pairs that are not both relayd's workers get
// no such line.
func TestRelaydRatio(t *testing.T) {
	withOwn := func(runs []fwdStep, relayd, direct float64) []fwdStep {
		for i := range runs {
			if runs[i].Mode == "direct" {
				continue
			}
			// What relayCost leaves: the relay run's label minus the
			// direct runs' mean.
			runs[i].RelayLabelNsPkt = map[string]float64{"relayd": relayd - direct, "sender": 300}
		}
		return runs
	}
	rep := &Report{Config: map[string]any{"cpus": 2, "cpu_ghz": "2.00", "server_price_usd": 2000}}
	for _, s := range []struct {
		relay         string
		calls         int
		lost          int64
		tasks, relayd float64
	}{
		{"userspace", 250, 0, 4000, 3000}, {"srtp", 250, 0, 6000, 3600},
		{"userspace", 500, 0, 3000, 2500}, {"srtp", 500, 0, 3600, 3250},
		{"userspace", 1000, 0, 2800, 2400}, {"srtp", 1000, 5, 3000, 2600}, // srtp lost: not common
		{"xdp", 250, 0, 900, 40},
	} {
		runs := withOwn(benchRuns(s.relay, uint64(100*s.calls), s.lost, s.tasks), s.relayd+50, 50)
		rep.Rows = append(rep.Rows, benchRowFromRuns(s.relay, benchMediaSIP, s.calls, runs, 2))
	}
	if got := rep.Rows[1].RelaydNsPerPkt; got != 3600 {
		t.Fatalf("srtp 250 calls: relayd_ns_per_pkt %v, want 3600", got)
	}
	summarizeBench(rep, []string{"xdp", "userspace", "srtp"}, 2, 2, 2000)
	var own []benchRatio
	for _, r := range rep.Ratios {
		if strings.Contains(r.What, "relayd's threads") {
			own = append(own, r)
		}
	}
	if len(own) != 1 || own[0].What != "srtp / userspace (relayd's threads)" {
		t.Fatalf("relayd's-threads ratios %+v, want srtp / userspace only", own)
	}
	// Steps 250 and 500: 3600/3000 and 3250/2500; medians 3425 / 2750.
	r := own[0]
	if len(r.Steps) != 2 || r.Steps[0].Calls != 250 || r.Steps[0].Task != 1.2 || r.Steps[1].Task != 1.3 || r.Task != 3425.0/2750 || r.Idle != 0 {
		t.Errorf("ratio %+v", r)
	}
	var buf bytes.Buffer
	rep.WriteText(&buf)
	if !strings.Contains(buf.String(), "srtp / userspace (relayd's threads)") || !strings.Contains(buf.String(), "250 calls 1.20, 500 calls 1.30") {
		t.Errorf("text lacks the relayd's-threads ratio:\n%s", buf.String())
	}
}

// checkBenchOutputs checks that bench.json parses and the four plots are
// there and not empty.
func checkBenchOutputs(t *testing.T, dir string, rep *Report) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("bench.json: %v", err)
	}
	if len(got.Rows) != len(rep.Rows) || len(got.Summaries) != len(rep.Summaries) {
		t.Errorf("bench.json: %d rows %d summaries, want %d %d", len(got.Rows), len(got.Summaries), len(rep.Rows), len(rep.Summaries))
	}
	for _, name := range []string{"cpu.png", "cpu.svg", "nsperpkt.png", "nsperpkt.svg"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Size() < 1000 {
			t.Errorf("plot %s: %v (%v)", name, fi, err)
		}
	}
	if len(got.Plots) != 4 {
		t.Errorf("plots %v", got.Plots)
	}
}

// TestWriteSIP: a SIP phase's jitter and gap are printed beside the direct
// run of the same calls, and only when that run came up whole.
func TestWriteSIP(t *testing.T) {
	whole := &benchSIPMedia{Succeeded: 200, WithMedia: 200, JitterP50Ms: 0.12, JitterP99Ms: 0.5, JitterMaxMs: 0.9, MaxGapMs: 43}
	rep := &Report{SIP: []benchSIP{
		{Relay: "xdp", Calls: 200, Succeeded: 200, WithMedia: 200, JitterP50Ms: 0.18, JitterP99Ms: 0.8, JitterMaxMs: 1.5, MaxGapMs: 51.2, Direct: whole},
		{Relay: "userspace", Calls: 200, Succeeded: 200, WithMedia: 200, JitterP50Ms: 14.5, JitterMaxMs: 37, MaxGapMs: 750,
			Direct: &benchSIPMedia{Succeeded: 150, WithMedia: 150, Error: "first errors: [\"timeout\"]"}},
		{Relay: "xdp", Calls: 50, Succeeded: 50, WithMedia: 50, JitterP50Ms: 3.3, MaxGapMs: 99.9},
	}}
	var b bytes.Buffer
	rep.writeSIP(&b)
	lines := strings.Split(b.String(), "\n")
	if len(lines) < 6 || !strings.Contains(lines[2], "direct jitter p50/p99/max ms") {
		t.Fatalf("output:\n%s", b.String())
	}
	if f := strings.Fields(lines[3]); f[8] != "0.18/0.80/1.50" || f[9] != "51.2" || f[13] != "0.12/0.50/0.90" || f[14] != "43.0" {
		t.Errorf("relay beside a whole direct run: %q", lines[3])
	}
	for _, l := range lines[4:6] {
		if f := strings.Fields(l); f[8] != "-" || f[9] != "-" {
			t.Errorf("relay's jitter shown without a whole direct run: %q", l)
		}
	}
	out := b.String()
	if !strings.Contains(out, "userspace 200 calls: the direct run did not bring all calls up with media (150 of 200)") ||
		!strings.Contains(out, "xdp 50 calls: no direct run of the same calls") ||
		!strings.Contains(out, "xdp 200 calls: receiver jitter p99 0.80 ms, +0.30 ms against the direct run (goal: within 0.5 ms)") {
		t.Errorf("notes missing:\n%s", out)
	}
}

// TestXSKRatios: the AF_XDP modes are compared in the same run with the
// socket modes they stand beside and with rtpengine, and srtp-xsk with
// userspace-xsk over relayd's own threads too.
func TestXSKRatios(t *testing.T) {
	c, err := Parse([]string{"--modes", "userspace,userspace-xsk,srtp,srtp-xsk", "--with-rtpengine"}, io.Discard)
	if err != nil || strings.Join(c.modes, ",") != "userspace,userspace-xsk,srtp,srtp-xsk" {
		t.Fatalf("modes %v: %v", c.modes, err)
	}
	rep := &Report{Config: map[string]any{"cpus": 2, "cpu_ghz": "2.00", "server_price_usd": 2000}}
	for _, s := range []struct {
		relay         string
		tasks, relayd float64
	}{{"userspace", 4000, 3000}, {userspaceXSK, 3000, 2000}, {"srtp", 4800, 3600}, {srtpXSK, 3900, 2500}, {"rtpengine", 8000, 7000}} {
		runs := benchRuns(s.relay, 50000, 0, s.tasks)
		for i := range runs {
			if runs[i].Mode != "direct" {
				runs[i].RelayLabelNsPkt = map[string]float64{"relayd": s.relayd}
			}
		}
		rep.Rows = append(rep.Rows, benchRowFromRuns(s.relay, benchMediaSIP, 500, runs, 2))
	}
	summarizeBench(rep, []string{"userspace", userspaceXSK, "srtp", srtpXSK, "rtpengine"}, 2, 2, 2000)
	got := map[string]float64{}
	for _, r := range rep.Ratios {
		got[r.What] = r.Task
	}
	for what, want := range map[string]float64{
		"userspace-xsk / userspace (CPU per packet)":  0.75,
		"userspace-xsk / rtpengine (CPU per packet)":  0.375,
		"srtp-xsk / userspace-xsk (CPU per packet)":   1.3,
		"srtp-xsk / srtp (CPU per packet)":            3900.0 / 4800,
		"srtp-xsk / userspace-xsk (relayd's threads)": 1.25,
		"userspace / rtpengine (CPU per packet)":      0.5,
		"srtp / userspace (relayd's threads)":         1.2,
	} {
		if g, ok := got[what]; !ok || g != want {
			t.Errorf("%s: %v (present %v), want %v", what, g, ok, want)
		}
	}
	if len(got) != 7+1 { // and srtp / userspace (CPU per packet)
		t.Errorf("ratios %v", got)
	}
}
