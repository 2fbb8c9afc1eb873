package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/relayd/relayd/voipgen/analyze"
	"github.com/relayd/relayd/voipgen/gen"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/labrelay"
)

func init() { demoRun = runDemoLab }

// demoSide is one end of every call: the caller or the callee. Each
// stream has one socket, bound to the endpoint's address and port, that
// both sends (voipgen's sender) and receives (voipgen's receiver): the
// relay's flow towards this side expects it as source and sends to it.
type demoSide struct {
	name string // direction of the packets it receives
	port int    // of stream 0
	rc   *analyze.Receiver
	snd  *gen.Sender

	rep analyze.Report
	res gen.SenderResult
}

// openDemoSide opens the sockets of one side in ns: stream i on
// local:port+2i, sending to relay:relayPort+4i.
func openDemoSide(ns *lab.NS, name string, cfg DemoConfig, local netip.Addr, port int, relay netip.Addr, relayPort int) (_ *demoSide, err error) {
	rcfg := analyze.Config{
		Addr: local, PortLo: port, PortHi: port + 2*(cfg.streams-1),
		Duration:  cfg.duration + 10*time.Second, // a safety net: the demo stops receivers itself
		ClockRate: cfg.codec.ClockRate, Batch: 64, MaxSSRCsPerPort: 16,
	}
	// The endpoints use every other port: one socket per stream.
	eps := make([]netip.AddrPort, cfg.streams)
	for i := range eps {
		eps[i] = netip.AddrPortFrom(local, uint16(port+2*i))
	}
	var rc *analyze.Receiver
	if err := ns.Do(func() (err error) { rc, err = analyze.NewOn(rcfg, eps); return err }); err != nil {
		return nil, fmt.Errorf("%s: %w", ns, err)
	}
	defer func() {
		if err != nil {
			rc.Close()
		}
	}()

	// Stream i sends from the receiver's socket port+2i, so the relay's
	// flow towards this side sees the source it expects.
	scfg := gen.SenderConfig{Streams: cfg.streams, Codec: cfg.codec, Ptime: cfg.ptime, Duration: cfg.duration}
	s, err := gen.NewSenderOn(scfg, rc.Conns(), func(i int) netip.AddrPort {
		return netip.AddrPortFrom(relay, uint16(relayPort+4*i))
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ns, err)
	}
	return &demoSide{name: name, port: port, rc: rc, snd: s}, nil
}

func runDemoLab(ctx context.Context, cfg DemoConfig) (_ *DemoReport, err error) {
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(cfg.Progress, "demo: %5.1fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the demo needs root (network namespaces, XDP)")
	}

	bin := cfg.relayd
	if bin == "" {
		step("building relayd (go build ./cmd/relayd)")
		if bin, err = labrelay.Build(); err != nil {
			return nil, err
		}
		defer labrelay.RemoveBuild()
	} else if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("--relayd: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	dir, err := os.MkdirTemp("", "relayd-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	// The default prefix, rl<pid>-<n>-, is unique, and lab.New removes
	// namespaces a killed demo left behind.
	l, err := lab.New(lab.Config{})
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	defer func() {
		if cerr := l.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("tear down lab: %w", cerr))
		}
		step("lab %s torn down", l.Prefix())
	}()
	step("lab up: namespaces %scaller, %srelay, %scallee", l.Prefix(), l.Prefix(), l.Prefix())
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	r, err := labrelay.New(l, labrelay.Options{Bin: bin, Dir: dir, XDPMode: cfg.xdpMode})
	if err != nil {
		return nil, fmt.Errorf("prepare relayd: %w", err)
	}
	defer func() {
		if cerr := r.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("stop relayd: %w", cerr))
		}
	}()
	if err := r.Start(); err != nil {
		return nil, err
	}
	step("relayd running (pid %d), XDP in %s mode on %s and %s", r.Pid(), cfg.xdpMode, lab.RelayCallerIfName, lab.RelayCalleeIfName)
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	media, callerA, calleeA := l.RelayMedia4, l.CallerAddr4, l.CalleeAddr4
	if cfg.ipv6 {
		media, callerA, calleeA = l.RelayMedia6, l.CallerAddr6, l.CalleeAddr6
	}
	rep := &DemoReport{Config: demoConfigReport{
		Streams: cfg.streams, Directions: 2, Codec: cfg.codec.Name, PtimeMs: cfg.ptime.Milliseconds(),
		DurationS: cfg.duration.Seconds(), PacketsPerStream: cfg.packetsPerStream(), IPv6: cfg.ipv6,
		XDPMode: cfg.xdpMode, Lab: l.Prefix(), RelayMedia: media.String(), Caller: callerA.String(), Callee: calleeA.String(),
	}}
	perDir := (&gen.SenderConfig{Dst: netip.AddrPortFrom(media, demoRelayPort), Streams: cfg.streams, Codec: cfg.codec, Ptime: cfg.ptime}).Load()
	rep.Load = demoLoad{PerDirection: perDir, Flows: 2 * cfg.streams, PPS: 2 * perDir.PPS,
		WireBitsPS: 2 * perDir.WireBitsPS, IPBitsPS: 2 * perDir.IPBitsPS}

	// Two flows per stream, each expecting its sender's address and port.
	type flowKey struct {
		stream int
		dir    string
	}
	flowOf := make(map[uint64]flowKey, 2*cfg.streams)
	for i := range cfg.streams {
		a := netip.AddrPortFrom(media, uint16(demoRelayPort+4*i))
		b := netip.AddrPortFrom(media, uint16(demoRelayPort+4*i+2))
		callerEP := netip.AddrPortFrom(callerA, uint16(demoCallerPort+2*i))
		calleeEP := netip.AddrPortFrom(calleeA, uint16(demoCalleePort+2*i))
		for _, req := range []struct {
			dir string
			admin.FlowRequest
		}{
			{demoToCallee, admin.FlowRequest{Match: a.String(), ExpectSource: callerEP.String(), SendFrom: b.String(), SendTo: calleeEP.String(), Mode: "xdp"}},
			{demoToCaller, admin.FlowRequest{Match: b.String(), ExpectSource: calleeEP.String(), SendFrom: a.String(), SendTo: callerEP.String(), Mode: "xdp"}},
		} {
			f, err := r.AddFlow(req.FlowRequest)
			if err != nil {
				return nil, fmt.Errorf("install flow %s of stream %d: %w", req.Match, i, err)
			}
			flowOf[f.ID] = flowKey{i, req.dir}
		}
	}
	step("installed %d static flows (POST /v1/flows)", 2*cfg.streams)

	caller, err := openDemoSide(l.Caller, demoToCaller, cfg, callerA, demoCallerPort, media, demoRelayPort)
	if err != nil {
		return nil, err
	}
	callee, err := openDemoSide(l.Callee, demoToCallee, cfg, calleeA, demoCalleePort, media, demoRelayPort+2)
	if err != nil {
		caller.rc.Close()
		return nil, err
	}
	sides := []*demoSide{caller, callee}

	step("sending %d %s/%v streams each way for %v (%.0f pps into the relay)", cfg.streams, cfg.codec.Name, cfg.ptime, cfg.duration, rep.Load.PPS)
	recvCtx, stopRecv := context.WithCancel(ctx)
	defer stopRecv()
	var recvWG, sendWG sync.WaitGroup
	for _, s := range sides {
		recvWG.Go(func() { s.rep = s.rc.Run(recvCtx) })
		sendWG.Go(func() { s.res = s.snd.Run(ctx) })
	}
	sendWG.Wait()
	// Let the last packets cross the relay, then stop the receivers; they
	// drain their sockets before they return.
	select {
	case <-time.After(cfg.grace):
	case <-ctx.Done():
	}
	stopRecv()
	recvWG.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	step("traffic done; reading the relay's flows and counters")

	flows, err := r.Flows()
	if err != nil {
		return nil, fmt.Errorf("read flows: %w\nrelayd log:\n%s", err, logTail(r.Log(), 20))
	}
	for _, f := range flows {
		k, ok := flowOf[f.ID]
		if !ok {
			continue
		}
		rep.Flows = append(rep.Flows, demoFlow{Stream: k.stream, Direction: k.dir, Flow: f})
	}
	sortDemoFlows(rep.Flows)
	rep.summarizeFlows()
	metrics, err := r.Metrics()
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w\nrelayd log:\n%s", err, logTail(r.Log(), 20))
	}
	if rep.Relay, err = parseDemoMetrics(metrics); err != nil {
		return nil, err
	}

	// callee receives what the caller sent, and the other way round.
	for _, pair := range [][2]*demoSide{{caller, callee}, {callee, caller}} {
		rep.Directions = append(rep.Directions, demoDirectionReport(pair[0], pair[1], cfg))
	}
	rep.judge(cfg.packetsPerStream())
	rep.Elapsed = time.Since(start).Seconds()
	return rep, nil
}

// demoDirectionReport compares what from sent with what to received.
func demoDirectionReport(from, to *demoSide, cfg DemoConfig) demoDirection {
	res, rr := from.res, to.rep
	d := demoDirection{
		Direction: to.name, Sent: res.Packets, SendErrors: res.Errors,
		SendLateP99: res.LateP99us, SendLateMax: res.LateMaxus,
		MeanJitterMs: rr.Totals.MeanJitterMs, MaxJitterMs: rr.Totals.MaxJitterMs, MaxGapMs: rr.Totals.MaxGapMs,
		Duplicates: rr.Totals.Duplicates, Reordered: rr.Totals.Reordered,
	}
	got := make([]uint64, cfg.streams) // unique packets per stream
	for _, s := range rr.Streams {
		i := (s.Port - to.port) / 2
		if i < 0 || i >= len(got) {
			continue
		}
		if s.Packets > 0 {
			d.Streams++
		}
		got[i] += s.Packets - s.Duplicates
	}
	for i, n := range got {
		d.Received += n
		if n != from.snd.Streams()[i].Sent {
			d.StreamsShort++
		}
	}
	d.Lost = int64(d.Sent) - int64(d.Received)
	if d.Sent > 0 {
		d.LossPct = 100 * float64(d.Lost) / float64(d.Sent)
	}
	return d
}

// sortDemoFlows orders flows by stream, caller->callee first.
func sortDemoFlows(fs []demoFlow) {
	sort.Slice(fs, func(i, j int) bool {
		a, b := &fs[i], &fs[j]
		return a.Stream < b.Stream || a.Stream == b.Stream && a.Direction == demoToCallee && b.Direction != demoToCallee
	})
}

// logTail returns the last n lines of log.
func logTail(log string, n int) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
