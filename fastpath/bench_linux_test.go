package fastpath

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/relayd/relayd/lab/minfwd"

	"github.com/relayd/relayd/dataplane"
)

// BenchmarkXDP measures the program's own run time per packet with
// BPF_PROG_TEST_RUN (the kernel times the repeat loop). Ingress is the
// namespace's loopback, from which the fib lookup routes to out0.
//
// The kernel reruns the program on the same buffer, so a forwarded frame is
// seen again as rewritten. The forward cases therefore use flows whose
// rewrite is a fixed point (match = send_to, frame already from send_from):
// every run does the full work (lookup, fib, statistics under the lock,
// rewrite, checksums), and the frame's TTL of 255 allows the 200 runs of
// each syscall. One benchmark iteration is one syscall of 200 runs (the
// kernel adds milliseconds of fixed cost per repeated test run, so ns/op is
// meaningless here); ns/pkt is the kernel's own timing of the program.
//
//	go test -run '^$' -bench XDP ./fastpath/
func BenchmarkXDP(b *testing.B) {
	e := newTestEnv(b)
	if err := inNS(e.ns, func() error { return osWrite("/proc/sys/net/ipv4/conf/lo/forwarding", "1") }); err != nil {
		b.Fatal(err)
	}
	for _, fl := range []dataplane.Flow{
		{Match: ap(callee4, 5000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000},
		{Match: ap(callee6, 5000), SendFrom: ap(relay6, 30002), SendTo: ap(callee6, 5000), ClockRate: 8000},
		{Match: ap(relay4, 30004), SendFrom: ap(relay4, 30006), SendTo: ap(callee4, 5000), Action: dataplane.Userspace},
		// No clock rate: counters only, no RTP statistics (as for RTCP).
		{Match: ap(callee4, 5002), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5002)},
	} {
		if err := e.fp.Install(fl); err != nil {
			b.Fatal(err)
		}
	}
	payload := rtpPacket(1, 1, 160, 160) // G.711 20 ms: 200 B IP, 214 B frame
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
	}{
		{"minimal_forwarder_ipv4", buildFrame(ap(relay4, 30002), ap(callee4, 5000), payload, frameOpts{ttl: 255}), xdpRedirect, minProg},
		{"forward_ipv4", buildFrame(ap(relay4, 30002), ap(callee4, 5000), payload, frameOpts{ttl: 255}), xdpRedirect, nil},
		{"forward_ipv4_no_rtp_stats", buildFrame(ap(relay4, 30002), ap(callee4, 5002), payload, frameOpts{ttl: 255}), xdpRedirect, nil},
		{"forward_ipv6", buildFrame(ap(relay6, 30002), ap(callee6, 5000), payload, frameOpts{ttl: 255}), xdpRedirect, nil},
		{"punt_userspace", buildFrame(ap(caller4, 4000), ap(relay4, 30004), payload, frameOpts{}), xdpPass, nil},
		{"pass_no_flow", buildFrame(ap(caller4, 4000), ap(relay4, 40000), payload, frameOpts{}), xdpPass, nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			const repeat = 200
			var total time.Duration
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
					if verdict != bc.verdict {
						b.Fatalf("verdict %s, want %s", verdictName[verdict], verdictName[bc.verdict])
					}
					total += per * repeat
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N*repeat), "ns/pkt")
		})
	}
}
