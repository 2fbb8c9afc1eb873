package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"

	"github.com/relayd/relayd/lab/labrelay"
)

// TestBenchLab runs voipgen bench at a tiny scale (one step of 20 calls,
// 10 SIP calls with voipgen's own media, xdp, userspace and srtp) and
// checks its bookkeeping, never its speed: the SIP calls came up with
// media both ways and nothing lost, through relayd and direct; the sweep's 20 calls were set up over
// SIP through relayd's B2BUA (SDES on the caller leg in srtp mode), and
// every packet sent both ways through relayd was received and counted by
// relayd; the report, JSON and plots are written.
func TestBenchLab(t *testing.T) {
	testenv.NeedRoot(t)
	if testing.Short() {
		t.Skip("builds relayd and a lab: skipped with -short")
	}
	bin, err := labrelay.Build()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg, err := Parse([]string{"--calls", "20", "--modes", "xdp,userspace,srtp", "--step", "1s", "--sip-calls", "10",
		"--sip-duration", "2s", "--quiet-wait", "5s", "--relayd", bin, "--out", dir}, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Progress = testWriter{t}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := runBenchLab(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteOutputs(dir); err != nil {
		t.Fatal(err)
	}
	if len(rep.SIP) != 2 {
		t.Fatalf("%d SIP phases, want 2", len(rep.SIP))
	}
	for _, s := range rep.SIP {
		if s.Succeeded != 10 || s.Failed != 0 || s.WithMedia != 10 || s.Lost != 0 || s.RecvPackets == 0 || s.Relayed < int64(s.RecvPackets) {
			t.Errorf("SIP phase %+v", s)
		}
		// The same calls direct, no relay: all up, media both ways.
		if d := s.Direct; d == nil || d.Error != "" || d.Succeeded != 10 || d.WithMedia != 10 || d.Lost != 0 || d.RecvPackets == 0 {
			t.Errorf("SIP phase %s: direct run %+v", s.Relay, d)
		}
		if !s.mediaShown() {
			t.Errorf("SIP phase %s: media quality not shown", s.Relay)
		}
	}
	if len(rep.Rows) != 3 || rep.Rows[0].Relay != "xdp" || rep.Rows[1].Relay != "userspace" || rep.Rows[2].Relay != "srtp" {
		t.Fatalf("rows %+v", rep.Rows)
	}
	for _, r := range rep.Rows {
		if r.Calls != 20 || r.Flows != 40 || r.Media != benchMediaSIP || r.Sent == 0 || r.Lost != 0 ||
			r.Received != r.Sent || r.Relayed != int64(r.Received) {
			t.Errorf("row %+v", r)
		}
		// XDP took the calls' flows back once their sources were
		// locked; the userspace modes forward everything themselves.
		want := r.Relayed
		if r.Relay == "xdp" {
			want = 0
		}
		if r.RelayedUserspace != want {
			t.Errorf("%s: %d of %d packets relayed by userspace, want %d", r.Relay, r.RelayedUserspace, r.Relayed, want)
		}
	}
	if len(rep.Summaries) != 3 {
		t.Fatalf("summaries %+v", rep.Summaries)
	}
	for _, s := range rep.Summaries {
		if s.MaxZeroLossCalls != 20 {
			t.Errorf("summary %+v", s)
		}
	}
	// Each step is direct, relay, relay, direct (and maybe once more).
	if n := len(rep.Runs); n < 12 || n > 24 || n%4 != 0 {
		t.Errorf("%d runs", n)
	}
	checkBenchOutputs(t, dir, rep)
	if _, err := os.Stat(filepath.Join(dir, "bench.json")); err != nil {
		t.Error(err)
	}
}

// TestBenchLabXDPEnds runs a sweep step of 30 calls through relayd (xdp
// and userspace) with the XDP sender and the XDP sink, and checks the
// accounting: every packet sent, both ways, in every run (direct and
// through relayd) was counted by the sink to its run and to its stream,
// relayd forwarded each of them, and the sink's CPU is its NAPI threads'.
func TestBenchLabXDPEnds(t *testing.T) {
	testenv.NeedRoot(t)
	if testing.Short() {
		t.Skip("builds relayd and a lab: skipped with -short")
	}
	bin, err := labrelay.Build()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg, err := Parse([]string{"--calls", "30", "--modes", "xdp,userspace", "--step", "1s", "--sip-calls", "0", "--sender", "xdp", "--sink", "xdp",
		"--quiet-wait", "5s", "--relayd", bin, "--out", dir}, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Progress = testWriter{t}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := runBenchLab(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 2 {
		t.Fatalf("rows %+v", rep.Rows)
	}
	for _, r := range rep.Rows {
		if r.Calls != 30 || r.Media != benchMediaSIP || r.Sent == 0 || r.Lost != 0 || r.Received != r.Sent || r.Relayed != int64(r.Received) {
			t.Errorf("row %+v", r)
		}
		if r.SinkCPU <= 0 || r.SenderCPU <= 0 {
			t.Errorf("%s: sender CPU %.3f, sink CPU %.3f: want both measured", r.Relay, r.SenderCPU, r.SinkCPU)
		}
	}
	if n := len(rep.Runs); n < 8 || n%4 != 0 {
		t.Fatalf("%d runs", n)
	}
	for _, st := range rep.Runs {
		// 30 calls at 100 pps for 1 s: 50 cycles of 60 streams, half
		// each way.
		if st.Sent != 3000 || st.Received != st.Sent || st.SendErrors != 0 || st.StreamsShort != 0 {
			t.Errorf("%s run of %s: sent %d, received %d, %d send errors, %d streams short", st.Mode, st.Phase, st.Sent, st.Received, st.SendErrors, st.StreamsShort)
		}
		if _, ok := st.LabelNsPkt["sink"]; ok {
			t.Errorf("%s run of %s: a sink thread measured beside the XDP sink", st.Mode, st.Phase)
		}
		if st.LabelNsPkt["napi"] <= 0 {
			t.Errorf("%s run of %s: no NAPI thread time (the XDP sink's)", st.Mode, st.Phase)
		}
	}
	var text strings.Builder
	rep.WriteText(&text)
	if !strings.Contains(text.String(), "sink CPU") {
		t.Errorf("no sink CPU column:\n%s", text.String())
	}
}
