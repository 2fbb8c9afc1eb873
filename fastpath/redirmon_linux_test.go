package fastpath

import (
	"encoding/binary"
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

// TestRedirectMonitor: while out0's peer out1 has an XDP program, out0
// takes redirected frames; without one (and without GRO) it refuses them:
// the redirect monitor sees the refusal, counts it, takes out0 out of
// tx_ports (the next frame is punted: no_egress), and the probe keeps it
// out until out1 has a program again. Refusing again right after, out0
// falls back again and is probed less often. A monitor started while out0
// refuses puts it in fallback at once.
//
// The same without probes ("no-probe": a kernel that refuses XDP test
// runs on live frames): out0 goes back untried every interval, the
// relay's next frame finds it refusing again, and the interval doubles.
// That needs refusals reported when the frame is enqueued (6.3 and
// later): on older kernels, which all run live frames (5.18 and later:
// Debian 12's 6.1 among them), the probes are tested alone.
//
// The relay's frames are live-frame runs of the relay program (the kernel
// redirects and flushes for real) where the kernel allows them, and frames
// sent into in1, in0's peer, with the relay program attached to in0, where
// it does not.
func TestRedirectMonitor(t *testing.T) {
	live := liveFramesWork(t)
	if live {
		t.Run("probe", func(t *testing.T) { testRedirectMonitor(t, true) })
	}
	if !live || kernelAtLeast(t, 6, 3) {
		t.Run("no-probe", func(t *testing.T) { testRedirectMonitorNoProbe(t, live) })
	}
}

// redirmonHarness is TestRedirectMonitor's test environment and helpers.
type redirmonHarness struct {
	t         *testing.T
	e         *testEnv
	logs      *observer.ObservedLogs
	log       *zap.Logger
	peerLinks map[string]link.Link
	frame     []byte
	send      func() // one relay frame from the caller, through in0
	mon       *redirMon
}

func newRedirmonHarness(t *testing.T, live bool) *redirmonHarness {
	h := &redirmonHarness{t: t, e: newTestEnv(t), peerLinks: map[string]link.Link{}}
	core, logs := observer.New(zap.DebugLevel)
	h.logs = logs
	h.log = zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
	t.Cleanup(func() {
		if h.mon != nil {
			h.mon.close()
		}
		for _, l := range h.peerLinks {
			l.Close()
		}
	})
	fl := dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000)}
	if err := h.e.fp.Install(fl); err != nil {
		t.Fatal(err)
	}
	h.frame = buildFrame(ap(caller4, 4000), fl.Match, rtpPacket(1, 1, 160, 160), frameOpts{})
	if live {
		h.send = h.liveRun
	} else {
		h.send = h.attachAndInject()
	}
	return h
}

// liveRun runs the relay program on the frame in live-frame mode, as
// received on in0.
func (h *redirmonHarness) liveRun() {
	h.t.Helper()
	e := h.e
	if err := inNS(e.ns, func() error {
		_, err := e.fp.objs.RelayXdp.Run(&ebpf.RunOptions{
			Data:    h.frame,
			Repeat:  1,
			Flags:   unix.BPF_F_TEST_XDP_LIVE_FRAMES,
			Context: xdpMd{DataEnd: uint32(len(h.frame)), IngressIfindex: uint32(e.in)},
		})
		return err
	}); err != nil {
		h.t.Fatalf("live run: %v", err)
	}
}

// attachAndInject attaches the relay program to in0 and returns a function
// that sends the frame into in1 (a packet socket), so that in0 receives
// it, and waits until the program has taken it.
func (h *redirmonHarness) attachAndInject() func() {
	t, e := h.t, h.e
	var fd, in1 int
	if err := inNS(e.ns, func() error {
		peer, err := netlink.LinkByName("in1")
		if err != nil {
			return err
		}
		in1 = peer.Attrs().Index
		l, err := link.AttachXDP(link.XDPOptions{Program: e.fp.objs.RelayXdp, Interface: e.in, Flags: link.XDPDriverMode})
		if err != nil {
			return err
		}
		h.peerLinks["in0 (relay)"] = l
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return func() {
		t.Helper()
		// The frames in0 takes from the caller: redirected, or punted.
		taken := func() uint64 {
			c := e.counters(t)
			return c["forward/redirect"] + c["punt/no_egress"]
		}
		before := taken()
		if err := unix.Sendto(fd, h.frame, 0, &unix.SockaddrLinklayer{Ifindex: in1}); err != nil {
			t.Fatalf("send into in1: %v", err)
		}
		for deadline := time.Now().Add(time.Second); taken() == before; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("in0's program never took the frame sent into in1")
			}
		}
	}
}

// peerXDP gives a peer (in1, out1) an XDP program, or takes it away.
func (h *redirmonHarness) peerXDP(name string, on bool) {
	h.t.Helper()
	if !on {
		if err := h.peerLinks[name].Close(); err != nil {
			h.t.Fatal(err)
		}
		delete(h.peerLinks, name)
		return
	}
	if err := inNS(h.e.ns, func() error {
		peer, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: h.e.fp.objs.RelayXdp, Interface: peer.Attrs().Index})
		h.peerLinks[name] = l
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
}

// start starts a monitor of in0 and out0 (h.mon), probing or not.
func (h *redirmonHarness) start(probe bool) {
	h.t.Helper()
	if err := inNS(h.e.ns, func() error {
		var err error
		redirmonNoProbe = !probe
		defer func() { redirmonNoProbe = false }()
		h.mon, err = startRedirMon(h.e.fp.objs.TxPorts, []dataplane.Interface{{Name: "in0", Index: h.e.in}, {Name: "out0", Index: h.e.out}}, h.log)
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
}

// state is out0's egress state; in0 must have none to report.
func (h *redirmonHarness) state() dataplane.Egress {
	h.t.Helper()
	eg := h.mon.egress()
	var out0 *dataplane.Egress
	for i := range eg {
		switch {
		case eg[i].Device == "out0":
			out0 = &eg[i]
		case eg[i].RedirectErrors != 0 || eg[i].Fallback:
			h.t.Fatalf("%+v: only out0 refuses redirected frames", eg[i])
		}
	}
	if len(eg) != 2 || out0 == nil {
		h.t.Fatalf("egress %+v, want in0 and out0", eg)
	}
	return *out0
}

func (h *redirmonHarness) waitFallback(want bool, within time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for h.state().Fallback != want {
		if time.Now().After(deadline) {
			h.t.Fatalf("fallback still %t after %s", !want, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *redirmonHarness) inTxPorts() bool {
	h.t.Helper()
	var v relayBpfDevmapVal
	err := h.e.fp.objs.TxPorts.Lookup(uint32(h.e.out), &v)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		h.t.Fatal(err)
	}
	return err == nil
}

func (h *redirmonHarness) interval() time.Duration {
	h.mon.mu.Lock()
	defer h.mon.mu.Unlock()
	return h.mon.devs[h.e.out].interval
}

// refusalLogs checks that every line about a refusal names out0 and that
// warn of them are warnings and debug at debug level.
func (h *redirmonHarness) refusalLogs(warn, debug int) {
	h.t.Helper()
	levels := map[zapcore.Level]int{}
	for _, en := range h.logs.FilterMessageSnippet("refuses redirected frames").All() {
		levels[en.Level]++
		if en.ContextMap()["device"] != "out0" {
			h.t.Errorf("%q names %v, want out0", en.Message, en.ContextMap()["device"])
		}
	}
	if levels[zap.WarnLevel] != warn || levels[zap.DebugLevel] != debug {
		h.t.Errorf("refusals logged by level %v, want %d warnings and %d debug lines", levels, warn, debug)
	}
}

// atStart checks out0 at the monitor's start: taking frames, in
// tx_ports, and addrs device addresses learnt.
func (h *redirmonHarness) atStart(addrs int) {
	h.t.Helper()
	if st := h.state(); st.Fallback || st.RedirectErrors != 0 || !h.inTxPorts() {
		h.t.Fatalf("out0 with out1's program, at start: %+v, in tx_ports %t", st, h.inTxPorts())
	}
	if n := countEntries(h.t, h.mon.objs.DevAddrs); n != addrs {
		h.t.Errorf("%d device addresses learnt, want %d", n, addrs)
	}
}

// firstRefusal takes out1's program away: the relay's next frame is
// refused, counted, and out0 falls back, so that the frame after is
// punted.
func (h *redirmonHarness) firstRefusal() {
	h.t.Helper()
	t, e := h.t, h.e
	h.peerXDP("out1", false)
	before := e.counters(t)
	h.send()
	h.waitFallback(true, 2*time.Second)
	if st := h.state(); st.RedirectErrors != 1 || h.inTxPorts() {
		t.Errorf("after the first refusal: %+v, in tx_ports %t; want 1 error, out of tx_ports", st, h.inTxPorts())
	}
	h.send()
	after := e.counters(t)
	if d := after["forward/redirect"] - before["forward/redirect"]; d != 1 {
		t.Errorf("%d frames redirected, want 1 (the refused one)", d)
	}
	if d := after["punt/no_egress"] - before["punt/no_egress"]; d != 1 {
		t.Errorf("%d frames punted for no_egress in fallback, want 1", d)
	}
}

// redirected checks that out0, back, takes the relay's next frame:
// redirected, no new error (wantErrors in all).
func (h *redirmonHarness) redirected(wantErrors uint64) {
	h.t.Helper()
	t, e := h.t, h.e
	before := e.counters(t)
	h.send()
	time.Sleep(50 * time.Millisecond)
	after := e.counters(t)
	if d := after["forward/redirect"] - before["forward/redirect"]; d != 1 {
		t.Errorf("after recovery: %d frames redirected, want 1", d)
	}
	if st := h.state(); st.Fallback || st.RedirectErrors != wantErrors || !h.inTxPorts() {
		t.Errorf("after recovery: %+v, in tx_ports %t; want no fallback and %d errors", st, h.inTxPorts(), wantErrors)
	}
}

func testRedirectMonitor(t *testing.T, live bool) {
	h := newRedirmonHarness(t, live)
	h.peerXDP("in1", true)
	h.peerXDP("out1", true)
	h.start(true)

	// The first probes found both devices taking frames, and learnt their
	// addresses.
	h.atStart(2)
	h.firstRefusal()
	// A probe (every second) finds out0 still refusing.
	time.Sleep(probeInterval + probeInterval/2)
	if st := h.state(); !st.Fallback || st.RedirectErrors != 1 || h.inTxPorts() {
		t.Errorf("out0 after a refused probe: %+v, in tx_ports %t; want fallback, still 1 error (the probe's are not counted)", st, h.inTxPorts())
	}

	h.peerXDP("out1", true)
	h.waitFallback(false, 3*probeInterval)
	if !h.inTxPorts() {
		t.Fatal("out0 not back in tx_ports after a successful probe")
	}
	h.redirected(1)

	// out1 loses its program again at once: the monitor was re-armed, out0
	// falls back again, and as it flaps it is probed half as often.
	h.peerXDP("out1", false)
	h.send()
	h.waitFallback(true, 2*time.Second)
	if st := h.state(); st.RedirectErrors != 2 {
		t.Errorf("after the second refusal: %d errors, want 2", st.RedirectErrors)
	}
	if iv := h.interval(); iv != 2*probeInterval {
		t.Errorf("probe interval %s after a refusal within %s of the return, want %s", iv, flapWindow, 2*probeInterval)
	}
	// One warning a minute: the second refusal is logged at debug level.
	h.refusalLogs(1, 1)

	// Stopping puts out0 back (with no workers, the redirect is the only
	// way out); a monitor started while out0 refuses takes it out at once,
	// before any frame of the relay's is refused.
	if err := h.mon.close(); err != nil {
		t.Fatal(err)
	}
	if !h.inTxPorts() {
		t.Error("out0 not back in tx_ports after the monitor stopped")
	}
	h.start(true)
	if st := h.state(); !st.Fallback || st.RedirectErrors != 0 || h.inTxPorts() {
		t.Errorf("out0 refusing when the monitor started: %+v, in tx_ports %t; want fallback and no error counted", st, h.inTxPorts())
	}
}

func testRedirectMonitorNoProbe(t *testing.T, live bool) {
	h := newRedirmonHarness(t, live)
	h.peerXDP("in1", true)
	h.peerXDP("out1", true)
	h.start(!live) // a kernel without live frames finds out itself
	if !live {
		h.mon.mu.Lock()
		noProbe := h.mon.noProbe
		h.mon.mu.Unlock()
		if !noProbe {
			t.Fatal("the monitor probes on a kernel that refuses live frames")
		}
		if n := len(h.logs.FilterMessageSnippet("refuses to run XDP programs on live frames").All()); n != 1 {
			t.Errorf("%d warnings about the probes, want 1", n)
		}
	}
	h.atStart(0) // nothing learnt without a probe

	// The relay's own frame finds out0 refusing.
	h.firstRefusal()

	// After the interval out0 goes back untried; the next frame is
	// refused, and out0 falls back for twice as long.
	h.waitFallback(false, 3*probeInterval)
	if !h.inTxPorts() {
		t.Fatal("out0 not back in tx_ports after its interval")
	}
	h.send()
	h.waitFallback(true, 2*time.Second)
	if st := h.state(); st.RedirectErrors != 2 {
		t.Errorf("after the second refusal: %d errors, want 2", st.RedirectErrors)
	}
	if iv := h.interval(); iv != 2*probeInterval {
		t.Errorf("interval %s after a refusal right after the return, want %s", iv, 2*probeInterval)
	}

	// out1 has a program again: out0 goes back after its interval and
	// takes the relay's frames.
	h.peerXDP("out1", true)
	h.waitFallback(false, 3*2*probeInterval)
	h.redirected(2)
	h.refusalLogs(1, 1)
	if n := len(h.logs.FilterMessageSnippet("tried again without a probe").All()); n != 2 {
		t.Errorf("%d returns without a probe logged, want 2", n)
	}
}

// liveFramesWork reports whether the kernel runs an XDP program on live
// frames (BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES): 5.18 and
// later, unless hardened against it.
func liveFramesWork(t *testing.T) bool {
	t.Helper()
	requireBPF(t)
	prog, _, closeFn, err := minfwd.Load()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	// Not IP: the forwarder passes it, and the stack drops what it has no
	// protocol for (IEEE 802's local experimental EtherType).
	frame := make([]byte, 60)
	binary.BigEndian.PutUint16(frame[12:14], probeEtherType)
	_, err = prog.Run(&ebpf.RunOptions{Data: frame, Repeat: 1, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES})
	if err != nil && !noLiveFrames(err) {
		t.Fatalf("live-frame run: %v", err)
	}
	return err == nil
}

// kernelAtLeast reports whether the running kernel is major.minor or later.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", unix.ByteSliceToString(u.Release[:]), err)
	}
	return ma > major || ma == major && mi >= minor
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
