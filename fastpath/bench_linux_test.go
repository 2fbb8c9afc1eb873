package fastpath

import (
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/relayd/relayd/lab/minfwd"

	"github.com/relayd/relayd/dataplane"
)

// BenchmarkXDP measures the program's own run time per packet with
// BPF_PROG_TEST_RUN: the kernel times each run. Ingress is the namespace's
// loopback, from which the fib lookup routes to out0.
//
// Each run is one syscall of a single repetition: a repeated test run
// reruns the program on the buffer it rewrote, and no forwarded flow can
// make that a fixed point (the loop guard drops a packet whose rewritten
// destination is a flow's match), so only a fresh frame per run does the
// full work (lookups, fib, statistics under the lock, rewrite, checksums).
// The kernel's timing of one run includes a clock read, the same for every
// case; ns/op is the syscall's and meaningless here, ns/pkt is the
// kernel's timing of the program (the mean; median-ns/pkt the median run,
// steadier on a busy machine).
//
//	go test -run '^$' -bench XDP ./fastpath/
func BenchmarkXDP(b *testing.B) {
	e := newTestEnv(b)
	if err := inNS(e.ns, func() error { return osWrite("/proc/sys/net/ipv4/conf/lo/forwarding", "1") }); err != nil {
		b.Fatal(err)
	}
	for _, fl := range []dataplane.Flow{
		{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000},
		{Match: ap(relay6, 30000), SendFrom: ap(relay6, 30002), SendTo: ap(callee6, 5000), ClockRate: 8000},
		{Match: ap(relay4, 30004), SendFrom: ap(relay4, 30006), SendTo: ap(callee4, 5000), Action: dataplane.Userspace},
		// No clock rate: counters only, no RTP statistics (as for RTCP).
		{Match: ap(relay4, 30008), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5002)},
		// Capped high enough never to refuse a benchmark's packet...
		{Match: ap(relay4, 30010), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000,
			RateCap: dataplane.RateCap{PPS: dataplane.MaxRatePPS, Burst: dataplane.MaxRateBurst}},
		// ... and low enough to refuse all but the first.
		{Match: ap(relay4, 30012), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000,
			RateCap: dataplane.RateCap{PPS: 1, Burst: 1}},
	} {
		if err := e.fp.Install(fl); err != nil {
			b.Fatal(err)
		}
	}
	payload := rtpPacket(1, 1, 160, 160) // G.711 20 ms: 200 B IP, 214 B frame
	// The capped flow's one token goes to a first packet, before timing.
	if err := inNS(e.ns, func() error {
		_, _, err := e.fp.objs.RelayXdp.Benchmark(buildFrame(ap(caller4, 4000), ap(relay4, 30012), payload, frameOpts{}), 1, nil)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	// The yardstick: a minimal forwarder (fib lookup, MAC and TTL rewrite,
	// DEVMAP redirect), timed the same way in the same run.
	minProg, minPorts, minClose, err := minfwd.Load()
	if err != nil {
		b.Fatal(err)
	}
	defer minClose()
	if err := inNS(e.ns, func() error { return minPorts.Put(uint32(e.out), minfwd.DevmapValue(uint32(e.out))) }); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name    string
		frame   []byte
		verdict uint32
		prog    *ebpf.Program
		// refills: the capped flow's token refills every second, and a
		// packet is forwarded now and then.
		refills bool
	}{
		{"minimal_forwarder_ipv4", buildFrame(ap(relay4, 30002), ap(callee4, 5000), payload, frameOpts{}), xdpRedirect, minProg, false},
		{"forward_ipv4", buildFrame(ap(caller4, 4000), ap(relay4, 30000), payload, frameOpts{}), xdpRedirect, nil, false},
		{"forward_ipv4_no_rtp_stats", buildFrame(ap(caller4, 4000), ap(relay4, 30008), payload, frameOpts{}), xdpRedirect, nil, false},
		{"forward_ipv4_rate_capped", buildFrame(ap(caller4, 4000), ap(relay4, 30010), payload, frameOpts{}), xdpRedirect, nil, false},
		{"drop_rate", buildFrame(ap(caller4, 4000), ap(relay4, 30012), payload, frameOpts{}), xdpDrop, nil, true},
		{"forward_ipv6", buildFrame(ap(caller6, 4000), ap(relay6, 30000), payload, frameOpts{}), xdpRedirect, nil, false},
		{"punt_userspace", buildFrame(ap(caller4, 4000), ap(relay4, 30004), payload, frameOpts{}), xdpPass, nil, false},
		{"pass_no_flow", buildFrame(ap(caller4, 4000), ap(relay4, 40000), payload, frameOpts{}), xdpPass, nil, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			const repeat = 1
			var total time.Duration
			runs := make([]time.Duration, 0, b.N)
			err := inNS(e.ns, func() error {
				b.ResetTimer()
				for range b.N {
					prog := e.fp.objs.RelayXdp
					if bc.prog != nil {
						prog = bc.prog
					}
					verdict, per, err := prog.Benchmark(bc.frame, repeat, nil)
					if err != nil {
						return err
					}
					if verdict != bc.verdict && !(bc.refills && verdict == xdpRedirect) {
						b.Fatalf("verdict %s, want %s", verdictName[verdict], verdictName[bc.verdict])
					}
					total += per * repeat
					runs = append(runs, per)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N*repeat), "ns/pkt")
			// The median run: what the program costs when nothing else
			// (an interrupt, another task on a busy machine) ran within.
			slices.Sort(runs)
			b.ReportMetric(float64(runs[len(runs)/2].Nanoseconds()), "median-ns/pkt")
		})
	}
}
