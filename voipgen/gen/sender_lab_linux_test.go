package gen

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// TestLabSenderCapacity measures the packets per second voipgen's raw
// sendmmsg sender sustains on the lab's veth with 1 and 2 threads, the
// streams paced at a 10 ms ptime so that the offered load exceeds what a
// core can send. The caller's packets are forwarded by the relay namespace
// to the callee (which drops them: nothing listens, ICMP is rate-limited);
// on veth that forwarding runs in the sender's softirq, so the CPU per
// packet includes it. Opt-in: VOIPGEN_BENCH=1 (minutes, and figures only).
//
//	VOIPGEN_BENCH=1 go test -run TestLabSenderCapacity -v ./cmd/voipgen/
func TestLabSenderCapacity(t *testing.T) {
	if os.Getenv("VOIPGEN_BENCH") == "" {
		t.Skip("benchmark: set VOIPGEN_BENCH=1")
	}
	l := lab.NewT(t)
	for _, tc := range []struct {
		streams, threads int
		transport        string
	}{{2000, 1, "raw"}, {4000, 1, "raw"}, {8000, 1, "raw"}, {8000, 2, "raw"}, {8000, 1, "xdp"}, {16000, 1, "xdp"}} {
		t.Run(fmt.Sprintf("%s %d streams %d threads", tc.transport, tc.streams, tc.threads), func(t *testing.T) {
			cfg := genCfg(t, "--dst", l.CalleeAddr4.String()+":10000", "--src", l.CallerAddr4.String()+":10000",
				"--streams", strconv.Itoa(tc.streams), "--ptime", "10ms", "--duration", "3s", "--threads", strconv.Itoa(tc.threads),
				"--transport", tc.transport, "--slot", "500us")
			var g *Generator
			if err := l.Caller.Do(func() (err error) { g, err = New(cfg); return err }); err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			res := g.Run(context.Background())
			t.Logf("offered %d pps, sent %.0f pps (%d errors), lateness p50 %.0f us p99 %.0f us max %.0f us, sender CPU %.2f s = %.2f us per packet",
				tc.streams*100, res.PPS, res.Errors, res.LateP50us, res.LateP99us, res.LateMaxus, res.CPUs, res.CPUPerPkUs)
		})
	}
	// The sender's own cost: the relay's r0 down, so that the caller's veth
	// drops every frame at once (no forwarding in the sender's softirq).
	// AF_XDP only: the raw transport would stop at neighbour resolution.
	t.Run("xdp 16000 streams, peer down", func(t *testing.T) {
		cfg := genCfg(t, "--dst", l.CalleeAddr4.String()+":10000", "--src", l.CallerAddr4.String()+":10000",
			"--streams", "16000", "--ptime", "10ms", "--duration", "3s", "--transport", "xdp", "--slot", "500us")
		var g *Generator
		if err := l.Caller.Do(func() (err error) { g, err = New(cfg); return err }); err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if err := l.Relay.SetLinkDown(lab.RelayCallerIfName); err != nil {
			t.Fatal(err)
		}
		defer l.Relay.SetLinkUp(lab.RelayCallerIfName)
		res := g.Run(context.Background())
		t.Logf("offered 1600000 pps, sent %.0f pps (%d errors), sender CPU %.2f s = %.2f us per packet", res.PPS, res.Errors, res.CPUs, res.CPUPerPkUs)
	})
	// Receiver: one socket and goroutine per stream, recvmmsg batches,
	// kernel timestamps, full analysis per packet.
	for _, n := range []int{1000, 2000, 3000} {
		t.Run(fmt.Sprintf("receiver %d streams at 10 ms", n), func(t *testing.T) {
			res, rep := labStreams(t, l, n, 3*time.Second, []string{"--ptime", "10ms", "--threads", "1", "--slot", "500us"}, nil)
			tt := rep.Totals
			t.Logf("sent %.0f pps; received %d of %d packets (%.3f%% lost), max gap %.1f ms, jitter max %.3f ms",
				res.PPS, tt.Packets, res.Packets, 100*float64(int64(res.Packets)-int64(tt.Packets))/float64(res.Packets), tt.MaxGapMs, tt.MaxJitterMs)
		})
	}
}
