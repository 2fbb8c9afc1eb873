package bench

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"

	"github.com/relayd/relayd/lab/labrelay"
)

// fwdbenchT runs fwdbench at a tiny scale (100 flows, 5,000 pps, one step
// of 1 s runs) for modes, skipping without root or with -short.
func fwdbenchT(t *testing.T, modes string, opts ...func(*FwdConfig)) *FwdReport {
	t.Helper()
	testenv.NeedRoot(t)
	if testing.Short() {
		t.Skip("builds relayd and a lab: skipped with -short")
	}
	bin, err := labrelay.Build()
	if err != nil {
		t.Fatal(err)
	}
	ms, err := parseModes(modes)
	if err != nil {
		t.Fatal(err)
	}
	cfg := FwdConfig{rates: []int{5000}, flows: []int{100}, step: time.Second, modes: ms, relayd: bin, allSteps: true}
	for _, o := range opts {
		o(&cfg)
	}
	rep, err := Fwd(context.Background(), cfg, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// checkSteps checks the bookkeeping of a tiny run, not any speed: every
// run sent to all 100 flows and lost nothing, every packet the sink
// counted through relayd went through relayd's flows, and every CPU
// figure is positive.
func checkSteps(t *testing.T, rep *FwdReport, modes ...string) {
	t.Helper()
	runs := map[string]int{}
	for _, s := range rep.Steps {
		runs[s.Mode]++
		if s.Flows != 100 || s.Sent == 0 || s.OfferedPPS != 5000 || s.PerFlowPPS != 50 {
			t.Errorf("%s: %d flows at %d pps (%.0f per flow) sent %d packets, want 100 flows, 5000 pps and packets",
				s.Mode, s.Flows, s.OfferedPPS, s.PerFlowPPS, s.Sent)
		}
		if s.Lost != 0 || s.StreamsShort != 0 || s.SendErrors != 0 || s.EncryptErrors != 0 {
			t.Errorf("%s (%s): lost %d packets, %d flows short, %d send and %d encrypt errors",
				s.Mode, s.Phase, s.Lost, s.StreamsShort, s.SendErrors, s.EncryptErrors)
		}
		if s.TaskNsPerPkt <= 0 || s.LabelNsPkt["sender"] <= 0 || s.LabelNsPkt["sink"] <= 0 {
			t.Errorf("%s: CPU per packet %.0f ns (sender %.0f, sink %.0f), want positive",
				s.Mode, s.TaskNsPerPkt, s.LabelNsPkt["sender"], s.LabelNsPkt["sink"])
		}
		switch s.Mode {
		case "direct", "kernel":
			if s.Relayed != -1 || s.ProgNsPerRun != nil {
				t.Errorf("%s: relayed %d, program figure %v, want none", s.Mode, s.Relayed, s.ProgNsPerRun)
			}
		default:
			if s.Relayed != int64(s.Received) || s.RelayDropped != 0 {
				t.Errorf("%s: relayd forwarded %d packets (dropped %d), the sink received %d", s.Mode, s.Relayed, s.RelayDropped, s.Received)
			}
			if s.RelayTaskNsPerPkt == nil || s.RelayLabelNsPkt == nil {
				t.Errorf("%s: no relay cost", s.Mode)
			}
		}
	}
	if runs["direct"] != 2*len(modes) {
		t.Errorf("direct runs %d, want %d", runs["direct"], 2*len(modes))
	}
	for _, m := range modes {
		if runs[m] != 2 {
			t.Errorf("%s: %d runs, want 2", m, runs[m])
		}
	}
	if len(rep.Summary.Modes) != len(modes) {
		t.Errorf("summary: %+v", rep.Summary)
	}
}

// TestFwdbenchSmall: kernel forwarding, relayd's XDP and the minimal C
// relay, whose counters stand in for relayd's and whose process is
// measured.
func TestFwdbenchSmall(t *testing.T) {
	rep := fwdbenchT(t, "kernel,xdp,cmmsg")
	checkSteps(t, rep, "kernel", "xdp", "cmmsg")
	for _, s := range rep.Steps {
		if s.Mode == "xdp" && (s.ProgNsPerRun == nil || *s.ProgNsPerRun <= 0 || s.ProgRuns < s.Received) {
			t.Errorf("xdp: program %d runs, %v ns per run, want at least %d runs and positive time", s.ProgRuns, s.ProgNsPerRun, s.Received)
		}
		if s.Mode == "cmmsg" {
			if s.LabelNsPkt["cmmsg"] <= 0 || s.LabelNsPkt["relayd"] != 0 || s.ProgNsPerRun != nil {
				t.Errorf("cmmsg: the C relay's CPU %.0f ns/pkt, relayd's %.0f, program %v; want the C relay's only",
					s.LabelNsPkt["cmmsg"], s.LabelNsPkt["relayd"], s.ProgNsPerRun)
			}
			if s.RelayedUserspace != s.Relayed {
				t.Errorf("cmmsg: %d of %d relayed in userspace, want all", s.RelayedUserspace, s.Relayed)
			}
		}
	}
	if len(rep.Installs) != 1 || rep.Installs[0].Mode != "xdp" {
		t.Errorf("installs %+v: want xdp's only (the C relay gets its flows at start)", rep.Installs)
	}
}

// TestFwdbenchUserspace: plain RTP through relayd's userspace workers (1
// and 2 workers) and SRTP decrypted by them (both suites); the direct runs
// of the SRTP modes carry the same encrypted packets.
func TestFwdbenchUserspace(t *testing.T) {
	modes := []string{"user-w1", "user-w2", "aescm-w1", "gcm-w1"}
	rep := fwdbenchT(t, "user-w1,user-w2,aescm-w1,gcm-w1")
	checkSteps(t, rep, modes...)
	for _, s := range rep.Steps {
		if s.Mode != "direct" && s.ProgNsPerRun != nil {
			t.Errorf("%s: program figure %v, want none", s.Mode, *s.ProgNsPerRun)
		}
	}
	if len(rep.Installs) != len(modes) {
		t.Errorf("installs: %+v", rep.Installs)
	}
	for _, in := range rep.Installs {
		if in.Flows != 100 || in.Added != 100 {
			t.Errorf("install: %+v", in)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) { w.t.Logf("%s", b); return len(b), nil }

// TestFwdbenchRelayNAPI: with the relay's receive in NAPI threads, each
// relay run reports its hop, the relay's own CPU, and the threads carry
// the relay's traffic: in the direct runs they do next to nothing (the
// lab's own neighbour traffic), and an XDP run's hop holds at least its
// program's run time.
func TestFwdbenchRelayNAPI(t *testing.T) {
	rep := fwdbenchT(t, "kernel,xdp,cmmsg", func(c *FwdConfig) { c.relayNAPI = true })
	checkSteps(t, rep, "kernel", "xdp", "cmmsg")
	least := math.Inf(1) // the smallest hop of a relay run
	for _, s := range rep.Steps {
		if s.HopNsPerPkt != nil {
			least = min(least, *s.HopNsPerPkt)
		}
	}
	for _, s := range rep.Steps {
		napi := s.LabelNsPkt["relay-napi"]
		if s.Mode == "direct" {
			if s.HopNsPerPkt != nil || napi > least/10 {
				t.Errorf("direct run (%s): hop %v, relay NAPI threads %.0f ns/pkt; want no hop, and the threads under a tenth of the least relay hop (%.0f)",
					s.Phase, s.HopNsPerPkt, napi, least)
			}
			continue
		}
		if s.HopNsPerPkt == nil || napi <= 0 || *s.HopNsPerPkt < napi || *s.HopNsPerPkt > s.TaskNsPerPkt {
			t.Errorf("%s: hop %v ns/pkt, relay NAPI threads %.0f, all threads %.0f; want the threads' CPU in the hop, within the total",
				s.Mode, s.HopNsPerPkt, napi, s.TaskNsPerPkt)
			continue
		}
		if s.Mode == "xdp" && s.ProgNsPerRun != nil && *s.HopNsPerPkt < *s.ProgNsPerRun {
			t.Errorf("xdp: hop %.0f ns/pkt below the program's %.0f ns a run", *s.HopNsPerPkt, *s.ProgNsPerRun)
		}
		if s.Mode == "cmmsg" && *s.HopNsPerPkt < napi+s.LabelNsPkt["cmmsg"] {
			t.Errorf("cmmsg: hop %.0f ns/pkt leaves out the C relay's %.0f", *s.HopNsPerPkt, s.LabelNsPkt["cmmsg"])
		}
	}
	var hops int
	for _, q := range rep.Summary.Ratios {
		if q.Name == "xdp/kernel" && q.Hop > 0 {
			hops++
		}
	}
	if hops != 1 {
		t.Errorf("ratios %+v: want xdp/kernel with a relay hop", rep.Summary.Ratios)
	}
}
