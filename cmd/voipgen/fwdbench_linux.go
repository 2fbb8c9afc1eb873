package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/labrelay"
	"github.com/relayd/relayd/lab/measure"
)

// Addresses fwdbench adds to the lab, all inside 198.18.0.0/15. Stream i
// goes to farBase+i (kernel and xdp: routed through the relay to the
// callee) or directBase+i (direct: over the extra veth pair); the callee
// accepts both prefixes locally (AnyIP routes), so one sink socket on
// 0.0.0.0:fwdSinkPort receives every stream, each with its own 5-tuple.
var (
	farPrefix      = netip.MustParsePrefix("198.18.64.0/18")
	directPrefix   = netip.MustParsePrefix("198.18.128.0/18")
	directCaller   = netip.MustParsePrefix("198.18.9.2/24") // on fb0 in caller
	directCallee   = netip.MustParsePrefix("198.18.9.1/24") // on fb1 in callee
	fwdSenderPort  = 4000
	fwdSinkPort    = 5000
	fwdMatchPort   = 30000 // flow i matches relay media address:30000+i
	fwdDirectIfs   = [2]string{"fb0", "fb1"}
	fwdWarmStreams = 100
)

func addrAt(p netip.Prefix, i int) netip.Addr {
	b := p.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// fwdBench holds the lab, the traffic ends and the accounting of one run.
type fwdBench struct {
	cfg      fwdConfig
	log      io.Writer
	l        *lab.Lab
	relay    *labrelay.Relay
	relayDir string
	snd      *fwdSender
	sink     *fwdSink
	sampler  measure.Sampler
	softirqd []int
	prog     *ebpf.Program
	run      uint8 // id of the last run, carried in the SSRC's bits 16-23
}

func fwdbench(ctx context.Context, cfg fwdConfig, log io.Writer) (rep *fwdReport, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("must run as root (network namespaces, XDP)")
	}
	b := &fwdBench{cfg: cfg, log: log}
	n := cfg.maxStreams()
	irq, irqKnown := measure.IRQTimeAccounting()
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	rep = &fwdReport{Config: map[string]any{
		"rates_pps": cfg.rates, "step_s": cfg.step.Seconds(), "modes": cfg.modes, "max_streams": n,
		"codec": "pcmu", "ptime_ms": fwdPtime.Milliseconds(), "rtp_bytes": 172, "ip_bytes": 200,
		"cpus": runtime.NumCPU(), "kernel": unix.ByteSliceToString(uts.Release[:]),
		"irq_time_accounting": map[bool]string{true: "on", false: "off"}[irq] + map[bool]string{true: "", false: " (unknown)"}[irqKnown],
		"cpu_methods": map[string]string{
			"tasks": "sum of /proc/PID/task/TID/schedstat run time of voipgen (sender, sink, runtime), relayd, ksoftirqd/N; per sent packet",
			"busy":  "whole machine: CPUs x elapsed - (idle + iowait + steal) from per-CPU /proc/stat (10 ms units); per sent packet",
			"relay": "mode figure minus the mean figure of the two direct runs (same sender, sink, rate) around its two runs (direct, mode, mode, direct)",
			"prog":  "relay_xdp run_time_ns / run_cnt from BPF stats (BPF_ENABLE_STATS, xdp phase only)",
		},
	}}
	if irqKnown && irq {
		rep.Summary.Notes = append(rep.Summary.Notes, "kernel has CONFIG_IRQ_TIME_ACCOUNTING: task times miss softirq work; trust the busy (idle) figures")
	}
	defer func() {
		rep.Summary = mergeNotes(summarize(rep.Steps, cfg.modes), rep.Summary.Notes)
		err = errors.Join(err, b.close())
	}()

	fmt.Fprintf(log, "building lab (%d streams max)\n", n)
	if err := b.setup(n); err != nil {
		return rep, err
	}
	if cfg.has("kernel") {
		fmt.Fprintln(log, "phase kernel: no relayd, kernel IPv4 forwarding in the relay namespace")
		if err := b.phase(ctx, rep, "kernel"); err != nil {
			return rep, err
		}
	}
	if cfg.has("xdp") {
		fmt.Fprintln(log, "phase xdp: starting relayd, installing flows")
		if err := b.startRelay(n); err != nil {
			return rep, err
		}
		stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
		if err != nil {
			return rep, fmt.Errorf("enable BPF run-time statistics: %w", err)
		}
		err = b.phase(ctx, rep, "xdp")
		stats.Close() // the kernel turns the statistics off with the last holder
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func mergeNotes(s fwdSummary, notes []string) fwdSummary {
	s.Notes = append(notes, s.Notes...)
	return s
}

// phase steps the rate for mode, each step after a direct run.
func (b *fwdBench) phase(ctx context.Context, rep *fwdReport, mode string) error {
	for _, m := range []string{"direct", mode} {
		if err := b.warm(ctx, m); err != nil {
			return err
		}
	}
	for _, rate := range b.cfg.rates {
		streams := streamsFor(rate)
		// direct, mode, mode, direct: the mean of the direct runs cancels
		// a linear drift of the machine's speed over the four runs.
		var runs [4]fwdStep
		for i, m := range []string{"direct", mode, mode, "direct"} {
			st, err := b.measure(ctx, m, mode, streams, rate)
			if err != nil {
				return err
			}
			runs[i] = st
		}
		baseTask := (runs[0].TaskNsPerPkt + runs[3].TaskNsPerPkt) / 2
		baseBusy := (runs[0].BusyNsPerPkt + runs[3].BusyNsPerPkt) / 2
		limited := false
		for i := 1; i <= 2; i++ {
			st := &runs[i]
			d, db := st.TaskNsPerPkt-baseTask, st.BusyNsPerPkt-baseBusy
			st.RelayTaskNsPerPkt, st.RelayBusyNsPerPkt = &d, &db
			limited = limited || st.SenderLimited
			fmt.Fprintf(b.log, "  %-6s %6d pps offered: sent %.0f pps, loss %.3f%%, relay %.0f ns/pkt (tasks) %.0f (idle)%s\n",
				mode, rate, st.SentPPS, st.LossPct, d, db, progText(st.ProgNsPerRun))
		}
		rep.Steps = append(rep.Steps, runs[:]...)
		if (!runs[1].lossless() || !runs[2].lossless() || limited) && !b.cfg.allSteps {
			if limited {
				fmt.Fprintf(b.log, "  %s: the sender fell short of %d pps: stopping (the sender's softirq does the relaying on veth)\n", mode, rate)
			}
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

func progText(p *float64) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf(", program %.0f ns/run", *p)
}

// warm sends a little traffic on a path so that neighbours are resolved
// and caches are warm before the first measured run.
func (b *fwdBench) warm(ctx context.Context, mode string) error {
	b.run++
	res := b.snd.run(ctx, b.snd.msgs[mode][:fwdWarmStreams], 300*time.Millisecond, b.run)
	b.sink.drain(b.run, res.packets)
	return ctx.Err()
}

func (b *fwdBench) targets() []measure.Target {
	pid := os.Getpid()
	t := []measure.Target{
		{Label: "sender", PID: pid, TIDs: []int{b.snd.tid}},
		{Label: "sink", PID: pid, TIDs: []int{b.sink.tid}},
		{Label: "voipgen", PID: pid},
	}
	if b.relay != nil && b.relay.Pid() != 0 {
		t = append(t, measure.Target{Label: "relayd", PID: b.relay.Pid()})
	}
	for _, p := range b.softirqd {
		t = append(t, measure.Target{Label: "ksoftirqd", PID: p})
	}
	return t
}

// measure runs one step: streams streams on mode's path for the step time.
func (b *fwdBench) measure(ctx context.Context, mode, phase string, streams, rate int) (fwdStep, error) {
	st := fwdStep{Mode: mode, Phase: phase, Streams: streams, OfferedPPS: streams * fwdStreamPPS, Relayed: -1}
	msgs := b.snd.msgs[mode][:streams]
	countsBefore := b.sink.counts(streams)
	b.run++
	run := b.run
	totalBefore := b.sink.runs[run].Load() // stragglers of the run 256 runs ago
	var relayedBefore uint64
	var progBefore *ebpf.ProgramStats
	if mode == "xdp" {
		var err error
		if relayedBefore, err = b.relayed(); err != nil {
			return st, err
		}
		if progBefore, err = b.prog.Stats(); err != nil {
			return st, fmt.Errorf("program stats: %w", err)
		}
	}
	targets := b.targets()
	s0, err := b.sampler.Snapshot(targets)
	if err != nil {
		return st, err
	}
	res := b.snd.run(ctx, msgs, b.cfg.step, run)
	b.sink.drain(run, res.packets+totalBefore)
	s1, err := b.sampler.Snapshot(targets)
	if err != nil {
		return st, err
	}
	u := measure.Diff(s0, s1)

	st.Sent, st.SendErrors = res.packets, res.errors
	st.Received = b.sink.runs[run].Load() - totalBefore
	st.Lost = int64(st.Sent) - int64(st.Received)
	st.ElapsedS = res.elapsed.Seconds()
	if st.Sent > 0 {
		st.LossPct = 100 * float64(st.Lost) / float64(st.Sent)
	}
	if res.elapsed > 0 {
		st.SentPPS = float64(st.Sent) / res.elapsed.Seconds()
		st.AchievedPPS = float64(st.Received) / res.elapsed.Seconds()
		st.SenderLimited = st.SentPPS < 0.97*float64(st.OfferedPPS)
	}
	countsAfter := b.sink.counts(streams)
	for i := range streams {
		if countsAfter[i]-countsBefore[i] < res.cycles {
			st.StreamsShort++
		}
	}
	st.TaskNsPerPkt = measure.NsPerPacket(u.Tasks, st.Sent)
	st.BusyNsPerPkt = measure.NsPerPacket(u.Busy, st.Sent)
	st.StealMs = float64(u.Steal) / 1e6
	st.LabelNsPkt = make(map[string]float64)
	for _, lt := range u.ByLabel {
		st.LabelNsPkt[lt.Label] = measure.NsPerPacket(lt.Time, st.Sent)
	}
	if mode == "xdp" {
		after, err := b.relayed()
		if err != nil {
			return st, err
		}
		st.Relayed = int64(after - relayedBefore)
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

// relayed sums the packets counted by relayd's flows.
func (b *fwdBench) relayed() (uint64, error) {
	fl, err := b.relay.Flows()
	if err != nil {
		return 0, fmt.Errorf("list flows: %w", err)
	}
	var n uint64
	for _, f := range fl {
		n += f.Packets
	}
	return n, nil
}

func (b *fwdBench) setup(streams int) error {
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
	if b.sink, err = newFwdSink(l.Callee, streams); err != nil {
		return err
	}
	b.snd, err = newFwdSender(l, streams)
	return err
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

func (b *fwdBench) startRelay(streams int) error {
	bin, err := relaydBinary(b.cfg.relayd)
	if err != nil {
		return err
	}
	if b.relayDir, err = os.MkdirTemp("", "fwdbench-relayd-"); err != nil {
		return err
	}
	// warn: relayd logs every idle flow at info level.
	r, err := labrelay.New(b.l, labrelay.Options{Bin: bin, Dir: b.relayDir, LogLevel: "warn"})
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return errors.Join(err, r.Close())
	}
	b.relay = r
	start := time.Now()
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make([]error, 8)
	for w := range errs {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= streams || errs[w] != nil {
					return
				}
				match := netip.AddrPortFrom(b.l.RelayMedia4, uint16(fwdMatchPort+i))
				_, errs[w] = r.AddFlow(admin.FlowRequest{
					Match:        match.String(),
					ExpectSource: netip.AddrPortFrom(b.l.CallerAddr4, uint16(fwdSenderPort)).String(),
					SendFrom:     match.String(),
					SendTo:       netip.AddrPortFrom(addrAt(farPrefix, i), uint16(fwdSinkPort)).String(),
					Mode:         "xdp",
				})
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("install flows: %w", err)
	}
	fmt.Fprintf(b.log, "  %d flows installed in %v\n", streams, time.Since(start).Round(time.Millisecond))
	var id uint32
	err = b.l.Relay.Do(func() error {
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

func (b *fwdBench) close() error {
	var errs []error
	if b.prog != nil {
		errs = append(errs, b.prog.Close())
	}
	if b.snd != nil {
		errs = append(errs, b.snd.close())
	}
	if b.sink != nil {
		b.sink.close()
	}
	if b.relay != nil {
		errs = append(errs, b.relay.Close())
	}
	if b.relayDir != "" {
		os.RemoveAll(b.relayDir)
	}
	if b.l != nil {
		errs = append(errs, b.l.Close())
	}
	return errors.Join(errs...)
}

// fwdSender sends the streams from one socket bound to 0.0.0.0:4000 in the
// caller namespace, like voipgen send --shared-socket: stream i's packet
// leaves in its 1 ms slot of the ptime, each slot in one sendmmsg. A
// stream's SSRC is run<<16 | its index, for the sink. Only the RTP header changes
// per packet (the G.711 payload is encoded once), to keep the sender's
// cost low and constant. A single goroutine locked to one thread sends, so
// its time on CPU is that thread's.
type fwdSender struct {
	conn    *net.UDPConn
	w       *ipv4.PacketConn
	streams []*stream
	msgs    map[string][]ipv4.Message // by mode
	tid     int
	jobs    chan fwdSendJob
}

type fwdSendJob struct {
	ctx  context.Context
	msgs []ipv4.Message
	dur  time.Duration
	run  uint8
	done chan fwdSendResult
}

type fwdSendResult struct {
	packets, errors, cycles uint64
	elapsed                 time.Duration
}

func newFwdSender(l *lab.Lab, n int) (*fwdSender, error) {
	c, err := l.Caller.ListenUDP("udp4", fmt.Sprintf("0.0.0.0:%d", fwdSenderPort))
	if err != nil {
		return nil, err
	}
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20)
		})
	}
	s := &fwdSender{conn: c, w: ipv4.NewPacketConn(c), msgs: make(map[string][]ipv4.Message), jobs: make(chan fwdSendJob)}
	cd := codecs["pcmu"]
	for i := range n {
		st := newStream(cd, fwdPtime, i, uint32(i), uint16(i*7), uint32(i)*1000)
		st.next()
		s.streams = append(s.streams, st)
	}
	for _, mode := range []string{"direct", "kernel", "xdp"} {
		ms := make([]ipv4.Message, n)
		for i := range ms {
			var to netip.AddrPort
			switch mode {
			case "direct":
				to = netip.AddrPortFrom(addrAt(directPrefix, i), uint16(fwdSinkPort))
			case "kernel":
				to = netip.AddrPortFrom(addrAt(farPrefix, i), uint16(fwdSinkPort))
			case "xdp":
				to = netip.AddrPortFrom(l.RelayMedia4, uint16(fwdMatchPort+i))
			}
			ms[i].Buffers = [][]byte{s.streams[i].buf}
			ms[i].Addr = net.UDPAddrFromAddrPort(to)
		}
		s.msgs[mode] = ms
	}
	tid := make(chan int)
	go s.loop(tid)
	s.tid = <-tid
	return s, nil
}

func (s *fwdSender) loop(tid chan<- int) {
	runtime.LockOSThread() // never unlocked: the thread is the sender's alone
	tid <- unix.Gettid()
	for j := range s.jobs {
		j.done <- s.send(j.ctx, j.msgs, j.dur, j.run)
	}
}

func (s *fwdSender) run(ctx context.Context, msgs []ipv4.Message, dur time.Duration, run uint8) fwdSendResult {
	done := make(chan fwdSendResult, 1)
	s.jobs <- fwdSendJob{ctx, msgs, dur, run, done}
	return <-done
}

// nextHeader advances the stream to its next packet, rewriting only the
// RTP header in its buffer.
func (st *stream) nextHeader() {
	st.hdr.SequenceNumber++
	st.hdr.Timestamp += st.tsStep
	st.hdr.MarshalTo(st.buf)
	st.sent++
}

func (s *fwdSender) send(ctx context.Context, msgs []ipv4.Message, dur time.Duration, run uint8) fwdSendResult {
	var res fwdSendResult
	n := len(msgs)
	for i := range n {
		s.streams[i].hdr.SSRC = uint32(run)<<16 | uint32(i)
	}
	slots := max(1, min(n, int(fwdPtime/slotWidth)))
	cycles := int(dur / fwdPtime)
	start := time.Now().Add(time.Millisecond)
	for cycle := 0; cycle < cycles && ctx.Err() == nil; cycle++ {
		base := time.Duration(cycle) * fwdPtime
		for k := range slots {
			deadline := start.Add(base + time.Duration(k)*fwdPtime/time.Duration(slots))
			if d := time.Until(deadline); d > 0 {
				time.Sleep(d)
			}
			lo, hi := k*n/slots, (k+1)*n/slots
			for i := lo; i < hi; i++ {
				s.streams[i].nextHeader()
			}
			ms := msgs[lo:hi]
			for len(ms) > 0 {
				k, err := s.w.WriteBatch(ms, 0)
				res.packets += uint64(max(k, 0))
				ms = ms[max(k, 0):]
				if err != nil && len(ms) > 0 {
					res.errors++
					ms = ms[1:]
				}
			}
		}
		res.cycles++
	}
	res.elapsed = time.Since(start)
	return res
}

func (s *fwdSender) close() error {
	close(s.jobs)
	return s.conn.Close()
}

// fwdSink receives on one UDP socket in the callee namespace with blocking
// recvmmsg on a thread of its own (no Go netpoller), and counts packets per
// stream and per run by SSRC (bits 0-15 the stream, 16-23 the run): the
// cheapest receiver that still checks every stream, and that counts
// packets arriving late for their run to that run, not to the next.
type fwdSink struct {
	fd      int
	perSSRC []atomic.Uint64
	runs    [256]atomic.Uint64
	total   atomic.Uint64
	stop    atomic.Bool
	done    chan struct{}
	tid     int
}

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

const fwdSinkBatch = 256

func newFwdSink(ns *lab.NS, n int) (*fwdSink, error) {
	k := &fwdSink{fd: -1, perSSRC: make([]atomic.Uint64, n), done: make(chan struct{})}
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		k.fd = fd
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20); err != nil {
			return err
		}
		tv := unix.Timeval{Usec: 20000}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrInet4{Port: fwdSinkPort})
	})
	if err != nil {
		if k.fd >= 0 {
			unix.Close(k.fd)
		}
		return nil, fmt.Errorf("sink socket: %w", err)
	}
	tid := make(chan int)
	go k.loop(tid)
	k.tid = <-tid
	return k, nil
}

func (k *fwdSink) loop(tid chan<- int) {
	defer close(k.done)
	runtime.LockOSThread() // never unlocked: the thread is the sink's alone
	tid <- unix.Gettid()
	bufs := make([][2048]byte, fwdSinkBatch)
	iovs := make([]unix.Iovec, fwdSinkBatch)
	hdrs := make([]mmsghdr, fwdSinkBatch)
	for i := range hdrs {
		iovs[i].Base = &bufs[i][0]
		iovs[i].SetLen(len(bufs[i]))
		hdrs[i].hdr.Iov = &iovs[i]
		hdrs[i].hdr.SetIovlen(1)
	}
	for !k.stop.Load() {
		r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(k.fd), uintptr(unsafe.Pointer(&hdrs[0])),
			fwdSinkBatch, unix.MSG_WAITFORONE, 0, 0)
		if errno != 0 {
			continue // EAGAIN after SO_RCVTIMEO, EINTR
		}
		n := int(r)
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
		k.total.Add(uint64(n))
	}
}

// counts returns the packets counted for the first n streams.
func (k *fwdSink) counts(n int) []uint64 {
	c := make([]uint64, n)
	for i := range c {
		c[i] = k.perSSRC[i].Load()
	}
	return c
}

// drain waits until run's count reaches want or no packet arrived for
// 100 ms (at most 3 s): packets still queued in veth rings or the socket
// are counted before the step ends.
func (k *fwdSink) drain(run uint8, want uint64) {
	last, since := k.total.Load(), time.Now()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		if k.runs[run].Load() >= want {
			return
		}
		time.Sleep(10 * time.Millisecond)
		if v := k.total.Load(); v != last {
			last, since = v, time.Now()
		} else if time.Since(since) >= 100*time.Millisecond {
			return
		}
	}
}

func (k *fwdSink) close() {
	k.stop.Store(true)
	<-k.done
	unix.Close(k.fd)
}
