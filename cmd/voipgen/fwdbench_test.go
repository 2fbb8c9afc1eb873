package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseFwdbench(t *testing.T) {
	var out bytes.Buffer
	cfg, err := parseFwdbench([]string{"--quick"}, &out)
	if err != nil || cfg.step != quickStep || !cmp.Equal(cfg.rates, quickRates) || !cfg.has("xdp") || !cfg.has("kernel") {
		t.Errorf("--quick: %+v %v", cfg, err)
	}
	cfg, err = parseFwdbench([]string{"--rates", "20k, 1000,150k", "--modes", "xdp", "--step", "500ms", "--json"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !cmp.Equal(cfg.rates, []int{20000, 1000, 150000}) || cfg.has("kernel") || cfg.step != 500*time.Millisecond || !cfg.json {
		t.Errorf("got %+v", cfg)
	}
	if cfg.maxStreams() != 3000 {
		t.Errorf("maxStreams = %d, want 3000", cfg.maxStreams())
	}
	for _, bad := range [][]string{{"--rates", "10"}, {"--rates", "600k"}, {"--rates", "x"}, {"--modes", "dpdk"}, {"--step", "1ms"}, {"extra"}} {
		if _, err := parseFwdbench(bad, &out); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if streamsFor(100000) != 2000 || streamsFor(20) != 1 {
		t.Error("streamsFor")
	}
}

func TestSummarize(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	steps := []fwdStep{
		{Mode: "direct", OfferedPPS: 100000, Sent: 100, Received: 100, AchievedPPS: 100000},
		{Mode: "kernel", OfferedPPS: 100000, Sent: 100, Received: 100, AchievedPPS: 100000, RelayTaskNsPerPkt: f(400), RelayBusyNsPerPkt: f(500)},
		{Mode: "kernel", OfferedPPS: 100000, Sent: 100, Received: 100, AchievedPPS: 99000, RelayTaskNsPerPkt: f(600), RelayBusyNsPerPkt: f(700)},
		{Mode: "kernel", OfferedPPS: 200000, Sent: 100, Received: 90, Lost: 10, AchievedPPS: 180000, RelayTaskNsPerPkt: f(9999), RelayBusyNsPerPkt: f(9999)},
		{Mode: "xdp", OfferedPPS: 100000, Sent: 100, Received: 100, AchievedPPS: 100000, RelayTaskNsPerPkt: f(1000), RelayBusyNsPerPkt: f(1200), ProgNsPerRun: f(300)},
		{Mode: "xdp", OfferedPPS: 100000, Sent: 100, Received: 100, AchievedPPS: 100000, RelayTaskNsPerPkt: f(1200), RelayBusyNsPerPkt: f(1200), ProgNsPerRun: f(300)},
		{Mode: "xdp", OfferedPPS: 200000, Sent: 100, Received: 100, AchievedPPS: 150000, SenderLimited: true, RelayTaskNsPerPkt: f(1100), RelayBusyNsPerPkt: f(1200), ProgNsPerRun: f(300)},
	}
	s := summarize(steps, []string{"kernel", "xdp"})
	k, x := s.Modes[0], s.Modes[1]
	if k.MaxLosslessOfferedPPS != 100000 || k.MaxLosslessAchievedPPS != 100000 || k.RelayTaskNsPerPkt != 500 || k.At100kTaskNsPerPkt != 500 || k.Steps != 2 {
		t.Errorf("kernel: %+v", k)
	}
	if x.MaxLosslessAchievedPPS != 150000 || !x.MaxLosslessSenderLimited || x.RelayTaskNsPerPkt != 1100 || x.At100kTaskNsPerPkt != 1100 || x.ProgNsPerRun != 300 {
		t.Errorf("xdp: %+v", x)
	}
	if s.XDPOverKernelTasks != 2.2 || s.XDPOverKernelTasks100k != 2.2 {
		t.Errorf("ratios: %+v", s)
	}
	r := fwdReport{Steps: steps, Summary: s}
	var out bytes.Buffer
	r.writeText(&out)
	for _, want := range []string{"MODE", "xdp/kernel: 2.20", "sender-limited", "program share"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, out.String())
		}
	}
	// No lossless step: zeros, not NaN, and a note.
	s = summarize([]fwdStep{{Mode: "xdp", Sent: 10, Lost: 10}}, []string{"xdp"})
	if s.Modes[0].RelayTaskNsPerPkt != 0 || len(s.Notes) != 1 {
		t.Errorf("no lossless step: %+v", s)
	}
}
