package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/internal/siptorture"
	"github.com/relayd/relayd/lab"
)

func init() { soakRun = runSoakLab }

// runSoakLab runs voipgen soak: fwdbench's lab, sender and sink
// (fwdBench.setup), relayd in xdp mode with its B2BUA, the calls of
// bench's SIP sweep (benchCalls), and the attackers.
func runSoakLab(ctx context.Context, cfg SoakConfig) (rep *SoakReport, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("must run as root (network namespaces, XDP)")
	}
	if cfg.Progress == nil {
		cfg.Progress = os.Stderr
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	var torture [][]byte
	if cfg.SIPGarbageRate > 0 {
		if cfg.TortureDir == "" {
			cfg.TortureDir = findTortureDir()
		}
		if torture, err = siptorture.Load(cfg.TortureDir); err != nil {
			return nil, fmt.Errorf("malformed SIP needs the torture messages (--torture-dir): %w", err)
		}
	}
	n := cfg.Calls
	rep = &SoakReport{Seed: cfg.Seed, Config: map[string]any{
		"calls": n, "duration": cfg.Duration.String(), "baseline": cfg.Baseline.String(), "window": cfg.window().String(),
		"sample": cfg.Sample.String(), "chunk": cfg.Chunk.String(), "attack_pps": cfg.AttackPPS, "invite_rate": cfg.InviteRate,
		"sip_garbage_rate": cfg.SIPGarbageRate, "heap_tolerance": cfg.HeapTolerance, "goroutine_tolerance": cfg.GoroutineTol,
		"media": "G.711 20 ms, a stream each way per call (100 pps per call), 172-byte RTP", "relayd": "dataplane.mode = xdp, SIP B2BUA, one route allowing the caller only, packet-rate caps on (the default)",
	}}
	rep.Media[0].Name, rep.Media[1].Name = "caller -> callee", "callee -> caller"
	fmt.Fprintf(cfg.Progress, "soak: %d calls for %v, seed %d (replay: --seed %d)\n", n, cfg.Duration, cfg.Seed, cfg.Seed)

	b := &fwdBench{cfg: FwdConfig{flows: []int{2 * n}, relayd: cfg.Relayd}, log: cfg.Progress}
	defer func() { err = errors.Join(err, b.close()) }()
	if err := b.setup(2 * n); err != nil {
		return rep, err
	}
	l := b.l
	if err := l.AddAttacker(); err != nil {
		return rep, err
	}
	// Before relayd attaches XDP (see EndHostQueues).
	if err := l.EndHostQueues(); err != nil {
		return rep, err
	}
	if _, err := l.RelayNAPIThreads(); err != nil {
		return rep, err
	}
	m := benchMode("xdp")
	b.relayPorts = benchSIPRelayPorts
	b.relayExtra = "latch_window = \"50ms\"\n" + soakSIPConfig(l)
	// relayd as deployed: every call's flows capped at a multiple of its
	// codec's rate, which the calls' media stays under and a flood from
	// a wrong source must take nothing of.
	b.relayCaps = true
	if err := b.startRelay(m); err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, b.stopRelay()) }()
	r := b.relay
	rep.Relayd.Pid = r.Pid()

	calls := &benchCalls{b: b, cfg: Config{Progress: cfg.Progress}}
	if err := calls.start(ctx, n); err != nil {
		return rep, err
	}
	closed := false
	closeCalls := func() {
		if closed {
			return
		}
		closed = true
		for _, c := range calls.close() {
			switch {
			case c.Success && c.ByeFrom == "local":
				rep.Calls.HungUp++
			case c.Error != "" && rep.Calls.Failures == "":
				rep.Calls.Failures = fmt.Sprintf("call %d: %s", c.Call, c.Error)
			}
		}
	}
	defer closeCalls()
	start := time.Now()
	rep.Calls.Placed = n
	if err := calls.grow(ctx, n); err != nil {
		rep.Calls.Up = int(calls.answered.Load())
		rep.Calls.Failures = err.Error()
		return rep, err
	}
	rep.Calls.Up, rep.Calls.SetupS = int(calls.answered.Load()), time.Since(start).Seconds()
	_, relay := calls.paths(n)
	// Past the latching window: every flow's source is locked and its
	// flows are back in XDP before the first spoofed packet.
	if err := b.warm(ctx, relay, m, false); err != nil {
		return rep, err
	}
	time.Sleep(300 * time.Millisecond)

	countersBefore, err := b.relayed()
	if err != nil {
		return rep, err
	}
	textBefore, err := r.Metrics()
	if err != nil {
		return rep, err
	}
	sipBefore := parseSoakSIP(textBefore)
	dropsBefore := labDrops(l)

	// The background, and the sampler, until the media ends.
	bctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	t0 := time.Now()
	var samplesMu sync.Mutex
	wg.Go(func() {
		tick := time.NewTicker(cfg.Sample)
		defer tick.Stop()
		for {
			s := sampleRelayd(r.Metrics, r.Pid(), time.Since(t0))
			samplesMu.Lock()
			rep.Samples = append(rep.Samples, s)
			samplesMu.Unlock()
			select {
			case <-bctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	ports := make([]netip.AddrPort, 0, 2*n)
	ports = append(append(ports, calls.toCallee[:n]...), calls.toCaller[:n]...)
	var media *soakMedia
	if cfg.AttackPPS > 0 {
		if media, err = newSoakMedia(l, cfg.Seed, ports); err != nil {
			return rep, err
		}
		defer media.close()
		wg.Go(func() { media.run(bctx, cfg.AttackPPS) })
	}
	var stranger *soakStranger
	if cfg.InviteRate > 0 || cfg.SIPGarbageRate > 0 {
		if stranger, err = newSoakStranger(l, cfg.Seed, torture); err != nil {
			return rep, err
		}
		defer stranger.close()
		wg.Go(func() { stranger.run(bctx, cfg.InviteRate, cfg.SIPGarbageRate) })
	}
	fmt.Fprintf(cfg.Progress, "soak: %d calls up in %.1f s; media, %d pps of spoofed media, %d INVITEs/s and %d malformed SIP datagrams/s from a stranger for %v\n",
		n, rep.Calls.SetupS, cfg.AttackPPS, cfg.InviteRate, cfg.SIPGarbageRate, cfg.Duration)

	totalBefore := b.sink.all()
	var legit uint64
	per := period(2*n, benchPPSPerCall*n)
	lastReport := time.Now()
	for ctx.Err() == nil {
		left := cfg.Duration - time.Since(t0)
		if left < 500*time.Millisecond {
			break
		}
		d := min(cfg.Chunk, left)
		tag := b.tag(m, false)
		if tag >= soakAttackTag {
			return rep, fmt.Errorf("out of SSRC tags at chunk %d", len(rep.Chunks))
		}
		ch := SoakChunk{StartS: time.Since(t0).Seconds(), Tag: tag}
		before, err := b.sink.counts(2 * n)
		if err != nil {
			return rep, err
		}
		runBefore := b.sink.run(tag)
		res := b.snd.run(ctx, relay, per, d, tag)
		b.sink.drain(tag, runBefore+res.packets)
		after, err := b.sink.counts(2 * n)
		if err != nil {
			return rep, err
		}
		got := b.sink.run(tag) - runBefore
		legit += got
		ch.Sent = [2]uint64{res.packets - res.rev, res.rev}
		for i := range 2 * n {
			ch.Received[i/n] += after[i] - before[i]
		}
		ch.ElapsedS = res.elapsed.Seconds()
		rep.Chunks = append(rep.Chunks, ch)
		for k := range 2 {
			dir := &rep.Media[k]
			dir.Sent += ch.Sent[k]
			dir.Received += ch.Received[k]
			if ch.Sent[k] != ch.Received[k] {
				dir.ChunksWithLoss++
			}
		}
		if got != res.packets {
			fmt.Fprintf(cfg.Progress, "  chunk %d at %.0f s: sent %d, received %d (%d each way sent, %d and %d received)\n",
				len(rep.Chunks), ch.StartS, res.packets, got, ch.Sent, ch.Received[0], ch.Received[1])
		}
		if time.Since(lastReport) >= time.Minute {
			lastReport = time.Now()
			var s SoakSample
			samplesMu.Lock()
			if k := len(rep.Samples); k > 0 {
				s = rep.Samples[k-1]
			}
			samplesMu.Unlock()
			fmt.Fprintf(cfg.Progress, "  %3.0f s: media sent %d/%d, lost %d/%d; relayd heap live %.2f MB, %.0f goroutines, %.0f GCs\n",
				time.Since(t0).Seconds(), rep.Media[0].Sent, rep.Media[1].Sent,
				int64(rep.Media[0].Sent)-int64(rep.Media[0].Received), int64(rep.Media[1].Sent)-int64(rep.Media[1].Received),
				s.HeapLive/1e6, s.Goroutines, s.GCs)
		}
	}
	elapsed := time.Since(t0)
	// The last sample closes the end window.
	last := sampleRelayd(r.Metrics, r.Pid(), elapsed)
	stop()
	wg.Wait()
	rep.Samples = append(rep.Samples, last)
	rep.ElapsedS = elapsed.Seconds()
	for k := range rep.Media {
		rep.Media[k].Lost = int64(rep.Media[k].Sent) - int64(rep.Media[k].Received)
		rep.Media[k].Nominal = uint64(float64(n) * float64(time.Second/fwdPtime) * elapsed.Seconds())
	}
	// Answers in flight, and anything relayd lets through late.
	time.Sleep(time.Second)
	rep.Attack.Delivered = b.sink.all() - totalBefore - legit
	dropsAfter := labDrops(l)
	for k, keys := range labDropKeys {
		for _, key := range keys {
			if d := dropsAfter[key] - dropsBefore[key]; d > 0 {
				if rep.Media[k].LabDrops == nil {
					rep.Media[k].LabDrops = map[string]uint64{}
				}
				rep.Media[k].LabDrops[key] = d
				rep.Media[k].LabDropped += d
			}
		}
	}
	if media != nil {
		media.report(&rep.Attack)
	}
	if stranger != nil {
		stranger.report(&rep.SIP)
	}
	if c, err := b.relayed(); err == nil {
		fwd, _, reasons := c.since(countersBefore)
		rep.Attack.RelaydForwarded, rep.Attack.RelaydDrops = fwd, reasons
		rep.Attack.RelaydUserspace = c.userspace - countersBefore.userspace
	}
	if text, err := r.Metrics(); err == nil {
		after := parseSoakSIP(text)
		rep.SIP.RelaydMalformed = after.malformed - sipBefore.malformed
		rep.SIP.RelaydRefused = map[string]float64{}
		for k, v := range after.refused {
			if d := v - sipBefore.refused[k]; d != 0 {
				rep.SIP.RelaydRefused[k] = d
			}
		}
	}
	if cs, err := r.Calls(); err == nil {
		rep.Calls.HeldEnd = len(cs)
	} else {
		rep.Calls.Failures = fmt.Sprintf("relayd's calls: %v", err)
	}
	rep.Calls.Answered = calls.calleeCalls.Load()
	rep.Relayd.Exited = unix.Kill(rep.Relayd.Pid, 0) != nil
	if log := r.Log(); strings.Contains(log, "panic") || strings.Contains(log, "fatal error") {
		i := max(strings.Index(log, "panic"), strings.Index(log, "fatal error"))
		rep.Relayd.Panic = strings.TrimSpace(log[i:min(len(log), i+300)])
	}
	closeCalls()
	rep.judge(cfg, elapsed)
	return rep, ctx.Err()
}

// labDropKeys are, per direction (caller -> callee, callee -> caller),
// the counters of labDrops where the lab loses packets outside relayd: the
// sending namespace's veth refused them (its peer in the relay, where XDP
// runs, had its ring full: the kernel counts IP OutDiscards or UDP
// SndbufErrors and tells the sender nothing; the caller's count includes
// the spoofed media sent from there), the relay's XDP redirect found the
// egress veth's peer ring full (xdp_xmit_errors), or the sink's socket was
// full. lab.EndHostQueues makes the first two rare.
var labDropKeys = [2][]string{
	{"caller ip OutDiscards", "caller udp SndbufErrors", "r1 xdp_xmit_errors", "callee udp RcvbufErrors"},
	{"callee ip OutDiscards", "callee udp SndbufErrors", "r0 xdp_xmit_errors", "caller udp RcvbufErrors"},
}

// labDrops reads the lab's own drop counters (see labDropKeys); a counter
// it cannot read is missing.
func labDrops(l *lab.Lab) map[string]uint64 {
	out := map[string]uint64{}
	for _, x := range []struct {
		name string
		ns   *lab.NS
	}{{"caller", l.Caller}, {"callee", l.Callee}} {
		var text []byte
		// /proc/net is the main thread's namespace: thread-self is the
		// one this locked thread entered.
		_ = x.ns.Do(func() (err error) { text, err = os.ReadFile("/proc/thread-self/net/snmp"); return err })
		// Each table of snmp is a header line and a value line.
		want := map[string]map[string]string{
			"Ip:":  {"OutDiscards": " ip OutDiscards"},
			"Udp:": {"SndbufErrors": " udp SndbufErrors", "RcvbufErrors": " udp RcvbufErrors"},
		}
		heads := map[string][]string{}
		for _, line := range strings.Split(string(text), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || want[f[0]] == nil {
				continue
			}
			head, ok := heads[f[0]]
			if !ok {
				heads[f[0]] = f
				continue
			}
			for i := 1; i < len(f) && i < len(head); i++ {
				if name, ok := want[f[0]][head[i]]; ok {
					v, _ := strconv.ParseUint(f[i], 10, 64)
					out[x.name+name] = v
				}
			}
		}
	}
	for _, ifname := range []string{lab.RelayCallerIfName, lab.RelayCalleeIfName} {
		b, err := l.Relay.Command("ethtool", "-S", ifname).Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && strings.HasSuffix(k, "_xdp_xmit_errors") {
				n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				out[ifname+" xdp_xmit_errors"] += n
			}
		}
	}
	return out
}

// findTortureDir looks for control/sip/testdata/torture in the working
// directory and above it.
func findTortureDir() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		c := filepath.Join(dir, "control", "sip", "testdata", "torture")
		if fi, err := os.Stat(c); err == nil && fi.IsDir() {
			return c
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}

// soakSIPConfig is relayd's [sip]: one route to the answerer, which only
// the caller's address may use.
func soakSIPConfig(l *lab.Lab) string {
	return fmt.Sprintf(`[sip]
listen = ["udp:%s:%d"]
[[route]]
name = "soak"
match = "."
allow = ["%s"]
attempt_timeout = "5s"
destinations = ["sip:answer@%s"]
`, l.RelayMedia4, benchSIPPort, l.CallerAddr4, netip.AddrPortFrom(l.CalleeAddr4, benchSIPPort))
}

// sampleRelayd reads relayd's metrics at t.
func sampleRelayd(metrics func() (string, error), pid int, t time.Duration) SoakSample {
	s := SoakSample{T: t.Seconds(), Pid: pid}
	text, err := metrics()
	if err != nil {
		s.Error = err.Error()
		return s
	}
	if err := s.parse(text); err != nil {
		s.Error = err.Error()
	}
	return s
}

// parse reads the sample's figures from relayd's metrics.
func (s *SoakSample) parse(text string) error {
	want := map[string]*float64{
		"go_gc_heap_live_bytes":         &s.HeapLive,
		"go_memstats_heap_inuse_bytes":  &s.HeapInuse,
		"go_goroutines":                 &s.Goroutines,
		"go_gc_duration_seconds_count":  &s.GCs,
		"process_resident_memory_bytes": &s.RSS,
		"process_start_time_seconds":    &s.Start,
	}
	found := 0
	for _, line := range strings.Split(text, "\n") {
		name, _, value, ok := parseDemoSample(line)
		if p := want[name]; ok && p != nil {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return fmt.Errorf("%s: %w", line, err)
			}
			*p = v
			found++
		}
	}
	if found != len(want) {
		var missing []string
		for k, p := range want {
			if *p == 0 {
				missing = append(missing, k)
			}
		}
		return fmt.Errorf("relayd's metrics lack %v", missing)
	}
	return nil
}

type soakSIPCounters struct {
	malformed float64
	refused   map[string]float64
}

// parseSoakSIP sums relayd_sip_malformed_total and relayd_sip_refused_total
// by reason.
func parseSoakSIP(text string) soakSIPCounters {
	c := soakSIPCounters{refused: map[string]float64{}}
	for _, line := range strings.Split(text, "\n") {
		name, labels, value, ok := parseDemoSample(line)
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch name {
		case "relayd_sip_malformed_total":
			c.malformed += v
		case "relayd_sip_refused_total":
			c.refused[labels["reason"]] += v
		}
	}
	return c
}

// soakMedia sends spoofed media from the caller's namespace through the
// relay's XDP program: a raw socket (IP_HDRINCL) forges each packet's
// source. Half of it is RTP-shaped (172 bytes, version 2, PCMU), half
// random bytes of 1 to 1,400; half goes to the calls' relay ports, half to
// random ports of relayd's range. Sources: the caller's address with any
// port but its media port, or another address of its subnet: never a
// call's exact source, which no relay can tell from the caller. Every
// packet of 12 bytes or more carries SSRC tag soakAttackTag, no stream's
// (bits 0-15 0xffff), so that the sink knows it.
type soakMedia struct {
	fd     int
	rng    *rand.Rand
	relay  netip.Addr
	caller netip.Addr
	ports  []netip.AddrPort
	buf    [1500]byte
	// counts by kind: rtp/garbage x call port/random port
	rtpCall, rtpRandom, garbageCall, garbageRandom, errs atomic.Uint64
}

func newSoakMedia(l *lab.Lab, seed uint64, ports []netip.AddrPort) (*soakMedia, error) {
	fd := -1
	err := l.Caller.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("raw socket in the caller namespace: %w", err)
	}
	return &soakMedia{fd: fd, rng: rand.New(rand.NewPCG(seed, seed^0x6d65646961)), relay: l.RelayMedia4, caller: l.CallerAddr4, ports: ports}, nil
}

func (a *soakMedia) close() { unix.Close(a.fd) }

// run sends pps packets a second, in 5 ms ticks, until ctx ends.
func (a *soakMedia) run(ctx context.Context, pps int) {
	const tick = 5 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start, sent := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		due := int(time.Since(start).Seconds() * float64(pps))
		for ; sent < due; sent++ {
			a.send()
		}
	}
}

func (a *soakMedia) send() {
	rng := a.rng
	rtp, toCall := rng.IntN(2) == 0, rng.IntN(2) == 0
	dst := netip.AddrPortFrom(a.relay, uint16(20000+rng.IntN(41000)))
	if toCall && len(a.ports) > 0 {
		dst = a.ports[rng.IntN(len(a.ports))]
	}
	var src [4]byte
	sport := uint16(1024 + rng.IntN(64512))
	if rng.IntN(2) == 0 {
		src = a.caller.As4()
		if sport == uint16(fwdSenderPort) {
			sport++
		}
	} else {
		src = [4]byte{198, 18, 0, byte(3 + rng.IntN(252))}
	}
	n := fwdRTPLen
	p := a.buf[28:]
	if rtp {
		p[0], p[1] = 0x80, 0
		binary.BigEndian.PutUint16(p[2:], uint16(rng.Uint32()))
		binary.BigEndian.PutUint32(p[4:], rng.Uint32())
		for i := 12; i < n; i++ {
			p[i] = 0xff
		}
	} else {
		n = 1 + rng.IntN(1400)
		for i := range n {
			p[i] = byte(rng.Uint32())
		}
	}
	if n >= 12 {
		p[8], p[9], p[10], p[11] = byte(rng.Uint32()), soakAttackTag, 0xff, 0xff
	}
	h := a.buf[:28]
	h[0], h[1] = 0x45, 0
	binary.BigEndian.PutUint16(h[2:], uint16(28+n))
	binary.BigEndian.PutUint32(h[4:], 0) // id and fragment: the kernel fills the id
	h[8], h[9] = 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(h[10:], 0) // checksum: the kernel's
	copy(h[12:16], src[:])
	d4 := dst.Addr().As4()
	copy(h[16:20], d4[:])
	binary.BigEndian.PutUint16(h[20:], sport)
	binary.BigEndian.PutUint16(h[22:], dst.Port())
	binary.BigEndian.PutUint16(h[24:], uint16(8+n))
	binary.BigEndian.PutUint16(h[26:], 0) // no UDP checksum (IPv4 allows it)
	if err := unix.Sendto(a.fd, a.buf[:28+n], 0, &unix.SockaddrInet4{Addr: d4}); err != nil {
		a.errs.Add(1)
		return
	}
	switch {
	case rtp && toCall:
		a.rtpCall.Add(1)
	case rtp:
		a.rtpRandom.Add(1)
	case toCall:
		a.garbageCall.Add(1)
	default:
		a.garbageRandom.Add(1)
	}
}

func (a *soakMedia) report(r *SoakAttack) {
	r.RTPAllocated, r.RTPRandom = a.rtpCall.Load(), a.rtpRandom.Load()
	r.GarbageAllocated, r.GarbageRandom = a.garbageCall.Load(), a.garbageRandom.Load()
	r.SendErrors = a.errs.Load()
}

// soakStranger is a SIP party outside the route's allow list, in the
// attacker namespace: it floods relayd with INVITEs (never ACKing the
// refusals, as an attacker would not) from one socket and sends malformed
// SIP from another, and counts the answers, also those a Via without a
// port sends to 5060.
type soakStranger struct {
	invite, garbage, via *net.UDPConn
	local                netip.Addr
	relay                netip.AddrPort
	rng                  *rand.Rand
	torture              [][]byte

	invites, garbageSent atomic.Uint64
	mu                   sync.Mutex
	inviteAnswers        map[string]uint64
	garbageAnswers       map[string]uint64
	answeredCallIDs      map[string]bool
	unparsed             uint64
	readers              sync.WaitGroup
}

const (
	soakInvitePort  = 5080
	soakGarbagePort = 5090
)

func newSoakStranger(l *lab.Lab, seed uint64, torture [][]byte) (*soakStranger, error) {
	s := &soakStranger{local: l.AttackerAddr4, relay: netip.AddrPortFrom(l.RelayMedia4, benchSIPPort),
		rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), torture: torture,
		inviteAnswers: map[string]uint64{}, garbageAnswers: map[string]uint64{}, answeredCallIDs: map[string]bool{}}
	err := l.Attacker.Do(func() error {
		for _, x := range []struct {
			c    **net.UDPConn
			port int
		}{{&s.invite, soakInvitePort}, {&s.garbage, soakGarbagePort}, {&s.via, benchSIPPort}} {
			c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.local, uint16(x.port))))
			if err != nil {
				return err
			}
			*x.c = c
		}
		return nil
	})
	if err != nil {
		s.close()
		return nil, fmt.Errorf("the stranger's sockets: %w", err)
	}
	s.readers.Add(3)
	go s.read(s.invite, true)
	go s.read(s.garbage, false)
	go s.read(s.via, false)
	return s, nil
}

func (s *soakStranger) close() {
	for _, c := range []*net.UDPConn{s.invite, s.garbage, s.via} {
		if c != nil {
			c.Close()
		}
	}
	s.readers.Wait()
}

// read counts the responses arriving on c by status code.
func (s *soakStranger) read(c *net.UDPConn, invite bool) {
	defer s.readers.Done()
	buf := make([]byte, 65536)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		m := buf[:n]
		code := ""
		if rest, ok := bytes.CutPrefix(m, []byte("SIP/2.0 ")); ok && len(rest) >= 3 {
			code = string(rest[:3])
		}
		s.mu.Lock()
		switch {
		case code == "":
			s.unparsed++
		case invite:
			s.inviteAnswers[code]++
			if id := headerValue(m, "Call-ID"); id != "" && len(s.answeredCallIDs) < 1<<20 {
				s.answeredCallIDs[id] = true
			}
		default:
			s.garbageAnswers[code]++
		}
		s.mu.Unlock()
	}
}

// headerValue returns the value of m's first header name (or its compact
// form i for Call-ID).
func headerValue(m []byte, name string) string {
	for _, line := range bytes.Split(m, []byte("\r\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		k = bytes.TrimSpace(k)
		if strings.EqualFold(string(k), name) || (name == "Call-ID" && string(k) == "i") {
			return string(bytes.TrimSpace(v))
		}
	}
	return ""
}

// run sends invites and garbage datagrams a second until ctx ends.
func (s *soakStranger) run(ctx context.Context, invites, garbage int) {
	const tick = 10 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	var ni, ng int
	to := net.UDPAddrFromAddrPort(s.relay)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		el := time.Since(start).Seconds()
		for due := int(el * float64(invites)); ni < due; ni++ {
			if _, err := s.invite.WriteToUDP(s.inviteMsg(ni), to); err == nil {
				s.invites.Add(1)
			}
		}
		for due := int(el * float64(garbage)); ng < due; ng++ {
			if _, err := s.garbage.WriteToUDP(siptorture.Garbage(s.rng, s.torture, ng), to); err == nil {
				s.garbageSent.Add(1)
			}
		}
	}
}

// inviteMsg is the stranger's i-th INVITE: well formed, with an offer.
func (s *soakStranger) inviteMsg(i int) []byte {
	sdp := fmt.Sprintf("v=0\r\no=- %d 1 IN IP4 %s\r\ns=-\r\nc=IN IP4 %s\r\nt=0 0\r\nm=audio %d RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=ptime:20\r\n",
		i+1, s.local, s.local, 40000+2*(i%1000))
	return fmt.Appendf(nil, "INVITE sip:answer@%s SIP/2.0\r\n"+
		"Via: SIP/2.0/UDP %s:%d;branch=z9hG4bK-soak-%d\r\n"+
		"Max-Forwards: 70\r\n"+
		"From: <sip:stranger@%s>;tag=s%d\r\n"+
		"To: <sip:answer@%s>\r\n"+
		"Call-ID: soak-stranger-%d@%s\r\n"+
		"CSeq: 1 INVITE\r\n"+
		"Contact: <sip:stranger@%s:%d>\r\n"+
		"Content-Type: application/sdp\r\n"+
		"Content-Length: %d\r\n\r\n%s",
		s.relay, s.local, soakInvitePort, i, s.local, i, s.relay.Addr(), i, s.local, s.local, soakInvitePort, len(sdp), sdp)
}

func (s *soakStranger) report(r *SoakSIP) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.Invites, r.Garbage = s.invites.Load(), s.garbageSent.Load()
	r.InviteAnswers, r.GarbageAnswers = maps.Clone(s.inviteAnswers), maps.Clone(s.garbageAnswers)
	r.InvitesAnswered, r.Unparsed = len(s.answeredCallIDs), s.unparsed
	r.TortureMessages = len(s.torture)
}
