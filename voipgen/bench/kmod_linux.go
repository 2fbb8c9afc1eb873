package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/labrelay"
	"github.com/relayd/relayd/lab/measure"
	"github.com/relayd/relayd/lab/rtpengine"
	"github.com/relayd/relayd/lab/rtpengine/ngclient"
	"github.com/relayd/relayd/lab/vm"
	"github.com/relayd/relayd/voipgen/analyze"
)

// Kmod runs voipgen kmodbench: in lab/vm's Debian guest with cfg.VM,
// else here.
func Kmod(ctx context.Context, cfg KmodConfig) (*KmodReport, error) {
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("must run as root (network namespaces, XDP, the kernel module)")
	}
	if cfg.VM {
		return kmodInVM(ctx, cfg)
	}
	return kmodHere(ctx, cfg)
}

// kmodTable is the kernel table rtpengine forwards through.
const kmodTable = 0

// kmodNGAddr is the ng listener of both relays, in the relay namespace.
var kmodNGAddr = netip.MustParseAddrPort("127.0.0.1:2223")

// kmodInVM builds the module for Debian's kernel, boots lab/vm's guest
// and runs voipgen kmodbench (this program) there with the same flags.
func kmodInVM(ctx context.Context, cfg KmodConfig) (*KmodReport, error) {
	k, err := vm.DebianKernel(ctx, vm.DefaultCache)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kmodbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	ko, err := rtpengine.BuildKernelModule(ctx, k.Release, dir)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "kmodbench: built %s for %s in %v\n", filepath.Base(ko), k.Release, time.Since(start).Round(time.Millisecond))
	self, err := voipgenBinary("")
	if err != nil {
		return nil, err
	}
	relayd, err := relaydBinary(cfg.Relayd)
	if err != nil {
		return nil, err
	}
	label := cfg.Label
	if label == "" {
		label = "TCG emulation (qemu, " + strconv.Itoa(cfg.CPUs) + " vCPU)"
		if os.Getenv("RELAYD_VM_ACCEL") == "kvm" {
			label = "KVM (qemu, " + strconv.Itoa(cfg.CPUs) + " vCPU)"
		}
	}
	out := filepath.Join(dir, "kmodbench.json")
	var args []string
	for _, a := range cfg.args {
		if a == "--vm" || a == "-vm" || strings.HasPrefix(a, "--vm=") || strings.HasPrefix(a, "-vm=") {
			continue
		}
		args = append(args, a)
	}
	args = append(args, "--module", ko, "--relayd", relayd, "--label", label, "--out", out)
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	// The guest's kernel loads no module on demand (its usermode helper
	// runs in the initramfs): veth is loaded here, the netfilter modules
	// by rtpengine.SetupKernel. An emulated CPU drains a veth late: a
	// longer backlog.
	script := "set -e\nexport HOME=/root PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n" +
		"modprobe -a veth\nsysctl -qw net.core.netdev_max_backlog=10000\n" +
		"'" + self + "' kmodbench " + strings.Join(quoted, " ") + "\n"
	fmt.Fprintf(cfg.Progress, "kmodbench: booting %s under %s\n", k.Release, label)
	timeout := time.Duration(cfg.Repeat*len(cfg.Relays))*(cfg.Duration+cfg.Warmup+2*time.Minute) + 5*time.Minute
	vctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := vm.Run(vctx, vm.Options{Kernel: k, Dir: dir, Script: script, CPUs: cfg.CPUs})
	if res != nil {
		fmt.Fprintf(cfg.Progress, "kmodbench: guest ran %v, exit status %d; its output:\n%s", res.Took.Round(time.Second), res.ExitCode, res.Output)
	}
	if err != nil {
		if res != nil {
			err = fmt.Errorf("%w\nconsole:\n%s", err, res.Console)
		}
		return nil, err
	}
	b, rerr := os.ReadFile(out)
	if rerr != nil {
		return nil, fmt.Errorf("guest exit status %d, no report: %w", res.ExitCode, rerr)
	}
	var rep KmodReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("guest report: %w", err)
	}
	if res.ExitCode != 0 {
		return &rep, fmt.Errorf("guest exit status %d", res.ExitCode)
	}
	return &rep, nil
}

// kmodHere runs the comparison in this kernel.
func kmodHere(ctx context.Context, cfg KmodConfig) (rep *KmodReport, err error) {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	rep = &KmodReport{Label: cfg.Label, Kernel: unix.ByteSliceToString(uts.Release[:]), CPUs: runtime.NumCPU(),
		Calls: cfg.Calls, Duration: cfg.Duration.Seconds()}
	if rep.Label == "" {
		rep.Label = "native"
	}
	defer func() {
		if cfg.Out != "" && rep != nil {
			b, jerr := json.MarshalIndent(rep, "", "  ")
			if jerr == nil {
				jerr = os.WriteFile(cfg.Out, append(b, '\n'), 0o644)
			}
			err = errors.Join(err, jerr)
		}
	}()
	if slices.Contains(cfg.Relays, kmodRtpengine) {
		if err := rtpengine.Available(""); err != nil {
			return rep, err
		}
		if rep.Daemon, err = rtpengine.Version(""); err != nil {
			return rep, err
		}
		if _, v, err := rtpengine.KernelSource(); err == nil {
			rep.Module = v
		}
		if !rtpengine.KernelModuleLoaded() && cfg.Module == "" {
			return rep, errors.New("xt_RTPENGINE is not loaded: pass --module (or --vm)")
		}
	}
	var relayd string
	if slices.Contains(cfg.Relays, kmodXDP) {
		if relayd, err = relaydBinary(cfg.Relayd); err != nil {
			return rep, err
		}
	}
	l, err := lab.New(lab.Config{})
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, l.Close()) }()
	rep.Notes = append(rep.Notes,
		"CPU: /proc/stat over all CPUs during the measured send (tick-sampled, 10 ms units), per packet sent; the sender and receivers are the same in every run",
		"jitter and gaps are over the whole stream, warm-up included (the SSRC stays: a new one sends rtpengine's kernel target back to userspace)")
	for rep1 := 1; rep1 <= cfg.Repeat; rep1++ {
		for _, name := range cfg.Relays {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			fmt.Fprintf(cfg.Progress, "kmodbench: repetition %d/%d, %s\n", rep1, cfg.Repeat, name)
			run := kmodRunOne(ctx, l, cfg, name, relayd)
			run.Repetition = rep1
			rep.Runs = append(rep.Runs, run)
			fmt.Fprintf(cfg.Progress, "  sent %d, received %d, lost %d, relayed %d, jitter p50 %.2f ms, max gap %.1f ms, softirq %.0f ns/pkt, busy %.0f ns/pkt %s\n",
				run.Sent, run.Received, run.Lost, run.Relayed, run.JitterP50Ms, run.MaxGapMs, run.SoftirqNs, run.BusyNs, run.Error)
		}
	}
	for _, r := range rep.Runs {
		if r.Error != "" {
			err = errors.Join(err, fmt.Errorf("%s, repetition %d: %s", r.Relay, r.Repetition, r.Error))
		}
	}
	return rep, err
}

// kmodRelay is a relay under test: where each party sends, its counters.
type kmodRelay struct {
	pid      int
	toCallee []netip.AddrPort // call i: where the caller sends
	toCaller []netip.AddrPort // call i: where the callee sends
	// counters returns the relay's packets relayed and its errors or
	// drops so far.
	counters func() (relayed, user, errs uint64, err error)
	close    func(run *KmodRun) error
}

func kmodRunOne(ctx context.Context, l *lab.Lab, cfg KmodConfig, name, relayd string) (run KmodRun) {
	run = KmodRun{Relay: name, Calls: cfg.Calls, Relayed: -1}
	fail := func(err error) KmodRun { run.Error = err.Error(); return run }
	n := cfg.Calls
	callers, callees := make([]*net.UDPConn, n), make([]*net.UDPConn, n)
	defer func() {
		for _, c := range append(callers, callees...) {
			if c != nil {
				c.Close()
			}
		}
	}()
	for i := range n {
		var err error
		if callers[i], err = l.Caller.ListenUDP("udp4", kmodCaller(l, i).String()); err != nil {
			return fail(err)
		}
		if callees[i], err = l.Callee.ListenUDP("udp4", kmodCallee(l, i).String()); err != nil {
			return fail(err)
		}
		callers[i].SetReadBuffer(256 << 10)
		callees[i].SetReadBuffer(256 << 10)
	}
	var r *kmodRelay
	var err error
	switch name {
	case kmodForward:
		r = &kmodRelay{close: func(*KmodRun) error { return nil }}
		for i := range n {
			r.toCallee, r.toCaller = append(r.toCallee, kmodCallee(l, i)), append(r.toCaller, kmodCaller(l, i))
		}
	case kmodRtpengine:
		r, err = kmodStartRtpengine(ctx, l, cfg)
	case kmodXDP:
		r, err = kmodStartRelayd(ctx, l, cfg, relayd)
	}
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := r.close(&run); err != nil && run.Error == "" {
			run.Error = err.Error()
		}
	}()

	rcfg := analyze.Config{ClockRate: 8000, Batch: 32, MaxSSRCsPerPort: 4, Duration: time.Hour}
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	var wg sync.WaitGroup
	reps := make([]analyze.Report, 2)
	for j, conns := range [][]*net.UDPConn{callees, callers} {
		rx := analyze.NewOnConns(rcfg, conns)
		wg.Go(func() { reps[j] = rx.Run(rctx) })
	}
	// The receivers close the sockets when they stop.
	defer func() { rcancel(); wg.Wait() }()

	var s measure.Sampler
	var targets []measure.Target
	if r.pid != 0 {
		targets = append(targets, measure.Target{Label: "relay", PID: r.pid})
		// The relay process's own time with its calls set up and no
		// media: what it costs whatever the rate.
		a, err := s.Snapshot(targets)
		if err != nil {
			return fail(err)
		}
		time.Sleep(2 * time.Second)
		b, err := s.Snapshot(targets)
		if err != nil {
			return fail(err)
		}
		u := measure.Diff(a, b)
		run.ProcessIdlePct = 100 * u.Get("relay").Seconds() / u.Elapsed.Seconds()
	}
	var snap0, snap1 measure.Snapshot
	var rel0, rel1, user0, user1, errs0, errs1 uint64
	var serr error
	mark := func(first bool) {
		snap, err := s.Snapshot(targets)
		serr = errors.Join(serr, err)
		var rel, us, e uint64
		if r.counters != nil {
			rel, us, e, err = r.counters()
			serr = errors.Join(serr, err)
		}
		if first {
			snap0, rel0, user0, errs0 = snap, rel, us, e
		} else {
			snap1, rel1, user1, errs1 = snap, rel, us, e
		}
	}
	drops0, derr := kmodDrops(l)
	if derr != nil {
		return fail(derr)
	}
	conns := append(slices.Clone(callers), callees...)
	dsts := append(slices.Clone(r.toCallee), r.toCaller...)
	sent, sentAll, sendErrs := kmodSend(ctx, conns, dsts, cfg.Warmup, cfg.Duration, mark)
	if serr != nil {
		return fail(serr)
	}
	// What was sent last is relayed and received.
	time.Sleep(300 * time.Millisecond)
	rcancel()
	wg.Wait()
	if r.counters != nil {
		// The counters after the last packets were relayed.
		if rel, us, e, err := r.counters(); err == nil {
			rel1, user1, errs1 = rel, us, e
		}
		run.Relayed, run.RelayErrors = int64(rel1-rel0), int64(errs1-errs0)
	}
	if drops1, err := kmodDrops(l); err == nil {
		run.VethDrops, run.SocketDrops = int64(drops1.veth-drops0.veth), int64(drops1.udp-drops0.udp)
	}
	run.RelayedUserspace = -1
	if name == kmodXDP {
		run.RelayedUserspace = int64(user1 - user0)
	}
	run.Sent, run.SentAll, run.SendErrors = sent, sentAll, sendErrs
	var jit []float64
	for _, rp := range reps {
		for _, st := range rp.Streams {
			run.Received += st.Packets
			run.Lost += st.Lost
			jit = append(jit, st.JitterMs)
			run.MaxGapMs = max(run.MaxGapMs, st.MaxGapMs)
		}
	}
	if len(jit) > 0 {
		run.JitterP50Ms, run.JitterMaxMs = median(jit), slices.Max(jit)
	}
	if got := len(jit); got != 2*n {
		run.Error = fmt.Sprintf("%d of %d streams received", got, 2*n)
	}
	u := measure.Diff(snap0, snap1)
	run.ElapsedS = u.Elapsed.Seconds()
	var soft, sys, idle uint64
	for i := range snap1.CPUs {
		if i < len(snap0.CPUs) {
			soft += snap1.CPUs[i].SoftIRQ - snap0.CPUs[i].SoftIRQ
			sys += snap1.CPUs[i].System - snap0.CPUs[i].System
			idle += snap1.CPUs[i].IdleNs() - snap0.CPUs[i].IdleNs()
		}
	}
	if u.Elapsed > 0 && len(snap1.CPUs) > 0 {
		run.IdlePct = 100 * float64(idle) / float64(int64(len(snap1.CPUs))*u.Elapsed.Nanoseconds())
	}
	tick := uint64(time.Second / measure.UserHZ)
	measured := sent
	run.SoftirqNs = measure.NsPerPacket(time.Duration(soft*tick), measured)
	run.SystemNs = measure.NsPerPacket(time.Duration(sys*tick), measured)
	run.BusyNs = measure.NsPerPacket(u.Busy, measured)
	if r.pid != 0 {
		run.ProcessNs = measure.NsPerPacket(u.Get("relay"), measured)
	}
	return run
}

// kmodDropCounts are where the lab drops packets outside the relays.
type kmodDropCounts struct {
	veth uint64 // rx and tx dropped of the four veths (a full queue or ring)
	udp  uint64 // the parties' UDP RcvbufErrors (a receiver too slow)
}

// kmodDrops reads the lab's drop counters, in every namespace's own view.
func kmodDrops(l *lab.Lab) (kmodDropCounts, error) {
	var d kmodDropCounts
	for _, x := range []struct {
		ns     *lab.NS
		ifname string
	}{{l.Caller, lab.CallerIfName}, {l.Relay, lab.RelayCallerIfName}, {l.Relay, lab.RelayCalleeIfName}, {l.Callee, lab.CalleeIfName}} {
		out, err := x.ns.Command("ip", "-s", "-j", "link", "show", "dev", x.ifname).Output()
		if err != nil {
			return d, fmt.Errorf("ip -s link show %s in %s: %w", x.ifname, x.ns, err)
		}
		var links []struct {
			Stats struct {
				RX struct{ Dropped uint64 } `json:"rx"`
				TX struct{ Dropped uint64 } `json:"tx"`
			} `json:"stats64"`
		}
		if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
			return d, fmt.Errorf("ip -s -j link show %s: %v: %q", x.ifname, err, out)
		}
		d.veth += links[0].Stats.RX.Dropped + links[0].Stats.TX.Dropped
	}
	for _, ns := range []*lab.NS{l.Caller, l.Callee} {
		out, err := ns.Command("cat", "/proc/net/snmp").Output()
		if err != nil {
			return d, fmt.Errorf("/proc/net/snmp in %s: %w", ns, err)
		}
		n, err := udpRcvbufErrors(string(out))
		if err != nil {
			return d, fmt.Errorf("/proc/net/snmp in %s: %w", ns, err)
		}
		d.udp += n
	}
	return d, nil
}

func kmodCaller(l *lab.Lab, i int) netip.AddrPort {
	return netip.AddrPortFrom(l.CallerAddr4, uint16(4000+2*i))
}

func kmodCallee(l *lab.Lab, i int) netip.AddrPort {
	return netip.AddrPortFrom(l.CalleeAddr4, uint16(5000+2*i))
}

// kmodCalls sets the same ng calls up on a relay: offer with the
// caller's SDP, answer with the callee's.
func kmodCalls(ctx context.Context, l *lab.Lab, c *ngclient.Client, n int, r *kmodRelay) ([]ngclient.Request, error) {
	reqs := make([]ngclient.Request, n)
	for i := range n {
		req := ngclient.Request{CallID: fmt.Sprintf("kmod-%d", i), FromTag: "caller", SDP: rtpengine.AudioSDP(kmodCaller(l, i), 1)}
		off, err := c.Offer(ctx, req)
		if err != nil {
			return reqs[:i], fmt.Errorf("call %d: offer: %w", i, err)
		}
		toCaller, err := kmodSDPMedia(off.SDP, l.RelayMedia4)
		if err != nil {
			return reqs[:i], fmt.Errorf("call %d: offer: %w", i, err)
		}
		req.ToTag, req.SDP = "callee", rtpengine.AudioSDP(kmodCallee(l, i), 2)
		reqs[i] = req
		ans, err := c.Answer(ctx, req)
		if err != nil {
			return reqs[:i+1], fmt.Errorf("call %d: answer: %w", i, err)
		}
		toCallee, err := kmodSDPMedia(ans.SDP, l.RelayMedia4)
		if err != nil {
			return reqs[:i+1], fmt.Errorf("call %d: answer: %w", i, err)
		}
		r.toCallee, r.toCaller = append(r.toCallee, toCallee), append(r.toCaller, toCaller)
	}
	return reqs, nil
}

func kmodSDPMedia(body string, relay netip.Addr) (netip.AddrPort, error) {
	d, err := sdp.Parse([]byte(body))
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(d.Streams) != 1 {
		return netip.AddrPort{}, fmt.Errorf("%d streams in the rewritten SDP", len(d.Streams))
	}
	ap := d.Streams[0].RTP()
	if ap.Addr() != relay {
		return ap, fmt.Errorf("rewritten SDP names %s, not the relay's %s", ap, relay)
	}
	return ap, nil
}

func kmodDelete(c *ngclient.Client, reqs []ngclient.Request) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, req := range reqs {
		if _, err := c.Delete(ctx, req); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d deletes failed, first: %w", len(errs), len(reqs), errs[0])
	}
	return nil
}

// kmodNGConfig: ng replies can be slow under emulation.
var kmodNGConfig = ngclient.Config{Timeout: 5 * time.Second, Retries: 2}

func kmodStartRtpengine(ctx context.Context, l *lab.Lab, cfg KmodConfig) (_ *kmodRelay, err error) {
	if err := rtpengine.SetupKernel(l.Relay, cfg.Module, kmodTable); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kmodbench-rtpengine-")
	if err != nil {
		return nil, err
	}
	e, err := rtpengine.Start(l, rtpengine.Options{Dir: dir, Kernel: true, Table: kmodTable, PortMin: 30000, PortMax: 39999,
		NGAddr: kmodNGAddr, Client: kmodNGConfig})
	if err != nil {
		return nil, errors.Join(err, rtpengine.TeardownKernel(l.Relay, kmodTable), os.RemoveAll(dir))
	}
	r := &kmodRelay{pid: e.Pid()}
	reqs, err := kmodCalls(ctx, l, e.Client(), cfg.Calls, r)
	r.counters = func() (uint64, uint64, uint64, error) {
		st, err := rtpengine.ReadKernelStats(kmodTable)
		return st.Packets, 0, st.Errors, err
	}
	r.close = func(run *KmodRun) error {
		derr := kmodDelete(e.Client(), reqs)
		cerr := e.Close()
		run.Kernelized = strings.Count(e.Log(), "Kernelizing media stream")
		if run.Kernelized == 0 && run.Error == "" {
			run.Error = "rtpengine logged no \"Kernelizing media stream\""
		}
		return errors.Join(derr, cerr, rtpengine.TeardownKernel(l.Relay, kmodTable), os.RemoveAll(dir))
	}
	if err != nil {
		return nil, errors.Join(err, r.close(&KmodRun{}))
	}
	return r, nil
}

func kmodStartRelayd(ctx context.Context, l *lab.Lab, cfg KmodConfig, bin string) (_ *kmodRelay, err error) {
	dir, err := os.MkdirTemp("", "kmodbench-relayd-")
	if err != nil {
		return nil, err
	}
	rl, err := labrelay.New(l, labrelay.Options{Bin: bin, Dir: dir, LogLevel: "warn",
		// A short latching window: the flows are back in XDP within the
		// warm-up.
		ExtraMedia: "latch_window = \"50ms\"\n",
		Extra:      fmt.Sprintf("[ng]\nlisten = [\"udp:%s\"]\n", kmodNGAddr)})
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	if err := rl.Start(); err != nil {
		return nil, errors.Join(err, rl.Close(), os.RemoveAll(dir))
	}
	conn, err := l.Relay.DialUDP("udp4", "", kmodNGAddr.String())
	if err != nil {
		return nil, errors.Join(err, rl.Close(), os.RemoveAll(dir))
	}
	c, err := ngclient.New(conn, kmodNGConfig)
	if err != nil {
		conn.Close()
		return nil, errors.Join(err, rl.Close(), os.RemoveAll(dir))
	}
	r := &kmodRelay{pid: rl.Pid()}
	reqs, err := kmodCalls(ctx, l, c, cfg.Calls, r)
	r.counters = func() (uint64, uint64, uint64, error) {
		rc, err := readRelayCounters(rl)
		if err != nil {
			return 0, 0, 0, err
		}
		_, dropped, _ := rc.since(relayCounters{})
		return rc.forwarded, rc.userspace, dropped, nil
	}
	r.close = func(*KmodRun) error {
		derr := kmodDelete(c, reqs)
		return errors.Join(derr, c.Close(), rl.Close(), os.RemoveAll(dir))
	}
	if err != nil {
		return nil, errors.Join(err, r.close(&KmodRun{}))
	}
	return r, nil
}

// kmodSend sends stream k's RTP from conns[k] to dsts[k], one 172-byte
// G.711 packet every 20 ms per stream, the streams spread over the 20 ms
// in four 5-ms slots, for warmup and then measured; mark(true) is called
// between the two, mark(false) after the last packet. The SSRC and the
// sequence go on across the mark. It returns the packets sent in the
// measured part, in all, and the send errors.
func kmodSend(ctx context.Context, conns []*net.UDPConn, dsts []netip.AddrPort, warmup, measured time.Duration,
	mark func(first bool)) (sent, all, errs uint64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Four slots of 5 ms: 200 wake-ups a second, whatever the rate (an
	// emulated CPU pays dearly for each).
	const ptime, slots = 20 * time.Millisecond, 4
	slot := ptime / slots
	pkts := make([][172]byte, len(conns))
	for k := range pkts {
		p := &pkts[k]
		p[0], p[1] = 0x80, 0x80 // V=2, marker, PT 0 (PCMU)
		binary.BigEndian.PutUint32(p[8:], 0x4b000000|uint32(k))
		for i := 12; i < len(p); i++ {
			p[i] = 0xff // µ-law silence
		}
	}
	warmTicks := int(warmup / ptime)
	total := warmTicks + int(measured/ptime)
	start := time.Now()
	for tick := 0; tick < total; tick++ {
		if tick == warmTicks {
			mark(true)
		}
		for s := range slots {
			if ctx.Err() != nil {
				return sent, all, errs
			}
			if d := time.Until(start.Add(time.Duration(tick)*ptime + time.Duration(s)*slot)); d > 0 {
				time.Sleep(d)
			}
			for k := s; k < len(conns); k += slots {
				p := &pkts[k]
				binary.BigEndian.PutUint16(p[2:], uint16(tick))
				binary.BigEndian.PutUint32(p[4:], uint32(tick)*160)
				if tick == 1 {
					p[1] = 0x00 // marker only on the first
				}
				if _, err := conns[k].WriteToUDPAddrPort(p[:], dsts[k]); err != nil {
					errs++
					continue
				}
				all++
				if tick >= warmTicks {
					sent++
				}
			}
		}
	}
	mark(false)
	return sent, all, errs
}
