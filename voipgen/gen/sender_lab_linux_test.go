package gen

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// reportSend reports a sender run as the benchmark's metrics: offered and
// sent packets per second, scheduling lateness and the sender's CPU per
// packet. One iteration is one run of fixed duration, so ns/op says nothing
// and is left out. It fails the benchmark when nothing was sent.
func reportSend(b *testing.B, offeredPPS int, res Result) {
	b.Helper()
	if res.Packets == 0 {
		b.Fatalf("no packet sent (%d errors)", res.Errors)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(offeredPPS), "offered-pps")
	b.ReportMetric(res.PPS, "sent-pps")
	b.ReportMetric(float64(res.Errors), "errors")
	b.ReportMetric(res.LateP50us, "late-p50-us")
	b.ReportMetric(res.LateP99us, "late-p99-us")
	b.ReportMetric(res.LateMaxus, "late-max-us")
	b.ReportMetric(res.CPUPerPkUs, "cpu-us/pkt")
}

// runSender builds a generator in the lab's caller namespace from args and
// runs it once per iteration; before (if set) runs after the generator is
// built and before the first run. The last run's result is reported.
func runSender(b *testing.B, l *lab.Lab, offeredPPS int, before func(), args ...string) {
	b.Helper()
	cfg := genCfg(b, args...)
	var g *Generator
	if err := l.Caller.Do(func() (err error) { g, err = New(cfg); return err }); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	if before != nil {
		before()
	}
	var res Result
	for b.Loop() {
		res = g.Run(context.Background())
	}
	reportSend(b, offeredPPS, res)
}

// BenchmarkLabSender measures the packets per second voipgen's raw
// sendmmsg and AF_XDP senders sustain on the lab's veth, 3 s per
// iteration, the streams paced at a 10 ms ptime so that the offered load
// exceeds what a core can send. The caller's packets are forwarded by the
// relay namespace to the callee (which drops them: nothing listens, ICMP
// is rate-limited); on veth that forwarding runs in the sender's softirq,
// so the CPU per packet includes it. Needs root (the lab):
//
//	go test -run '^$' -bench LabSender ./voipgen/gen/
func BenchmarkLabSender(b *testing.B) {
	l := lab.NewT(b)
	for _, tc := range []struct {
		streams, threads int
		transport        string
	}{{2000, 1, "raw"}, {4000, 1, "raw"}, {8000, 1, "raw"}, {8000, 2, "raw"}, {8000, 1, "xdp"}, {16000, 1, "xdp"}} {
		b.Run(fmt.Sprintf("%s/streams=%d/threads=%d", tc.transport, tc.streams, tc.threads), func(b *testing.B) {
			runSender(b, l, tc.streams*100, nil,
				"--dst", l.CalleeAddr4.String()+":10000", "--src", l.CallerAddr4.String()+":10000",
				"--streams", strconv.Itoa(tc.streams), "--ptime", "10ms", "--duration", "3s", "--threads", strconv.Itoa(tc.threads),
				"--transport", tc.transport, "--slot", "500us")
		})
	}
	// The sender's own cost: the relay's r0 down, so that the caller's veth
	// drops every frame at once (no forwarding in the sender's softirq).
	// AF_XDP only: the raw transport would stop at neighbour resolution.
	b.Run("xdp/streams=16000/threads=1/peer-down", func(b *testing.B) {
		runSender(b, l, 16000*100, func() {
			if err := l.Relay.SetLinkDown(lab.RelayCallerIfName); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				if err := l.Relay.SetLinkUp(lab.RelayCallerIfName); err != nil {
					b.Error(err)
				}
			})
		},
			"--dst", l.CalleeAddr4.String()+":10000", "--src", l.CallerAddr4.String()+":10000",
			"--streams", "16000", "--ptime", "10ms", "--duration", "3s", "--transport", "xdp", "--slot", "500us")
	})
}

// BenchmarkLabSenderToReceiver measures voipgen's receiver (one socket and
// goroutine per stream, recvmmsg batches, kernel timestamps, full analysis
// per packet) against the raw sender at a 10 ms ptime through the lab's
// forwarding namespace, 3 s per iteration: what was sent, the share lost,
// the longest gap and the worst jitter. Needs root (the lab).
func BenchmarkLabSenderToReceiver(b *testing.B) {
	l := lab.NewT(b)
	for _, n := range []int{1000, 2000, 3000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			var res Result
			var lost, maxGap, maxJitter float64
			for b.Loop() {
				r, rep := labStreams(b, l, n, 3*time.Second, []string{"--ptime", "10ms", "--threads", "1", "--slot", "500us"}, nil)
				tt := rep.Totals
				if r.Packets == 0 {
					b.Fatalf("no packet sent (%d errors)", r.Errors)
				}
				res = r
				lost = 100 * float64(int64(r.Packets)-int64(tt.Packets)) / float64(r.Packets)
				maxGap, maxJitter = tt.MaxGapMs, tt.MaxJitterMs
			}
			reportSend(b, n*100, res)
			b.ReportMetric(lost, "lost-%")
			b.ReportMetric(maxGap, "max-gap-ms")
			b.ReportMetric(maxJitter, "jitter-max-ms")
		})
	}
}
