package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relayd/relayd/sdes"
)

func modeNames(ms []fwdMode) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

func TestParseFwdbench(t *testing.T) {
	var out bytes.Buffer
	cfg, err := ParseFwd(nil, &out)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(modeNames(cfg.modes), []string{"kernel", "xdp", "user-w1", "user-w2", "aescm-w1", "gcm-w1"}); d != "" {
		t.Errorf("default modes (-got +want):\n%s", d)
	}
	if !cmp.Equal(cfg.flows, []int{1000, 10000}) || cfg.step != defaultStep || cfg.overload != defaultOver || !cmp.Equal(cfg.rates, defaultRates) {
		t.Errorf("defaults: %+v", cfg)
	}
	if cfg.relayNAPI {
		t.Error("relay NAPI threads by default")
	}
	if cfg, err = ParseFwd([]string{"--relay-napi"}, &out); err != nil || !cfg.relayNAPI {
		t.Errorf("--relay-napi: %+v %v", cfg, err)
	}
	cfg, err = ParseFwd([]string{"--quick"}, &out)
	if err != nil || cfg.step != quickStep || !cmp.Equal(cfg.rates, quickRates) || cfg.overload != quickOver || cfg.quietWait != quickQuiet {
		t.Errorf("--quick: %+v %v", cfg, err)
	}
	cfg, err = ParseFwd([]string{"--rates", "20k, 1000,150k", "--flows", "100,10", "--modes", "xdp,srtp,user-w3,userspace,user-w1,CMMSG,xdpmin,cmmsg",
		"--step", "500ms", "--overload", "0", "--json", "--quiet-wait", "0"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !cmp.Equal(cfg.rates, []int{20000, 1000, 150000}) || !cmp.Equal(cfg.flows, []int{10, 100}) || cfg.step != 500*time.Millisecond ||
		!cfg.JSON || cfg.overload != 0 || cfg.maxFlows() != 100 || cfg.quietWait != 0 {
		t.Errorf("got %+v", cfg)
	}
	if d := cmp.Diff(modeNames(cfg.modes), []string{"xdp", "aescm-w1", "gcm-w1", "user-w3", "user-w1", "user-w2", "cmmsg", "xdpmin"}); d != "" {
		t.Errorf("modes (-got +want):\n%s", d)
	}
	if m := cfg.modes[2]; m.Kind != "srtp" || m.Workers != 1 || m.Suite != sdes.AEAD_AES_128_GCM {
		t.Errorf("gcm-w1: %+v", m)
	}
	// The C relay is one thread, like one worker, and no relayd.
	if m := cfg.modes[6]; m.Kind != "cmmsg" || m.Workers != 1 || m.relayd() {
		t.Errorf("cmmsg: %+v, relayd %t", m, m.relayd())
	}
	if m := cfg.modes[7]; m.Kind != "xdpmin" || m.relayd() {
		t.Errorf("xdpmin: %+v, relayd %t", m, m.relayd())
	}
	// AF_XDP receive: user-wN or an SRTP mode with -xsk before -wN.
	cfg, err = ParseFwd([]string{"--modes", "user-xsk-w1,user-w1,aescm-xsk-w2@0s"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(cfg.modes, []fwdMode{{Name: "user-xsk-w1", Kind: "user", Workers: 1, IO: "afxdp"}, {Name: "user-w1", Kind: "user", Workers: 1},
		{Name: "aescm-xsk-w2@0s", Kind: "srtp", Workers: 2, Suite: sdes.AES_CM_128_HMAC_SHA1_80, Coalesce: "0s", IO: "afxdp"}}); d != "" {
		t.Errorf("modes (-got +want):\n%s", d)
	}
	for _, bad := range [][]string{
		{"--modes", "xdp-xsk-w1"}, {"--modes", "user-xsk"}, {"--modes", "cmmsg-xsk-w1"},
		{"--rates", "10"}, {"--rates", "2000k"}, {"--rates", "x"}, {"--flows", "20000"}, {"--flows", "0"},
		{"--modes", "dpdk"}, {"--modes", "user-w0"}, {"--modes", "aes-w1"}, {"--modes", "cmmsg-w2"}, {"--step", "1ms"}, {"extra"},
		// 10,000 flows at 5k pps: one packet per flow every 2 s.
		{"--flows", "10000", "--rates", "5k"},
	} {
		if _, err := ParseFwd(bad, &out); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if period(1000, 100000) != 10*time.Millisecond {
		t.Error("period")
	}
}

func TestSummarize(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	ok := func(mode string, flows, rate int, task, busy float64) fwdStep {
		return fwdStep{Mode: mode, Phase: mode, Flows: flows, OfferedPPS: rate, Sent: 100, Received: 100, SentPPS: float64(rate),
			AchievedPPS: float64(rate), RelayTaskNsPerPkt: f(task), RelayBusyNsPerPkt: f(busy), Comparable: true}
	}
	lossy := func(mode string, flows, rate int, ach float64, over bool) fwdStep {
		return fwdStep{Mode: mode, Phase: mode, Flows: flows, OfferedPPS: rate, Sent: 100, Received: 80, Lost: 20, LossPct: 20,
			SentPPS: float64(rate), AchievedPPS: ach, Overload: over}
	}
	x100 := ok("xdp", 1000, 100000, 1000, 1200)
	x100.ProgNsPerRun = f(300)
	lim := ok("xdp", 1000, 200000, 1100, 1200)
	lim.SenderLimited, lim.AchievedPPS, lim.Comparable = true, 150000, false
	steps := []fwdStep{
		{Mode: "direct", Phase: "kernel", Flows: 1000, OfferedPPS: 100000, Sent: 100, Received: 100},
		ok("kernel", 1000, 100000, 400, 500), ok("kernel", 1000, 100000, 600, 700),
		lossy("kernel", 1000, 200000, 180000, false), lossy("kernel", 1000, 200000, 180000, false),
		x100, x100, lim, lim,
		ok("user-w1", 1000, 50000, 4000, 4000), ok("user-w1", 1000, 50000, 4000, 4000),
		ok("user-w1", 1000, 100000, 3000, 3600), ok("user-w1", 1000, 100000, 3000, 3600),
		lossy("user-w1", 1000, 150000, 120000, false), lossy("user-w1", 1000, 150000, 120000, false),
		lossy("user-w1", 1000, 200000, 110000, true), lossy("user-w1", 1000, 200000, 110000, true),
		ok("aescm-w1", 1000, 50000, 4400, 4400), ok("aescm-w1", 1000, 50000, 4400, 4400),
		ok("aescm-w1", 1000, 100000, 3600, 3600), ok("aescm-w1", 1000, 100000, 3600, 3600),
		lossy("user-w2", 1000, 50000, 20000, false), lossy("user-w2", 1000, 50000, 20000, false),
		// The C relay: lossless at 50k and 100k, as user-w1 is.
		ok("cmmsg", 1000, 50000, 2000, 2200), ok("cmmsg", 1000, 50000, 2000, 2200),
		ok("cmmsg", 1000, 100000, 1500, 1800), ok("cmmsg", 1000, 100000, 1500, 1800),
		lossy("cmmsg", 1000, 150000, 140000, false), lossy("cmmsg", 1000, 150000, 140000, false),
	}
	// The minimal forwarder, its two runs far apart; its relay hops
	// (--relay-napi) 500 and 600 ns against xdp's 700 and 800.
	for i, task := range []float64{300, 700} {
		m := ok("xdpmin", 1000, 100000, task, task)
		m.ProgNsPerRun = f(100)
		m.HopNsPerPkt = f(500 + 100*float64(i))
		steps = append(steps, m)
	}
	for i := range steps {
		if steps[i].Mode == "xdp" && steps[i].OfferedPPS == 100000 {
			steps[i].HopNsPerPkt = f(700 + 100*float64(i%2))
		}
	}
	// A first attempt of a step whose runs disagreed: left out.
	sup := lossy("user-w1", 1000, 50000, 10, false)
	sup.Superseded = true
	steps = append(steps, sup, sup)
	installs := []fwdInstall{{Mode: "user-w1", Flows: 1000, Added: 1000, Seconds: 0.5}}
	modes, err := parseModes("kernel,xdp,user-w1,aescm-w1,user-w2,cmmsg,xdpmin")
	if err != nil {
		t.Fatal(err)
	}
	s := summarize(steps, installs, modes, []int{1000})
	got := map[string]fwdModeSummary{}
	for _, m := range s.Modes {
		got[m.Mode] = m
	}
	if k := got["kernel"]; k.MaxLosslessOfferedPPS != 100000 || k.RelayTaskNsPerPkt != 500 || k.At100kTaskNsPerPkt != 500 || k.Steps != 1 || !k.Overloaded {
		t.Errorf("kernel: %+v", k)
	}
	if x := got["xdp"]; x.MaxLosslessAchievedPPS != 150000 || !x.MaxLosslessSenderLimited || x.RelayTaskNsPerPkt != 1000 ||
		x.At100kTaskNsPerPkt != 1000 || x.ProgNsPerRun != 300 || x.Overloaded || x.RelayTaskMaxNs != 1000 {
		t.Errorf("xdp: %+v", x)
	}
	u := got["user-w1"]
	if u.MaxLosslessOfferedPPS != 100000 || u.PPSPerWorker != 100000 || u.PeakAchievedPPS != 120000 || u.Collapse || !u.Overloaded ||
		len(u.Curve) != 4 || !u.Curve[3].Overload || u.InstallS != 0.5 || u.RelayTaskNsPerPkt != 3500 {
		t.Errorf("user-w1: %+v", u)
	}
	if w2 := got["user-w2"]; w2.Steps != 0 || w2.PeakPPSPerWorker != 10000 || w2.Collapse {
		t.Errorf("user-w2: %+v", w2)
	}
	r := map[string]fwdRatio{}
	for _, q := range s.Ratios {
		r[q.Name] = q
	}
	if q := r["xdp/kernel"]; q.Tasks != 2 || !cmp.Equal(q.Rates, []int{100000}) || q.SRTP || q.TasksLo != 1000.0/600 || q.TasksHi != 2.5 || q.Prog != 0 {
		t.Errorf("xdp/kernel: %+v", q)
	}
	// The runs' spread bounds the ratio; the programs' times compare too.
	if q := r["xdp/xdpmin"]; q.Tasks != 2 || q.TasksLo != 1000.0/700 || q.TasksHi != 1000.0/300 || q.Prog != 3 || q.ProgNumNs != 300 || q.ProgDenNs != 100 {
		t.Errorf("xdp/xdpmin: %+v", q)
	}
	// The relay hops: means 750 and 550, bounded by the runs' extremes.
	if q := r["xdp/xdpmin"]; q.Hop != 750.0/550 || q.HopNumNs != 750 || q.HopDenNs != 550 || q.HopLo != 700.0/600 || q.HopHi != 800.0/500 {
		t.Errorf("xdp/xdpmin relay hop: %+v", q)
	}
	// No hop where a mode had none.
	if q := r["xdp/kernel"]; q.Hop != 0 || q.HopNumNs != 0 {
		t.Errorf("xdp/kernel relay hop: %+v", q)
	}
	if q := r["xdp/user-w1"]; q.Tasks != 1.0/3 || q.SRTP {
		t.Errorf("xdp/user-w1: %+v", q)
	}
	if q := r["aescm-w1/user-w1"]; q.Tasks != 4000.0/3500 || !cmp.Equal(q.Rates, []int{50000, 100000}) || !q.SRTP {
		t.Errorf("aescm-w1/user-w1: %+v", q)
	}
	// user-w1 (4000, 3000 ns) against the C relay (2000, 1500 ns) at the
	// two rates both carried without loss; not at 150k, where both lost.
	if q := r["user-w1/cmmsg"]; q.Tasks != 2 || q.NumNs != 3500 || q.DenNs != 1750 || q.Busy != 7600.0/4000 ||
		!cmp.Equal(q.Rates, []int{50000, 100000}) || q.SRTP {
		t.Errorf("user-w1/cmmsg: %+v", q)
	}
	if c := got["cmmsg"]; c.PPSPerWorker != 100000 || c.RelayTaskNsPerPkt != 1750 || !c.Overloaded {
		t.Errorf("cmmsg: %+v", c)
	}
	// Only modes of the run are compared: no figure from elsewhere.
	for name := range r {
		if strings.Contains(name, "(ref)") {
			t.Errorf("ratio %s against a reference figure", name)
		}
	}
	notes := strings.Join(s.Notes, "\n")
	if !strings.Contains(notes, "1 step(s) were run again") ||
		!strings.Contains(notes, "xdp/xdpmin at 1000 flows: the runs put the ratio anywhere in 1.43..3.33") ||
		!strings.Contains(notes, "compare 3.00") || !strings.Contains(notes, "compare 1.36 (runs 1.17..1.60)") || strings.Contains(notes, "xdp/kernel at") {
		t.Errorf("notes: %q", s.Notes)
	}
	if _, ok := r["user-w2/user-w1"]; ok {
		t.Error("user-w2/user-w1 without a common lossless rate")
	}
	rep := FwdReport{Steps: steps, Summary: s}
	var out bytes.Buffer
	rep.WriteText(&out)
	if strings.Contains(out.String(), "goal") || strings.Contains(out.String(), ": met") || strings.Contains(out.String(), "NOT met") {
		t.Errorf("text output judges against a goal:\n%s", out.String())
	}
	for _, want := range []string{"MODE", "xdp/user-w1", "aescm-w1/user-w1", "user-w1/cmmsg", "(1000 / 500 ns; runs 1.43..3.33)", "programs 3.00 (300 / 100 ns a run)", "relay hop 1.36 (750 / 550 ns; runs 1.17..1.60)", "HOP_NS", "SRTP overhead +14%", "150.0k*", "graceful", "3000..4000", "loss curves", "user-w1    1000 flows: 50.0k 0.00%"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, out.String())
		}
	}
	// No lossless step: zeros, not NaN, and a note; a collapse is noted.
	s = summarize([]fwdStep{
		lossy("xdp", 10, 1000, 900, false), lossy("xdp", 10, 2000, 400, true),
	}, nil, modes[1:2], []int{10})
	if s.Modes[0].RelayTaskNsPerPkt != 0 || !s.Modes[0].Collapse || len(s.Notes) != 2 {
		t.Errorf("no lossless step: %+v", s)
	}
}

func TestParseRelayCounters(t *testing.T) {
	text := `# HELP relayd_packets_total Packets by verdict.
# TYPE relayd_packets_total counter
relayd_packets_total{reason="redirect",verdict="forward"} 1.5e+06
relayd_packets_total{reason="userspace_send",verdict="forward"} 20
relayd_packets_total{reason="wrong_source",verdict="drop"} 3
relayd_packets_total{reason="userspace_srtp_auth",verdict="drop"} 4
relayd_packets_total{reason="no_flow",verdict="pass"} 7
relayd_bytes_total{reason="redirect",verdict="forward"} 9e+09
`
	c, err := parseRelayCounters(text)
	if err != nil {
		t.Fatal(err)
	}
	fwd, drop, reasons := c.since(relayCounters{drops: map[string]uint64{"wrong_source": 3}})
	if fwd != 1500020 || drop != 4 || !cmp.Equal(reasons, map[string]uint64{"userspace_srtp_auth": 4}) {
		t.Errorf("got %d forwarded, %d dropped %v; want 1500020, 4 srtp_auth", fwd, drop, reasons)
	}
	if c.userspace != 20 {
		t.Errorf("got %d forwarded by userspace, want 20", c.userspace)
	}
	if _, err := parseRelayCounters("go_goroutines 5\n"); err == nil {
		t.Error("no counters: no error")
	}
}

func TestDisturbed(t *testing.T) {
	ok := fwdStep{Mode: "user-w1", Sent: 10, Received: 10}
	bad := fwdStep{Mode: "user-w1", Sent: 10, Received: 5, Lost: 5}
	d := fwdStep{Mode: "direct", Sent: 10, Received: 10, OfferedPPS: 100000}
	dbad := fwdStep{Mode: "direct", Sent: 10, Received: 9, Lost: 1}
	dshort := d
	dshort.SenderLimited = true
	short := ok
	short.SenderLimited = true
	for _, c := range []struct {
		runs      []fwdStep
		senderMax float64
		want      bool
	}{
		{[]fwdStep{d, ok, ok, d}, 0, false},
		{[]fwdStep{d, bad, bad, d}, 0, false}, // both lost: the relay's limit
		{[]fwdStep{d, ok, bad, d}, 0, true},
		{[]fwdStep{d, ok, ok, dbad}, 0, true},
		{[]fwdStep{dshort, ok, ok, d}, 200000, true},  // the sender did 200k before
		{[]fwdStep{dshort, ok, ok, d}, 105000, false}, // near the sender's limit
		{[]fwdStep{d, ok, short, d}, 0, true},
		{[]fwdStep{d, short, short, d}, 0, false},
		{[]fwdStep{ok, short}, 0, true}, // overload steps are never rerun, but the rule holds
	} {
		if got := disturbed(c.runs, c.senderMax); got != c.want {
			t.Errorf("disturbed(%v, %.0f) = %v, want %v", c.runs, c.senderMax, got, c.want)
		}
	}
}

// TestWorkerDelay: the workers' histogram and wake-ups are read from
// relayd's metrics and a run's quantiles taken from their increase.
func TestWorkerDelay(t *testing.T) {
	metrics := func(b50, b100, b200, inf, wakes, naps, batches int) string {
		return fmt.Sprintf(`relayd_packets_total{reason="userspace_forward",verdict="forward"} 0
relayd_userspace_delay_seconds_bucket{le="5e-05"} %d
relayd_userspace_delay_seconds_bucket{le="0.0001"} %d
relayd_userspace_delay_seconds_bucket{le="0.0002"} %d
relayd_userspace_delay_seconds_bucket{le="+Inf"} %d
relayd_userspace_delay_seconds_sum 0.1
relayd_userspace_delay_seconds_count %d
relayd_userspace_wakeups_total{kind="nap"} %d
relayd_userspace_wakeups_total{kind="socket"} %d
relayd_userspace_batches_total %d
relayd_userspace_afxdp_packets_total %d
`, b50, b100, b200, inf, inf, naps, wakes, batches, inf-10) // from the first reading on, every packet through AF_XDP
	}
	before, err := parseRelayCounters(metrics(10, 10, 10, 10, 5, 0, 5))
	if err != nil {
		t.Fatal(err)
	}
	// This run: 100 packets, 40 within 50 us, 95 within 100 us, 99 within 200 us, 1 above.
	after, err := parseRelayCounters(metrics(50, 105, 109, 110, 7, 18, 25))
	if err != nil {
		t.Fatal(err)
	}
	got := after.workerDelay(before)
	want := &WorkerDelay{Packets: 100, P50US: 100, P99US: 200, Wakeups: 2, Naps: 18, Batches: 20, PerBatch: 5, AFXDP: 100}
	if got == nil || *got != *want {
		t.Errorf("workerDelay = %+v, want %+v", got, want)
	}
	if d := before.workerDelay(before); d != nil {
		t.Errorf("no packets: %+v, want nil", d)
	}
	// 100 more, 10 of them past the last bucket: p99 is "more than
	// 200 us", and the report still encodes (JSON has no infinity).
	late, err := parseRelayCounters(metrics(90, 195, 199, 210, 9, 36, 45))
	if err != nil {
		t.Fatal(err)
	}
	got = late.workerDelay(after)
	want = &WorkerDelay{Packets: 100, P50US: 100, P99US: 200, P99Over: true, Wakeups: 2, Naps: 18, Batches: 20, PerBatch: 5, AFXDP: 100}
	if got == nil || *got != *want {
		t.Errorf("workerDelay past the last bucket = %+v, want %+v", got, want)
	}
	if b, err := json.Marshal(got); err != nil || !strings.Contains(string(b), `"p99_us":200,"p99_over":true`) {
		t.Errorf("json: %s, %v; want p99_us 200 with p99_over", b, err)
	}
}

// TestAFXDPDrops: the kernel's drops into the workers' AF_XDP sockets
// count as relayd's, by reason, beside its own verdicts.
func TestAFXDPDrops(t *testing.T) {
	metrics := func(rate, noFrame, full int) string {
		return fmt.Sprintf(`relayd_packets_total{reason="userspace_forward",verdict="forward"} 100
relayd_packets_total{reason="rate",verdict="drop"} %d
relayd_userspace_afxdp_dropped_total{reason="no_frame"} %d
relayd_userspace_afxdp_dropped_total{reason="rx_ring_full"} %d
relayd_userspace_afxdp_fill_frames 1024
`, rate, noFrame, full)
	}
	before, err := parseRelayCounters(metrics(1, 2, 0))
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseRelayCounters(metrics(1, 9, 4))
	if err != nil {
		t.Fatal(err)
	}
	_, dropped, reasons := after.since(before)
	if want := map[string]uint64{"afxdp_no_frame": 7, "afxdp_rx_ring_full": 4}; dropped != 11 || !maps.Equal(reasons, want) {
		t.Errorf("dropped %d %v, want 11 %v", dropped, reasons, want)
	}
}
