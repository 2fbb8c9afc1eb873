package bench

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/relayd/relayd/voipgen/gen"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/internal/pktio"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/cmmsg"
	"github.com/relayd/relayd/lab/labrelay"
	"github.com/relayd/relayd/lab/measure"
	"github.com/relayd/relayd/lab/minfwd"
	"github.com/relayd/relayd/lab/xdpsink"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

// Addresses fwdbench adds to the lab, all inside 198.18.0.0/15. Flow i
// goes to farPrefix+i (kernel forwarding, and relayd's flows send there:
// routed through the relay to the callee) or directPrefix+i (direct: over
// the extra veth pair); the callee accepts both prefixes locally (AnyIP
// routes), so one sink socket on 0.0.0.0:fwdSinkPort receives every flow,
// each with its own 5-tuple.
var (
	farPrefix     = netip.MustParsePrefix("198.18.64.0/18")
	directPrefix  = netip.MustParsePrefix("198.18.128.0/18")
	directCaller  = netip.MustParsePrefix("198.18.9.2/24") // on fb0 in caller
	directCallee  = netip.MustParsePrefix("198.18.9.1/24") // on fb1 in callee
	fwdSenderPort = 4000
	fwdSinkPort   = 5000
	fwdMatchPort  = 30000 // flow i matches relay media address:30000+i
	fwdDirectIfs  = [2]string{"fb0", "fb1"}
)

// fwdCmmsgCPU is the CPU the C relay is pinned to: user-w1's worker's
// (relayd runs N workers on CPUs 0..N-1).
const fwdCmmsgCPU = 0

const (
	fwdRTPLen   = 172 // 12-byte RTP header, 160 bytes of G.711
	fwdSRTPRoom = 16  // what SRTP adds at most: the GCM tag
	fwdWarm     = 200 * time.Millisecond
	// Before each step fwdbench waits, up to fwdQuietStep and
	// cfg.quietWait in all, until the machine (idle but for others) is
	// busy less than fwdQuietBusy CPUs over fwdQuietSample.
	fwdQuietBusy   = 0.3
	fwdQuietSample = 150 * time.Millisecond
	fwdQuietStep   = 3 * time.Second
)

func addrAt(p netip.Prefix, i int) netip.Addr {
	b := p.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// fwdBench holds the lab, the traffic ends and the accounting of one run,
// and the relayd of the mode being measured.
type fwdBench struct {
	cfg      FwdConfig
	log      io.Writer
	l        *lab.Lab
	snd      *fwdSender
	sink     *fwdSink
	sampler  measure.Sampler
	softirqd []int
	// napi: with the XDP sink or --relay-napi, the end veths' NAPI
	// threads (the end hosts' receive work, label napi).
	napi []int
	// relayNAPI: with --relay-napi, the relay's veths' NAPI threads (label
	// relay-napi), where the relay's XDP or the kernel's forwarding runs.
	relayNAPI []int
	run       uint8    // id of the last run; its tag goes in the SSRC's bits 16-23
	srtpRuns  [2]uint8 // SRTP modes: direct and relay runs so far (see tag)
	// senderMax is the most pps the sender managed in a direct run.
	senderMax float64
	// quietLeft is what is left of the time to wait for a quiet machine.
	quietLeft time.Duration

	// relayExtra and relayPorts, when set, go into the next relayd's
	// configuration (after [media]'s keys; media.ports).
	relayExtra, relayPorts string
	// relayTop, when set, is TOML added to the next relayd's
	// configuration after its sections (such as [ng]).
	relayTop string
	// relayCaps keeps the next relayd's packet-rate caps on (the lab
	// relays' default is off: the benchmarks' flows run far faster than
	// a codec).
	relayCaps bool
	// xcMat is the transcode mode's audio (nil without the mode), xcClock
	// the timing of bcg729 alone.
	xcMat   *transcodeMaterial
	xcClock *bcg729Clock
	// afterRun, when set, runs after each measured run of a step (the
	// transcode sweeps time bcg729 there).
	afterRun func() error

	// The current mode's relayd, nil for kernel forwarding.
	relay *labrelay.Relay
	// cm is the C relay of mode cmmsg, nil otherwise.
	cm        *cmmsg.Relay
	relayDir  string
	prog      *ebpf.Program // xdp: relayd's XDP program
	bpfStats  io.Closer     // xdp: BPF run-time statistics on while open
	installed int           // flows installed in relay: 0..installed-1
	// SRTP modes: per flow, the master key||salt (base64) the relay
	// decrypts with and the sender's Encrypter.
	keys []string
	enc  []*srtpflow.Encrypter
}

func Fwd(ctx context.Context, cfg FwdConfig, log io.Writer) (rep *FwdReport, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("must run as root (network namespaces, XDP)")
	}
	b := &fwdBench{cfg: cfg, log: log, quietLeft: cfg.quietWait}
	n := cfg.maxFlows()
	irq, irqKnown := measure.IRQTimeAccounting()
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	names := make([]string, len(cfg.modes))
	for i, m := range cfg.modes {
		names[i] = m.Name
	}
	rep = &FwdReport{Config: map[string]any{
		"rates_pps": cfg.rates, "flows": cfg.flows, "step_s": cfg.step.Seconds(), "overload_steps": cfg.overload,
		"modes": names, "codec": "pcmu", "rtp_bytes": fwdRTPLen, "ip_bytes": fwdRTPLen + 28,
		"cpus": runtime.NumCPU(), "kernel": unix.ByteSliceToString(uts.Release[:]),
		"irq_time_accounting": map[bool]string{true: "on", false: "off"}[irq] + map[bool]string{true: "", false: " (unknown)"}[irqKnown],
		"relayd": map[string]string{
			"xdp":       "dataplane.mode = xdp, flows mode xdp",
			"userspace": "dataplane.mode = userspace (no XDP program), dataplane.workers = N pinned one per CPU, flows mode userspace",
			"afxdp":     "user-xsk-wN, aescm-xsk-wN, gcm-xsk-wN: as userspace with dataplane.userspace_io = afxdp: relayd's XDP program (bpf/xsk.c, native) on r0 and r1 redirects the steered ports' packets into the workers' AF_XDP sockets (copy mode), sending unchanged (raw-socket sendmmsg)",
			"srtp":      "as userspace, flows with decrypt {suite, key} (a key per flow); the sender encrypts with srtpflow.Encrypter in its send loop, in the direct runs too",
			"cmmsg":     "no relayd: lab/cmmsg, a minimal C relay with relayd's flows (ports, source check, IPv4+UDP header rewrite with the UDP checksum): relayd's sk_lookup steering to one UDP socket, blocking recvmmsg of up to 64 with IP_ORIGDSTADDR, one sendmmsg per batch on an IPPROTO_RAW socket, pinned to CPU 0; started per phase with exactly its flows",
		},
		"cpu_methods": map[string]string{
			"tasks": "sum of /proc/PID/task/TID/schedstat run time of voipgen (sender, sink, runtime), relayd, ksoftirqd/N; per sent packet",
			"busy":  "whole machine: CPUs x elapsed - (idle + iowait + steal) from per-CPU /proc/stat (10 ms units); per sent packet",
			"relay": "mode figure minus the mean figure of the two direct runs (same sender, sink, rate, packets) around its two runs (direct, mode, mode, direct)",
			"prog":  "relay_xdp run_time_ns / run_cnt from BPF stats (BPF_ENABLE_STATS, xdp mode only)",
		},
	}}
	if irqKnown && irq {
		rep.Summary.Notes = append(rep.Summary.Notes, "kernel has CONFIG_IRQ_TIME_ACCOUNTING: task times miss softirq work; trust the busy (idle) figures")
	}
	defer func() {
		rep.Summary = mergeNotes(summarize(rep.Steps, rep.Installs, cfg.modes, cfg.flows), rep.Summary.Notes)
		err = errors.Join(err, b.close())
	}()

	fmt.Fprintf(log, "building lab (%d flows max)\n", n)
	if err := b.setup(n); err != nil {
		return rep, err
	}
	for _, m := range cfg.modes {
		if err := b.runMode(ctx, rep, m); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func mergeNotes(s fwdSummary, notes []string) fwdSummary {
	s.Notes = append(notes, s.Notes...)
	return s
}

// runMode measures mode m at every flow count; relayd, if the mode has
// one, runs for all of them and gets the flows each count adds. The C
// relay of mode cmmsg is started for each count with exactly its flows.
func (b *fwdBench) runMode(ctx context.Context, rep *FwdReport, m fwdMode) (err error) {
	if !m.relayd() {
		switch m.Kind {
		case "xdpmin":
			fmt.Fprintln(b.log, "mode xdpmin: no relayd, the minimal XDP forwarder (lab/minfwd) on r0 and r1")
			fwd, aerr := minfwd.Attach(b.l.Relay.Path(), lab.RelayCallerIfName, lab.RelayCalleeIfName)
			if aerr != nil {
				return aerr
			}
			stats, serr := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
			if serr != nil {
				fwd.Close()
				return fmt.Errorf("enable BPF run-time statistics: %w", serr)
			}
			b.prog = fwd.Program()
			defer func() {
				b.prog = nil
				err = errors.Join(err, stats.Close(), fwd.Close())
			}()
		case "cmmsg":
			fmt.Fprintf(b.log, "mode cmmsg: no relayd, the minimal C relay (lab/cmmsg) on CPU %d, steered by relayd's sk_lookup program\n", fwdCmmsgCPU)
		default:
			fmt.Fprintln(b.log, "mode kernel: no relayd, kernel IPv4 forwarding in the relay namespace")
		}
		for _, f := range b.cfg.flows {
			if m.Kind == "cmmsg" {
				if err := b.startCmmsg(f); err != nil {
					return err
				}
			}
			err := b.phase(ctx, rep, m, f)
			if m.Kind == "cmmsg" {
				err = errors.Join(err, b.stopCmmsg())
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	fmt.Fprintf(b.log, "mode %s: starting relayd\n", m.Name)
	if err := b.startRelay(m); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.stopRelay()) }()
	for _, f := range b.cfg.flows {
		in, err := b.install(m, f)
		if err != nil {
			return err
		}
		rep.Installs = append(rep.Installs, in)
		if err := b.phase(ctx, rep, m, f); err != nil {
			return err
		}
	}
	return nil
}

// fwdPath is what the sender sends in one kind of run: the messages and,
// for SRTP, the encrypters.
type fwdPath struct {
	msgs fwdMsgs // caller -> relay -> callee, from the caller's socket
	// rev, when not empty, is the other way: callee -> relay -> caller,
	// from the callee's socket (the sink's), streams after msgs'.
	rev fwdMsgs
	enc []*srtpflow.Encrypter // SRTP: encrypts msgs' streams
	// xc, on a transcoding relay's path, makes its runs transcode runs:
	// the sender keeps each stream's SSRC from run to run (a relay
	// transcodes under SSRCs of its own, so the sink cannot tell runs or
	// streams apart by SSRC: it counts by the relay port a packet came
	// from and checks every packet's format; see fwdExpect).
	xc *fwdTranscode
}

// fwdTranscode is what the sink needs to count a transcoding relay's
// output: ports[p] is the stream whose packets come from the relay's port
// p, -1 for none.
type fwdTranscode struct {
	ports []int32
}

// fwdTranscodeTag is the SSRC tag (bits 16-23) of every transcode run
// through a relay: b.tag never hands it out.
const fwdTranscodeTag = 0xfe

// What a transcoding relay must deliver: G.729 20 ms to the callee (the
// sink's socket), G.711 µ-law 20 ms to the caller (the sender's).
var fwdTranscodeWant = [2]struct {
	pt   uint8
	size int
}{{g729PT, g729RTPLen}, {pcmuPT, fwdRTPLen}}

// fwdExpect is one transcode run's accounting in the sink: every packet
// counts for run tag; its stream comes from the port it was sent from, and
// its format must be fwdTranscodeWant's for the socket it arrived on.
// The sink's threads update it while it is installed (fwdSink.expect).
type fwdExpect struct {
	tag   uint8
	ports []int32
	ok    [2]atomic.Uint64 // per socket (0 the callee's, 1 the caller's): packets in the right format
	bad   [2]atomic.Uint64 // in another format
	// lastBad is the last wrong packet's payload type<<16 | length.
	lastBad [2]atomic.Uint32
	unknown atomic.Uint64 // from a port of no stream
}

// check returns an error when any packet of the run was not transcoded.
func (x *fwdExpect) check() error {
	var errs []error
	for side, who := range []string{"callee", "caller"} {
		if n := x.bad[side].Load(); n > 0 {
			v := x.lastBad[side].Load()
			errs = append(errs, fmt.Errorf("%d of %d packets to the %s not PT %d of %d bytes (the last: PT %d, %d bytes)",
				n, n+x.ok[side].Load(), who, fwdTranscodeWant[side].pt, fwdTranscodeWant[side].size, v>>16, v&0xffff))
		}
	}
	if n := x.unknown.Load(); n > 0 {
		errs = append(errs, fmt.Errorf("%d packets from a port that is no call's", n))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("the relay did not transcode: %w", err)
	}
	return nil
}

// paths returns the direct path and mode m's path for f flows.
func (b *fwdBench) paths(m fwdMode, f int) (direct, mode fwdPath) {
	srtpLen := 0
	if m.Kind == "srtp" {
		srtpLen = fwdRTPLen + m.Suite.RTPTagLen()
		direct.enc, mode.enc = b.enc[:f], b.enc[:f]
	}
	direct.msgs = b.snd.messages(f, srtpLen, func(i int) netip.AddrPort {
		return netip.AddrPortFrom(addrAt(directPrefix, i), uint16(fwdSinkPort))
	})
	mode.msgs = b.snd.messages(f, srtpLen, func(i int) netip.AddrPort {
		if m.Kind == "kernel" || m.Kind == "xdpmin" {
			return netip.AddrPortFrom(addrAt(farPrefix, i), uint16(fwdSinkPort))
		}
		return netip.AddrPortFrom(b.l.RelayMedia4, uint16(fwdMatchPort+i))
	})
	return direct, mode
}

// phase steps the rate for mode m at f flows. Until the first step with
// loss each step runs direct, mode, mode, direct; then up to cfg.overload
// steps run the mode only, for the overload curve.
func (b *fwdBench) phase(ctx context.Context, rep *FwdReport, m fwdMode, f int) error {
	direct, mode := b.paths(m, f)
	if err := b.warm(ctx, direct, m, true); err != nil {
		return err
	}
	if err := b.warm(ctx, mode, m, false); err != nil {
		return err
	}
	over := -1 // overload steps run so far; -1 before the first loss
	for _, rate := range b.cfg.rates {
		runs, err := b.step(ctx, m, f, rate, direct, mode, over >= 0)
		if err != nil {
			return err
		}
		// One of the two mode runs lost packets and the other did not,
		// or a direct run lost some: on a shared machine that is mostly
		// another process taking the CPU for a while. Run the step again
		// once; the first attempt stays in the report, superseded.
		if over < 0 && !b.cfg.allSteps && disturbed(runs, b.senderMax) {
			for i := range runs {
				runs[i].Superseded = true
			}
			rep.Steps = append(rep.Steps, runs...)
			fmt.Fprintf(b.log, "  %s %d pps: the runs disagree (loss or a short sender in one of two, or a direct run disturbed): running the step again\n", m.Name, rate)
			if runs, err = b.step(ctx, m, f, rate, direct, mode, false); err != nil {
				return err
			}
		}
		lossy, limited := false, false
		for i := range runs {
			if runs[i].Mode != "direct" {
				lossy = lossy || !runs[i].lossless()
				limited = limited || runs[i].SenderLimited
			}
		}
		rep.Steps = append(rep.Steps, runs...)
		if err := ctx.Err(); err != nil {
			return err
		}
		if b.cfg.allSteps {
			continue
		}
		// Past the first loss the relay is the bottleneck: offer more, up
		// to cfg.overload steps. Without loss, a sender that fell short
		// cannot offer more (on veth the relaying of kernel and xdp runs
		// in the sender's softirq: their relay cost slows the sender).
		switch {
		case over >= 0:
			over++
			if over >= b.cfg.overload {
				return nil
			}
		case lossy:
			if b.cfg.overload == 0 {
				return nil
			}
			over = 0
			fmt.Fprintf(b.log, "  %s: loss at %d pps: %d overload step(s) follow\n", m.Name, rate, b.cfg.overload)
		case limited:
			fmt.Fprintf(b.log, "  %s: the sender fell short of %d pps: stopping\n", m.Name, rate)
			return nil
		}
	}
	return nil
}

// step runs one step of mode m: direct, mode, mode, direct (or the two
// mode runs only, overload) at rate pps over f flows, and reports it.
func (b *fwdBench) step(ctx context.Context, m fwdMode, f, rate int, direct, mode fwdPath, overload bool) ([]fwdStep, error) {
	order := []string{"direct", m.Name, m.Name, "direct"}
	if overload {
		order = order[1:3]
	}
	waited, busy, err := b.quiet(ctx)
	if err != nil {
		return nil, err
	}
	if waited >= 500*time.Millisecond {
		fmt.Fprintf(b.log, "  waited %.1f s for other processes to leave the CPUs (busy %.2f CPUs before the step)\n", waited.Seconds(), busy)
	}
	var runs []fwdStep
	for _, name := range order {
		p := mode
		if name == "direct" {
			p = direct
		}
		st, err := b.measure(ctx, name, m, f, rate, p)
		if err != nil {
			return nil, err
		}
		if b.afterRun != nil {
			if err := b.afterRun(); err != nil {
				return nil, err
			}
		}
		st.Overload = overload
		if len(runs) == 0 {
			st.QuietWaitS = waited.Seconds()
		}
		if name == "direct" {
			b.senderMax = max(b.senderMax, st.SentPPS)
		}
		runs = append(runs, st)
	}
	for i := range runs {
		st := &runs[i]
		if st.Mode == "direct" {
			if !st.lossless() {
				fmt.Fprintf(b.log, "  direct   %5d flows %6d pps offered: sent %6.0f pps, loss %.3f%%%s\n",
					f, rate, st.SentPPS, st.LossPct, waitText(st))
			}
			continue
		}
		if !overload {
			b.relayCost(st, &runs[0], &runs[3])
		}
		if st.RelayDropped > 0 {
			fmt.Fprintf(b.log, "  relayd dropped %d packets: %v\n", st.RelayDropped, st.RelayDrops)
		}
		if len(st.LabDrops) > 0 {
			fmt.Fprintf(b.log, "  lab drop counters that grew: %v\n", st.LabDrops)
		}
		fmt.Fprintf(b.log, "  %-8s %5d flows %6d pps offered: sent %6.0f pps, achieved %6.0f, loss %.3f%%, relay %s ns/pkt (tasks) %s (idle)%s%s%s\n",
			m.Name, f, rate, st.SentPPS, st.AchievedPPS, st.LossPct, optNs(st.RelayTaskNsPerPkt), optIdle(st.RelayBusyNsPerPkt),
			progText(st.ProgNsPerRun), delayText(st.WorkerDelay), waitText(st))
	}
	return runs, ctx.Err()
}

// quiet waits until the machine is nearly idle (fwdQuietBusy CPUs over
// fwdQuietSample, when nothing of the benchmark runs), at most
// fwdQuietStep and what is left of cfg.quietWait: a shared machine's other
// processes take CPU from the measured threads and run-queue waits turn
// into loss. It returns the time waited beyond the first sample and the
// last busy figure.
func (b *fwdBench) quiet(ctx context.Context) (time.Duration, float64, error) {
	if b.quietLeft <= 0 {
		return 0, 0, nil
	}
	start := time.Now()
	var busy float64
	for {
		s0, err := b.sampler.Snapshot(nil)
		if err != nil {
			return 0, 0, err
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(fwdQuietSample):
		}
		s1, err := b.sampler.Snapshot(nil)
		if err != nil {
			return 0, 0, err
		}
		u := measure.Diff(s0, s1)
		busy = float64(u.Busy) / float64(u.Elapsed)
		waited := max(0, time.Since(start)-fwdQuietSample)
		if busy < fwdQuietBusy || waited >= fwdQuietStep || waited >= b.quietLeft {
			b.quietLeft -= waited
			return waited, busy, nil
		}
	}
}

// waitText tells how long the run's threads waited for a CPU, and how busy
// the machine was outside them, when that was notable.
func waitText(st *fwdStep) string {
	var parts []string
	for _, l := range []string{"sender", "sink", "relayd", "cmmsg"} {
		if w := st.LabelWaitMs[l]; w >= 10 {
			parts = append(parts, fmt.Sprintf("%s %.0f ms", l, w))
		}
	}
	out := ""
	if len(parts) > 0 {
		out = "; waited for a CPU: " + strings.Join(parts, ", ")
	}
	if st.BusyNsPerPkt > 0 && st.OutsideNsPerPkt/st.BusyNsPerPkt > 0.2 {
		out += fmt.Sprintf("; other processes: %.0f%% of the machine's busy time", 100*st.OutsideNsPerPkt/st.BusyNsPerPkt)
	}
	return out
}

// relayCost sets st's relay cost: its figures minus the mean of the two
// direct runs d0 and d1.
func (b *fwdBench) relayCost(st, d0, d1 *fwdStep) {
	st.Comparable = !st.SenderLimited && !d0.SenderLimited && !d1.SenderLimited
	d := st.TaskNsPerPkt - (d0.TaskNsPerPkt+d1.TaskNsPerPkt)/2
	db := st.BusyNsPerPkt - (d0.BusyNsPerPkt+d1.BusyNsPerPkt)/2
	st.RelayTaskNsPerPkt, st.RelayBusyNsPerPkt = &d, &db
	st.RelayLabelNsPkt = make(map[string]float64)
	for l, v := range st.LabelNsPkt {
		st.RelayLabelNsPkt[l] = v - (d0.LabelNsPkt[l]+d1.LabelNsPkt[l])/2
	}
}

func optNs(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f", *p)
}

// optIdle is optNs for an idle cross-check figure (see fmtIdle).
func optIdle(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmtIdle(*p, "%.0f")
}

func progText(p *float64) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf(", program %.0f ns/run", *p)
}

// tag returns the run tag for the next run of mode m, direct or through
// the relay. SRTP modes use two tags for direct runs and two others for
// relay runs, alternating: a flow then has at most four SSRCs, so the SRTP
// contexts at both ends keep little state (a real call keeps its SSRC),
// and the relay sees an SSRC from its first packet on, as the sender's
// context does (SDES carries no rollover counter: a relay that joined an
// SSRC after a sequence number wrap would guess it wrong). The drain
// between runs keeps the counts of consecutive runs apart.
func (b *fwdBench) tag(m fwdMode, direct bool) uint8 {
	b.run++
	if b.run == fwdTranscodeTag {
		b.run++
	}
	if m.Kind != "srtp" {
		return b.run
	}
	k := 1
	if direct {
		k = 0
	}
	b.srtpRuns[k]++
	return uint8(2*k) | b.srtpRuns[k]&1
}

// warm sends two packets per flow on a path so that neighbours are
// resolved and caches are warm before the first measured run.
func (b *fwdBench) warm(ctx context.Context, p fwdPath, m fwdMode, direct bool) error {
	tag := b.tag(m, direct)
	before := b.sink.run(tag)
	if p.xc != nil && !direct {
		b.sink.expect.Store(&fwdExpect{tag: tag, ports: p.xc.ports})
		defer b.sink.expect.Store(nil)
	}
	res := b.snd.run(ctx, p, fwdWarm/2, fwdWarm, tag)
	if res.err != nil {
		return res.err
	}
	b.sink.drain(tag, before+res.packets)
	return ctx.Err()
}

func (b *fwdBench) targets() []measure.Target {
	pid := os.Getpid()
	t := []measure.Target{
		{Label: "sender", PID: pid, TIDs: []int{b.snd.tid}},
	}
	if b.sink.xdp == nil {
		t = append(t, measure.Target{Label: "sink", PID: pid, TIDs: []int{b.sink.tid, b.sink.tid2}})
	}
	t = append(t, measure.Target{Label: "voipgen", PID: pid})
	for _, p := range b.napi {
		t = append(t, measure.Target{Label: "napi", PID: p})
	}
	for _, p := range b.relayNAPI {
		t = append(t, measure.Target{Label: "relay-napi", PID: p})
	}
	if b.relay != nil && b.relay.Pid() != 0 {
		t = append(t, measure.Target{Label: "relayd", PID: b.relay.Pid()})
	}
	if b.cm != nil {
		t = append(t, measure.Target{Label: "cmmsg", PID: b.cm.Pid()})
	}
	for _, p := range b.softirqd {
		t = append(t, measure.Target{Label: "ksoftirqd", PID: p})
	}
	return t
}

// measure runs one step: f flows sharing rate pps on path p for the step
// time. name is "direct" or m's name.
func (b *fwdBench) measure(ctx context.Context, name string, m fwdMode, f, rate int, p fwdPath) (fwdStep, error) {
	st := fwdStep{Mode: name, Phase: m.Name, Flows: f, Workers: m.Workers, OfferedPPS: rate,
		PerFlowPPS: float64(rate) / float64(f), Relayed: -1, RelayDropped: -1, RelayedUserspace: -1}
	viaRelay := name != "direct" && (b.relay != nil || b.cm != nil)
	countsBefore, err := b.sink.counts(f)
	if err != nil {
		return st, err
	}
	tag := b.tag(m, name == "direct")
	totalBefore := b.sink.run(tag) // earlier runs with this tag
	var countersBefore relayCounters
	var progBefore *ebpf.ProgramStats
	if viaRelay {
		if countersBefore, err = b.relayed(); err != nil {
			return st, err
		}
	}
	if name != "direct" && b.prog != nil {
		if progBefore, err = b.prog.Stats(); err != nil {
			return st, fmt.Errorf("program stats: %w", err)
		}
	}
	var x *fwdExpect
	if p.xc != nil && name != "direct" {
		x = &fwdExpect{tag: tag, ports: p.xc.ports}
		b.sink.expect.Store(x)
	}
	dropsBefore := labPathDrops(b.l)
	targets := b.targets()
	// Collect this process's garbage now (the metrics just read, the
	// last run's), not in the measured run.
	runtime.GC()
	s0, err := b.sampler.Snapshot(targets)
	if err != nil {
		return st, err
	}
	res := b.snd.run(ctx, p, period(f, rate), b.cfg.step, tag)
	if res.err != nil {
		return st, res.err
	}
	b.sink.drain(tag, res.packets+totalBefore)
	s1, err := b.sampler.Snapshot(targets)
	if err != nil {
		return st, err
	}
	if x != nil {
		b.sink.expect.Store(nil)
		st.TranscodedToCallee, st.TranscodedToCaller = x.ok[0].Load(), x.ok[1].Load()
		// Received is what the expectation classified, not the tag's
		// count read later: a transcoding relay's own packets
		// (concealment, comfort noise) can still arrive once the run is
		// drained, and would be received without being classified.
		st.Received = st.TranscodedToCallee + st.TranscodedToCaller + x.bad[0].Load() + x.bad[1].Load()
		if err := x.check(); err != nil {
			return st, fmt.Errorf("%s, %d flows: %w", name, f, err)
		}
	}
	u := measure.Diff(s0, s1)

	st.Sent, st.SendErrors, st.EncryptErrors = res.packets, res.errors, res.encErrors
	if x == nil {
		st.Received = b.sink.run(tag) - totalBefore
	}
	st.Lost = int64(st.Sent) - int64(st.Received)
	st.ElapsedS = res.elapsed.Seconds()
	if st.Sent > 0 {
		st.LossPct = 100 * float64(st.Lost) / float64(st.Sent)
	}
	if st.Lost > 0 {
		for k, v := range labPathDrops(b.l) {
			if d := v - dropsBefore[k]; v > dropsBefore[k] {
				if st.LabDrops == nil {
					st.LabDrops = map[string]uint64{}
				}
				st.LabDrops[k] = d
			}
		}
	}
	if res.elapsed > 0 {
		st.SentPPS = float64(st.Sent) / res.elapsed.Seconds()
		st.AchievedPPS = float64(st.Received) / res.elapsed.Seconds()
		st.SenderLimited = st.SentPPS < 0.97*float64(st.OfferedPPS)
	}
	countsAfter, err := b.sink.counts(f)
	if err != nil {
		return st, err
	}
	for i := range f {
		if countsAfter[i]-countsBefore[i] < res.cycles {
			st.StreamsShort++
		}
	}
	st.TaskNsPerPkt = measure.NsPerPacket(u.Tasks, st.Sent)
	st.BusyNsPerPkt = measure.NsPerPacket(u.Busy, st.Sent)
	st.OutsideNsPerPkt = st.BusyNsPerPkt - st.TaskNsPerPkt
	st.StealMs = float64(u.Steal) / 1e6
	st.LabelNsPkt, st.LabelWaitMs = make(map[string]float64), make(map[string]float64)
	for _, lt := range u.ByLabel {
		st.LabelNsPkt[lt.Label] = measure.NsPerPacket(lt.Time, st.Sent)
		st.LabelWaitMs[lt.Label] = float64(lt.Wait) / 1e6
	}
	if viaRelay {
		c, err := b.relayed()
		if err != nil {
			return st, err
		}
		fwd, dropped, reasons := c.since(countersBefore)
		st.Relayed, st.RelayDropped, st.RelayDrops = int64(fwd), int64(dropped), reasons
		st.RelayedUserspace = int64(c.userspace - countersBefore.userspace)
		if m.Kind == "user" || m.Kind == "srtp" {
			st.WorkerDelay = c.workerDelay(countersBefore)
		}
	}
	if b.relayNAPI != nil && name != "direct" {
		// The relay hop: its NAPI threads, and relayd or the C relay (the
		// one that ran; neither in kernel and xdpmin modes).
		v := st.LabelNsPkt["relay-napi"] + st.LabelNsPkt["relayd"] + st.LabelNsPkt["cmmsg"]
		st.HopNsPerPkt = &v
	}
	if progBefore != nil {
		ps, err := b.prog.Stats()
		if err != nil {
			return st, fmt.Errorf("program stats: %w", err)
		}
		st.ProgRuns = ps.RunCount - progBefore.RunCount
		if st.ProgRuns > 0 {
			v := float64(ps.Runtime-progBefore.Runtime) / float64(st.ProgRuns)
			st.ProgNsPerRun = &v
		}
	}
	return st, ctx.Err()
}

// relayed returns relayd's global counters (GET /metrics): packets
// forwarded and dropped, over all flows and both data planes. The metrics
// are small, unlike the flow list, whose encoding at 10,000 flows would
// leave relayd garbage to collect in the next measured run. In mode
// cmmsg it returns the C relay's counters.
func (b *fwdBench) relayed() (relayCounters, error) {
	if b.cm != nil {
		c := b.cm.Counters()
		return relayCounters{forwarded: c.Forwarded, userspace: c.Forwarded, drops: map[string]uint64{
			"no_flow": c.NoFlow, "wrong_source": c.WrongSource, "too_big": c.Truncated, "send_failed": c.SendFailed,
		}}, nil
	}
	text, err := b.relay.Metrics()
	if err != nil {
		return relayCounters{}, fmt.Errorf("relayd metrics: %w", err)
	}
	return parseRelayCounters(text)
}

func (b *fwdBench) setup(flows int) error {
	l, err := lab.New(lab.Config{})
	if err != nil {
		return err
	}
	b.l = l
	run := func(ns *lab.NS, args ...string) error {
		if out, err := ns.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s in %s: %w: %s", strings.Join(args, " "), ns, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	c, e := fwdDirectIfs[0], fwdDirectIfs[1]
	for _, step := range []struct {
		ns   *lab.NS
		args []string
	}{
		// The direct path: a veth pair between caller and callee set up
		// like the lab's (GRO on, tx checksum offload off).
		{l.Caller, []string{"ip", "link", "add", c, "type", "veth", "peer", "name", e, "netns", l.Callee.Name()}},
		{l.Caller, []string{"ip", "addr", "add", directCaller.String(), "dev", c}},
		{l.Callee, []string{"ip", "addr", "add", directCallee.String(), "dev", e}},
		{l.Caller, []string{"ip", "link", "set", c, "up"}},
		{l.Callee, []string{"ip", "link", "set", e, "up"}},
		{l.Caller, []string{"ip", "route", "add", directPrefix.String(), "via", directCallee.Addr().String(), "dev", c}},
		// The relay forwards the far prefix to the callee.
		{l.Relay, []string{"ip", "route", "add", farPrefix.String(), "via", l.CalleeAddr4.String(), "dev", lab.RelayCalleeIfName}},
		// The callee accepts both prefixes as local addresses.
		{l.Callee, []string{"ip", "route", "add", "local", farPrefix.String(), "dev", "lo"}},
		{l.Callee, []string{"ip", "route", "add", "local", directPrefix.String(), "dev", "lo"}},
	} {
		if err := run(step.ns, step.args...); err != nil {
			return err
		}
	}
	for _, x := range []struct {
		ns   *lab.NS
		name string
	}{{l.Caller, c}, {l.Callee, e}} {
		if err := x.ns.SetGRO(x.name, true); err != nil {
			return err
		}
		if err := x.ns.SetTxChecksum(x.name, false); err != nil {
			return err
		}
	}
	if b.softirqd, err = b.sampler.FindByComm("ksoftirqd/"); err != nil {
		return err
	}
	xdpSink := b.cfg.sink == benchEndXDP
	// With --relay-napi the end veths receive in threads of their own too:
	// otherwise the end host's receive, raised as a softirq by the relay's
	// redirect or transmit, would run in the relay's thread and be billed
	// to the relay hop.
	if xdpSink || b.cfg.relayNAPI {
		// What a host's NIC has (see lab.EndHostQueues), on the four end
		// veths, before any XDP program is attached: the sink's receive
		// work runs in NAPI threads of its own, measured as its CPU.
		for _, e := range []struct {
			ns   *lab.NS
			name string
		}{{l.Caller, lab.CallerIfName}, {l.Callee, lab.CalleeIfName}, {l.Caller, c}, {l.Callee, e}} {
			pids, err := e.ns.HostQueues(e.name)
			if err != nil {
				return err
			}
			// HostQueues pinned ring i's thread to CPU i.
			b.napi = append(b.napi, pids...)
		}
	}
	if b.cfg.relayNAPI {
		// Before XDP is attached to the relay's veths (see HostQueues).
		if b.relayNAPI, err = l.RelayNAPIThreads(); err != nil {
			return err
		}
	}
	if b.sink, err = newFwdSink(l.Callee, flows); err != nil {
		return err
	}
	if b.snd, err = newFwdSender(l, flows, b.cfg.sender == benchEndXDP); err != nil {
		return err
	}
	// Reverse streams go out of the sink's socket and come back to the
	// sender's.
	b.snd.rfd = b.sink.fd
	if xdpSink {
		return b.sink.useXDP(l, c, e)
	}
	b.sink.watch(b.snd.fd)
	return nil
}

func relaydBinary(p string) (string, error) {
	if p != "" {
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		c := filepath.Join(filepath.Dir(exe), "relayd")
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() {
			return c, nil
		}
	}
	if _, err := exec.LookPath("go"); err != nil {
		return "", errors.New("no relayd next to voipgen and no go toolchain to build one: pass --relayd")
	}
	return labrelay.Build()
}

// startRelay starts relayd for mode m without flows. For an SRTP mode it
// also makes a key per flow and the sender's encrypters.
func (b *fwdBench) startRelay(m fwdMode) error {
	bin, err := relaydBinary(b.cfg.relayd)
	if err != nil {
		return err
	}
	if b.relayDir, err = os.MkdirTemp("", "fwdbench-relayd-"); err != nil {
		return err
	}
	// warn: relayd logs every idle flow at info level.
	o := labrelay.Options{Bin: bin, Dir: b.relayDir, LogLevel: "warn", ExtraMedia: b.relayExtra, Ports: b.relayPorts, Extra: b.relayTop, RateCaps: b.relayCaps,
		WorkerScheduling: b.cfg.workerSched, WorkerPriority: b.cfg.workerPrio}
	m.setRelayd(&o)
	r, err := labrelay.New(b.l, o)
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return errors.Join(err, r.Close())
	}
	b.relay, b.installed = r, 0
	switch m.Kind {
	case "xdp":
		if err := b.openProg(); err != nil {
			return err
		}
		stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
		if err != nil {
			return fmt.Errorf("enable BPF run-time statistics: %w", err)
		}
		b.bpfStats = stats
	case "srtp":
		start := time.Now()
		n := b.cfg.maxFlows()
		b.keys, b.enc = make([]string, n), make([]*srtpflow.Encrypter, n)
		for i := range n {
			c, err := sdes.Generate(1, m.Suite)
			if err != nil {
				return err
			}
			b.keys[i] = base64.StdEncoding.EncodeToString(append(c.Key, c.Salt...))
			if b.enc[i], err = srtpflow.NewEncrypter(srtpflow.Config{Suite: m.Suite, Key: c.Key, Salt: c.Salt}); err != nil {
				return err
			}
		}
		fmt.Fprintf(b.log, "  %d %s keys and sender contexts made in %v\n", n, m.Suite, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// setRelayd sets relayd's data plane options for mode m in o.
func (m fwdMode) setRelayd(o *labrelay.Options) {
	if m.Kind == "xdp" {
		return
	}
	o.Workers, o.Coalesce, o.UserspaceIO = m.Workers, m.Coalesce, m.IO
	if m.Plane != "xdp" {
		o.Mode = "userspace"
	}
}

// openProg opens the XDP program relayd attached to the caller side.
func (b *fwdBench) openProg() error {
	var id uint32
	err := b.l.Relay.Do(func() error {
		link, err := netlink.LinkByName(lab.RelayCallerIfName)
		if err != nil {
			return err
		}
		if x := link.Attrs().Xdp; x != nil {
			id = x.ProgId
		}
		return nil
	})
	if err != nil || id == 0 {
		return fmt.Errorf("find the XDP program on %s: id %d: %v", lab.RelayCallerIfName, id, err)
	}
	if b.prog, err = ebpf.NewProgramFromID(ebpf.ProgramID(id)); err != nil {
		return fmt.Errorf("open XDP program %d: %w", id, err)
	}
	if info, err := b.prog.Info(); err == nil && info.Name != "relay_xdp" {
		return fmt.Errorf("program %d on %s is %q, want relay_xdp", id, lab.RelayCallerIfName, info.Name)
	}
	return nil
}

// install adds flows b.installed..f-1 to relayd with parallel POSTs, in
// a fixed shuffle (installOrder).
func (b *fwdBench) install(m fwdMode, f int) (fwdInstall, error) {
	in := fwdInstall{Mode: m.Name, Flows: f, Added: f - b.installed}
	mode := "xdp"
	if m.Kind != "xdp" {
		mode = "userspace"
	}
	start := time.Now()
	var wg sync.WaitGroup
	order := installOrder(b.installed, f)
	next := atomic.Int64{}
	errs := make([]error, fwdInstallers)
	for w := range errs {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if k >= len(order) || errs[w] != nil {
					return
				}
				i := order[k]
				fl := b.flow(i)
				req := admin.FlowRequest{
					Match:        fl.Match.String(),
					ExpectSource: fl.Source.String(),
					SendFrom:     fl.From.String(),
					SendTo:       fl.To.String(),
					Mode:         mode,
				}
				if m.Kind == "srtp" {
					req.Decrypt = &admin.Crypto{Suite: m.Suite.String(), Key: b.keys[i]}
				}
				_, errs[w] = b.relay.AddFlow(req)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return in, fmt.Errorf("install flows: %w", err)
	}
	d := time.Since(start)
	in.Seconds = d.Seconds()
	if d > 0 {
		in.PerSec = float64(in.Added) / d.Seconds()
	}
	b.installed = f
	fmt.Fprintf(b.log, "  %d flows installed in %v (%.0f/s, %d parallel POSTs), %d in all\n",
		in.Added, d.Round(time.Millisecond), in.PerSec, fwdInstallers, f)
	return in, nil
}

// installOrder is the order in which install adds flows from..to-1:
// callOrder's shuffle of them. The sender sends flow i's packets in 1 ms
// slots of consecutive indexes; installed in that order, relayd would pack
// blocks of consecutive flows onto one worker (dataplane.pack_flows), each
// woken in its block's slots only, where the flows of real calls, started
// at any moment, reach every worker in every slot.
func installOrder(from, to int) []int {
	order := callOrder(to - from)
	for k := range order {
		order[k] += from
	}
	return order
}

// flow is relayd's flow i, as install adds it and the C relay carries it:
// from the sender's socket to the relay's port fwdMatchPort+i, sent on
// from that port to the far prefix's address i, routed to the callee.
func (b *fwdBench) flow(i int) cmmsg.Flow {
	match := netip.AddrPortFrom(b.l.RelayMedia4, uint16(fwdMatchPort+i))
	return cmmsg.Flow{
		Match:  match,
		Source: netip.AddrPortFrom(b.l.CallerAddr4, uint16(fwdSenderPort)),
		From:   match,
		To:     netip.AddrPortFrom(addrAt(farPrefix, i), uint16(fwdSinkPort)),
	}
}

// startCmmsg starts the C relay in the relay namespace with flows
// 0..f-1.
func (b *fwdBench) startCmmsg(f int) error {
	flows := make([]cmmsg.Flow, f)
	for i := range flows {
		flows[i] = b.flow(i)
	}
	cm, err := cmmsg.Start(b.l.Relay, fwdCmmsgCPU, flows)
	if err != nil {
		return err
	}
	b.cm = cm
	fmt.Fprintf(b.log, "  C relay started with %d flows (pid %d)\n", f, cm.Pid())
	return nil
}

// stopCmmsg stops the C relay, if one runs.
func (b *fwdBench) stopCmmsg() error {
	if b.cm == nil {
		return nil
	}
	if c := b.cm.Counters(); c.Batches > 0 {
		fmt.Fprintf(b.log, "  C relay: %d packets received in %d recvmmsg batches (%.1f per batch), %d forwarded, %d dropped\n",
			c.Received, c.Batches, float64(c.Received)/float64(c.Batches), c.Forwarded, c.Dropped())
	}
	err := b.cm.Close()
	b.cm = nil
	return err
}

// stopRelay stops the current relayd and drops its mode's state.
func (b *fwdBench) stopRelay() error {
	var errs []error
	if b.bpfStats != nil {
		errs = append(errs, b.bpfStats.Close()) // the kernel turns the statistics off with the last holder
		b.bpfStats = nil
	}
	if b.prog != nil {
		errs = append(errs, b.prog.Close())
		b.prog = nil
	}
	if b.relay != nil {
		errs = append(errs, b.relay.Close())
		b.relay = nil
	}
	if b.relayDir != "" {
		os.RemoveAll(b.relayDir)
		b.relayDir = ""
	}
	b.keys, b.enc = nil, nil
	return errors.Join(errs...)
}

func (b *fwdBench) close() error {
	errs := []error{b.stopRelay(), b.stopCmmsg()}
	if b.sink != nil {
		b.sink.close() // first: it also reads the sender's socket
	}
	if b.snd != nil {
		errs = append(errs, b.snd.close())
	}
	if b.l != nil {
		errs = append(errs, b.l.Close())
	}
	return errors.Join(errs...)
}

// fwdSender sends the flows from one socket bound to 0.0.0.0:4000 in the
// caller namespace: a run of f flows at rate pps sends one packet of each
// flow per period f/rate, spread over the period in 1 ms slots, each slot
// in one sendmmsg. A flow's SSRC is tag<<16 | its index, for the sink.
// Only the RTP header changes per packet (the payload is written once);
// for SRTP the packet is then encrypted into the flow's second buffer
// (srtpflow.Encrypter, no allocation once the SSRC is known). A single
// goroutine locked to one thread sends, so its time on CPU is that
// thread's.
//
// With xdp (--sender xdp) the messages also carry whole frames' headers
// (fwdFrames) and go out through AF_XDP TX rings, one per veth, instead
// of the sockets.
type fwdSender struct {
	fd      int // caller side
	rfd     int // callee side, for reverse streams: the sink's socket
	streams []fwdStream
	tid     int
	jobs    chan fwdSendJob
	// xdp: send frames through xsks (opened as paths need them).
	xdp  bool
	l    *lab.Lab
	xsks []fwdXSK
}

// fwdXSK is the sender's AF_XDP socket on one veth.
type fwdXSK struct {
	ns      *lab.NS
	ifindex int
	x       *pktio.XSK
}

// fwdFrames is an fwdMsgs' XDP side: per message the Ethernet, IPv4 and
// UDP headers of its frame (UDP checksum 0) and the one's complement sum
// of its UDP pseudo-header and header, to which each packet's payload is
// added; the payload is the message's iovec.
type fwdFrames struct {
	xsk  *pktio.XSK
	hdrs [][fwdHdrLen]byte
	sums []uint64
}

// fwdHdrLen is the Ethernet, IPv4 and UDP headers of a frame.
const fwdHdrLen = 14 + 20 + 8

// fwdMsgs is one sendmmsg vector: message i carries flow i's buffer to
// its destination.
type fwdMsgs struct {
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet4
	ctrl  []fwdPktinfo // reverse streams: each message's source address
	// frames: the XDP sender's frames (nil for sendmmsg); err, when
	// building them failed (a next hop that did not resolve).
	frames *fwdFrames
	err    error
}

// fwdPktinfo is a control message that sets a datagram's source address
// (IP_PKTINFO's ipi_spec_dst): the callee's socket sends each reverse
// stream from its own address, local there through an AnyIP route.
type fwdPktinfo struct {
	hdr  unix.Cmsghdr
	info unix.Inet4Pktinfo
	_    [4]byte // to CMSG_SPACE
}

func (m fwdMsgs) len() int { return len(m.hdrs) }

// fwdStream is one flow's packet: RTP, and SRTP when encrypted.
type fwdStream struct {
	seq  uint16
	ts   uint32
	buf  [fwdRTPLen]byte
	sbuf [fwdRTPLen + fwdSRTPRoom]byte
	// n is the RTP packet's length, fwdRTPLen when 0. With loop, each
	// packet's payload is the next n-12 bytes of loop (from pos), which
	// holds a whole number of payloads: real audio, not fixed bytes.
	n    int
	loop []byte
	pos  int
}

func (st *fwdStream) len() int {
	if st.n == 0 {
		return fwdRTPLen
	}
	return st.n
}

// defaultPayload writes stream i's fixed payload: any G.711 bytes.
func (st *fwdStream) defaultPayload(i int) {
	st.buf[0], st.buf[1] = 0x80, 0 // version 2, PT 0 (PCMU)
	st.n, st.loop, st.pos = 0, nil, 0
	for j := 12; j < fwdRTPLen; j++ {
		st.buf[j] = byte(0xd5 ^ (i + j*13))
	}
}

// setLoop makes stream i send payload type pt with payloads of size
// bytes taken in turn from loop, starting at payload start. The sender
// must be idle.
func (s *fwdSender) setLoop(i int, pt uint8, size int, loop []byte, start int) {
	st := &s.streams[i]
	st.buf[1], st.n, st.loop = pt, 12+size, loop
	st.pos = start % (len(loop) / size) * size
}

// resetStreams gives every stream its fixed PCMU payload back. The sender
// must be idle.
func (s *fwdSender) resetStreams() {
	for i := range s.streams {
		s.streams[i].defaultPayload(i)
	}
}

type fwdSendJob struct {
	ctx         context.Context
	path        fwdPath
	period, dur time.Duration
	tag         uint8
	done        chan fwdSendResult
}

type fwdSendResult struct {
	packets, errors, encErrors, cycles uint64
	rev                                uint64 // of packets: the reverse streams' (callee -> caller)
	elapsed                            time.Duration
	err                                error // the path could not be sent (nothing was)
}

// holdP raises GOMAXPROCS by one for the calling thread, which keeps its
// P from now on (the sender's, a sink's: locked to their goroutines for
// good, they sleep and make system calls the Go scheduler does not see:
// gen.SleepUntilHeld), and returns the function that lowers it again.
// Without it, each such thread would take a CPU's worth of P from the rest
// of voipgen (its SIP stack, the bench's own goroutines) for its lifetime.
func holdP() (release func()) {
	procsMu.Lock()
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 1)
	procsMu.Unlock()
	return func() {
		procsMu.Lock()
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) - 1)
		procsMu.Unlock()
	}
}

// procsMu makes holdP's read and write of GOMAXPROCS one step.
var procsMu sync.Mutex

// fwdSocket opens a UDP socket bound to 0.0.0.0:port in ns, with buffers
// far larger than what a sender slot or a sink tick moves: the sender's
// socket also receives the reverse streams, and the sink's sends them.
// It is a plain blocking socket the Go runtime does not know (see
// newFwdSender and fwdSink).
func fwdSocket(ns *lab.NS, port int) (int, error) {
	fd := -1
	err := ns.Do(func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrInet4{Port: port})
	})
	if err != nil && fd >= 0 {
		unix.Close(fd)
	}
	return fd, err
}

// newFwdSender opens the sender's socket in the caller namespace: a plain
// blocking socket that the Go runtime does not know, so that neither its
// sends nor the kernel freeing its packets (sock_wfree, EPOLLOUT) ever
// wake the netpoller. Its thread paces itself with clock_nanosleep.
//
// With xdp it sends frames through AF_XDP sockets instead (the socket is
// still opened: the reverse streams come back to it).
func newFwdSender(l *lab.Lab, n int, xdp bool) (*fwdSender, error) {
	fd, err := fwdSocket(l.Caller, fwdSenderPort)
	if err != nil {
		return nil, fmt.Errorf("sender socket: %w", err)
	}
	s := &fwdSender{fd: fd, streams: make([]fwdStream, n), jobs: make(chan fwdSendJob), xdp: xdp, l: l}
	for i := range s.streams {
		st := &s.streams[i]
		st.seq, st.ts = uint16(i*7), uint32(i)*1000
		st.defaultPayload(i)
	}
	tid := make(chan int)
	go s.loop(tid)
	s.tid = <-tid
	return s, nil
}

// messages returns one message per flow 0..f-1 to dst(i) (IPv4), carrying
// the flow's RTP buffer, or its SRTP buffer of srtpLen bytes if srtpLen > 0.
func (s *fwdSender) messages(f, srtpLen int, dst func(i int) netip.AddrPort) fwdMsgs {
	return s.build(s.l.Caller, 0, f, srtpLen, nil, dst)
}

// revMessages returns one message per reverse stream off+0..off+c-1
// (plain RTP), from src(j) to dst(j), to send on the callee's socket.
func (s *fwdSender) revMessages(off, c int, src, dst func(j int) netip.AddrPort) fwdMsgs {
	return s.build(s.l.Callee, off, c, 0, src, dst)
}

// build returns the messages of streams off+0..off+n-1, sent from
// namespace ns: stream off+i's buffer (SRTP of srtpLen bytes if srtpLen >
// 0) to dst(i), from src(i) when src is not nil.
func (s *fwdSender) build(ns *lab.NS, off, n, srtpLen int, src, dst func(i int) netip.AddrPort) fwdMsgs {
	m := fwdMsgs{hdrs: make([]mmsghdr, n), iovs: make([]unix.Iovec, n), names: make([]unix.RawSockaddrInet4, n)}
	if src != nil {
		m.ctrl = make([]fwdPktinfo, n)
	}
	for i := range m.hdrs {
		st := &s.streams[off+i]
		if srtpLen > 0 {
			m.iovs[i].Base = &st.sbuf[0]
			m.iovs[i].SetLen(srtpLen)
		} else {
			m.iovs[i].Base = &st.buf[0]
			m.iovs[i].SetLen(st.len())
		}
		ap := dst(i)
		m.names[i].Family = unix.AF_INET
		m.names[i].Addr = ap.Addr().As4()
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&m.names[i].Port))[:], ap.Port())
		h := &m.hdrs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&m.names[i]))
		h.Namelen = unix.SizeofSockaddrInet4
		h.Iov = &m.iovs[i]
		h.SetIovlen(1)
		if src != nil {
			pi := &m.ctrl[i]
			pi.hdr.Level, pi.hdr.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
			pi.hdr.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
			pi.info.Spec_dst = src(i).Addr().As4()
			h.Control = (*byte)(unsafe.Pointer(pi))
			h.SetControllen(unix.CmsgSpace(unix.SizeofInet4Pktinfo))
		}
	}
	if s.xdp && n > 0 {
		m.frames, m.err = s.frames(ns, &m, src, dst)
	}
	return m
}

// frames builds m's frames from ns: every message goes out of the
// interface and to the next hop of dst(0)'s route (each path's
// destinations share one: the relay's address, or a prefix routed to one
// gateway), from src(i), or from the route's source address and the
// sender's port.
func (s *fwdSender) frames(ns *lab.NS, m *fwdMsgs, src, dst func(i int) netip.AddrPort) (*fwdFrames, error) {
	var ifindex int
	var eth [14]byte
	var from netip.Addr
	err := ns.Do(func() error {
		var err error
		if ifindex, eth, err = gen.NextHop(dst(0).Addr()); err != nil {
			return err
		}
		routes, err := netlink.RouteGet(dst(0).Addr().AsSlice())
		if err != nil || len(routes) == 0 {
			return fmt.Errorf("route to %s: %v", dst(0).Addr(), err)
		}
		from, _ = netip.AddrFromSlice(routes[0].Src.To4())
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("XDP sender in %s: %w", ns, err)
	}
	x, err := s.xsk(ns, ifindex)
	if err != nil {
		return nil, err
	}
	n := len(m.hdrs)
	fr := &fwdFrames{xsk: x, hdrs: make([][fwdHdrLen]byte, n), sums: make([]uint64, n)}
	for i := range n {
		sa, da := netip.AddrPortFrom(from, uint16(fwdSenderPort)), dst(i)
		if src != nil {
			sa = src(i)
		}
		fr.sums[i] = fwdFrameHeader(&fr.hdrs[i], eth, sa, da, int(m.iovs[i].Len))
	}
	return fr, nil
}

// fwdFrameHeader writes the Ethernet, IPv4 and UDP headers of a frame
// from src to dst with payload bytes of UDP payload (checksum left 0) and
// returns the one's complement sum of the UDP pseudo-header and header.
func fwdFrameHeader(h *[fwdHdrLen]byte, eth [14]byte, src, dst netip.AddrPort, payload int) uint64 {
	copy(h[:14], eth[:])
	ip := h[14:34]
	ip[0], ip[1] = 0x45, 0
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+payload))
	binary.BigEndian.PutUint16(ip[4:], 0)      // id
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8], ip[9] = 64, unix.IPPROTO_UDP
	ip[10], ip[11] = 0, 0
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:], pktio.Checksum(pktio.Sum(0, ip)))
	udp := h[34:42]
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(8+payload))
	udp[6], udp[7] = 0, 0
	sum := pktio.Sum(0, ip[12:20]) + unix.IPPROTO_UDP + uint64(8+payload)
	return pktio.Sum(sum, udp)
}

// xsk returns the sender's AF_XDP socket on ifindex in ns, opening it
// the first time.
func (s *fwdSender) xsk(ns *lab.NS, ifindex int) (*pktio.XSK, error) {
	for _, x := range s.xsks {
		if x.ns == ns && x.ifindex == ifindex {
			return x.x, nil
		}
	}
	var x *pktio.XSK
	err := ns.Do(func() (err error) {
		x, err = pktio.OpenXSK(ifindex, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("XDP sender in %s: %w", ns, err)
	}
	s.xsks = append(s.xsks, fwdXSK{ns: ns, ifindex: ifindex, x: x})
	return x, nil
}

// push sends messages lo..hi-1 of m as frames: each frame is its header
// and the stream's current packet, the UDP checksum its header's sum plus
// the payload's. A frame that finds no free UMEM frame for fwdXSKWait
// counts as an error. It does not allocate.
func (s *fwdSender) push(res *fwdSendResult, m *fwdMsgs, lo, hi int, rev bool) {
	fr := m.frames
	x := fr.xsk
	for i := lo; i < hi; i++ {
		f := x.Frame()
		if f == nil {
			for deadline := gen.MonoNow() + int64(fwdXSKWait); f == nil && gen.MonoNow() < deadline; {
				x.Flush()
				gen.SleepUntilHeld(gen.MonoNow() + int64(20*time.Microsecond))
				f = x.Frame()
			}
			if f == nil {
				res.errors++
				continue
			}
		}
		pay := unsafe.Slice(m.iovs[i].Base, m.iovs[i].Len)
		copy(f, fr.hdrs[i][:])
		n := fwdHdrLen + copy(f[fwdHdrLen:], pay)
		binary.BigEndian.PutUint16(f[40:], pktio.Checksum(pktio.Sum(fr.sums[i], pay)))
		x.Queue(n)
		res.packets++
		if rev {
			res.rev++
		}
	}
	x.Flush()
}

// fwdXSKWait is how long the XDP sender waits for a free UMEM frame (the
// kernel has not sent or completed the ring's 4,096) before it counts a
// packet as not sent.
const fwdXSKWait = 5 * time.Millisecond

// flushAll waits, up to 100 ms, until every frame queued on the sender's
// AF_XDP sockets has been taken by the kernel: a run's packets leave
// within the run.
func (s *fwdSender) flushAll() {
	deadline := gen.MonoNow() + int64(100*time.Millisecond)
	for _, x := range s.xsks {
		for x.x.Flush() > 0 && gen.MonoNow() < deadline {
			gen.SleepUntilHeld(gen.MonoNow() + int64(50*time.Microsecond))
		}
	}
}

func (s *fwdSender) loop(tid chan<- int) {
	runtime.LockOSThread() // never unlocked: the thread is the sender's alone
	defer holdP()()
	tid <- unix.Gettid()
	for j := range s.jobs {
		j.done <- s.send(j)
	}
}

// run sends p's flows, one packet per flow per period, for dur.
func (s *fwdSender) run(ctx context.Context, p fwdPath, period, dur time.Duration, tag uint8) fwdSendResult {
	done := make(chan fwdSendResult, 1)
	s.jobs <- fwdSendJob{ctx, p, period, dur, tag, done}
	return <-done
}

func (s *fwdSender) send(j fwdSendJob) fwdSendResult {
	var res fwdSendResult
	msgs, rev, enc := j.path.msgs, j.path.rev, j.path.enc
	if res.err = errors.Join(msgs.err, rev.err); res.err != nil {
		return res
	}
	nf := msgs.len()
	n := nf + rev.len()
	ssrcHigh := uint32(j.tag) << 16
	if j.path.xc != nil {
		ssrcHigh = fwdTranscodeTag << 16
	}
	slots := max(1, min(n, int(j.period/fwdSlot)))
	cycles := max(1, int(j.dur/j.period))
	start := gen.MonoNow() + int64(time.Millisecond)
	for cycle := 0; cycle < cycles && j.ctx.Err() == nil; cycle++ {
		base := time.Duration(cycle) * j.period
		for k := range slots {
			gen.SleepUntilHeld(start + int64(base+time.Duration(k)*j.period/time.Duration(slots)))
			lo, hi := k*n/slots, (k+1)*n/slots
			for i := lo; i < hi; i++ {
				st := &s.streams[i]
				st.seq++
				st.ts += uint32(fwdPtime / time.Millisecond * 8) // 8 kHz clock
				binary.BigEndian.PutUint16(st.buf[2:], st.seq)
				binary.BigEndian.PutUint32(st.buf[4:], st.ts)
				binary.BigEndian.PutUint32(st.buf[8:], ssrcHigh|uint32(i))
				if st.loop != nil {
					st.pos += copy(st.buf[12:st.len()], st.loop[st.pos:])
					if st.pos >= len(st.loop) {
						st.pos = 0
					}
				}
				if enc != nil && i < nf {
					if _, err := enc[i].EncryptRTP(st.sbuf[:0], st.buf[:]); err != nil {
						res.encErrors++
					}
				}
			}
			switch {
			case msgs.frames != nil:
				if lo < nf {
					s.push(&res, &msgs, lo, min(hi, nf), false)
				}
				if hi > nf && rev.frames != nil {
					s.push(&res, &rev, max(lo, nf)-nf, hi-nf, true)
				}
			default:
				if lo < nf {
					s.sendmmsg(&res, s.fd, msgs.hdrs[lo:min(hi, nf)])
				}
				if hi > nf {
					s.sendmmsg(&res, s.rfd, rev.hdrs[max(lo, nf)-nf:hi-nf])
				}
			}
		}
		res.cycles++
	}
	s.flushAll()
	res.elapsed = time.Duration(gen.MonoNow() - start)
	return res
}

// sendmmsg sends all of hs on fd, skipping a message the kernel refuses.
func (s *fwdSender) sendmmsg(res *fwdSendResult, fd int, hs []mmsghdr) {
	for len(hs) > 0 {
		r, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&hs[0])), uintptr(len(hs)), 0, 0, 0)
		switch {
		case errno == unix.EINTR:
		case errno != 0:
			res.errors++ // the first message failed: skip it
			hs = hs[1:]
		default:
			res.packets += uint64(r)
			if fd == s.rfd {
				res.rev += uint64(r)
			}
			hs = hs[r:]
		}
	}
}

func (s *fwdSender) close() error {
	close(s.jobs)
	errs := []error{unix.Close(s.fd)}
	for _, x := range s.xsks {
		errs = append(errs, x.x.Close())
	}
	return errors.Join(errs...)
}

// fwdSink receives on one UDP socket in the callee namespace on a thread
// of its own (no Go netpoller), and counts packets per stream and per run
// by SSRC (bits 0-15 the stream, 16-23 the run): the cheapest receiver
// that still checks every stream, and that counts packets arriving late
// for their run to that run, not to the next.
//
// It wakes on a timer every fwdSinkTick and drains its socket with
// non-blocking recvmmsg, instead of blocking until a packet arrives. A
// blocking receiver that keeps up is woken once per packet or few, and how
// many packets each wakeup finds depends on how the arrivals are spaced,
// so on what is in the path: a dearer relay spreads the sender's bursts,
// the sink wakes more often, and its wakeups (a cross-CPU IPI and two
// context switches, several microseconds in a VM) were billed to the
// relay. A timer makes the sink's wakeups the same in every run.
type fwdSink struct {
	fd      int // its own socket, in the callee namespace
	perSSRC []atomic.Uint64
	runs    [256]atomic.Uint64
	total   atomic.Uint64
	stop    atomic.Bool
	// expect, when set, is the transcode run in progress: its packets are
	// counted by fwdExpect's rules, not by SSRC.
	expect atomic.Pointer[fwdExpect]
	// xdp, when set, is the sink (useXDP): perSSRC, runs and total are
	// not used, the program's counters are.
	xdp *xdpsink.Sink
	wg  sync.WaitGroup
	tid int
	// fd2 and tid2: the caller's socket (the sender's), drained by a
	// second thread when reverse streams come back to it (watch).
	fd2  int
	tid2 int
	// pauseMu guards resumed: while it is set, the sink's threads wait on
	// it instead of ticking (see pause).
	pauseMu sync.Mutex
	resumed chan struct{}
}

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

const (
	fwdSinkBatch = 256
	// fwdSinkTick is how often the sink drains its socket: 1,000 wakeups a
	// second whatever the rate; its 64 MiB receive buffer holds far more
	// than a tick's packets at any rate the lab reaches.
	fwdSinkTick = time.Millisecond
)

func newFwdSink(ns *lab.NS, n int) (*fwdSink, error) {
	fd, err := fwdSocket(ns, fwdSinkPort)
	if err != nil {
		return nil, fmt.Errorf("sink socket: %w", err)
	}
	return &fwdSink{fd: fd, fd2: -1, perSSRC: make([]atomic.Uint64, n)}, nil
}

// watch starts the sink's threads: one receiving on its own socket, one
// on fd (the sender's socket, not closed by the sink).
func (k *fwdSink) watch(fd int) {
	k.tid = k.start(k.fd)
	k.fd2 = fd
	k.tid2 = k.start(fd)
}

// useXDP makes the sink the XDP program of lab/xdpsink, counting what
// arrives for the sink's and the sender's ports on the end hosts' veths
// (c0 and e0) and on the direct pair (callerIf in the caller namespace,
// calleeIf in the callee's): no thread, no socket receives anything.
func (k *fwdSink) useXDP(l *lab.Lab, callerIf, calleeIf string) error {
	if len(k.perSSRC) > xdpsink.Streams {
		return fmt.Errorf("XDP sink: %d streams, it tells %d apart", len(k.perSSRC), xdpsink.Streams)
	}
	x, err := xdpsink.Load(uint16(fwdSinkPort), uint16(fwdSenderPort))
	if err != nil {
		return err
	}
	if err := x.Attach(l.Caller.Path(), lab.CallerIfName, callerIf); err != nil {
		return errors.Join(err, x.Close())
	}
	if err := x.Attach(l.Callee.Path(), lab.CalleeIfName, calleeIf); err != nil {
		return errors.Join(err, x.Close())
	}
	k.xdp = x
	return nil
}

// run returns the packets counted for run tag so far.
func (k *fwdSink) run(tag uint8) uint64 {
	if k.xdp != nil {
		n, err := k.xdp.Run(tag)
		if err != nil {
			return 0 // read again at the next call: the map does not go away
		}
		return n
	}
	return k.runs[tag].Load()
}

// all returns every packet counted so far, RTP or not.
func (k *fwdSink) all() uint64 {
	if k.xdp != nil {
		n, _ := k.xdp.Total()
		return n
	}
	return k.total.Load()
}

func (k *fwdSink) start(fd int) int {
	tid := make(chan int)
	k.wg.Add(1)
	go k.loop(fd, tid)
	return <-tid
}

func (k *fwdSink) loop(fd int, tid chan<- int) {
	defer k.wg.Done()
	runtime.LockOSThread() // never unlocked: the thread is the sink's alone
	defer holdP()()
	tid <- unix.Gettid()
	bufs := make([][2048]byte, fwdSinkBatch)
	iovs := make([]unix.Iovec, fwdSinkBatch)
	hdrs := make([]mmsghdr, fwdSinkBatch)
	names := make([]unix.RawSockaddrInet4, fwdSinkBatch)
	for i := range hdrs {
		iovs[i].Base = &bufs[i][0]
		iovs[i].SetLen(len(bufs[i]))
		hdrs[i].hdr.Iov = &iovs[i]
		hdrs[i].hdr.SetIovlen(1)
		hdrs[i].hdr.Name = (*byte)(unsafe.Pointer(&names[i]))
	}
	side := 1 // fwdExpect's index of this socket
	if fd == k.fd {
		side = 0
	}
	next := gen.MonoNow()
	for !k.stop.Load() {
		if ch := k.pausedOn(); ch != nil {
			<-ch
			next = gen.MonoNow()
			continue
		}
		next += int64(fwdSinkTick)
		if now := gen.MonoNow(); next < now {
			next = now // fell behind (descheduled): no burst of catch-up ticks
		}
		gen.SleepUntilHeld(next)
		for {
			for i := range hdrs {
				hdrs[i].hdr.Namelen = unix.SizeofSockaddrInet4
			}
			x := k.expect.Load()
			r, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&hdrs[0])),
				fwdSinkBatch, unix.MSG_DONTWAIT, 0, 0)
			if errno != 0 {
				break // EAGAIN: drained (or EINTR: next tick)
			}
			n := int(r)
			if x != nil {
				k.countTranscoded(x, side, bufs[:n], hdrs[:n], names[:n])
				n = 0
			}
			for i := range n {
				if hdrs[i].n >= 12 {
					b := &bufs[i]
					ssrc := uint32(b[8])<<24 | uint32(b[9])<<16 | uint32(b[10])<<8 | uint32(b[11])
					if i := int(ssrc & 0xffff); i < len(k.perSSRC) {
						k.perSSRC[i].Add(1)
					}
					k.runs[ssrc>>16&0xff].Add(1)
				}
			}
			k.total.Add(uint64(r))
			if int(r) < fwdSinkBatch {
				break
			}
		}
	}
}

// pause stops the sink's ticks until resume: while nothing is sent to
// it, as during the SIP phase, its two threads' thousands of wakeups a
// second would only compete for the CPUs with what is measured. What
// arrives meanwhile waits in the socket for the next tick.
func (k *fwdSink) pause() {
	k.pauseMu.Lock()
	defer k.pauseMu.Unlock()
	if k.resumed == nil {
		k.resumed = make(chan struct{})
	}
}

// resume starts the sink's ticks again after pause.
func (k *fwdSink) resume() {
	k.pauseMu.Lock()
	defer k.pauseMu.Unlock()
	if k.resumed != nil {
		close(k.resumed)
		k.resumed = nil
	}
}

// pausedOn returns the channel to wait on while the sink is paused, or nil.
func (k *fwdSink) pausedOn() chan struct{} {
	k.pauseMu.Lock()
	defer k.pauseMu.Unlock()
	return k.resumed
}

// countTranscoded counts a batch received on socket side during a
// transcode run x.
func (k *fwdSink) countTranscoded(x *fwdExpect, side int, bufs [][2048]byte, hdrs []mmsghdr, names []unix.RawSockaddrInet4) {
	want := fwdTranscodeWant[side]
	var ok, bad uint64
	for i := range hdrs {
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&names[i].Port))[:])
		if s := x.ports[port]; s >= 0 && int(s) < len(k.perSSRC) {
			k.perSSRC[s].Add(1)
		} else {
			x.unknown.Add(1)
		}
		n := int(hdrs[i].n)
		pt := uint8(0xff)
		if n >= 12 {
			pt = bufs[i][1] & 0x7f
		}
		if pt == want.pt && n == want.size {
			ok++
		} else {
			bad++
			x.lastBad[side].Store(uint32(pt)<<16 | uint32(n&0xffff))
		}
	}
	x.ok[side].Add(ok)
	x.bad[side].Add(bad)
	k.runs[x.tag].Add(uint64(len(hdrs)))
}

// counts returns the packets counted for the first n streams.
func (k *fwdSink) counts(n int) ([]uint64, error) {
	c := make([]uint64, n)
	if k.xdp != nil {
		return c, k.xdp.Streams(c)
	}
	for i := range c {
		c[i] = k.perSSRC[i].Load()
	}
	return c, nil
}

// drain waits until run's count reaches want, or until no packet arrived
// for 250 ms while the sink's socket holds nothing (at most 3 s): packets
// still queued in veth rings, relayd's socket or the sink's socket are
// counted before the step ends, also when a thread is starved for a while
// on a busy machine.
func (k *fwdSink) drain(run uint8, want uint64) {
	last, since := k.all(), time.Now()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		if k.run(run) >= want {
			return
		}
		time.Sleep(10 * time.Millisecond)
		if v := k.all(); v != last {
			last, since = v, time.Now()
		} else if k.queued() {
			since = time.Now()
		} else if time.Since(since) >= 250*time.Millisecond {
			return
		}
	}
}

// queued reports whether a socket of the sink holds a packet.
func (k *fwdSink) queued() bool {
	for _, fd := range []int{k.fd, k.fd2} {
		if fd < 0 {
			continue
		}
		if q, err := unix.IoctlGetInt(fd, unix.SIOCINQ); err == nil && q > 0 {
			return true
		}
	}
	return false
}

func (k *fwdSink) close() {
	k.stop.Store(true)
	k.resume()
	k.wg.Wait()
	if k.xdp != nil {
		k.xdp.Close()
	}
	unix.Close(k.fd)
}

// labPathDrops reads the lab's drop counters on the media's way (see
// labDrops) and the end and relay veths' own: the interface statistics'
// rx and tx drops, and ethtool -S's counters of drops, errors and failures
// (veth's XDP ring overruns: xdp_xmit_errors, peer_tq_xdp_xmit_fail...).
// Keys are "<namespace> <counter>" or "<device> <counter>".
func labPathDrops(l *lab.Lab) map[string]uint64 {
	out := labDrops(l)
	for _, x := range []struct {
		ns  *lab.NS
		ifs []string
	}{{l.Caller, []string{lab.CallerIfName, fwdDirectIfs[0]}}, {l.Callee, []string{lab.CalleeIfName, fwdDirectIfs[1]}},
		{l.Relay, []string{lab.RelayCallerIfName, lab.RelayCalleeIfName}}} {
		for _, ifname := range x.ifs {
			if b, err := x.ns.Command("ip", "-s", "-j", "link", "show", ifname).Output(); err == nil {
				var links []struct {
					Stats struct {
						RX, TX struct {
							Dropped uint64 `json:"dropped"`
						}
					} `json:"stats64"`
				}
				if json.Unmarshal(b, &links) == nil && len(links) == 1 {
					out[ifname+" rx_dropped"] = links[0].Stats.RX.Dropped
					out[ifname+" tx_dropped"] = links[0].Stats.TX.Dropped
				}
			}
			b, err := x.ns.Command("ethtool", "-S", ifname).Output()
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
				if !ok || !(strings.Contains(k, "drop") || strings.Contains(k, "err") || strings.Contains(k, "fail")) {
					continue
				}
				if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
					out[ifname+" "+k] = n
				}
			}
		}
	}
	return out
}

// delayText describes what the userspace workers added to a run's packets.
func delayText(d *WorkerDelay) string {
	if d == nil {
		return ""
	}
	afxdp := ""
	if d.AFXDP > 0 {
		afxdp = fmt.Sprintf(", %.0f%% through AF_XDP", 100*float64(d.AFXDP)/float64(d.Packets))
	}
	return fmt.Sprintf("; worker delay p50 %s, p99 %s, %.1f packets per read, %d wake-ups + %d naps%s",
		usText(d.P50US, d.P50Over), usText(d.P99US, d.P99Over), d.PerBatch, d.Wakeups, d.Naps, afxdp)
}

// usText is a quantile of a histogram: at most us, or more than us past
// the last bucket.
func usText(us float64, over bool) string {
	if over {
		return fmt.Sprintf("> %g us", us)
	}
	return fmt.Sprintf("<= %g us", us)
}
