//go:build linux

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/lab/labrelay"
)

func TestDemoFlags(t *testing.T) {
	cfg, err := ParseDemo(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.streams != 100 || cfg.duration != 10*time.Second || cfg.codec.Name != "pcmu" || cfg.ptime != 20*time.Millisecond ||
		cfg.xdpMode != "native" || cfg.ipv6 || cfg.JSON || cfg.relayd != "" || cfg.packetsPerStream() != 500 {
		t.Errorf("defaults: %+v", cfg)
	}
	for _, args := range [][]string{
		{"--streams", "0"},
		{"--streams", "2501"},
		{"--xdp-mode", "skb"},
		{"--duration", "10ms"},
		{"--codec", "opus"},
		{"extra"},
	} {
		if _, err := ParseDemo(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if _, err := ParseDemo([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

const demoMetrics = `# HELP relayd_packets_total Packets seen by the data planes, by verdict and reason.
# TYPE relayd_packets_total counter
relayd_packets_total{reason="tx",verdict="forward"} 3
relayd_packets_total{reason="redirect",verdict="forward"} 2000
relayd_packets_total{reason="ipv6_ext",verdict="punt"} 4
relayd_packets_total{reason="fib_no_neigh",verdict="punt"} 1
relayd_packets_total{reason="wrong_source",verdict="drop"} 5
relayd_packets_total{reason="not_ip",verdict="pass"} 2
relayd_bytes_total{reason="redirect",verdict="forward"} 436000
relayd_flows{path="xdp"} 20
relayd_xdp_attached{interface="r1",mode="native"} 1
relayd_xdp_attached{interface="r0",mode="native"} 1
`

func TestParseDemoMetrics(t *testing.T) {
	rc, err := parseDemoMetrics(demoMetrics)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Forwarded != 2003 || rc.Punted != 5 || rc.FlowPunts != 1 || rc.Dropped != 5 || rc.Passed != 2 {
		t.Errorf("totals %+v", rc)
	}
	if len(rc.Attached) != 2 || rc.Attached[0] != (demoXDPAttachment{"r0", "native"}) {
		t.Errorf("attached %+v", rc.Attached)
	}
	if c := rc.Counters[0]; c.Verdict != "forward" || c.Reason != "redirect" || c.Packets != 2000 || c.Bytes != 436000 {
		t.Errorf("first counter %+v", c)
	}
	if _, err := parseDemoMetrics("go_goroutines 7\n"); err == nil {
		t.Error("no relayd counters: no error")
	}
}

// demoReportFor builds the report of a clean run of n streams of per
// packets each, as runDemoLab would.
func demoReportFor(n, per int) *DemoReport {
	r := &DemoReport{Config: demoConfigReport{Streams: n}}
	for i := range 2 * n {
		dir := demoToCallee
		if i%2 == 1 {
			dir = demoToCaller
		}
		r.Flows = append(r.Flows, demoFlow{Stream: i / 2, Direction: dir,
			Flow: admin.Flow{ID: uint64(i + 1), Path: "xdp", Packets: uint64(per), Bytes: uint64(per) * 200}})
	}
	r.summarizeFlows()
	for _, dir := range []string{demoToCallee, demoToCaller} {
		r.Directions = append(r.Directions, demoDirection{Direction: dir, Streams: n, Sent: uint64(n * per), Received: uint64(n * per)})
	}
	r.Relay.Forwarded = uint64(2 * n * per)
	return r
}

func TestDemoJudge(t *testing.T) {
	r := demoReportFor(3, 10)
	r.judge(10)
	if !r.Pass || r.Verdict != "PASS: 3 streams x 2 directions, 60 packets relayed by XDP, 0 lost" {
		t.Fatalf("clean run: pass %v, %q, problems %q", r.Pass, r.Verdict, r.Problems)
	}
	for name, spoil := range map[string]func(r *DemoReport){
		"lost": func(r *DemoReport) {
			r.Directions[1].Received--
			r.Directions[1].Lost = 1
			r.Directions[1].StreamsShort = 1
			r.Relay.Forwarded--
			r.Flows[3].Packets--
			r.summarizeFlows()
		},
		"punted by a flow":   func(r *DemoReport) { r.Relay.FlowPunts = 1 },
		"userspace path":     func(r *DemoReport) { r.Flows[0].Path = "userspace"; r.summarizeFlows() },
		"counters disagree":  func(r *DemoReport) { r.Relay.Forwarded++ },
		"flow missing":       func(r *DemoReport) { r.Flows = r.Flows[1:]; r.summarizeFlows() },
		"sender short":       func(r *DemoReport) { r.Directions[0].Sent--; r.Directions[0].Received-- },
		"dropped wrong src":  func(r *DemoReport) { r.Relay.Dropped = 2 },
		"duplicates arrived": func(r *DemoReport) { r.Directions[0].Duplicates = 1 },
	} {
		r := demoReportFor(3, 10)
		spoil(r)
		r.judge(10)
		if r.Pass || !strings.HasPrefix(r.Verdict, "FAIL: ") || len(r.Problems) == 0 {
			t.Errorf("%s: pass %v, %q", name, r.Pass, r.Verdict)
		}
	}
	var buf bytes.Buffer
	r = demoReportFor(30, 10)
	r.judge(10)
	r.WriteText(&buf, false)
	if got := strings.Count(buf.String(), " xdp "); got != 10 {
		t.Errorf("text report lists %d flows, want 6 first and 4 worst:\n%s", got, buf.String())
	}
}

// TestDemo runs the demo in-process: a lab, a real relayd with XDP, 10
// streams each way for 2 s, IPv4 in native and IPv6 in generic mode.
func TestDemo(t *testing.T) {
	testenv.NeedRoot(t)
	if testing.Short() {
		t.Skip("builds relayd and relays traffic for seconds; skipped with -short")
	}
	bin, err := labrelay.Build()
	if err != nil {
		t.Fatal(err)
	}
	// labrelay.Build rebuilds if another test removed it; the binary is
	// removed when the test process ends (TestMain).

	const streams, perStream = 10, 100 // 2 s of 20 ms packets
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"ipv4-native", nil},
		{"ipv6-generic", []string{"--ipv6", "--xdp-mode", "generic"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--streams", "10", "--duration", "2s", "--relayd", bin, "--json"}, tc.args...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg, err := ParseDemo(args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			rep, runErr := Demo(ctx, cfg)
			if rep == nil {
				t.Fatalf("run: %v", runErr)
			}
			// The report as --json prints it.
			b, err := json.Marshal(rep)
			if err != nil {
				t.Fatal(err)
			}
			var r DemoReport
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("run: %v; report: %v\n%s", runErr, err, b)
			}
			if runErr != nil || !r.Pass {
				t.Fatalf("run: %v; pass %v; problems %q", runErr, r.Pass, r.Problems)
			}

			want := uint64(streams * perStream)
			var received uint64
			for _, d := range r.Directions {
				if d.Sent != want || d.Received != want || d.Lost != 0 || d.Streams != streams || d.StreamsShort != 0 {
					t.Errorf("%s: %+v, want %d packets of %d streams sent and received", d.Direction, d, want, streams)
				}
				received += d.Received
			}
			if len(r.Directions) != 2 || received != 2*want {
				t.Errorf("receivers got %d packets in %d directions, want %d in 2", received, len(r.Directions), 2*want)
			}
			// Every packet the receivers got was relayed by XDP, and the
			// relay's flows, its global counters and the receivers agree.
			if r.Relay.Forwarded != received || r.FlowSummary.Packets != received || r.Relay.FlowPunts != 0 || r.Relay.Dropped != 0 {
				t.Errorf("relay forwarded %d, flows counted %d, receivers got %d; %d flow punts, %d drops",
					r.Relay.Forwarded, r.FlowSummary.Packets, received, r.Relay.FlowPunts, r.Relay.Dropped)
			}
			if len(r.Flows) != 2*streams {
				t.Fatalf("%d flows, want %d", len(r.Flows), 2*streams)
			}
			for _, f := range r.Flows {
				if f.Path != "xdp" || f.Packets != perStream || f.Received != perStream || f.Lost != 0 || f.Dropped != 0 {
					t.Errorf("flow %d (stream %d %s): %+v, want %d packets on xdp", f.ID, f.Stream, f.Direction, f.Flow, perStream)
				}
			}
			if r.Load.PPS != 2*streams*50 {
				t.Errorf("load %v pps, want %d", r.Load.PPS, 2*streams*50)
			}
			if wantV := "PASS: 10 streams x 2 directions, 2000 packets relayed by XDP, 0 lost"; r.Verdict != wantV {
				t.Errorf("verdict %q, want %q", r.Verdict, wantV)
			}
			var text bytes.Buffer
			r.WriteText(&text, false)
			if !strings.Contains(text.String(), "\n"+r.Verdict+" (") {
				t.Errorf("text report lacks the verdict:\n%s", text.String())
			}
		})
	}
}
