package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayd/relayd/voipgen/payload"
	"github.com/relayd/relayd/voipgen/sipua"

	"github.com/emiago/sipgo/sip"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/labrelay"
	"github.com/relayd/relayd/lab/measure"
	"github.com/relayd/relayd/lab/rtpengine"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

func init() { benchRun = runBenchLab }

const (
	benchSIPPort   = 5060
	benchCallerSIP = 5070
	benchRTPPort   = 20000
)

// runBenchLab runs voipgen bench: the lab and the traffic ends are
// fwdbench's (fwdBench.setup), each relay is measured with fwdbench's
// step (direct, relay, relay, direct) at each call count.
func runBenchLab(ctx context.Context, cfg Config) (rep *Report, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("must run as root (network namespaces, XDP)")
	}
	if cfg.rtpengine {
		if err := rtpengine.Available(""); err != nil {
			return nil, err
		}
	}
	cpus := runtime.NumCPU()
	ghz := 0.0
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		ghz = cpuGHz(f)
		f.Close()
	}
	xc := slices.Contains(cfg.modes, transcodeRelayd)
	plain := slices.ContainsFunc(cfg.modes, func(m string) bool { return m != transcodeRelayd })
	var steps []int // every step's call count, of every sweep that runs
	if plain {
		steps = append(steps, cfg.calls...)
	}
	if xc {
		steps = append(steps, cfg.transcodeCalls...)
	}
	maxCalls := slices.Max(steps)
	rates := make([]int, len(steps))
	for i, c := range steps {
		rates[i] = benchPPSPerCall * c
	}
	fc := FwdConfig{rates: rates, flows: []int{2 * maxCalls}, step: cfg.step, relayd: cfg.relayd, quietWait: cfg.quietWait,
		sender: cfg.sender, sink: cfg.sink, workerSched: cfg.workerSched, workerPrio: cfg.workerPrio}
	b := &fwdBench{cfg: fc, log: cfg.Progress, quietLeft: cfg.quietWait}
	var relays []string
	for _, m := range cfg.modes {
		if m != transcodeRelayd {
			relays = append(relays, m)
		}
	}
	if cfg.rtpengine && plain {
		relays = append(relays, "rtpengine")
	}
	if xc {
		relays = append(relays, transcodeRelayd)
		if cfg.rtpengine {
			relays = append(relays, transcodeRtpengine)
		}
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	irq, irqKnown := measure.IRQTimeAccounting()
	rep = &Report{Config: map[string]any{
		"calls": cfg.calls, "relays": relays, "codec": "pcmu", "ptime_ms": 20, "pps_per_call": benchPPSPerCall,
		"rtp_bytes": fwdRTPLen, "step_s": cfg.step.Seconds(), "repeat": cfg.repeat, "userspace_io": cfg.userspaceIO, "worker_scheduling": cfg.workerSched, "worker_priority": cfg.workerPrio, "sip_calls": cfg.sipCalls, "sip_call_duration_s": cfg.sipDuration.Seconds(),
		"cpus": cpus, "cpu_ghz": fmt.Sprintf("%.2f", ghz), "kernel": unix.ByteSliceToString(uts.Release[:]), "server_price_usd": cfg.price,
		"relay_setup": map[string]string{
			"xdp":       "relayd dataplane.mode = xdp, flows mode xdp",
			"userspace": fmt.Sprintf("relayd dataplane.mode = userspace, workers = %d (one per CPU), flows mode userspace", cpus),
			"srtp":      "as userspace, caller leg SRTP: flows decrypt AES_CM_128_HMAC_SHA1_80 (a key per flow), plain RTP to the callee; the sender encrypts, in the direct runs too",
			userspaceXSK: "as userspace, dataplane.userspace_io = afxdp: relayd's XDP program (bpf/xsk.c, native) on the relay's veths redirects the calls' packets into the workers' AF_XDP sockets (copy mode); " +
				"they send as in userspace (raw-socket sendmmsg)",
			srtpXSK:     "as srtp, with the workers receiving as in userspace-xsk",
			xdpSRTP:     "as srtp in relayd dataplane.mode = xdp: the XDP program passes the SRTP flows' packets to the kernel, which steers them to the workers' sockets (sk_lookup)",
			xdpSRTPXSK:  "as xdp-srtp, dataplane.userspace_io = afxdp: the XDP program (bpf/relay.c) redirects the SRTP flows' packets into the workers' AF_XDP sockets",
			"rtpengine": "Debian's rtpengine, userspace (--table=-1), one thread per CPU, ng offer/answer per flow, deleted at the end",
			transcodeRelayd: fmt.Sprintf("relayd dataplane.mode = userspace, workers = %d (one per CPU), ng listener; per call an ng offer (PCMU + telephone-event, "+
				"codec: mask PCMU, transcode G729) and answer (G.729 only, annexb=no)", cpus),
			transcodeRtpengine: "Debian's rtpengine as for rtpengine (bcg729 for G.729), the same ng offer and answer as relayd's transcode calls",
		},
		"transcode_calls": cfg.transcodeCalls,
		"sender":          benchEndText[cfg.sender],
		"sink":            benchEndText[cfg.sink+" sink"],
		"relay_ports_sip": benchSIPRelayPorts,
		"cpu_methods": map[string]string{
			"tasks":   "schedstat run time of voipgen (sender, sink, runtime), the relay process (relayd or rtpengine) and ksoftirqd/N, per packet sent, relay runs minus the mean of the two direct runs",
			"idle":    "whole machine: CPUs x elapsed - idle - iowait - steal from /proc/stat (10 ms ticks), per packet sent, relay runs minus direct runs",
			"cpu_pct": "ns per packet x sent packets per second / (CPUs x 1e9)",
		},
		"irq_time_accounting": map[bool]string{true: "on", false: "off"}[irq] + map[bool]string{true: "", false: " (unknown)"}[irqKnown],
	}}
	if irqKnown && irq {
		rep.Notes = append(rep.Notes, "kernel has CONFIG_IRQ_TIME_ACCOUNTING: task times miss softirq work; trust the idle figures")
	}
	// The Go heaps (relayd's SRTP contexts above all) are on 2 MiB pages
	// only when the kernel gives them unasked: "always", Debian 12's
	// default.
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err == nil {
		thp := thpMode(b)
		rep.Config["transparent_hugepage"] = thp
		if thp != "" && thp != "always" {
			rep.Notes = append(rep.Notes, "transparent huge pages: "+thp+" (Debian 12's kernel: always): relayd's Go heap, its SRTP contexts included, is on 4 KiB pages here")
		}
	}
	switch {
	case !plain:
	case cfg.static:
		rep.Notes = append(rep.Notes, "sweep media: static flows, both flows of a call caller -> relay -> callee (the relay does the same work per packet in either direction)")
	default:
		rep.Notes = append(rep.Notes, "sweep media: relayd's calls are SIP calls through its B2BUA, a stream each way; rtpengine's are ng calls (offer/answer), the same streams")
	}
	if len(cfg.sipCalls) > 0 {
		rep.Notes = append(rep.Notes, "jitter and max gap come from the SIP phase (voipgen's per-call media and analysis)")
	}
	if xc {
		rep.Notes = append(rep.Notes, "transcode: a relay may send more than it was sent (negative loss): packets it makes itself, "+
			"such as comfort noise or concealment over the pause between two runs; every packet received was checked transcoded")
	}
	defer func() {
		summarizeBench(rep, relays, ghz, cpus, cfg.price)
		if rep.Transcode != nil && b.xcClock != nil {
			c := b.xcClock
			rep.Transcode.Bcg729 = bcg729Cost(bcg729Timings{enc: c.enc, dec: c.dec, nenc: c.nenc, ndec: c.ndec, contexts: c.contexts(), cpu: c.cpu})
			summarizeTranscode(rep, ghz)
			c.close()
		}
		err = errors.Join(err, b.close())
	}()
	if xc {
		if b.xcMat, err = newTranscodeMaterial(); err != nil {
			return rep, fmt.Errorf("transcode: %w", err)
		}
		if b.xcClock, err = newBcg729Clock(b.xcMat, slices.Max(cfg.transcodeCalls)); err != nil {
			return rep, fmt.Errorf("transcode: %w", err)
		}
		rep.Transcode = &benchTranscodeReport{}
		// bcg729 is timed before the relays, after each run of their
		// transcode sweeps and after them: the figure is the median of
		// all, from this run.
		if err := b.xcClock.measure(bcg729Frames, bcg729EdgeReps); err != nil {
			return rep, fmt.Errorf("time bcg729: %w", err)
		}
		defer func() {
			if err == nil {
				err = b.xcClock.measure(bcg729Frames, bcg729EdgeReps)
			}
		}()
	}
	fmt.Fprintf(cfg.Progress, "bench: building the lab (%d flows for %d calls), relays %v\n", 2*maxCalls, maxCalls, relays)
	if err := b.setup(2 * maxCalls); err != nil {
		return rep, err
	}
	for i, name := range relays {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		fmt.Fprintf(cfg.Progress, "bench: [%d/%d] %s\n", i+1, len(relays), name)
		var own func(context.Context, Config, *Report) error
		switch name {
		case "rtpengine":
			own = b.benchRtpengine
		case transcodeRelayd:
			own = b.benchRelaydTranscode
		case transcodeRtpengine:
			own = b.benchRtpengineTranscode
		}
		if own != nil {
			if err := own(ctx, cfg, rep); err != nil {
				return rep, fmt.Errorf("%s: %w", name, err)
			}
			continue
		}
		for _, n := range cfg.sipCalls {
			if benchMode(name).Kind == "srtp" {
				break
			}
			// Nothing goes to the sink during the phase.
			b.sink.pause()
			s := b.benchSIPCalls(ctx, cfg, name, n)
			b.sink.resume()
			rep.SIP = append(rep.SIP, s)
			fmt.Fprintf(cfg.Progress, "  SIP: %d of %d calls up, %d packets sent, %d received, %d lost, jitter p50 %.2f ms, max gap %.1f ms %s\n",
				s.Succeeded, s.Calls, s.SentPackets, s.RecvPackets, s.Lost, s.JitterP50Ms, s.MaxGapMs, s.Error)
			if d := s.Direct; d != nil {
				fmt.Fprintf(cfg.Progress, "  SIP direct: %d of %d calls up, %d lost, jitter p50 %.2f ms, max gap %.1f ms %s\n",
					d.Succeeded, s.Calls, d.Lost, d.JitterP50Ms, d.MaxGapMs, d.Error)
			}
			if err := ctx.Err(); err != nil {
				return rep, err
			}
		}
		sweep := b.benchRelaydSIP
		if cfg.static {
			sweep = b.benchRelayd
		}
		if err := sweep(ctx, cfg, rep, name); err != nil {
			return rep, fmt.Errorf("%s: %w", name, err)
		}
	}
	if len(cfg.sipCalls) > 0 && slices.ContainsFunc(cfg.modes, func(m string) bool { return benchMode(m).Kind == "srtp" }) {
		rep.Notes = append(rep.Notes, "srtp: no SIP phase with media (voipgen's per-call media is plain RTP); its sweep's SIP calls offer SDES")
	}
	return rep, nil
}

// benchEndText describes the sender and sink kinds in the report.
var benchEndText = map[string]string{
	benchEndMmsg: "mmsg: one thread, sendmmsg on a socket in the caller namespace and one in the callee namespace (reverse streams, IP_PKTINFO sources)",
	benchEndXDP: "xdp: one thread, whole Ethernet+IPv4+UDP frames (UDP checksum computed per packet) through AF_XDP TX rings (copy mode) on the caller's and callee's veths " +
		"(c0, e0; fb0, fb1 for direct runs)",
	benchEndMmsg + " sink": "mmsg: a thread per end socket waking every 1 ms to drain it with recvmmsg, counting per SSRC",
	benchEndXDP + " sink": "xdp: lab/xdpsink on c0, e0, fb0 and fb1 counting per SSRC in per-CPU arrays and dropping; those veths get a pfifo queue, a receive ring per CPU " +
		"and threaded NAPI at SCHED_FIFO 50, whose threads are the sink's CPU (label napi)",
}

func benchMode(name string) fwdMode {
	w := runtime.NumCPU()
	switch name {
	case "xdp":
		return fwdMode{Name: "xdp", Kind: "xdp"}
	case "srtp":
		return fwdMode{Name: "srtp", Kind: "srtp", Workers: w, Suite: sdes.AES_CM_128_HMAC_SHA1_80}
	case srtpXSK:
		return fwdMode{Name: srtpXSK, Kind: "srtp", Workers: w, Suite: sdes.AES_CM_128_HMAC_SHA1_80, IO: "afxdp"}
	case xdpSRTP:
		return fwdMode{Name: xdpSRTP, Kind: "srtp", Workers: w, Suite: sdes.AES_CM_128_HMAC_SHA1_80, Plane: "xdp", IO: "socket"}
	case xdpSRTPXSK:
		return fwdMode{Name: xdpSRTPXSK, Kind: "srtp", Workers: w, Suite: sdes.AES_CM_128_HMAC_SHA1_80, Plane: "xdp", IO: "afxdp"}
	case userspaceXSK:
		return fwdMode{Name: userspaceXSK, Kind: "user", Workers: w, IO: "afxdp"}
	case "rtpengine":
		return fwdMode{Name: "rtpengine", Kind: "rtpengine"}
	case transcodeRtpengine:
		return fwdMode{Name: transcodeRtpengine, Kind: "rtpengine"}
	case transcodeRelayd:
		return fwdMode{Name: transcodeRelayd, Kind: "user", Workers: w}
	}
	return fwdMode{Name: "userspace", Kind: "user", Workers: w}
}

// relaydMode is benchMode with the run's --userspace-io for relayd's
// userspace workers, except in the modes that name theirs.
func (c Config) relaydMode(name string) fwdMode {
	m := benchMode(name)
	if (m.Kind == "user" || m.Kind == "srtp") && m.IO == "" {
		m.IO = c.userspaceIO
	}
	return m
}

// benchRelayd runs the sweep through relayd in mode name, with static
// flows installed through the admin API.
func (b *fwdBench) benchRelayd(ctx context.Context, cfg Config, rep *Report, name string) (err error) {
	m := cfg.relaydMode(name)
	if err := b.startRelay(m); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.stopRelay()) }()
	return b.benchSweep(ctx, cfg, cfg.calls, rep, m, benchMediaStatic, func(f int) (fwdPath, fwdPath, error) {
		if _, err := b.install(m, f); err != nil {
			return fwdPath{}, fwdPath{}, err
		}
		d, p := b.paths(m, f)
		return d, p, nil
	})
}

// benchSweep steps through cfg.calls for relay m until the first step with
// loss or the second in a row where the sender could not offer the load
// (its rows say "sender short"); prepare readies
// the relay for f flows and returns the direct and relay paths.
func (b *fwdBench) benchSweep(ctx context.Context, cfg Config, steps []int, rep *Report, m fwdMode, media string,
	prepare func(f int) (direct, relay fwdPath, err error)) error {
	short := false // the last step's sender fell short of the rate
	for i, c := range steps {
		f := 2 * c
		fmt.Fprintf(cfg.Progress, "  %s step %d/%d: %d calls (%d flows, %d pps offered)\n", m.Name, i+1, len(steps), c, f, benchPPSPerCall*c)
		direct, relay, err := prepare(f)
		if err != nil {
			return err
		}
		if err := b.warm(ctx, direct, m, true); err != nil {
			return err
		}
		if err := b.warm(ctx, relay, m, false); err != nil {
			return err
		}
		var all []fwdStep
		rerun := false
		for range cfg.repeat {
			runs, err := b.step(ctx, m, f, benchPPSPerCall*c, direct, relay, false)
			if err != nil {
				return err
			}
			if disturbed(runs, b.senderMax) && !rerun {
				for j := range runs {
					runs[j].Superseded = true
				}
				rep.Runs = append(rep.Runs, runs...)
				fmt.Fprintf(cfg.Progress, "  %s %d calls: the runs disagree (loss or a short sender in one of two, or a direct run disturbed): running the step again\n", m.Name, c)
				if runs, err = b.step(ctx, m, f, benchPPSPerCall*c, direct, relay, false); err != nil {
					return err
				}
				rerun = true
			}
			rep.Runs = append(rep.Runs, runs...)
			all = append(all, runs...)
		}
		row := benchRowFromRuns(m.Name, media, c, all, runtime.NumCPU())
		row.Rerun = rerun
		rep.Rows = append(rep.Rows, row)
		fmt.Fprintf(cfg.Progress, "  => %s %d calls: loss %.3f%%, relay CPU %.1f%% (tasks) %s%% (idle), %.0f ns/pkt (tasks)\n",
			m.Name, c, row.LossPct, row.TaskCPUPct, fmtIdle(row.IdleCPUPct, "%.1f"), row.TaskNsPerPkt)
		switch {
		case !row.lossless():
			fmt.Fprintf(cfg.Progress, "  %s: loss at %d calls: stopping\n", m.Name, c)
			return nil
		case row.SenderLimited && short:
			fmt.Fprintf(cfg.Progress, "  %s: the sender fell short of the offered rate twice in a row: stopping\n", m.Name)
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: the sender could not offer %d calls (%d pps) nor the step before; the sweep stopped there without loss", m.Name, c, benchPPSPerCall*c))
			return nil
		}
		// One short step on a shared machine may be another process
		// taking the sender's CPU: go on, and stop after two.
		short = row.SenderLimited
	}
	return nil
}

// benchRtpengine runs the sweep through rtpengine: one ng call (offer,
// answer) per call, caller 198.18.0.2:4000 (the sender's socket) and
// callee farPrefix+i:5000 (the sink's), a stream each way as through
// relayd, deleted at the end.
func (b *fwdBench) benchRtpengine(ctx context.Context, cfg Config, rep *Report) (err error) {
	e, err := rtpengine.Start(b.l, rtpengine.Options{PortMin: 20000, PortMax: 59999, ExtraArgs: b.rtpengineSched()})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	// The engine's threads are measured with the other tasks (under the
	// ksoftirqd label: fwdBench.targets knows only relayd).
	softirqd := b.softirqd
	b.softirqd = append(slices.Clone(softirqd), e.Pid())
	defer func() { b.softirqd = softirqd }()
	var calls []*rtpengine.Call
	defer func() {
		if len(calls) == 0 {
			return
		}
		start := time.Now()
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var failed atomic.Int64
		parallel(len(calls), 8, func(i int) {
			if e.DeleteCall(dctx, calls[i]) != nil {
				failed.Add(1)
			}
		})
		fmt.Fprintf(cfg.Progress, "  rtpengine: %d calls deleted in %v (%d failed)\n", len(calls), time.Since(start).Round(time.Millisecond), failed.Load())
	}()
	m := benchMode("rtpengine")
	return b.benchSweep(ctx, cfg, cfg.calls, rep, m, benchMediaNG, func(f int) (fwdPath, fwdPath, error) {
		start, n := time.Now(), len(calls)
		more := make([]*rtpengine.Call, f/2-n)
		errs := make([]error, len(more))
		parallel(len(more), 8, func(i int) {
			more[i], errs[i] = e.SetupCall(ctx, rtpengine.CallSpec{
				Caller: netip.AddrPortFrom(b.l.CallerAddr4, uint16(fwdSenderPort)),
				Callee: netip.AddrPortFrom(addrAt(farPrefix, n+i), uint16(fwdSinkPort)),
			})
		})
		for _, c := range more {
			if c != nil {
				calls = append(calls, c)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return fwdPath{}, fwdPath{}, err
		}
		fmt.Fprintf(cfg.Progress, "  rtpengine: %d ng calls set up in %v, %d in all\n", len(more), time.Since(start).Round(time.Millisecond), len(calls))
		direct, relay, _ := b.callPaths(f/2, nil, func(i int) netip.AddrPort { return calls[i].CallerToCallee },
			func(j int) netip.AddrPort { return calls[j].CalleeToCaller })
		return direct, relay, nil
	})
}

// rtpengineSched is rtpengine's --scheduling and --priority for
// --worker-scheduling and --worker-priority: its media threads get what
// relayd's workers get.
func (b *fwdBench) rtpengineSched() []string {
	if b.cfg.workerSched == "" {
		return nil
	}
	return []string{"--scheduling=" + b.cfg.workerSched, fmt.Sprintf("--priority=%d", b.cfg.workerPrio)}
}

// parallel runs fn(0..n-1) on at most k goroutines.
func parallel(n, k int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, k) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
}

// benchSIPCalls places n SIP calls with media through relayd in mode
// name (its B2BUA on the relay's media address, one route to the
// answerer in the callee namespace) and reports both ends' view, then
// places the same calls directly, relayd stopped, for comparison.
func (b *fwdBench) benchSIPCalls(ctx context.Context, cfg Config, name string, n int) benchSIP {
	s := benchSIP{Relay: name, Media: "SIP calls via relayd's B2BUA", Calls: n, DurationS: cfg.sipDuration.Seconds(), Relayed: -1}
	fail := func(err error) benchSIP { s.Error = err.Error(); s.Failed = n - s.Succeeded; return s }
	ua, err := voipgenBinary(cfg.voipgen)
	if err != nil {
		return fail(err)
	}
	if err := b.sipCallsRelayed(ctx, cfg, ua, name, &s); err != nil {
		return fail(err)
	}
	l := b.l
	direct := sipEnds{caller: l.Caller, callee: l.Callee, callerAddr: directCaller.Addr(), calleeAddr: directCallee.Addr(),
		target: netip.AddrPortFrom(directCallee.Addr(), benchSIPPort)}
	run, err := runSIPEnds(ctx, ua, direct, n, cfg.sipDuration)
	d := sipMedia(run)
	if err != nil {
		d.Error = err.Error()
	}
	s.Direct = &d
	return s
}

// sipCallsRelayed is benchSIPCalls' run through relayd: it fills s in.
func (b *fwdBench) sipCallsRelayed(ctx context.Context, cfg Config, ua, name string, s *benchSIP) error {
	bin, err := relaydBinary(cfg.relayd)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-sip-relayd-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l := b.l
	extra := benchSIPConfig(l) + fmt.Sprintf("[cdr]\npath = %q\nfsync_interval = \"1s\"\n", filepath.Join(dir, "cdr.jsonl"))
	o := labrelay.Options{Bin: bin, Dir: dir, LogLevel: "warn", ExtraMedia: extra}
	cfg.relaydMode(name).setRelayd(&o)
	r, err := labrelay.New(l, o)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Start(); err != nil {
		return err
	}
	before, err := readRelayCounters(r)
	if err != nil {
		return err
	}
	ends := sipEnds{caller: l.Caller, callee: l.Callee, callerAddr: l.CallerAddr4, calleeAddr: l.CalleeAddr4,
		target: netip.AddrPortFrom(l.RelayMedia4, benchSIPPort)}
	run, err := runSIPEnds(ctx, ua, ends, s.Calls, cfg.sipDuration)
	if err != nil {
		return err
	}
	cs := sipua.Summarize(run.caller)
	s.Succeeded, s.Failed = cs.Succeeded, cs.Failed
	s.T200P50Ms, s.T200MaxMs = cs.T200Ms.P50, cs.T200Ms.Max
	m := sipMedia(run)
	s.WithMedia, s.SentPackets, s.RecvPackets, s.Lost = m.WithMedia, m.SentPackets, m.RecvPackets, m.Lost
	s.JitterP50Ms, s.JitterP99Ms, s.JitterMaxMs, s.MaxGapMs = m.JitterP50Ms, m.JitterP99Ms, m.JitterMaxMs, m.MaxGapMs
	if after, err := readRelayCounters(r); err == nil {
		fwd, _, _ := after.since(before)
		s.Relayed = int64(fwd)
	}
	s.Error = m.Error
	return nil
}

// sipMedia sums both ends' reports of a run: the worse end's jitter and
// gaps, the callers' successes and their first errors.
func sipMedia(run sipRun) benchSIPMedia {
	cs, as := sipua.Summarize(run.caller), sipua.Summarize(run.answerer)
	m := benchSIPMedia{Succeeded: cs.Succeeded, WithMedia: cs.WithMedia,
		SentPackets: cs.SentPackets + as.SentPackets, RecvPackets: cs.RecvPackets + as.RecvPackets, Lost: cs.Lost + as.Lost,
		JitterP50Ms: max(cs.JitterMs.P50, as.JitterMs.P50), JitterP99Ms: max(cs.JitterMs.P99, as.JitterMs.P99), JitterMaxMs: max(cs.JitterMs.Max, as.JitterMs.Max),
		MaxGapMs: max(cs.MaxGapMs.Max, as.MaxGapMs.Max)}
	var errs []string
	for _, c := range run.caller {
		if c.Error != "" && len(errs) < 3 {
			errs = append(errs, c.Error)
		}
	}
	if len(errs) > 0 {
		m.Error = fmt.Sprintf("first errors: %q", errs)
	}
	return m
}

func readRelayCounters(r *labrelay.Relay) (relayCounters, error) {
	text, err := r.Metrics()
	if err != nil {
		return relayCounters{}, fmt.Errorf("relayd metrics: %w", err)
	}
	return parseRelayCounters(text)
}

// benchSIPConfig is relayd's [sip] and one route sending every call to
// the answerer in the callee namespace.
func benchSIPConfig(l *lab.Lab) string {
	return fmt.Sprintf(`[sip]
listen = ["udp:%s:%d"]
[[route]]
name = "bench"
match = "."
attempt_timeout = "5s"
destinations = ["sip:answer@%s"]
`, l.RelayMedia4, benchSIPPort, netip.AddrPortFrom(l.CalleeAddr4, benchSIPPort))
}

// benchSIPRelayPorts is relayd's media port range for the SIP sweep: each
// call takes an RTP and an RTCP port on each leg.
// 10000-65535 holds 13,884 calls (benchMaxCalls: 13,000); nothing else in
// the relay namespace binds a UDP port there (SIP is on 5060).
const benchSIPRelayPorts = "10000-65535"

// benchCalls is the SIP side of the sweep through relayd: an answerer in
// the callee namespace and batches of callers in the caller namespace,
// signalling only (sipSignal). Call i's caller media is the sender's
// socket (CallerAddr4:fwdSenderPort); the i-th call the answerer takes
// answers with farPrefix+i:fwdSinkPort, the sink's socket. What each side
// learns from the other's SDP, the relay's ports, is kept per call.
type benchCalls struct {
	b    *fwdBench
	cfg  Config
	srtp bool

	mu       sync.Mutex
	toCallee []netip.AddrPort // call i: where the caller sends (relay port, A leg), from the 200's SDP
	toCaller []netip.AddrPort // answered call j: where the callee sends (relay port, B leg), from the INVITE's SDP
	answered atomic.Int64
	// calleeCalls counts the INVITEs the answerer took (with an SDP offer).
	calleeCalls atomic.Int64

	actx    context.Context
	acancel context.CancelFunc
	ansDone chan error
	batches []benchBatch
}

type benchBatch struct {
	cancel context.CancelFunc
	done   chan []sipua.CallReport
}

func (s *benchCalls) start(ctx context.Context, maxCalls int) error {
	l := s.b.l
	c, err := payload.LookupAny("pcmu", 20*time.Millisecond)
	if err != nil {
		return err
	}
	s.toCallee, s.toCaller = make([]netip.AddrPort, maxCalls), make([]netip.AddrPort, maxCalls)
	acfg := sipua.AnswerConfig{Endpoint: sipua.Endpoint{Listen: netip.AddrPortFrom(l.CalleeAddr4, benchSIPPort), Media: l.CalleeAddr4,
		RTPPort: benchRTPPort, Codec: c, Ptime: 20 * time.Millisecond, Duration: 24 * time.Hour, NS: l.Callee.Do,
		Signal: &sipua.Signal{
			Media: func(j int) netip.AddrPort { return netip.AddrPortFrom(addrAt(farPrefix, j), uint16(fwdSinkPort)) },
			Peer: func(j int, a netip.AddrPort) {
				s.calleeCalls.Add(1)
				s.mu.Lock()
				if j < len(s.toCaller) {
					s.toCaller[j] = a
				}
				s.mu.Unlock()
			},
		}},
		Personality: "answer", MaxCalls: 1 << 30, MaxCallDur: 24 * time.Hour}
	s.actx, s.acancel = context.WithCancel(ctx)
	ready := make(chan struct{})
	s.ansDone = make(chan error, 1)
	go func() {
		_, err := sipua.AnswerCalls(s.actx, acfg, ready)
		s.ansDone <- err
	}()
	select {
	case <-ready:
		return nil
	case err := <-s.ansDone:
		s.ansDone <- err
		return fmt.Errorf("answerer: %v", err)
	}
}

// grow places calls until n are up: one batch of new calls from a SIP
// endpoint of its own, held until close.
func (s *benchCalls) grow(ctx context.Context, n int) error {
	have := int(s.answered.Load())
	if n <= have {
		return nil
	}
	l, k := s.b.l, len(s.batches)
	c, err := payload.LookupAny("pcmu", 20*time.Millisecond)
	if err != nil {
		return err
	}
	var failed atomic.Int64
	var firstFailure atomic.Pointer[string]
	sig := &sipua.Signal{
		Media: func(int) netip.AddrPort { return netip.AddrPortFrom(l.CallerAddr4, uint16(fwdSenderPort)) },
		Peer: func(i int, a netip.AddrPort) {
			s.mu.Lock()
			s.toCallee[have+i] = a
			s.mu.Unlock()
			s.answered.Add(1)
		},
		Failed: func(i, status int, reason string) {
			why := fmt.Sprintf("call %d: status %d %s", have+i, status, reason)
			firstFailure.CompareAndSwap(nil, &why)
			failed.Add(1)
		},
	}
	if s.srtp {
		sig.Crypto = func(i int) string { return "1 AES_CM_128_HMAC_SHA1_80 inline:" + s.b.keys[have+i] }
	}
	ccfg := sipua.CallConfig{Endpoint: sipua.Endpoint{Listen: netip.AddrPortFrom(l.CallerAddr4, uint16(benchCallerSIP+k)), Media: l.CallerAddr4,
		RTPPort: benchRTPPort, Codec: c, Ptime: 20 * time.Millisecond, Duration: 24 * time.Hour, NS: l.Caller.Do, Signal: sig},
		Calls: n - have, Concurrent: n - have, Rate: 1000, Timeout: 10 * time.Second}
	if err := sip.ParseUri(fmt.Sprintf("sip:answer@%s:%d", l.RelayMedia4, benchSIPPort), &ccfg.Target); err != nil {
		return err
	}
	bctx, cancel := context.WithCancel(context.Background())
	bt := benchBatch{cancel: cancel, done: make(chan []sipua.CallReport, 1)}
	s.batches = append(s.batches, bt)
	go func() {
		reps, _ := sipua.PlaceCalls(bctx, ccfg)
		bt.done <- reps
	}()
	start := time.Now()
	for int(s.answered.Load()) < n {
		select {
		case reps := <-bt.done:
			bt.done <- reps
			failed, first := 0, ""
			for _, r := range reps {
				if !r.Success {
					failed++
					if first == "" {
						first = fmt.Sprintf("status %d %s", r.Status, r.Error)
					}
				}
			}
			return fmt.Errorf("%d of %d SIP calls failed (first: %s)", failed, n-have, first)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		// Every call of the batch has ended its setup, some without an
		// answer: the step cannot offer its calls.
		if f := failed.Load(); f > 0 && int(s.answered.Load())+int(f) >= n {
			return fmt.Errorf("%d of %d SIP calls failed (first: %s)", f, n-have, *firstFailure.Load())
		}
		if time.Since(start) > time.Minute {
			why := ""
			if p := firstFailure.Load(); p != nil {
				why = fmt.Sprintf(", %d failed (first: %s)", failed.Load(), *p)
			}
			return fmt.Errorf("only %d of %d calls answered after a minute%s", s.answered.Load(), n, why)
		}
	}
	fmt.Fprintf(s.cfg.Progress, "  %d SIP calls set up through relayd's B2BUA in %v, %d in all\n", n-have, time.Since(start).Round(time.Millisecond), n)
	return nil
}

// paths returns the direct and relay paths of the first n calls: forward
// streams 0..n-1 (caller -> callee), reverse streams n..2n-1, the calls in
// callOrder.
func (s *benchCalls) paths(n int) (direct, relay fwdPath) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var enc []*srtpflow.Encrypter
	if s.srtp {
		enc = s.b.enc[:n]
	}
	direct, relay, _ = s.b.callPaths(n, enc, func(i int) netip.AddrPort { return s.toCallee[i] },
		func(j int) netip.AddrPort { return s.toCaller[j] })
	return direct, relay
}

// callPaths fills in the direct and relay paths of n calls, each a stream
// each way, the calls in callOrder: stream i carries call c = order[i],
// forward from the caller's socket to the relay at toCallee(c) (direct: to
// directPrefix+i), stream n+i its reverse, from the callee's socket, from
// farPrefix+c to the relay at toCaller(c) (direct: from directPrefix+i to
// the caller's fb0 address). With enc (by call) the forward streams are
// SRTP (AES_CM_128_HMAC_SHA1_80), in both.
func (b *fwdBench) callPaths(n int, enc []*srtpflow.Encrypter, toCallee, toCaller func(int) netip.AddrPort) (direct, relay fwdPath, order []int) {
	order = callOrder(n)
	srtpLen := 0
	if enc != nil {
		srtpLen = fwdRTPLen + sdes.AES_CM_128_HMAC_SHA1_80.RTPTagLen()
		byStream := make([]*srtpflow.Encrypter, n)
		for i, c := range order {
			byStream[i] = enc[c]
		}
		direct.enc, relay.enc = byStream, byStream
	}
	snd := b.snd
	far := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(addrAt(farPrefix, order[i]), uint16(fwdSinkPort))
	}
	near := func(i int) netip.AddrPort { return netip.AddrPortFrom(addrAt(directPrefix, i), uint16(fwdSinkPort)) }
	direct.msgs = snd.messages(n, srtpLen, near)
	direct.rev = snd.revMessages(n, n, near, func(int) netip.AddrPort {
		return netip.AddrPortFrom(directCaller.Addr(), uint16(fwdSenderPort))
	})
	relay.msgs = snd.messages(n, srtpLen, func(i int) netip.AddrPort { return toCallee(order[i]) })
	relay.rev = snd.revMessages(n, n, far, func(i int) netip.AddrPort { return toCaller(order[i]) })
	return direct, relay, order
}

// callOrder is the order of n calls' streams in the sender: a fixed
// shuffle. The sender sends its streams in 1 ms slots of consecutive
// indexes; in the calls' order, a relay worker carrying a block of
// consecutive calls (relayd packs calls onto few workers,
// dataplane.pack_flows) would be woken in its block's slots only and
// read twice the packets per wake-up, where real calls, started at any
// moment, reach every worker in every slot.
func callOrder(n int) []int {
	return rand.New(rand.NewPCG(uint64(n), 0x5eed)).Perm(n)
}

// close hangs every call up (BYE from the callers) and stops the answerer.
// It returns the callers' reports of the batches that ended in time.
func (s *benchCalls) close() (all []sipua.CallReport) {
	start := time.Now()
	for _, bt := range s.batches {
		bt.cancel()
	}
	for _, bt := range s.batches {
		select {
		case reps := <-bt.done:
			all = append(all, reps...)
		case <-time.After(30 * time.Second):
		}
	}
	n := len(all)
	if s.acancel != nil {
		s.acancel()
		select {
		case <-s.ansDone:
		case <-time.After(10 * time.Second):
		}
	}
	if n > 0 {
		fmt.Fprintf(s.cfg.Progress, "  %d SIP calls hung up in %v\n", n, time.Since(start).Round(time.Millisecond))
	}
	return all
}

// benchRelaydSIP runs the sweep through relayd in mode name with its
// media set up by SIP calls through relayd's B2BUA (see benchCalls):
// each call is two flows, caller -> callee and callee -> caller, the
// caller leg SRTP in srtp mode (the caller offers SDES; relayd decrypts
// toward the callee and encrypts toward the caller).
func (b *fwdBench) benchRelaydSIP(ctx context.Context, cfg Config, rep *Report, name string) (err error) {
	m := cfg.relaydMode(name)
	b.relayPorts = benchSIPRelayPorts
	// A short latching window: a call's flows settle (source locked, XDP
	// flows back in XDP) within the warm-up that follows its setup.
	b.relayExtra = "latch_window = \"50ms\"\n" + benchSIPConfig(b.l)
	defer func() { b.relayExtra, b.relayPorts = "", "" }()
	if err := b.startRelay(m); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.stopRelay()) }()
	calls := &benchCalls{b: b, cfg: cfg, srtp: m.Kind == "srtp"}
	if err := calls.start(ctx, slices.Max(cfg.calls)); err != nil {
		return err
	}
	defer calls.close()
	return b.benchSweep(ctx, cfg, cfg.calls, rep, m, benchMediaSIP, func(f int) (fwdPath, fwdPath, error) {
		n := f / 2
		if err := calls.grow(ctx, n); err != nil {
			return fwdPath{}, fwdPath{}, err
		}
		direct, relay := calls.paths(n)
		// Past the latching window, and the locked flows moved back.
		if err := b.warm(ctx, relay, m, false); err != nil {
			return fwdPath{}, fwdPath{}, err
		}
		time.Sleep(300 * time.Millisecond)
		return direct, relay, nil
	})
}
