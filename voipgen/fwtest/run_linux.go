package fwtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/fwpair"
	"github.com/relayd/relayd/voipgen/analyze"
	"github.com/relayd/relayd/voipgen/gen"
	"github.com/relayd/relayd/voipgen/payload"
)

// Run runs the experiment cfg describes and returns its report. On an
// error after some results the report holds them and the error says what
// stopped it; everything Run started is torn down either way.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("fwtest needs root (network namespaces, keepalived, conntrackd)")
	}
	for _, b := range []string{"keepalived", "conntrackd", "nft"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("fwtest needs %s (apt-get install keepalived conntrackd nftables)", b)
		}
	}
	if cfg.Capture != "" {
		if _, err := exec.LookPath("tcpdump"); err != nil {
			return nil, errors.New("--capture needs tcpdump")
		}
		if err := os.MkdirAll(cfg.Capture, 0o755); err != nil {
			return nil, err
		}
	}
	r := &runner{cfg: cfg, progress: cfg.Progress}
	if r.progress == nil {
		r.progress = io.Discard
	}
	rep := &Report{Title: "voipgen fwtest: a redundant firewall pair (keepalived VRRP, conntrackd) in network namespaces",
		Config: cfg, Reference: ThesisReference()}
	var errs []error
	for _, fwd := range cfg.Forwarders {
		rows, err := r.throughput(ctx, fwd)
		rep.Throughput = append(rep.Throughput, rows...)
		if err != nil {
			errs = append(errs, fmt.Errorf("throughput %s: %w", fwd, err))
			if ctx.Err() != nil {
				return rep, errors.Join(errs...)
			}
		}
	}
	if len(cfg.Failures) > 0 {
		rows, err := r.failovers(ctx)
		rep.Failovers = append(rep.Failovers, rows...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}

type runner struct {
	cfg      Config
	progress io.Writer
}

func (r *runner) say(format string, args ...any) {
	fmt.Fprintf(r.progress, "fwtest: "+format+"\n", args...)
}

// newPair builds a pair, torn down when ctx ends or by its Close.
func (r *runner) newPair(ctx context.Context, pc fwpair.Config) (*fwpair.Pair, error) {
	pc.Log = r.cfg.Log
	return fwpair.New(ctx, pc)
}

// throughput searches the zero-loss rate of the pair with forwarder fwd,
// once per packet size.
func (r *runner) throughput(ctx context.Context, fwd string) ([]ThroughputRow, error) {
	// Several host addresses spread the streams over more 5-tuples and
	// fewer receiving sockets.
	const hostAddrs = 16
	pc := fwpair.Config{HostAddrs: hostAddrs, Conntrackd: fwd == fwpair.ForwarderKernel, Forwarder: fwd,
		Stateless: fwd == fwpair.ForwarderXDP, VRRPVersion: 3, Advert: time.Second}
	r.say("throughput %s: building the pair (%s)", fwd, map[bool]string{true: "stateless, XDP forwarder", false: "stateful, conntrackd"}[pc.Stateless])
	p, err := r.newPair(ctx, pc)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	var rows []ThroughputRow
	for _, size := range r.cfg.Sizes {
		name := fmt.Sprintf("%s %s", fwd, size)
		ipBytes := map[string]int{"g711": 200, "g729": 60, "mix": 130}[size]
		trial := func(ctx context.Context, pps int) (TrialResult, error) { return r.trial(ctx, p, size, pps) }
		sc := r.cfg.Search
		sc.BelowSender = true // on veth the sender's softirq forwards: its limit is the path's
		res, err := Search(ctx, sc, trial, func(s Step) {
			r.say("throughput %s: %d pps: %s", name, s.PPS, s.Outcome)
		})
		rows = append(rows, NewThroughputRow(name, res, ipBytes, 20*time.Millisecond, 2))
		r.say("throughput %s: %s", name, res)
		if err != nil {
			return rows, err
		}
	}
	return rows, nil
}

// trial offers pps packets per second of size through p, LAN to WAN, for
// cfg.Trial, and counts what crossed: the WAN host's UDP layer counts
// every datagram that reached it (delivered or dropped for a full socket
// buffer), so the receiving program's own speed does not count against
// the pair; the receiver's analysis gives duplicates.
func (r *runner) trial(ctx context.Context, p *fwpair.Pair, size string, pps int) (TrialResult, error) {
	const ptime = 20 * time.Millisecond
	streams := max(1, pps*int(ptime/time.Millisecond)/1000)
	type part struct {
		codec   string
		streams int
	}
	parts := []part{{map[string]string{"g711": "pcmu", "g729": "g729", "mix": "pcmu"}[size], streams}}
	if size == "mix" {
		parts = []part{{"pcmu", (streams + 1) / 2}, {"g729", streams / 2}}
	}
	n := len(p.LANAddrs)
	lanR := fmt.Sprintf("%s-%s", p.LANAddrs[0], p.LANAddrs[n-1])
	wanR := fmt.Sprintf("%s-%s", p.WANAddrs[0], p.WANAddrs[n-1])

	// One socket per port on every WAN address: stream i arrives on port
	// base+2*(i/n) of address i mod n.
	total := 0
	for _, pt := range parts {
		total += pt.streams
	}
	rcfg := analyze.Config{Addr: netip.IPv4Unspecified(), PortLo: wanBasePort, PortHi: wanBasePort + 2*((total-1)/n) + 2*len(parts),
		Duration: r.cfg.Trial + 10*time.Second, Idle: 300 * time.Millisecond, ClockRate: 8000, Batch: 64, MaxSSRCsPerPort: 4 * n}
	var rc *analyze.Receiver
	if err := p.WAN.Do(func() (err error) { rc, err = analyze.New(rcfg); return err }); err != nil {
		return TrialResult{}, fmt.Errorf("receiver: %w", err)
	}
	before, err := udpCounters(p.WAN)
	if err != nil {
		rc.Close()
		return TrialResult{}, err
	}
	done := make(chan analyze.Report, 1)
	go func() { done <- rc.Run(context.Background()) }()

	var gens []*gen.Generator
	defer func() {
		for _, g := range gens {
			g.Close()
		}
	}()
	off := 0
	for _, pt := range parts {
		if pt.streams == 0 {
			continue
		}
		port := 2 * (off / n)
		args := []string{"--dst", fmt.Sprintf("%s:%d", wanR, wanBasePort+port), "--src", fmt.Sprintf("%s:%d", lanR, lanBasePort+port),
			"--streams", strconv.Itoa(pt.streams), "--codec", pt.codec, "--ptime", ptime.String(), "--duration", r.cfg.Trial.String(),
			"--transport", r.cfg.Transport, "--threads", strconv.Itoa(r.cfg.Threads), "--grace", "0s"}
		gcfg, err := gen.Parse(args, io.Discard)
		if err != nil {
			rc.Close()
			return TrialResult{}, fmt.Errorf("sender: %w", err)
		}
		gcfg.Progress = false
		var g *gen.Generator
		if err := p.LAN.Do(func() (err error) { g, err = gen.New(gcfg); return err }); err != nil {
			rc.Close()
			return TrialResult{}, fmt.Errorf("sender: %w", err)
		}
		gens = append(gens, g)
		off += pt.streams + (n-pt.streams%n)%n
	}
	results := make([]gen.Result, len(gens))
	var wg sync.WaitGroup
	for i, g := range gens {
		wg.Go(func() { results[i] = g.Run(ctx) })
	}
	wg.Wait()
	var rep analyze.Report
	select {
	case rep = <-done:
	case <-ctx.Done():
		rc.Close()
		<-done
		return TrialResult{}, ctx.Err()
	}
	after, err := udpCounters(p.WAN)
	if err != nil {
		return TrialResult{}, err
	}
	tr := TrialResult{Duration: r.cfg.Trial, Received: rep.Totals.Packets, Duplicated: rep.Totals.Duplicates}
	for _, res := range results {
		tr.Sent += res.Packets
		tr.AchievedPPS += res.PPS
	}
	tr.Offered = uint64(float64(pps) * r.cfg.Trial.Seconds())
	tr.OfferedPPS = float64(streams) * float64(time.Second/ptime)
	crossed := after.sub(before)
	if crossed < tr.Sent {
		tr.Lost = tr.Sent - crossed
	}
	return tr, nil
}

// udpStats are a namespace's UDP counters (/proc/net/snmp).
type udpStats struct{ in, noPorts, inErrors uint64 }

// sub is the datagrams that reached the namespace's UDP layer since b.
func (a udpStats) sub(b udpStats) uint64 {
	return (a.in - b.in) + (a.noPorts - b.noPorts) + (a.inErrors - b.inErrors)
}

// udpCounters reads ns's UDP counters.
func udpCounters(ns *lab.NS) (udpStats, error) {
	var s udpStats
	err := ns.Do(func() error {
		f, err := os.Open("/proc/thread-self/net/snmp") // this thread's namespace, not the process's
		if err != nil {
			return err
		}
		defer f.Close()
		var head []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) == 0 || fields[0] != "Udp:" {
				continue
			}
			if head == nil {
				head = fields
				continue
			}
			for i := 1; i < len(fields) && i < len(head); i++ {
				v, _ := strconv.ParseUint(fields[i], 10, 64)
				switch head[i] {
				case "InDatagrams":
					s.in = v
				case "NoPorts":
					s.noPorts = v
				case "InErrors":
					s.inErrors = v
				}
			}
			return nil
		}
		return errors.New("no Udp line in /proc/net/snmp")
	})
	return s, err
}

// failovers runs every failover case cfg.Reps times, on one pair per
// VRRP setting and conntrackd choice.
func (r *runner) failovers(ctx context.Context) ([]FailoverRow, error) {
	var rows []FailoverRow
	for _, v := range r.cfg.VRRP {
		for _, ct := range r.cfg.Conntrackd {
			pc := fwpair.Config{HostAddrs: 4, VRRPVersion: v.Version, Advert: v.Advert, Conntrackd: ct, Stateless: r.cfg.Stateless}
			r.say("failover: building the pair (VRRPv%d, adverts %v, conntrackd %v)", v.Version, v.Advert, ct)
			p, err := r.newPair(ctx, pc)
			if err != nil {
				return rows, err
			}
			for _, kind := range r.cfg.Failures {
				for _, streams := range r.cfg.Streams {
					for rep := 1; rep <= r.cfg.Reps; rep++ {
						c := FailoverCase{Kind: kind, VRRPVersion: v.Version, AdvertMs: float64(MsOf(v.Advert)), Conntrackd: ct,
							Ruleset: map[bool]string{false: "stateful", true: "stateless"}[r.cfg.Stateless], Streams: streams}
						fail, recov, err := r.failover(ctx, p, c, rep)
						if err != nil {
							p.Close()
							return rows, fmt.Errorf("%s rep %d: %w", c, rep, err)
						}
						rows = append(rows, fail, recov)
						r.say("%s rep %d: glitch p50 %v max %v, outage %v, never recovered %d of %d; back to fw1: glitch max %v",
							c, rep, fail.GlitchP50, fail.GlitchMax, fail.OutageMs, fail.NeverRecovered, fail.Streams, recov.GlitchMax)
					}
				}
			}
			if err := p.Close(); err != nil {
				return rows, err
			}
		}
	}
	return rows, nil
}

var failureOf = map[FailureKind]fwpair.Failure{
	AdminStop: fwpair.StopKeepalived, AdminPriority: fwpair.LowerPriority,
	CrashLinks: fwpair.CutLinks, CrashKill: fwpair.KillDaemons,
}

// failover runs calls through p, fails the master, waits for the backup,
// recovers, and analyses both moves.
func (r *runner) failover(ctx context.Context, p *fwpair.Pair, c FailoverCase, rep int) (fail, recov FailoverRow, err error) {
	cd, err := payload.Lookup(r.cfg.Codec, r.cfg.Ptime)
	if err != nil {
		return fail, recov, err
	}
	if m, err := p.Master(); err != nil || m != 0 {
		if _, err := p.WaitMaster(ctx, 0); err != nil {
			return fail, recov, fmt.Errorf("fw1 is not master before the run: %w", err)
		}
	}
	// Each run's calls start from no state: nothing an earlier run left
	// on the backup can carry them.
	if err := p.FlushState(); err != nil {
		return fail, recov, err
	}
	advert := time.Duration(c.AdvertMs * float64(time.Millisecond))
	// Long enough for the backup to declare the master down (3 adverts
	// plus skew) and for the streams to settle after.
	hold := max(2*time.Second, 3*advert+1500*time.Millisecond)
	warm, settle := time.Second, 1500*time.Millisecond
	if r.cfg.Quick {
		warm, settle = 600*time.Millisecond, time.Second
	}
	dur := warm + 2*hold + settle + 10*time.Second // an upper bound: the run stops the senders

	lan, err := openSide(p.LAN, "wan->lan", p.LANAddrs, lanBasePort, r.cfg.Calls)
	if err != nil {
		return fail, recov, err
	}
	defer lan.close()
	wan, err := openSide(p.WAN, "lan->wan", p.WANAddrs, wanBasePort, r.cfg.Calls)
	if err != nil {
		return fail, recov, err
	}
	defer wan.close()
	if err := wan.sender(lan, cd, r.cfg.Ptime, dur); err != nil {
		return fail, recov, err
	}
	bidir := c.Streams == Bidirectional
	if bidir {
		if err := lan.sender(wan, cd, r.cfg.Ptime, dur); err != nil {
			return fail, recov, err
		}
		wan.record(lan)
	} else if err := lan.open(wan); err != nil {
		return fail, recov, err
	}
	lan.record(wan)
	stopCapture := r.capture(p, c, rep)
	defer stopCapture()
	var calls *sipCalls
	if r.cfg.SIP {
		// Hung up a little before the media stops, after the recovery.
		if calls, err = startSIP(ctx, p, lan, wan, cd, r.cfg.Ptime, warm+2*hold-300*time.Millisecond); err != nil {
			return fail, recov, err
		}
	}

	mctx, stopMedia := context.WithCancel(ctx)
	defer stopMedia()
	wait := runSenders(mctx, lan, wan)
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(warm); err != nil {
		return fail, recov, err
	}
	failAt, err := p.Fail(ctx, failureOf[c.Kind])
	if err != nil {
		return fail, recov, err
	}
	wctx, cancel := context.WithTimeout(ctx, hold+5*advert+5*time.Second)
	masterAt, werr := p.WaitMaster(wctx, 1)
	cancel()
	if err := sleep(time.Until(failAt.Add(hold))); err != nil {
		return fail, recov, err
	}
	recAt, err := p.Recover(ctx)
	if err != nil {
		return fail, recov, err
	}
	wctx, cancel = context.WithTimeout(ctx, hold+5*advert+5*time.Second)
	backAt, berr := p.WaitMaster(wctx, 0)
	cancel()
	if err := sleep(time.Until(recAt.Add(hold))); err != nil {
		return fail, recov, err
	}
	var sipRes *SIPResult
	if calls != nil {
		sipRes = calls.wait(10 * time.Second)
	}
	// The recording ends when the senders are told to stop: a sender
	// slower to stop than another must not make its peer's stream look
	// as if it had stopped early.
	end := time.Now()
	stopMedia()
	if err := wait(); err != nil {
		return fail, recov, err
	}
	time.Sleep(50 * time.Millisecond) // the last packets in flight
	recs := lan.stop()
	if bidir {
		w := wan.stop()
		for i := range w {
			w[i].ID = len(recs)
		}
		recs = append(recs, w...)
	}
	for i := range recs {
		recs[i].ID = i
	}
	if werr != nil {
		return fail, recov, fmt.Errorf("fw2 did not become master: %w", werr)
	}
	if berr != nil {
		return fail, recov, fmt.Errorf("fw1 did not become master again: %w", berr)
	}

	// The failure, on what arrived before the recovery; the recovery on
	// what arrived after the failure.
	before := make([]StreamRecord, len(recs))
	for i, s := range recs {
		before[i] = s
		k, _ := slices.BinarySearchFunc(s.Arrivals, recAt.UnixNano(), func(a Arrival, t int64) int { return cmpInt64(a.At, t) })
		before[i].Arrivals = s.Arrivals[:k]
	}
	fail = NewFailoverRow(c, rep, Analyze(before, failAt.UnixNano(), r.cfg.Ptime, recAt.UnixNano()))
	// The recovery on what arrived from shortly before it, so its losses
	// are its own.
	after := make([]StreamRecord, len(recs))
	from := recAt.Add(-TimelineBefore).UnixNano()
	for i, s := range recs {
		after[i] = s
		k, _ := slices.BinarySearchFunc(s.Arrivals, from, func(a Arrival, t int64) int { return cmpInt64(a.At, t) })
		after[i].Arrivals = s.Arrivals[k:]
	}
	rc := c
	rc.Kind, rc.After = RecoveryPreempt, c.Kind
	recov = NewFailoverRow(rc, rep, Analyze(after, recAt.UnixNano(), r.cfg.Ptime, end.UnixNano()))
	fail.SIP = sipRes
	fail.VRRPMs = FloatOf(float64(MsOf(masterAt.Sub(failAt))))
	recov.VRRPMs = FloatOf(float64(MsOf(backAt.Sub(recAt))))
	if c.Conntrackd {
		fail.SyncMs = syncMs(p.Events(), 1, failAt, recAt)
		recov.SyncMs = syncMs(p.Events(), 0, recAt, end)
	}
	return fail, recov, nil
}

// syncMs is the time from t0 to fw's notify script committing conntrackd's
// external cache to the kernel (its MASTER step "-c"), before t1; nil if it
// did not log one.
func syncMs(evs []fwpair.Event, fw int, t0, t1 time.Time) *float64 {
	for _, e := range evs {
		if e.FW == fw && e.Source == fwpair.SourceNotify && e.Time.After(t0) && e.Time.Before(t1) &&
			strings.Contains(e.Text, "MASTER conntrackd -c ") {
			return FloatOf(float64(MsOf(e.Time.Sub(t0))))
		}
	}
	return nil
}

// capture runs tcpdump on the receiving hosts' interfaces for the run,
// when cfg.Capture is set, and returns what stops it.
func (r *runner) capture(p *fwpair.Pair, c FailoverCase, rep int) func() {
	if r.cfg.Capture == "" {
		return func() {}
	}
	var cmds []*exec.Cmd
	for _, h := range []struct {
		ns   *lab.NS
		name string
	}{{p.LAN, "lan"}, {p.WAN, "wan"}} {
		file := filepath.Join(r.cfg.Capture, fmt.Sprintf("%s-rep%d-%s.pcap", slug(c.String()), rep, h.name))
		// A 32 MB buffer: with the default 2 MB, tcpdump, descheduled on
		// a busy machine, was seen to drop packets around a failover,
		// and the capture then showed a gap the media never had.
		cmd := h.ns.Command("tcpdump", "-i", fwpair.HostIfName, "-n", "-s", "64", "-B", "32768", "-w", file, "--time-stamp-precision=nano", "udp")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		// tcpdump's closing statistics ("N packets dropped by kernel")
		// go beside the capture: a capture that dropped packets shows
		// gaps the media never had.
		if f, err := os.Create(file + ".stats"); err == nil {
			cmd.Stderr = f
			defer f.Close() // the child has its own descriptor
		}
		if err := cmd.Start(); err != nil {
			r.say("capture %s: %v", file, err)
			continue
		}
		cmds = append(cmds, cmd)
	}
	time.Sleep(300 * time.Millisecond) // tcpdump opens its capture
	return func() {
		for _, cmd := range cmds {
			_ = cmd.Process.Signal(syscall.SIGINT)
			_ = cmd.Wait()
		}
		cmds = nil
	}
}
