package fastpath

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/lab/minfwd"
)

// TestRedirectMonitor runs the relay program in live-frame mode (the
// kernel redirects and flushes for real) toward out0. While out0's peer
// out1 has an XDP program, out0 takes redirected frames; without one (and
// without GRO) it refuses them: the redirect monitor sees the refusal,
// counts it, takes out0 out of tx_ports (the next frame is punted:
// no_egress), and the probe keeps it out until out1 has a program again.
// Refusing again right after, out0 falls back again and is probed less
// often. A monitor started while out0 refuses puts it in fallback at once.
func TestRedirectMonitor(t *testing.T) {
	e := newTestEnv(t)
	core, logs := observer.New(zap.DebugLevel)
	log := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
	// peerXDP gives a peer (in1, out1) an XDP program, or takes it away.
	peerLinks := map[string]link.Link{}
	peerXDP := func(name string, on bool) {
		t.Helper()
		if !on {
			if err := peerLinks[name].Close(); err != nil {
				t.Fatal(err)
			}
			delete(peerLinks, name)
			return
		}
		if err := inNS(e.ns, func() error {
			peer, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			l, err := link.AttachXDP(link.XDPOptions{Program: e.fp.objs.RelayXdp, Interface: peer.Attrs().Index})
			peerLinks[name] = l
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, l := range peerLinks {
			l.Close()
		}
	})
	start := func() *redirMon {
		t.Helper()
		var mon *redirMon
		if err := inNS(e.ns, func() error {
			var err error
			mon, err = startRedirMon(e.fp.objs.TxPorts, []dataplane.Interface{{Name: "in0", Index: e.in}, {Name: "out0", Index: e.out}}, log)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return mon
	}
	peerXDP("in1", true)
	peerXDP("out1", true)
	mon := start()
	t.Cleanup(func() { mon.close() })

	fl := dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000)}
	if err := e.fp.Install(fl); err != nil {
		t.Fatal(err)
	}
	frame := buildFrame(ap(caller4, 4000), fl.Match, rtpPacket(1, 1, 160, 160), frameOpts{})
	live := func() {
		t.Helper()
		if err := inNS(e.ns, func() error {
			_, err := e.fp.objs.RelayXdp.Run(&ebpf.RunOptions{
				Data:    frame,
				Repeat:  1,
				Flags:   unix.BPF_F_TEST_XDP_LIVE_FRAMES,
				Context: xdpMd{DataEnd: uint32(len(frame)), IngressIfindex: uint32(e.in)},
			})
			return err
		}); err != nil {
			t.Fatalf("live run: %v", err)
		}
	}
	state := func(mon *redirMon) dataplane.Egress {
		t.Helper()
		eg := mon.egress()
		var out0 *dataplane.Egress
		for i := range eg {
			switch {
			case eg[i].Device == "out0":
				out0 = &eg[i]
			case eg[i].RedirectErrors != 0 || eg[i].Fallback:
				t.Fatalf("%+v: only out0 refuses redirected frames", eg[i])
			}
		}
		if len(eg) != 2 || out0 == nil {
			t.Fatalf("egress %+v, want in0 and out0", eg)
		}
		return *out0
	}
	waitFallback := func(want bool, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for state(mon).Fallback != want {
			if time.Now().After(deadline) {
				t.Fatalf("fallback still %t after %s", !want, within)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	inTxPorts := func() bool {
		var v relayBpfDevmapVal
		err := e.fp.objs.TxPorts.Lookup(uint32(e.out), &v)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatal(err)
		}
		return err == nil
	}

	// The first probes found both devices taking frames, and learnt their
	// addresses.
	if st := state(mon); st.Fallback || st.RedirectErrors != 0 || !inTxPorts() {
		t.Fatalf("out0 with out1's program, at start: %+v, in tx_ports %t", st, inTxPorts())
	}
	if n := countEntries(t, mon.objs.DevAddrs); n != 2 {
		t.Errorf("%d device addresses learnt, want 2", n)
	}

	peerXDP("out1", false)
	before := e.counters(t)
	live()
	waitFallback(true, 2*time.Second)
	if st := state(mon); st.RedirectErrors != 1 {
		t.Errorf("%d redirect errors counted, want 1", st.RedirectErrors)
	}
	if inTxPorts() {
		t.Error("out0 still in tx_ports in fallback")
	}
	live()
	after := e.counters(t)
	if d := after["forward/redirect"] - before["forward/redirect"]; d != 1 {
		t.Errorf("%d frames redirected, want 1 (the refused one)", d)
	}
	if d := after["punt/no_egress"] - before["punt/no_egress"]; d != 1 {
		t.Errorf("%d frames punted for no_egress in fallback, want 1", d)
	}
	// A probe (every second) finds out0 still refusing.
	time.Sleep(probeInterval + probeInterval/2)
	if st := state(mon); !st.Fallback || st.RedirectErrors != 1 || inTxPorts() {
		t.Errorf("out0 after a refused probe: %+v, in tx_ports %t; want fallback, still 1 error (the probe's are not counted)", st, inTxPorts())
	}

	peerXDP("out1", true)
	waitFallback(false, 3*probeInterval)
	if !inTxPorts() {
		t.Fatal("out0 not back in tx_ports after a successful probe")
	}
	before = e.counters(t)
	live()
	time.Sleep(50 * time.Millisecond)
	after = e.counters(t)
	if d := after["forward/redirect"] - before["forward/redirect"]; d != 1 {
		t.Errorf("after recovery: %d frames redirected, want 1", d)
	}
	if st := state(mon); st.Fallback || st.RedirectErrors != 1 {
		t.Errorf("after recovery: %+v, want no fallback and no new error", st)
	}

	// out1 loses its program again at once: the monitor was re-armed, out0
	// falls back again, and as it flaps it is probed half as often.
	peerXDP("out1", false)
	live()
	waitFallback(true, 2*time.Second)
	if st := state(mon); st.RedirectErrors != 2 {
		t.Errorf("after the second refusal: %d errors, want 2", st.RedirectErrors)
	}
	mon.mu.Lock()
	interval := mon.devs[e.out].interval
	mon.mu.Unlock()
	if interval != 2*probeInterval {
		t.Errorf("probe interval %s after a refusal within %s of the return, want %s", interval, flapWindow, 2*probeInterval)
	}
	// One warning a minute: the second refusal is logged at debug level.
	levels := map[zapcore.Level]int{}
	for _, en := range logs.FilterMessageSnippet("refuses redirected frames").All() {
		levels[en.Level]++
		if en.ContextMap()["device"] != "out0" {
			t.Errorf("%q names %v, want out0", en.Message, en.ContextMap()["device"])
		}
	}
	if levels[zap.WarnLevel] != 1 || levels[zap.DebugLevel] != 1 {
		t.Errorf("refusals logged by level %v, want one warning and one debug line", levels)
	}

	// Stopping puts out0 back (with no workers, the redirect is the only
	// way out); a monitor started while out0 refuses takes it out at once,
	// before any frame of the relay's is refused.
	if err := mon.close(); err != nil {
		t.Fatal(err)
	}
	if !inTxPorts() {
		t.Error("out0 not back in tx_ports after the monitor stopped")
	}
	mon = start()
	if st := state(mon); !st.Fallback || st.RedirectErrors != 0 || inTxPorts() {
		t.Errorf("out0 refusing when the monitor started: %+v, in tx_ports %t; want fallback and no error counted", st, inTxPorts())
	}
}

func countEntries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var k uint64
	var v uint32
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// BenchmarkRedirectMonitor measures what the monitor costs on the hot
// path: xdp_devmap_xmit fires for every devmap flush, refusal or not, and
// runs the monitor's devmap_xmit program. A forwarder runs in live-frame
// mode (the kernel redirects, flushes, and the veth transmits into its
// peer, which has an XDP program and so takes the frames), batch by batch
// as a driver's NAPI poll would, and the kernel's BPF statistics time the
// monitor's program and the forwarder. The forwarder is lab/minfwd's (the
// relay program's rewrite would turn the recycled frames into another
// flow's); its frames' TTL of 255 lasts 250 runs of each page. Reported:
// ns/flush, the monitor program's run time per flush (the tracepoint's
// own record adds to it); flushes/frame; fwd_ns/frame, the forwarder's
// run time per frame, for scale.
//
//	go test -run '^$' -bench RedirectMonitor ./fastpath/
func BenchmarkRedirectMonitor(b *testing.B) {
	e := newTestEnv(b)
	if err := inNS(e.ns, func() error {
		peer, err := netlink.LinkByName("out1")
		if err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: e.fp.objs.RelayXdp, Interface: peer.Attrs().Index})
		if err != nil {
			return err
		}
		b.Cleanup(func() { l.Close() })
		return nil
	}); err != nil {
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
	var mon *redirMon
	if err := inNS(e.ns, func() error {
		var err error
		mon, err = startRedirMon(e.fp.objs.TxPorts, []dataplane.Interface{{Name: "in0", Index: e.in}, {Name: "out0", Index: e.out}}, zaptest.NewLogger(b))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer mon.close()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	progStats := func(p *ebpf.Program) (time.Duration, uint64) {
		st, err := p.Stats()
		if err != nil {
			b.Fatal(err)
		}
		return st.Runtime, st.RunCount
	}
	frame := buildFrame(ap(caller4, 4000), ap(callee4, 5000), rtpPacket(1, 1, 160, 160), frameOpts{ttl: 255})
	for _, batch := range []uint32{16, 64} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			repeat := 250 * batch
			monT0, monN0 := progStats(mon.objs.DevmapXmit)
			fwdT0, fwdN0 := progStats(minProg)
			before := e.counters(b)
			if err := inNS(e.ns, func() error {
				for range b.N {
					if _, err := minProg.Run(&ebpf.RunOptions{
						Data:      frame,
						Repeat:    repeat,
						BatchSize: batch,
						Flags:     unix.BPF_F_TEST_XDP_LIVE_FRAMES,
						Context:   xdpMd{DataEnd: uint32(len(frame)), IngressIfindex: uint32(e.in)},
					}); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			frames := uint64(b.N) * uint64(repeat)
			if d := e.counters(b)["pass/no_flow"] - before["pass/no_flow"]; d < frames {
				b.Fatalf("%d frames arrived at out1, want %d", d, frames)
			}
			monT1, monN1 := progStats(mon.objs.DevmapXmit)
			fwdT1, fwdN1 := progStats(minProg)
			if monN1 == monN0 {
				b.Fatal("the monitor's devmap_xmit program never ran")
			}
			b.ReportMetric(float64((monT1-monT0).Nanoseconds())/float64(monN1-monN0), "ns/flush")
			b.ReportMetric(float64(monN1-monN0)/float64(frames), "flushes/frame")
			b.ReportMetric(float64((fwdT1-fwdT0).Nanoseconds())/float64(fwdN1-fwdN0), "fwd_ns/frame")
		})
	}
}
