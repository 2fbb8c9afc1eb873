package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/relayd/relayd/lab/labrelay"
)

// TestFwdbenchSmall runs fwdbench at a tiny scale (100 streams, 5,000 pps,
// one step of 1 s runs) and checks the bookkeeping, not any speed: every
// packet the sink counted in the xdp runs went through relayd's flows, and
// every CPU figure is positive.
func TestFwdbenchSmall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fwdbench needs root: network namespaces, XDP, BPF statistics")
	}
	if testing.Short() {
		t.Skip("builds relayd and a lab: skipped with -short")
	}
	bin, err := labrelay.Build()
	if err != nil {
		t.Fatal(err)
	}
	cfg := fwdConfig{rates: []int{5000}, step: time.Second, modes: []string{"kernel", "xdp"}, relayd: bin, allSteps: true}
	rep, err := fwdbench(context.Background(), cfg, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]int{}
	for _, s := range rep.Steps {
		modes[s.Mode]++
		if s.Streams != 100 || s.Sent == 0 {
			t.Errorf("%s: %d streams sent %d packets, want 100 streams and packets", s.Mode, s.Streams, s.Sent)
		}
		if s.Lost != 0 || s.StreamsShort != 0 {
			t.Errorf("%s: lost %d packets, %d streams short", s.Mode, s.Lost, s.StreamsShort)
		}
		if s.TaskNsPerPkt <= 0 || s.LabelNsPkt["sender"] <= 0 || s.LabelNsPkt["sink"] <= 0 {
			t.Errorf("%s: CPU per packet %.0f ns (sender %.0f, sink %.0f), want positive",
				s.Mode, s.TaskNsPerPkt, s.LabelNsPkt["sender"], s.LabelNsPkt["sink"])
		}
		switch s.Mode {
		case "xdp":
			if s.Relayed != int64(s.Received) {
				t.Errorf("xdp: relayd's flows counted %d packets, the sink received %d", s.Relayed, s.Received)
			}
			if s.ProgNsPerRun == nil || *s.ProgNsPerRun <= 0 || s.ProgRuns < s.Received {
				t.Errorf("xdp: program %d runs, %v ns per run, want at least %d runs and positive time", s.ProgRuns, s.ProgNsPerRun, s.Received)
			}
			if s.RelayTaskNsPerPkt == nil {
				t.Error("xdp: no relay cost")
			}
		case "kernel", "direct":
			if s.Relayed != -1 || s.ProgNsPerRun != nil {
				t.Errorf("%s: relayed %d, program figure %v, want none", s.Mode, s.Relayed, s.ProgNsPerRun)
			}
		}
	}
	if modes["direct"] != 4 || modes["kernel"] != 2 || modes["xdp"] != 2 {
		t.Errorf("runs per mode %v, want direct 4, kernel 2, xdp 2", modes)
	}
	if len(rep.Summary.Modes) != 2 {
		t.Errorf("summary: %+v", rep.Summary)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) { w.t.Logf("%s", b); return len(b), nil }
