package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/rtnl"
)

// The redirect monitor (bpf/redirmon.c) sees the frames the kernel
// refuses to send after the relay program redirected them: the program
// has counted them forwarded by then, and without the monitor they are
// lost without a trace (a veth whose peer has neither an XDP program nor
// GRO refuses every one). On the first refusal toward a device the
// monitor takes the device out of tx_ports, so that the program punts the
// flows toward it (punt/no_egress) and the userspace workers relay them
// through the kernel's stack, which does not need the device's XDP
// transmit. Every probeInterval the redirect probe sends one frame into
// each such device through XDP; when the device takes it, the device goes
// back into tx_ports and its flows back to XDP. At start every device is
// probed once: a device that refuses from the start is in fallback before
// its first media frame, and the probe teaches the program each device's
// address (see redirmon.c).

// probeInterval is how often a device in fallback is probed. A probe costs
// one 60-byte frame on the device's link and one bpf syscall. A device
// that refuses again within flapWindow of going back to XDP is probed half
// as often each time, down to once every maxProbeInterval: each return
// costs the frames refused before the fallback.
const (
	probeInterval    = time.Second
	maxProbeInterval = 32 * time.Second
	flapWindow       = 10 * time.Second
)

// fallbackWarnEvery limits the warning about a device that refuses
// redirected frames to one a minute per device; the others are logged at
// debug level and counted in the next warning.
const fallbackWarnEvery = time.Minute

// probeEtherType is IEEE 802's local experimental EtherType: the probe
// frame means nothing to any receiver, which drops it.
const probeEtherType = 0x88B5

type egressDevice struct {
	name    string
	ifindex int
	kind    string // netlink link type: "veth", "device", ...
	probe   []byte // the probe frame

	fallback   bool
	since      time.Time
	err        int32 // the refusal's negative errno
	interval   time.Duration
	nextProbe  time.Time
	restored   time.Time // when the device last went back to XDP
	lastWarn   time.Time
	suppressed int
}

type redirMon struct {
	log     *zap.Logger
	objs    redirmonObjects
	txPorts *ebpf.Map
	links   []link.Link
	events  *ringbuf.Reader
	// devmapXmit is the xdp_devmap_xmit link, closed when the probe finds
	// the tracepoint's arguments are not as the program reads them.
	devmapXmit link.Link
	// ns is the network namespace of the caller of startRedirMon: a
	// DEVMAP entry names an ifindex of its writer's namespace, and
	// relayd's tests run the data plane in a namespace of their own.
	ns netns.NsHandle

	mu        sync.Mutex // guards devs' state and the following
	devs      map[int]*egressDevice
	lastProbe redirmonProbeResult
	// noProbe: the kernel refuses BPF_PROG_TEST_RUN with live frames
	// (before 5.18, or a hardened kernel), so nothing is probed: a device
	// in fallback is put back into tx_ports when its interval has passed,
	// and the relay's own frames tell whether it takes them (see
	// probeLocked).
	noProbe bool

	stop chan struct{}
	wg   sync.WaitGroup
}

// startRedirMon loads and attaches the redirect monitor for ifaces, whose
// egress entries are in txPorts. The monitor is private to this process:
// nothing of it is pinned, and a restart starts it afresh.
func startRedirMon(txPorts *ebpf.Map, ifaces []dataplane.Interface, log *zap.Logger) (*redirMon, error) {
	began := time.Now()
	spec, err := loadRedirmon()
	if err != nil {
		return nil, fmt.Errorf("load BPF spec: %w", err)
	}
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	m := &redirMon{log: log, txPorts: txPorts, ns: ns, devs: make(map[int]*egressDevice), stop: make(chan struct{}), noProbe: redirmonNoProbe}
	if err := spec.LoadAndAssign(&m.objs, nil); err != nil {
		ns.Close()
		return nil, explainLoad(err)
	}
	ok := false
	defer func() {
		if !ok {
			m.close()
		}
	}()
	relayID, err := mapID(txPorts)
	if err != nil {
		return nil, err
	}
	probeID, err := mapID(m.objs.ProbePorts)
	if err != nil {
		return nil, err
	}
	if err := m.objs.Config.Put(uint32(0), redirmonRedirmonConfig{RelayMapId: relayID, ProbeMapId: probeID}); err != nil {
		return nil, fmt.Errorf("configure the redirect monitor: %w", err)
	}
	for _, i := range ifaces {
		// One device gone (deleted since its attachment: the link watch
		// hands the monitor its successor) leaves the others watched.
		if _, err := m.add(i); err != nil {
			log.Warn("redirect refusals of this device are not watched", zap.String("device", i.Name), zap.Error(err))
		}
	}

	// xdp_redirect_map_err is gone from 6.18 (see redirmon.c).
	var tracepoints []string
	for _, tp := range []struct {
		name     string
		prog     *ebpf.Program
		optional bool
	}{
		{"xdp_redirect_err", m.objs.RedirectErr, false},
		{"xdp_redirect_map_err", m.objs.RedirectErr, true},
		{"xdp_devmap_xmit", m.objs.DevmapXmit, false},
	} {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp.name, Program: tp.prog})
		if err != nil {
			if tp.optional && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("attach to raw tracepoint %s: %w", tp.name, err)
		}
		if tp.name == "xdp_devmap_xmit" {
			m.devmapXmit = l
		}
		m.links = append(m.links, l)
		tracepoints = append(tracepoints, tp.name)
	}
	if m.events, err = ringbuf.NewReader(m.objs.Events); err != nil {
		return nil, fmt.Errorf("read the redirect monitor's events: %w", err)
	}
	ok = true
	m.wg.Add(1)
	go m.readEvents()

	// The first probe of each device: its address for xdp_devmap_xmit, and
	// a device that refuses from the start goes into fallback now.
	m.mu.Lock()
	for _, d := range m.devs {
		m.firstProbeLocked(d)
	}
	m.mu.Unlock()

	m.wg.Add(1)
	go m.probeLoop()
	log.Info("watching XDP redirect refusals", zap.Strings("tracepoints", tracepoints),
		zap.Duration("took", time.Since(began).Round(time.Millisecond)))
	return m, nil
}

// add starts watching device i. Called before the monitor runs or with
// m.mu held.
func (m *redirMon) add(i dataplane.Interface) (*egressDevice, error) {
	d, err := newEgressDevice(i)
	if err != nil {
		return nil, err
	}
	if err := m.objs.ProbePorts.Put(uint32(i.Index), redirmonBpfDevmapVal{Ifindex: uint32(i.Index)}); err != nil {
		return nil, fmt.Errorf("add %s to the probe's redirect map: %w", i.Name, err)
	}
	if err := m.objs.Devices.Put(uint32(i.Index), uint32(redirmonDevFlagsDEV_F_ARMED)); err != nil {
		return nil, fmt.Errorf("arm the redirect monitor for %s: %w", i.Name, err)
	}
	d.interval = probeInterval
	m.devs[i.Index] = d
	return d, nil
}

// replace follows device i, re-created since it had ifindex old: the old
// device's state goes, the new one starts afresh and is probed at once
// (one that refuses from the start goes into fallback now). Called on a
// thread in m's namespace.
func (m *redirMon) replace(old int, i dataplane.Interface) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := m.devs[old]; d != nil && d.name == i.Name {
		delete(m.devs, old)
		m.objs.ProbePorts.Delete(uint32(old))
		m.objs.Devices.Delete(uint32(old))
	}
	d, err := m.add(i)
	if err != nil {
		m.log.Warn("redirect refusals of the re-created device are not watched", zap.String("device", i.Name), zap.Error(err))
		return
	}
	m.firstProbeLocked(d)
}

// firstProbeLocked probes a device the monitor just took on: it learns
// the device's address for xdp_devmap_xmit, and a device that refuses
// from the start goes into fallback now.
func (m *redirMon) firstProbeLocked(d *egressDevice) {
	if m.noProbe {
		return
	}
	accepted, err := m.probe(d)
	if errors.Is(err, errNoLiveFrames) {
		return
	}
	if err != nil {
		m.log.Warn("redirect probe failed", zap.String("device", d.name), zap.Error(err))
		return
	}
	if !accepted {
		m.fallbackLocked(d, m.lastProbe.Err)
	}
}

func mapID(m *ebpf.Map) (uint32, error) {
	info, err := m.Info()
	if err != nil {
		return 0, fmt.Errorf("map info: %w", err)
	}
	id, ok := info.ID()
	if !ok {
		return 0, errors.New("map info: the kernel reports no map id")
	}
	return uint32(id), nil
}

func newEgressDevice(i dataplane.Interface) (*egressDevice, error) {
	nl, err := netlink.LinkByIndex(i.Index)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", i.Name, err)
	}
	d := &egressDevice{name: i.Name, ifindex: i.Index, kind: nl.Type()}
	// Ethernet header to the device's own address (a switch does not send
	// a frame back out of the port it came in on), the ifindex the probe
	// program redirects to, a marker, padding to the minimum frame size.
	frame := make([]byte, 60)
	mac := nl.Attrs().HardwareAddr
	if len(mac) == 6 {
		copy(frame[0:6], mac)
		copy(frame[6:12], mac)
	}
	binary.BigEndian.PutUint16(frame[12:14], probeEtherType)
	binary.NativeEndian.PutUint32(frame[14:18], uint32(i.Index))
	copy(frame[18:], "relayd redirect probe")
	d.probe = frame
	return d, nil
}

// readEvents takes the program's reports of a first refusal.
func (m *redirMon) readEvents() {
	defer m.wg.Done()
	var rec ringbuf.Record
	for {
		if err := m.events.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			m.log.Warn("read redirect monitor event", zap.Error(err))
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if len(rec.RawSample) < 8 {
			continue
		}
		ifindex := binary.NativeEndian.Uint32(rec.RawSample[0:4])
		errno := int32(binary.NativeEndian.Uint32(rec.RawSample[4:8]))
		m.refused(int(ifindex), errno)
	}
}

// refused puts the device the program reported into fallback.
func (m *redirMon) refused(ifindex int, errno int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := m.devs[ifindex]; d != nil && !d.fallback {
		m.fallbackLocked(d, errno)
	}
}

// fallbackLocked takes d out of tx_ports, so that the relay program punts
// what it would redirect there.
func (m *redirMon) fallbackLocked(d *egressDevice, errno int32) {
	if err := m.txPorts.Delete(uint32(d.ifindex)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		m.log.Error("cannot take the device out of the redirect map; frames toward it are lost",
			zap.String("device", d.name), zap.Error(err))
		return
	}
	now := time.Now()
	d.fallback, d.since, d.err = true, now, errno
	if !d.restored.IsZero() && now.Sub(d.restored) < flapWindow {
		d.interval = min(2*d.interval, maxProbeInterval)
	} else {
		d.interval = probeInterval
	}
	d.nextProbe = now.Add(d.interval)
	fields := []zap.Field{zap.String("device", d.name), zap.Int("ifindex", d.ifindex),
		zap.String("error", errnoString(errno)), zap.String("likely_cause", d.cause(errno)),
		zap.Duration("probe_interval", d.interval)}
	if now.Sub(d.lastWarn) < fallbackWarnEvery {
		d.suppressed++
		m.log.Debug("device refuses redirected frames again; its flows are relayed in userspace", fields...)
		return
	}
	if d.suppressed > 0 {
		fields = append(fields, zap.Int("times_since_last_warning", d.suppressed))
	}
	d.lastWarn, d.suppressed = now, 0
	if m.noProbe {
		m.log.Warn("device refuses redirected frames; its flows are relayed in userspace until it is tried again", fields...)
		return
	}
	m.log.Warn("device refuses redirected frames; its flows are relayed in userspace until the redirect probe finds it takes them again", fields...)
}

// cause says what makes a device refuse redirected frames, as far as the
// kernel's error tells.
func (d *egressDevice) cause(errno int32) string {
	if d.kind == "veth" && -errno != int32(unix.ENETDOWN) {
		return "the veth's peer is down or has neither an XDP program nor GRO: a veth takes redirected frames only when its peer is up " +
			"with one of them (attach an XDP program to the peer, or ethtool -K PEER gro on)"
	}
	switch -errno {
	case int32(unix.EOPNOTSUPP):
		return "the driver does not offer XDP transmit (ndo_xdp_xmit) in its current configuration"
	case int32(unix.ENETDOWN):
		return "the device is down"
	case int32(unix.ENXIO), int32(unix.ENOSPC), int32(unix.EBUSY):
		return "the driver has no XDP transmit queue ready (some need an XDP program of their own attached, or more channels)"
	}
	return "the driver refused the frames"
}

func errnoString(errno int32) string {
	if errno >= 0 {
		return strconv.Itoa(int(errno))
	}
	name := unix.ErrnoName(unix.Errno(-errno))
	if -errno == int32(unix.EOPNOTSUPP) {
		name = "EOPNOTSUPP" // the kernel's name for it; ENOTSUP is the same number
	}
	return fmt.Sprintf("%d (%s)", errno, name)
}

func (m *redirMon) probeLoop() {
	defer m.wg.Done()
	// The thread stays locked in the namespace; it ends with the goroutine.
	// Entering it only when it is another: under the unit setns is refused
	// (RestrictNamespaces=), and relayd runs in its namespace anyway.
	runtime.LockOSThread()
	if cur, err := netns.Get(); err != nil || !cur.Equal(m.ns) {
		if err == nil {
			cur.Close()
		}
		if err := netns.Set(m.ns); err != nil {
			m.log.Error("redirect probe cannot enter the data plane's network namespace: devices in fallback stay there", zap.Error(err))
			return
		}
	} else {
		cur.Close()
	}
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.mu.Lock()
		now := time.Now()
		for _, d := range m.devs {
			if d.fallback && !now.Before(d.nextProbe) {
				d.nextProbe = now.Add(d.interval)
				m.probeLocked(d)
			}
		}
		m.mu.Unlock()
	}
}

// probeLocked runs the redirect probe on d and, when d took the frame,
// puts it back into tx_ports. Without probes (noProbe) d goes back
// untried: if it still refuses, the relay's next frame toward it is
// refused and reported, and d falls back again with twice the interval
// (flapWindow), so a device that keeps refusing costs a frame or a few
// every maxProbeInterval.
func (m *redirMon) probeLocked(d *egressDevice) {
	if !m.noProbe {
		accepted, err := m.probe(d)
		if errors.Is(err, errNoLiveFrames) {
			return // the next round puts it back untried
		}
		if err != nil {
			m.log.Warn("redirect probe failed; the device stays in fallback", zap.String("device", d.name), zap.Error(err))
			return
		}
		if !accepted {
			return
		}
	}
	// Armed before the device goes back: a refusal right after is reported.
	if err := m.objs.Devices.Put(uint32(d.ifindex), uint32(redirmonDevFlagsDEV_F_ARMED)); err != nil {
		m.log.Warn("cannot re-arm the redirect monitor; the device stays in fallback", zap.String("device", d.name), zap.Error(err))
		return
	}
	if err := m.txPorts.Put(uint32(d.ifindex), relayBpfDevmapVal{Ifindex: uint32(d.ifindex)}); err != nil {
		m.log.Warn("cannot put the device back into the redirect map; it stays in fallback", zap.String("device", d.name), zap.Error(err))
		return
	}
	d.fallback, d.restored = false, time.Now()
	if m.noProbe {
		m.log.Info("device tried again without a probe; its flows are back on XDP unless it refuses their frames",
			zap.String("device", d.name), zap.Duration("fallback_for", time.Since(d.since).Round(time.Millisecond)))
		return
	}
	m.log.Info("device takes redirected frames again; its flows are back on XDP",
		zap.String("device", d.name), zap.Duration("fallback_for", time.Since(d.since).Round(time.Millisecond)))
}

// redirmonNoProbe starts monitors without probes, as on a kernel that
// refuses live frames (tests).
var redirmonNoProbe bool

// errNoLiveFrames is the probe's error where the kernel refuses to run an
// XDP program on live frames.
var errNoLiveFrames = errors.New("the kernel refuses BPF_PROG_TEST_RUN with live frames")

// noLiveFrames reports whether err, from a live-frame run, says the kernel
// will not run one: EINVAL for the flag before 5.18, EPERM or EOPNOTSUPP
// where a hardened kernel forbids it.
func noLiveFrames(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.Errno(524)) // ENOTSUPP, the kernel's own
}

// probe sends d's probe frame into d through XDP (BPF_PROG_TEST_RUN in
// live-frame mode redirects and flushes within the syscall) and reports
// whether d took it: no tracepoint saw it refused. What they saw is left
// in m.lastProbe. Called with m.mu held.
func (m *redirMon) probe(d *egressDevice) (bool, error) {
	var res redirmonProbeResult
	if err := m.objs.ProbeResults.Put(uint32(0), res); err != nil {
		return false, fmt.Errorf("reset the probe's result: %w", err)
	}
	// A probe frame whose redirect raised no event would leave its CPU's
	// flag set, and the next relay bulk flushed there would pass for a
	// probe's.
	if err := m.objs.Probing.Put(uint32(0), make([]uint32, ebpf.MustPossibleCPU())); err != nil {
		return false, fmt.Errorf("reset the probe's flags: %w", err)
	}
	if _, err := m.objs.RedirectProbe.Run(&ebpf.RunOptions{
		Data:   d.probe,
		Repeat: 1,
		Flags:  unix.BPF_F_TEST_XDP_LIVE_FRAMES,
	}); err != nil {
		if noLiveFrames(err) && !m.noProbe {
			m.noProbe = true
			m.log.Warn("this kernel refuses to run XDP programs on live frames (BPF_PROG_TEST_RUN): egress devices are not probed. "+
				"A device is found refusing by the first of the relay's frames it refuses, and one in fallback is put back "+
				"into the redirect map untried when its probe interval has passed (a frame or a few lost each time it still refuses); "+
				"refusals at flush time (kernels before 6.3) are not seen", zap.Error(err))
		}
		if m.noProbe {
			return false, errNoLiveFrames
		}
		return false, fmt.Errorf("run the probe program: %w", err)
	}
	if err := m.objs.ProbeResults.Lookup(uint32(0), &res); err != nil {
		return false, fmt.Errorf("read the probe's result: %w", err)
	}
	m.lastProbe = res
	if res.EnqueueRefusals > 0 {
		return false, nil
	}
	if m.devmapXmit == nil {
		return true, nil // flush-time refusals are not watched (below)
	}
	if res.Flushes == 0 {
		return false, errors.New("the probe frame was neither refused nor flushed")
	}
	// One frame, taken or refused, and an error that is an errno: else
	// xdp_devmap_xmit's arguments are not where the program reads them
	// (a kernel that changed the tracepoint), and what it counts is noise.
	if res.Ifindex == uint32(d.ifindex) && res.Sent+res.Drops == 1 && res.Err <= 0 && res.Err > -4096 {
		return res.Drops == 0, nil
	}
	if m.devmapXmit != nil {
		m.devmapXmit.Close()
		m.devmapXmit = nil
		m.log.Warn("xdp_devmap_xmit's arguments are not as the redirect monitor reads them: refusals at flush time (kernels before 6.3) are not watched",
			zap.String("device", d.name), zap.Any("probe", res))
	}
	return true, nil
}

// egress reports every device's refusals and whether it is in fallback.
func (m *redirMon) egress() []dataplane.Egress {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]dataplane.Egress, 0, len(m.devs))
	var per []redirmonEgressErrors
	for _, d := range m.devs {
		e := dataplane.Egress{Device: d.name, Fallback: d.fallback}
		if err := m.objs.RedirectErrors.Lookup(uint32(d.ifindex), &per); err == nil {
			for _, p := range per {
				e.RedirectErrors += p.Frames
			}
		}
		out = append(out, e)
	}
	return out
}

// close stops the monitor. Devices in fallback go back into tx_ports:
// without relayd nothing relays what the program punts, and the redirect
// is their only chance (the next start probes them again at once).
func (m *redirMon) close() error {
	if m.events != nil {
		close(m.stop)
		m.events.Close()
		m.wg.Wait()
	}
	var errs []error
	m.mu.Lock()
	errs = append(errs, rtnl.InNamespace(m.ns, func() error {
		for _, d := range m.devs {
			if d.fallback {
				if err := m.txPorts.Put(uint32(d.ifindex), relayBpfDevmapVal{Ifindex: uint32(d.ifindex)}); err != nil {
					return fmt.Errorf("put %s back into the redirect map: %w", d.name, err)
				}
				d.fallback = false
			}
		}
		return nil
	}))
	m.mu.Unlock()
	m.ns.Close()
	for _, l := range m.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, m.objs.Close())
	return errors.Join(errs...)
}
