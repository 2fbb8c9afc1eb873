package fastpath

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"

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
// full work (lookups, route, statistics under the lock, rewrite, checksums;
// the route from the flow's route cache after its first packet, as in relayd).
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
		// uncached: with the route cache off, every packet looked up.
		uncached bool
	}{
		{"minimal_forwarder_ipv4", buildFrame(ap(relay4, 30002), ap(callee4, 5000), payload, frameOpts{}), xdpRedirect, minProg, false, false},
		{"forward_ipv4", buildFrame(ap(caller4, 4000), ap(relay4, 30000), payload, frameOpts{}), xdpRedirect, nil, false, false},
		{"forward_ipv4_uncached", buildFrame(ap(caller4, 4000), ap(relay4, 30000), payload, frameOpts{}), xdpRedirect, nil, false, true},
		{"forward_ipv4_no_rtp_stats", buildFrame(ap(caller4, 4000), ap(relay4, 30008), payload, frameOpts{}), xdpRedirect, nil, false, false},
		{"forward_ipv4_rate_capped", buildFrame(ap(caller4, 4000), ap(relay4, 30010), payload, frameOpts{}), xdpRedirect, nil, false, false},
		{"drop_rate", buildFrame(ap(caller4, 4000), ap(relay4, 30012), payload, frameOpts{}), xdpDrop, nil, true, false},
		{"forward_ipv6", buildFrame(ap(caller6, 4000), ap(relay6, 30000), payload, frameOpts{}), xdpRedirect, nil, false, false},
		{"punt_userspace", buildFrame(ap(caller4, 4000), ap(relay4, 30004), payload, frameOpts{}), xdpPass, nil, false, false},
		{"pass_no_flow", buildFrame(ap(caller4, 4000), ap(relay4, 40000), payload, frameOpts{}), xdpPass, nil, false, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.uncached {
				if err := e.fp.routes.close(); err != nil {
					b.Fatal(err)
				}
				e.fp.routes = nil
				defer e.watchRoutes(b, routeRefresh)
			}
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

// farPrefix holds the destinations of BenchmarkXDPFlows' flows, one
// address each, routed through callee4 on out0 (as fwdbench's flows are).
var farPrefix = netip.MustParsePrefix("198.18.64.0/18")

// BenchmarkXDPFlows times the program with many flows installed, each
// packet to another flow in a random order (so that the map lookups find
// their entries anywhere in the tables and the caches, not one hot entry),
// beside the minimal forwarder on a frame to the same destination, run by
// run in the same loop: relay-ns/pkt and minfwd-ns/pkt are the median
// runs, ratio their quotient. The flows are as relayd installs a call's:
// a clock rate (RTP statistics), an expected source and a packet-rate cap
// (high enough never to refuse). Each flow's packets carry consecutive
// sequence numbers and timestamps, the statistics' common case.
//
// The loop runs on one CPU, as a flow's packets do in relayd (one
// receive queue's). Each flow's first packet, before the timing, fills its
// route cache entry, which no refresh empties while the benchmark runs:
// what is timed is the cache's hit, as for a flow's packets between two
// refreshes (a flow of 50 packets per second looks its route up once a
// second, one packet in 50).
//
// Every run's time includes the test run's own fixed cost (clock reads,
// the dispatch into the program), the same for both programs:
// empty-ns/pkt is the median run of a program that returns at once, and
// net-ratio the ratio of the two programs' medians with it taken off.
//
// flows_16 is the reference with every flow's state in the CPU's caches:
// what the program's instructions cost. At 1,000 and 10,000 flows each
// packet's flow state is out of the caches (hundreds to thousands of
// runs, each a syscall, pass before a flow's next packet), and the
// difference is the program's cache misses, most of all those that wait
// for one another (see port_flows and slot_port_base in bpf/relay.c).
//
//	go test -run '^$' -bench XDPFlows -count 5 ./fastpath/
func BenchmarkXDPFlows(b *testing.B) {
	for _, n := range benchFlowCounts(b) {
		b.Run(fmt.Sprintf("flows_%d", n), func(b *testing.B) { benchFlows(b, n) })
	}
}

func benchFlows(b *testing.B, n int) {
	e := newTestEnvFlows(b, 65536) // relayd's default map size
	err := inNS(e.ns, func() error {
		if err := osWrite("/proc/sys/net/ipv4/conf/lo/forwarding", "1"); err != nil {
			return err
		}
		out, err := netlink.LinkByIndex(e.out)
		if err != nil {
			return err
		}
		dst := net.IPNet{IP: farPrefix.Addr().AsSlice(), Mask: net.CIDRMask(farPrefix.Bits(), 32)}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: out.Attrs().Index, Dst: &dst, Gw: callee4.AsSlice()})
	})
	if err != nil {
		b.Fatal(err)
	}
	minProg, minPorts, minClose, err := minfwd.Load()
	if err != nil {
		b.Fatal(err)
	}
	defer minClose()
	if err := inNS(e.ns, func() error { return minPorts.Put(uint32(e.out), minfwd.DevmapValue(uint32(e.out))) }); err != nil {
		b.Fatal(err)
	}
	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, xdpPass), asm.Return()},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer empty.Close()

	relayFrames := make([]*rtpFrame, n)
	minFrames := make([][]byte, n)
	for i := range n {
		port := uint16(20000 + i)
		dst := ap(addrAt(farPrefix, i), 5000)
		fl := dataplane.Flow{
			Match: ap(relay4, port), SendFrom: ap(relay4, port), SendTo: dst,
			ExpectSource: ap(caller4, 4000), ClockRate: 8000,
			RateCap: dataplane.RateCap{PPS: dataplane.MaxRatePPS, Burst: dataplane.MaxRateBurst},
		}
		if err := e.fp.Install(fl); err != nil {
			b.Fatal(err)
		}
		relayFrames[i] = newRTPFrame(ap(caller4, 4000), fl.Match, uint32(i), uint16(i*7))
		minFrames[i] = buildFrame(ap(relay4, port), dst, rtpPacket(uint32(i), 1, 160, 160), frameOpts{})
	}
	order := rand.New(rand.NewPCG(1, 2)).Perm(n)
	e.watchRoutes(b, time.Hour)

	relayRuns := make([]time.Duration, 0, b.N)
	minRuns := make([]time.Duration, 0, b.N)
	emptyRuns := make([]time.Duration, 0, b.N)
	run := func(prog *ebpf.Program, frame []byte, want uint32, runs *[]time.Duration) error {
		verdict, per, err := prog.Benchmark(frame, 1, nil)
		if err != nil {
			return err
		}
		if verdict != want {
			return fmt.Errorf("verdict %s, want %s", verdictName[verdict], verdictName[want])
		}
		*runs = append(*runs, per)
		return nil
	}
	err = inNS(e.ns, func() error {
		// One CPU, as a flow's packets are in relayd (a receive queue's):
		// its statistics and its route cache entry stay in that CPU's
		// caches, and no run finds them on the other.
		restore, err := pinThread()
		if err != nil {
			return err
		}
		defer restore()
		for _, f := range relayFrames {
			if verdict, _, err := e.fp.objs.RelayXdp.Benchmark(f.next(), 1, nil); err != nil || verdict != xdpRedirect {
				return fmt.Errorf("first packet: verdict %s, %v", verdictName[verdict], err)
			}
		}
		b.ResetTimer()
		for i := range b.N {
			k := order[i%n]
			f := relayFrames[k].next()
			// Alternate which program runs first: the second finds the
			// syscall's path warm.
			if i%2 == 0 {
				if err := run(e.fp.objs.RelayXdp, f, xdpRedirect, &relayRuns); err != nil {
					return fmt.Errorf("relay: %w", err)
				}
			}
			if err := run(minProg, minFrames[k], xdpRedirect, &minRuns); err != nil {
				return fmt.Errorf("minimal forwarder: %w", err)
			}
			if i%2 == 1 {
				if err := run(e.fp.objs.RelayXdp, f, xdpRedirect, &relayRuns); err != nil {
					return fmt.Errorf("relay: %w", err)
				}
			}
			if err := run(empty, minFrames[k], xdpPass, &emptyRuns); err != nil {
				return fmt.Errorf("empty program: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	relay, minf, zero := median(relayRuns), median(minRuns), median(emptyRuns)
	b.ReportMetric(relay, "relay-ns/pkt")
	b.ReportMetric(minf, "minfwd-ns/pkt")
	b.ReportMetric(zero, "empty-ns/pkt")
	b.ReportMetric(relay/minf, "ratio")
	if minf > zero {
		b.ReportMetric((relay-zero)/(minf-zero), "net-ratio")
	}
}

// median returns the median of runs in ns; it sorts runs.
func median(runs []time.Duration) float64 {
	slices.Sort(runs)
	return float64(runs[len(runs)/2].Nanoseconds())
}

// addrAt returns the i-th address of p (IPv4).
func addrAt(p netip.Prefix, i int) netip.Addr {
	b := p.Addr().As4()
	v := binary.BigEndian.Uint32(b[:]) + uint32(i)
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// rtpFrame is one flow's IPv4 RTP frame, sent again and again with the
// next sequence number and timestamp.
type rtpFrame struct {
	src, dst netip.AddrPort
	frame    []byte
}

func newRTPFrame(src, dst netip.AddrPort, ssrc uint32, seq uint16) *rtpFrame {
	return &rtpFrame{src: src, dst: dst, frame: buildFrame(src, dst, rtpPacket(ssrc, seq-1, uint32(seq-1)*160, 160), frameOpts{})}
}

// next advances the frame's RTP sequence number by one and its timestamp
// by 20 ms at 8 kHz, fixes the UDP checksum and returns the frame.
func (r *rtpFrame) next() []byte {
	const udpOff, rtpOff = 14 + 20, 14 + 20 + 8
	f := r.frame
	binary.BigEndian.PutUint16(f[rtpOff+2:], binary.BigEndian.Uint16(f[rtpOff+2:])+1)
	binary.BigEndian.PutUint32(f[rtpOff+4:], binary.BigEndian.Uint32(f[rtpOff+4:])+160)
	binary.BigEndian.PutUint16(f[udpOff+6:], udpChecksum(r.src.Addr(), r.dst.Addr(), f[udpOff:]))
	return f
}

// BenchmarkInstallRemove is a flow's install and removal, as a call's
// setup and hang-up do for each of its flows (the SIP B2BUA's CPU per
// call): the map updates, the statistics slot's reset and last read.
//
//	go test -run '^$' -bench InstallRemove -count 5 ./fastpath/
func BenchmarkInstallRemove(b *testing.B) {
	e := newTestEnvFlows(b, 65536)
	fl := dataplane.Flow{Match: ap(relay4, 20000), SendFrom: ap(relay4, 20000), SendTo: ap(callee4, 5000),
		ExpectSource: ap(caller4, 4000), ClockRate: 8000}
	b.ReportAllocs()
	for b.Loop() {
		if err := e.fp.Install(fl); err != nil {
			b.Fatal(err)
		}
		if _, err := e.fp.Remove(fl.Match); err != nil {
			b.Fatal(err)
		}
	}
}

// benchFlowCounts returns BenchmarkXDPFlows's flow counts: 16, 1,000 and
// 10,000, or the comma-separated counts of RELAYD_BENCH_FLOWS (to find
// where the flows' state leaves a cache: docs/bench.md).
func benchFlowCounts(b *testing.B) []int {
	s := os.Getenv("RELAYD_BENCH_FLOWS")
	if s == "" {
		return []int{16, 1000, 10000}
	}
	var ns []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 30000 {
			b.Fatalf("RELAYD_BENCH_FLOWS: %q is not a flow count from 1 to 30000", f)
		}
		ns = append(ns, n)
	}
	return ns
}
