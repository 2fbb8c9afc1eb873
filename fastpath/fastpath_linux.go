package fastpath

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/bpffs"
	"github.com/relayd/relayd/internal/flowkey"
	"github.com/relayd/relayd/internal/rtnl"
)

// Fastpath is the XDP data plane: the loaded program, its pinned maps and
// its links. It implements dataplane.DataPlane and dataplane.Observer and is
// safe for concurrent use. Close releases this process's handles and leaves
// the pinned state forwarding.
type Fastpath struct {
	log  *zap.Logger
	cfg  Config
	dir  string
	objs relayObjects

	mu        sync.Mutex // guards the following
	ifaces    []ifaceState
	links     []link.Link
	slots     *slotAlloc                // the stats slots
	installed map[flowKey]installedFlow // every flow installed or adopted
	loops     loopIndex                 // which flows send to which flows' matches
	closed    bool

	nhMu sync.Mutex               // guards nh
	nh   map[netip.Addr]time.Time // destinations whose next hop was resolved, and when

	mon     *redirMon       // nil when redirect failures cannot be watched
	monDone chan struct{}   // closed once the monitor and the link watch started, or failed to
	lw      *rtnl.LinkWatch // the interfaces (linkwatch_linux.go); nil when not followed

	ports      *portTable  // the program's flows by port; nil where not used
	routeSlots uint32      // the program's route cache entries per CPU; 0: none
	rgen       *routeGen   // the route cache's generation and lease
	routes     *routeWatch // nil when the route cache is off
}

// nhFresh is how long a destination whose next hop resolved is not looked
// up again: the kernel keeps a confirmed neighbour REACHABLE for about
// 30 s and STALE (still valid for bpf_fib_lookup) after. A call's four
// flows, and calls to the same peers, then cost no netlink round trips.
const nhFresh = 10 * time.Second

type flowKey = relayFlowKey

// New loads the XDP program, takes over maps pinned by a previous run (or
// creates and pins them), attaches to cfg.Interfaces (replacing the program
// of a pinned link atomically, so forwarding never stops) and adopts the
// flows already installed.
func New(cfg Config, log *zap.Logger) (*Fastpath, error) {
	cfg.setDefaults()
	if cfg.XDPMode != "native" && cfg.XDPMode != "generic" {
		return nil, fmt.Errorf("xdp mode %q: want native or generic", cfg.XDPMode)
	}
	if cfg.MaxFlows < 1 || cfg.MaxFlows > 1<<22 {
		return nil, fmt.Errorf("max flows %d: want 1 to %d", cfg.MaxFlows, 1<<22)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("raise memlock limit: %w", err)
	}
	f := &Fastpath{
		log:       log,
		cfg:       cfg,
		dir:       filepath.Join(cfg.PinPath, "v"+strconv.Itoa(LayoutVersion)),
		installed: make(map[flowKey]installedFlow),
	}
	if err := ensureBPFFS(cfg.PinPath, log); err != nil {
		return nil, err
	}
	_, statErr := os.Stat(f.dir)
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pin directory: %w", err)
	}
	if err := f.load(true); err != nil {
		if errors.Is(statErr, os.ErrNotExist) {
			os.Remove(f.dir) // only when empty: a refused load pins nothing
		}
		return nil, err
	}
	if err := f.adopt(); err != nil {
		f.objs.Close()
		return nil, err
	}
	// Before the program runs on any interface: every lookup it caches
	// then comes after the watch began.
	if ns, err := netns.Get(); err != nil {
		log.Warn("route cache off: XDP looks every packet's route up", zap.Error(err))
	} else {
		f.watchRoutes(ns, routeRefresh)
		ns.Close()
	}
	for _, name := range cfg.Interfaces {
		if err := f.attach(name); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.detachStale(); err != nil {
		f.Close()
		return nil, err
	}
	// The monitor starts beside the rest of relayd: its load, attachments
	// and first probes (tens of milliseconds) would otherwise lengthen a
	// restart, while which the userspace flows wait. Close waits for it.
	f.monDone = make(chan struct{})
	ifaces := f.Interfaces()
	ns, nsErr := netns.Get()
	go func() {
		defer close(f.monDone)
		var mon *redirMon
		err := nsErr
		if err == nil {
			err = rtnl.InNamespace(ns, func() (err error) {
				mon, err = startRedirMon(f.objs.TxPorts, ifaces, log.Named("redirmon"))
				return err
			})
		}
		if err != nil {
			log.Warn("redirect failures are not watched: frames a device refuses after the XDP redirect are lost unnoticed, "+
				"and flows toward it are not moved to userspace", zap.Error(err))
		} else {
			f.mu.Lock()
			f.mon = mon
			f.mu.Unlock()
		}
		// After the monitor: a device re-created from now on is handed
		// to it.
		if nsErr != nil {
			err = nsErr
		} else if len(ifaces) > 0 {
			err = f.watchLinks(ns)
		}
		if nsErr == nil {
			ns.Close()
		}
		if err != nil && len(ifaces) > 0 {
			log.Warn("interfaces are not followed: one deleted and re-created goes without XDP until relayd restarts", zap.Error(err))
		}
	}()
	return f, nil
}

// loadSpec returns the program's collection spec; tests replace it.
var loadSpec = loadRelay

// load loads the collection. With pin set, maps are taken over from (or
// pinned to) f.dir; without it they are private (tests).
func (f *Fastpath) load(pin bool) error {
	spec, err := loadSpec()
	if err != nil {
		return fmt.Errorf("load BPF spec: %w", err)
	}
	spec.Maps["flows"].MaxEntries = uint32(f.cfg.MaxFlows)
	spec.Maps["stats"].MaxEntries = uint32(f.cfg.MaxFlows)
	if f.routeSlots, err = sizeRouteCache(spec, f.cfg.MaxFlows); err != nil {
		return err
	}
	f.slots = f.cfg.slotAlloc()
	if err := spec.Variables["slot_port_base"].Set(f.slots.base); err != nil {
		return err
	}
	opts := &ebpf.CollectionOptions{}
	if x := f.cfg.XSK; x != nil {
		opts.MapReplacements = map[string]*ebpf.Map{"xsk_steer": x.Steer, "xsks": x.Sockets, "xsk_devs": x.Devices}
		for name, m := range opts.MapReplacements {
			spec.Maps[name].MaxEntries = m.MaxEntries()
		}
		if err := spec.Variables["xsk_devices"].Set(uint32(x.NumDevices)); err != nil {
			return err
		}
		var meta uint32
		if x.ReceiveTime {
			meta = 1
		}
		if err := spec.Variables["xsk_meta"].Set(meta); err != nil {
			return err
		}
	}
	if pin {
		opts.Maps.PinPath = f.dir
	} else {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
	}
	var old *oldCounters
	if pin {
		if old, err = takeOldCounters(f.dir, spec.Maps["counters"].MaxEntries); err != nil {
			return err
		}
	}
	// cilium/ebpf unpins the maps it created when a program is refused;
	// New removes the directory it made.
	if err := spec.LoadAndAssign(&f.objs, opts); err != nil {
		if rerr := old.restore(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return fmt.Errorf("take over maps pinned in %s (max_flows changed?): %w; run relayd -detach first", f.dir, err)
		}
		return explainLoad(err)
	}
	if err := old.moveTo(f.objs.Counters); err != nil {
		f.log.Warn("global counters of the previous run not carried over", zap.Error(err))
	}
	if f.ports, err = mapPortTable(f.objs.PortFlows.FD()); err != nil {
		f.objs.Close()
		return err
	}
	if pin {
		path := filepath.Join(f.dir, "prog")
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			f.ports.close()
			f.objs.Close()
			return fmt.Errorf("replace pinned program: %w", err)
		}
		if err := f.objs.RelayXdp.Pin(path); err != nil {
			f.ports.close()
			f.objs.Close()
			return fmt.Errorf("pin program: %w", err)
		}
	}
	return nil
}

// oldCounters are the global counters a previous relayd pinned in a map of
// another size (one with fewer counters): the new program gets a new map,
// which takes over their values, so /metrics counts on across the
// upgrade. The old program keeps its map until its links move to the new
// one.
type oldCounters struct {
	m      *ebpf.Map
	path   string
	values [][]relayCounter // by counter, per CPU
}

// takeOldCounters unpins the counters map in dir when its size is not
// slots, and returns it with its values; nil when there is none or it
// fits.
func takeOldCounters(dir string, slots uint32) (*oldCounters, error) {
	path := filepath.Join(dir, "counters")
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the pinned counters map: %w", err)
	}
	if m.MaxEntries() == slots {
		m.Close()
		return nil, nil
	}
	o := &oldCounters{m: m, path: path}
	for i := range min(m.MaxEntries(), slots) {
		var per []relayCounter
		if err := m.Lookup(i, &per); err != nil {
			m.Close()
			return nil, fmt.Errorf("read pinned counter %d: %w", i, err)
		}
		o.values = append(o.values, per)
	}
	if err := m.Unpin(); err != nil {
		m.Close()
		return nil, fmt.Errorf("replace the pinned counters map: %w", err)
	}
	return o, nil
}

// restore pins the old map back: the new program was refused, and the
// previous run's state stays as it was.
func (o *oldCounters) restore() error {
	if o == nil {
		return nil
	}
	defer o.m.Close()
	if err := o.m.Pin(o.path); err != nil {
		return fmt.Errorf("pin the previous counters map back: %w", err)
	}
	return nil
}

// moveTo writes the old values into the new map and lets the old go.
func (o *oldCounters) moveTo(m *ebpf.Map) error {
	if o == nil {
		return nil
	}
	defer o.m.Close()
	for i, per := range o.values {
		if err := m.Put(uint32(i), per); err != nil {
			return fmt.Errorf("counter %d: %w", i, err)
		}
	}
	return nil
}

// adopt rebuilds the slot allocator from the flows a previous run left.
func (f *Fastpath) adopt() error {
	flows, err := f.dumpFlows()
	if err != nil {
		return err
	}
	now := f.cfg.now()
	for _, e := range flows {
		f.slots.take(e.v.StatsIdx)
		f.installed[e.k] = installedFlow{at: now.UnixNano(), slot: e.v.StatsIdx}
	}
	f.adoptLoops(flows)
	for i := range flows {
		f.ports.install(&flows[i].k, &flows[i].v)
	}
	if len(flows) > 0 {
		f.log.Info("adopted pinned flows", zap.Int("flows", len(flows)), zap.String("pin_path", f.dir))
	}
	for _, e := range flows {
		fl := flowOf(e.k, e.v)
		f.shadow(&fl)
	}
	return nil
}

// shadow installs fl in the punt relay, if there is one.
func (f *Fastpath) shadow(fl *dataplane.Flow) {
	if f.cfg.Punt == nil || (fl.Action != dataplane.Forward && fl.Action != dataplane.Reflect) {
		return
	}
	if err := f.cfg.Punt.InstallShadow(fl); err != nil {
		f.log.Warn("punted packets of this flow will not be relayed", zap.Stringer("match", fl.Match), zap.Error(err))
	}
}

func (f *Fastpath) linkPath(name string) string { return filepath.Join(f.dir, "link_"+name) }

func (f *Fastpath) attach(name string) error {
	iface, l, err := f.attachIface(name)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.ifaces = append(f.ifaces, ifaceState{Interface: iface})
	f.links = append(f.links, l)
	f.mu.Unlock()
	return nil
}

// attachIface attaches the program to interface name (or takes over its
// pinned link) and makes it an egress of the redirect map.
func (f *Fastpath) attachIface(name string) (dataplane.Interface, link.Link, error) {
	nl, err := netlink.LinkByName(name)
	if err != nil {
		return dataplane.Interface{}, nil, fmt.Errorf("interface %s: %w", name, err)
	}
	attrs := nl.Attrs()
	if max := f.objs.TxPorts.MaxEntries(); uint32(attrs.Index) >= max {
		return dataplane.Interface{}, nil, fmt.Errorf("interface %s: ifindex %d is beyond the redirect map (%d entries)", name, attrs.Index, max)
	}
	iface := dataplane.Interface{Name: name, Index: attrs.Index}
	log := f.log.With(zap.String("interface", name))

	var l link.Link
	path := f.linkPath(name)
	old, err := f.adoptLink(path, name, attrs.Index, log)
	if err != nil {
		return dataplane.Interface{}, nil, err
	}
	if old != nil {
		l = old
		iface.Adopted = true
	} else {
		flags := link.XDPDriverMode
		if f.cfg.XDPMode == "generic" {
			flags = link.XDPGenericMode
		}
		l, err = link.AttachXDP(link.XDPOptions{Program: f.objs.RelayXdp, Interface: attrs.Index, Flags: flags})
		if err != nil && flags == link.XDPDriverMode {
			log.Warn("native XDP unavailable, falling back to generic (slower)", zap.Error(err))
			l, err = link.AttachXDP(link.XDPOptions{Program: f.objs.RelayXdp, Interface: attrs.Index, Flags: link.XDPGenericMode})
		}
		if err != nil {
			return dataplane.Interface{}, nil, fmt.Errorf("attach XDP to %s: %w", name, err)
		}
		if err := l.Pin(path); err != nil {
			l.Close()
			return dataplane.Interface{}, nil, fmt.Errorf("pin link of %s: %w", name, err)
		}
	}
	iface.Mode = "native"
	if nl2, err := netlink.LinkByIndex(attrs.Index); err == nil && nl2.Attrs().Xdp != nil && nl2.Attrs().Xdp.AttachMode == xdpAttachedSKB {
		iface.Mode = "generic"
	}
	if err := f.objs.TxPorts.Put(uint32(attrs.Index), relayBpfDevmapVal{Ifindex: uint32(attrs.Index)}); err != nil {
		l.Close()
		return dataplane.Interface{}, nil, fmt.Errorf("add %s to the redirect map: %w", name, err)
	}
	f.checkForwarding(name, log)
	log.Info("XDP attached", zap.Int("ifindex", attrs.Index), zap.String("mode", iface.Mode),
		zap.Int("mtu", attrs.MTU), zap.Bool("adopted", iface.Adopted))
	return iface, l, nil
}

// adoptLink takes over the link pinned at path for interface name (index
// ifindex), putting the new program on it: forwarding never stops. It
// returns nil, nil when there is no pinned link, or when the pinned one
// cannot be kept and was removed: severed (the interface was deleted and
// re-created while relayd was stopped) or attached to another ifindex. The
// caller then attaches afresh; the maps, and so every pinned flow, stay.
func (f *Fastpath) adoptLink(path, name string, ifindex int, log *zap.Logger) (link.Link, error) {
	old, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load pinned link %s: %w", path, err)
	}
	var stale string
	const severed = "severed: the interface was deleted (and re-created)"
	if info, err := old.Info(); err == nil && info.XDP() != nil && int(info.XDP().Ifindex) != ifindex {
		stale = fmt.Sprintf("pinned for ifindex %d, the interface now has %d", info.XDP().Ifindex, ifindex)
		if info.XDP().Ifindex == 0 {
			stale = severed
		}
	} else if err := old.Update(f.objs.RelayXdp); errors.Is(err, unix.ENOLINK) {
		stale = severed
	} else if err != nil {
		old.Close()
		return nil, fmt.Errorf("replace program on %s: %w", name, err)
	} else {
		return old, nil
	}
	// Unpinning drops the last reference: a link still attached elsewhere
	// (an ifindex now another device's) detaches from it.
	if err := old.Unpin(); err != nil {
		old.Close()
		return nil, fmt.Errorf("remove stale pinned link of %s (%s): %w", name, stale, err)
	}
	old.Close()
	log.Warn("replacing the stale pinned XDP link with a fresh attachment; pinned flows are kept",
		zap.String("reason", stale), zap.String("pin", path))
	return nil, nil
}

// checkForwarding warns when forwarding is off on an interface: the fib
// lookup then fails and every packet is punted. It turns it on when
// configured to.
func (f *Fastpath) checkForwarding(name string, log *zap.Logger) {
	for _, p := range []string{
		"/proc/sys/net/ipv4/conf/" + name + "/forwarding",
		"/proc/sys/net/ipv6/conf/" + name + "/forwarding",
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			log.Warn("cannot read forwarding sysctl", zap.String("path", p), zap.Error(err))
			continue
		}
		if strings.TrimSpace(string(b)) != "0" {
			continue
		}
		if f.cfg.EnableForwarding {
			if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
				log.Error("cannot enable forwarding", zap.String("path", p), zap.Error(err))
				continue
			}
			log.Info("enabled forwarding", zap.String("sysctl", p))
			continue
		}
		log.Warn("forwarding is off: XDP fib lookups fail and packets are punted to the kernel; set dataplane.enable_forwarding or the sysctl",
			zap.String("sysctl", p))
	}
}

// detachStale removes pinned links of interfaces no longer configured.
func (f *Fastpath) detachStale() error {
	want := make(map[string]bool)
	for _, n := range f.cfg.Interfaces {
		want[n] = true
	}
	ents, err := os.ReadDir(f.dir)
	if err != nil {
		return fmt.Errorf("read pin directory: %w", err)
	}
	for _, e := range ents {
		name, ok := strings.CutPrefix(e.Name(), "link_")
		if !ok || want[name] {
			continue
		}
		if err := unpinLink(filepath.Join(f.dir, e.Name())); err != nil {
			return err
		}
		f.log.Info("detached XDP from interface no longer configured", zap.String("interface", name))
	}
	return nil
}

func unpinLink(path string) error {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		// A link whose device is gone cannot be loaded; the pin is all
		// that is left of it.
		if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("remove pinned link %s: %w", path, errors.Join(err, rerr))
		}
		return nil
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpin link %s: %w", path, err)
	}
	return nil
}

// Close releases this process's handles. Pinned links keep the program
// attached and forwarding; the next New takes over.
func (f *Fastpath) Close() error {
	if f.monDone != nil {
		<-f.monDone
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	var errs []error
	if f.lw != nil {
		// Not under mu: a re-attachment under way takes it.
		f.mu.Unlock()
		f.lw.Close()
		f.mu.Lock()
	}
	if f.mon != nil {
		errs = append(errs, f.mon.close())
	}
	if f.routes != nil {
		errs = append(errs, f.routes.close())
	}
	for _, l := range f.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, f.ports.close(), f.objs.Close())
	return errors.Join(errs...)
}

// Detach removes every link, program and map pinned under pinPath (all
// layout versions): forwarding stops and all flows are gone.
func Detach(pinPath string, log *zap.Logger) error {
	if pinPath == "" {
		pinPath = DefaultPinPath
	}
	vers, err := os.ReadDir(pinPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", pinPath, err)
	}
	var errs []error
	for _, v := range vers {
		// Only layout directories (v1, v2, ...): a bpffs root also holds
		// the kernel's own maps.debug and progs.debug.
		if !v.IsDir() || !isLayoutDir(v.Name()) {
			continue
		}
		dir := filepath.Join(pinPath, v.Name())
		ents, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "link_") {
				if err := unpinLink(filepath.Join(dir, e.Name())); err != nil {
					errs = append(errs, err)
					continue
				}
				log.Info("detached XDP", zap.String("interface", strings.TrimPrefix(e.Name(), "link_")))
			}
		}
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), "link_") {
				if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
		if err := os.Remove(dir); err != nil {
			errs = append(errs, err)
		}
	}
	// The directory itself goes unless it is a mount point or not empty.
	if err := os.Remove(pinPath); err != nil && !errors.Is(err, os.ErrNotExist) &&
		!errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.ENOTEMPTY) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func isLayoutDir(name string) bool {
	n, ok := strings.CutPrefix(name, "v")
	if !ok {
		return false
	}
	_, err := strconv.Atoi(n)
	return err == nil
}

// Path implements dataplane.DataPlane.
func (f *Fastpath) Path() dataplane.Path { return dataplane.PathXDP }

// Interfaces implements dataplane.Observer.
func (f *Fastpath) Interfaces() []dataplane.Interface {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]dataplane.Interface, len(f.ifaces))
	for i := range f.ifaces {
		out[i] = f.ifaces[i].Interface
		out[i].Gone = f.ifaces[i].gone
	}
	return out
}

// Egress implements dataplane.EgressObserver: nil when the redirect
// monitor does not run.
func (f *Fastpath) Egress() []dataplane.Egress {
	f.mu.Lock()
	mon := f.mon
	f.mu.Unlock()
	if mon == nil {
		return nil
	}
	return mon.egress()
}

// Counters implements dataplane.Observer: the global counters summed over
// CPUs.
func (f *Fastpath) Counters() ([]dataplane.Counter, error) {
	out := make([]dataplane.Counter, 0, len(counterInfo))
	var per []relayCounter
	for i, ci := range counterInfo {
		if err := f.objs.Counters.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("read counter %s/%s: %w", ci.Verdict, ci.Reason, err)
		}
		c := dataplane.Counter{Verdict: ci.Verdict, Reason: ci.Reason}
		for _, p := range per {
			c.Packets += p.Packets
			c.Bytes += p.Bytes
		}
		out = append(out, c)
	}
	return out, nil
}

func keyOf(ap netip.AddrPort) flowKey {
	var k flowKey
	k.Family, k.Addr, k.Port = flowkey.Parts(ap)
	return k
}

func addrPortOf(family uint8, addr [16]uint8, port uint16) netip.AddrPort {
	var a netip.Addr
	if family == unix.AF_INET {
		a = netip.AddrFrom4([4]byte(addr[:4]))
	} else {
		a = netip.AddrFrom16(addr)
	}
	return netip.AddrPortFrom(a, ntohs(port))
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
func ntohs(v uint16) uint16 { return v<<8 | v>>8 }

func addrBytes(a netip.Addr) [16]uint8 {
	a = a.Unmap()
	var b [16]uint8
	if a.Is4() {
		v := a.As4()
		copy(b[:], v[:])
		return b
	}
	return a.As16()
}

func valueOf(fl *dataplane.Flow, slot uint32) relayFlowValue {
	v := relayFlowValue{
		Id:        fl.ID,
		StatsIdx:  slot,
		ClockRate: fl.ClockRate,
		TicksMult: dataplane.TicksMult(fl.ClockRate),
		Action:    uint8(fl.Action),
		Owner:     uint8(fl.Owner),
	}
	if fl.SendTo.IsValid() {
		v.Family = unix.AF_INET6
		if fl.SendTo.Addr().Unmap().Is4() {
			v.Family = unix.AF_INET
		}
		v.SrcAddr = addrBytes(fl.SendFrom.Addr())
		v.SrcPort = htons(fl.SendFrom.Port())
		v.DstAddr = addrBytes(fl.SendTo.Addr())
		v.DstPort = htons(fl.SendTo.Port())
	}
	if fl.Latch {
		// The userspace shadow learns the source; until it is locked the
		// program hands the flow's packets over.
		v.Flags |= uint8(relayFlowFlagsFLOW_F_LATCH)
		v.Action = uint8(dataplane.Userspace)
	}
	if fl.ExpectSource.IsValid() && !fl.Latch {
		v.Flags |= uint8(relayFlowFlagsFLOW_F_EXPECT_ADDR)
		if fl.ExpectSource.Port() != 0 {
			v.Flags |= uint8(relayFlowFlagsFLOW_F_EXPECT_PORT)
		}
	}
	if fl.ExpectSource.IsValid() {
		v.ExpectAddr = addrBytes(fl.ExpectSource.Addr())
		v.ExpectPort = htons(fl.ExpectSource.Port())
	}
	if fl.RateCap.PPS != 0 {
		v.RateMult = rateMult(fl.RateCap.PPS)
		v.RateBurst = uint16(fl.RateCap.Burst)
	}
	return v
}

// rateMult is the program's refill factor for a cap of pps packets per
// second: tokens of 2^-16 packet per nanosecond, times 2^24 (rounded), so
// that elapsed ns * rateMult >> 24 is the refill. Under 2^32 for
// dataplane.MaxRatePPS; the rounding is under 0.0005 packets per second.
func rateMult(pps uint32) uint32 { return uint32((uint64(pps)<<40 + 5e8) / 1e9) }

// rateOf inverts rateMult (the steps of rateMult are over 1,000 apart).
func rateOf(mult uint32) uint32 { return uint32((uint64(mult)*1e9 + 1<<39) >> 40) }

func flowOf(k flowKey, v relayFlowValue) dataplane.Flow {
	fl := dataplane.Flow{
		ID:        v.Id,
		Match:     addrPortOf(k.Family, k.Addr, k.Port),
		Action:    dataplane.Action(v.Action),
		ClockRate: v.ClockRate,
		Owner:     dataplane.Owner(v.Owner),
	}
	if v.Family != 0 {
		fl.SendFrom = addrPortOf(v.Family, v.SrcAddr, v.SrcPort)
		fl.SendTo = addrPortOf(v.Family, v.DstAddr, v.DstPort)
	}
	if v.Flags&uint8(relayFlowFlagsFLOW_F_EXPECT_ADDR) != 0 || v.Flags&uint8(relayFlowFlagsFLOW_F_LATCH) != 0 {
		if v.ExpectAddr != ([16]uint8{}) {
			fl.ExpectSource = addrPortOf(k.Family, v.ExpectAddr, v.ExpectPort)
		}
	}
	if v.Flags&uint8(relayFlowFlagsFLOW_F_LATCH) != 0 {
		fl.Latch = true
		fl.Action = dataplane.Forward
	}
	if v.RateMult != 0 {
		fl.RateCap = dataplane.RateCap{PPS: rateOf(v.RateMult), Burst: uint32(v.RateBurst)}
	}
	return fl
}

// Install implements dataplane.DataPlane.
func (f *Fastpath) Install(fl dataplane.Flow) error { return f.InstallShared(&fl) }

// InstallShared implements dataplane.SharedInstaller: the flow's shadow
// keeps fl.
func (f *Fastpath) InstallShared(fl *dataplane.Flow) error {
	if err := fl.Validate(); err != nil {
		return err
	}
	if fl.NeedsUserspace() {
		return fmt.Errorf("SRTP, transcoding and terminated RTCP run in userspace: %w", dataplane.ErrNotSupported)
	}
	k := keyOf(fl.Match)
	f.resolve(fl)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	slot, ok := f.slots.alloc(fl.Match.Port())
	if !ok {
		return dataplane.ErrFull
	}
	// A fresh slot starts from zero whatever its previous flow left.
	if err := f.objs.Stats.Update(&slot, &zeroStats, ebpf.UpdateLock); err != nil {
		f.slots.release(slot)
		return fmt.Errorf("reset flow statistics: %w", err)
	}
	v := valueOf(fl, slot)
	f.markLoop(k, &v)
	_, exists := f.installed[k]
	if !exists {
		// The flows that send to k loop once it is installed: flagged
		// before.
		if err := f.loopsTo(k, true); err != nil {
			f.slots.release(slot)
			return errors.Join(fmt.Errorf("install flow %s: %w", fl.Match, err), f.loopsTo(k, false))
		}
	}
	if err := f.objs.Flows.Update(&k, &v, ebpf.UpdateNoExist); err != nil {
		f.slots.release(slot)
		if !exists && !errors.Is(err, ebpf.ErrKeyExist) {
			err = errors.Join(err, f.loopsTo(k, false))
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyExist):
			return dataplane.ErrExists
		case errors.Is(err, unix.E2BIG), errors.Is(err, unix.ENOMEM):
			return dataplane.ErrFull
		}
		return fmt.Errorf("install flow %s: %w", fl.Match, err)
	}
	f.installed[k] = installedFlow{at: f.cfg.now().UnixNano(), slot: slot}
	f.loops.set(k, &v)
	f.ports.install(&k, &v)
	f.shadow(fl)
	return nil
}

// lookupFlow reads k's entry of the flow map into v and reports whether
// it is there.
func (f *Fastpath) lookupFlow(k *flowKey, v *relayFlowValue) bool {
	return f.objs.Flows.Lookup(k, v) == nil
}

var errClosed = errors.New("fastpath closed")

// installedFlow is what the Fastpath keeps of an installed flow besides
// the map entry: when it was installed or adopted (Unix ns), and its
// statistics slot, so that an update writes the entry without reading it
// first.
type installedFlow struct {
	at   int64
	slot uint32
}

// zeroStats is a fresh slot's statistics. The maps' keys and values are
// passed by pointer: cilium/ebpf then hands their memory to the kernel as
// it is, where a value would be encoded by reflection (encoding/binary),
// allocating, at every install, update and removal.
var zeroStats relayFlowStats

// resolve resolves the next hop of a forwarded flow before its first
// packet, so that packet is not punted for want of a neighbour entry.
func (f *Fastpath) resolve(fl *dataplane.Flow) {
	if f.cfg.NeighbourWait < 0 || fl.Action != dataplane.Forward {
		return
	}
	dst := fl.SendTo.Addr()
	now := f.cfg.now()
	f.nhMu.Lock()
	at, seen := f.nh[dst]
	f.nhMu.Unlock()
	if seen && now.Sub(at) < nhFresh {
		return
	}
	nh, ok, err := resolveNeighbour(dst, f.cfg.NeighbourWait)
	if err == nil && ok {
		f.nhMu.Lock()
		if f.nh == nil || len(f.nh) > 1<<16 {
			f.nh = make(map[netip.Addr]time.Time) // bounded: start afresh
		}
		f.nh[dst] = now
		f.nhMu.Unlock()
	}
	switch {
	case err != nil:
		f.log.Warn("cannot resolve next hop of flow", zap.Stringer("match", fl.Match), zap.Stringer("send_to", fl.SendTo), zap.Error(err))
	case !ok:
		f.log.Info("next hop not resolved yet; first packets may be punted", zap.Stringer("match", fl.Match), zap.Stringer("next_hop", nh))
	}
}

// Update implements dataplane.DataPlane: the flow keeps its statistics.
func (f *Fastpath) Update(fl dataplane.Flow) error { return f.UpdateShared(&fl) }

// UpdateShared implements dataplane.SharedInstaller: the flow's shadow
// keeps fl.
func (f *Fastpath) UpdateShared(fl *dataplane.Flow) error {
	if err := fl.Validate(); err != nil {
		return err
	}
	if fl.NeedsUserspace() {
		return fmt.Errorf("SRTP, transcoding and terminated RTCP run in userspace: %w", dataplane.ErrNotSupported)
	}
	k := keyOf(fl.Match)
	f.resolve(fl)
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.installed[k]
	if !ok {
		return dataplane.ErrNotFound
	}
	v := valueOf(fl, in.slot)
	f.markLoop(k, &v)
	if err := f.objs.Flows.Update(&k, &v, ebpf.UpdateExist); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return dataplane.ErrNotFound
		}
		return fmt.Errorf("update flow %s: %w", fl.Match, err)
	}
	f.ports.update(&k, &v)
	f.loops.set(k, &v)
	if f.cfg.Punt != nil {
		if err := f.cfg.Punt.UpdateShadow(fl); err != nil {
			f.cfg.Punt.RemoveShadow(fl.Match)
			f.shadow(fl)
		}
	}
	return nil
}

// Remove implements dataplane.DataPlane.
func (f *Fastpath) Remove(match netip.AddrPort) (dataplane.Stats, error) {
	k := keyOf(match)
	f.mu.Lock()
	defer f.mu.Unlock()
	var v relayFlowValue
	// The program finds the flow in the flow map until it goes from there.
	// Another flow on its port takes its entry.
	f.ports.remove(&k, f.lookupFlow)
	if err := f.objs.Flows.LookupAndDelete(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return dataplane.Stats{}, dataplane.ErrNotFound
		}
		// Hash maps gained LookupAndDelete in 5.14; fall back.
		if err2 := f.objs.Flows.Lookup(&k, &v); err2 != nil {
			return dataplane.Stats{}, fmt.Errorf("look up flow %s: %w", match, err2)
		}
		if err2 := f.objs.Flows.Delete(&k); err2 != nil {
			return dataplane.Stats{}, fmt.Errorf("remove flow %s: %w", match, err2)
		}
	}
	delete(f.installed, k)
	f.loops.remove(k)
	// The flows that sent to k loop no more: cleared after it went.
	if err := f.loopsTo(k, false); err != nil {
		f.log.Warn("flows toward a removed flow's match stay flagged as loops: their packets are dropped",
			zap.Stringer("match", match), zap.Error(err))
	}
	st, err := f.readStats(v.StatsIdx)
	f.slots.release(v.StatsIdx)
	if f.cfg.Punt != nil {
		if sh, err := f.cfg.Punt.RemoveShadow(match); err == nil {
			st.Add(sh)
		}
	}
	return st, err
}

// Stats implements dataplane.DataPlane.
func (f *Fastpath) Stats(match netip.AddrPort) (dataplane.Stats, error) {
	var v relayFlowValue
	if err := f.objs.Flows.Lookup(new(keyOf(match)), &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return dataplane.Stats{}, dataplane.ErrNotFound
		}
		return dataplane.Stats{}, fmt.Errorf("look up flow %s: %w", match, err)
	}
	st, err := f.readStats(v.StatsIdx)
	if err == nil && f.cfg.Punt != nil {
		if sh, err := f.cfg.Punt.ShadowStat(match); err == nil {
			st.Add(sh)
		}
	}
	return st, err
}

func (f *Fastpath) readStats(slot uint32) (dataplane.Stats, error) {
	var s relayFlowStats
	if err := f.objs.Stats.LookupWithFlags(&slot, &s, ebpf.LookupLock); err != nil {
		return dataplane.Stats{}, fmt.Errorf("read flow statistics: %w", err)
	}
	return convertStats(&s, monoNow(), f.cfg.now()), nil
}

// monoNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns, without
// a system call (x/sys/unix's ClockGettime makes one; it ran at every
// flow's removal): the Go runtime's monotonic clock is CLOCK_MONOTONIC
// read through the vDSO, so the time since monoRef was taken, added to
// the clock's reading then, is the clock's reading now. The reading is
// taken after monoRef's time.Now, so monoNow is never behind the clock (a
// packet's bpf_ktime_get_ns is never after it), and ahead by at most the
// time between the two: the closest pair of a few tries, a microsecond or
// less.
func monoNow() uint64 { return monoRef.ns + uint64(time.Since(monoRef.at)) }

var monoRef = func() (r struct {
	at time.Time
	ns uint64
}) {
	gap := time.Duration(math.MaxInt64)
	for range 5 {
		at := time.Now()
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		if d := time.Since(at); d < gap {
			gap, r.at, r.ns = d, at, uint64(ts.Nano())
		}
	}
	return r
}()

func convertStats(s *relayFlowStats, mono uint64, wall time.Time) dataplane.Stats {
	st := dataplane.Stats{
		Packets: s.Packets,
		Bytes:   s.Bytes,
		Dropped: s.Dropped,
	}
	if s.LastSeenNs != 0 {
		st.LastSeen = wall
		if s.LastSeenNs < mono {
			st.LastSeen = wall.Add(-time.Duration(mono - s.LastSeenNs))
		}
	}
	if s.Initialized != 0 {
		ext := s.Cycles + uint32(s.MaxSeq)
		st.SSRC = s.Ssrc
		st.ExtHighestSeq = ext
		st.BaseSeq = s.BaseSeq
		st.Received = s.Received
		st.Lost = int64(ext) - int64(s.BaseSeq) + 1 - int64(s.Received)
		st.Jitter = s.Jitter16 >> 4
		st.SSRCChanges = s.SsrcChanges
	}
	return st
}

type flowEntry struct {
	k flowKey
	v relayFlowValue
}

// dumpFlows reads the whole flow map in batches.
func (f *Fastpath) dumpFlows() ([]flowEntry, error) {
	f.mu.Lock()
	out := make([]flowEntry, 0, len(f.installed))
	f.mu.Unlock()
	err := f.walkFlows(func(k *flowKey, v *relayFlowValue) { out = append(out, flowEntry{*k, *v}) })
	return out, err
}

// walkFlows calls fn with every entry of the flow map, read in batches
// (entry by entry on kernels without batch lookups of hash maps).
func (f *Fastpath) walkFlows(fn func(k *flowKey, v *relayFlowValue)) error {
	// Batches as large as the flows, up to 4096; never under 256, which a
	// hash bucket (a batch's unit) does not outgrow.
	f.mu.Lock()
	chunk := min(4096, max(256, len(f.installed)+64))
	f.mu.Unlock()
	keys := make([]flowKey, chunk)
	vals := make([]relayFlowValue, chunk)
	var cursor ebpf.MapBatchCursor
	seen := false
	for {
		n, err := f.objs.Flows.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			fn(&keys[i], &vals[i])
		}
		seen = seen || n > 0
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) && !seen {
			entries, err := f.iterateFlows()
			for i := range entries {
				fn(&entries[i].k, &entries[i].v)
			}
			return err
		}
		if err != nil {
			return fmt.Errorf("read flow map: %w", err)
		}
	}
}

func (f *Fastpath) iterateFlows() ([]flowEntry, error) {
	var out []flowEntry
	var e flowEntry
	it := f.objs.Flows.Iterate()
	for it.Next(&e.k, &e.v) {
		out = append(out, e)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate flow map: %w", err)
	}
	return out, nil
}

// slotStats are the statistics of the slots in use (readSlots).
type slotStats struct {
	all []relayFlowStats           // slots [0, n), read in batches
	one map[uint32]*relayFlowStats // or each slot in use, read alone
}

// of returns slot's statistics; nil when they were not read.
func (s *slotStats) of(slot uint32) *relayFlowStats {
	if s.one != nil {
		return s.one[slot]
	}
	if int(slot) < len(s.all) {
		return &s.all[slot]
	}
	return nil
}

// sparseSlots: when the slots in use are fewer than one in sparseSlots
// of those up to the highest, readSlots reads them one at a time (a
// system call each, 1-2 µs) rather than every slot up to the highest in
// batches (0.2-0.3 µs a slot). Slots follow the relay ports: a few calls'
// flows can have slots thousands apart.
const sparseSlots = 8

// readSlots reads the statistics of slots, each under its lock.
func (f *Fastpath) readSlots(slots []uint32) (slotStats, error) {
	var n uint32
	for _, s := range slots {
		n = max(n, s+1)
	}
	if uint64(len(slots))*sparseSlots >= uint64(n) {
		all, err := f.readAllStats(n)
		return slotStats{all: all}, err
	}
	buf := make([]relayFlowStats, len(slots))
	one := make(map[uint32]*relayFlowStats, len(slots))
	for i, s := range slots {
		if err := f.objs.Stats.LookupWithFlags(&s, &buf[i], ebpf.LookupLock); err != nil {
			return slotStats{}, fmt.Errorf("read flow statistics: %w", err)
		}
		one[s] = &buf[i]
	}
	return slotStats{one: one}, nil
}

// readAllStats reads the stats slots [0, n) in batches, under each slot's lock.
func (f *Fastpath) readAllStats(n uint32) ([]relayFlowStats, error) {
	// The batches go straight into out; keys are the kernel's scratch.
	out := make([]relayFlowStats, n)
	const chunk = 4096
	keys := make([]uint32, min(int(n), chunk))
	var cursor ebpf.MapBatchCursor
	got := 0
	for got < int(n) {
		want := min(int(n)-got, chunk)
		c, err := f.objs.Stats.BatchLookup(&cursor, keys[:want], out[got:got+want], &ebpf.BatchOptions{ElemFlags: uint64(ebpf.LookupLock)})
		got += c
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read flow statistics: %w", err)
		}
	}
	return out[:got], nil
}

// List implements dataplane.DataPlane: the flow map and the statistics
// array (up to the highest slot in use) are each read in batches, or the
// slots in use alone when they are few (readSlots).
func (f *Fastpath) List() ([]dataplane.FlowStats, error) {
	flows, err := f.dumpFlows()
	if err != nil {
		return nil, err
	}
	slots := make([]uint32, len(flows)) // the slots in use: flows installed since have none counted
	for i := range flows {
		slots[i] = flows[i].v.StatsIdx
	}
	stats, err := f.readSlots(slots)
	if err != nil {
		return nil, err
	}
	var shadows map[netip.AddrPort]dataplane.Stats
	if f.cfg.Punt != nil {
		if shadows, err = f.cfg.Punt.ShadowStats(); err != nil {
			f.log.Warn("read punted packet counters", zap.Error(err))
		}
	}
	mono, wall := monoNow(), f.cfg.now()
	out := make([]dataplane.FlowStats, 0, len(flows))
	for _, e := range flows {
		fs := dataplane.FlowStats{Flow: flowOf(e.k, e.v)}
		if st := stats.of(e.v.StatsIdx); st != nil {
			fs.Stats = convertStats(st, mono, wall)
		}
		fs.Stats.Add(shadows[fs.Flow.Match])
		out = append(out, fs)
	}
	return out, nil
}

var _ dataplane.StatsReader = (*Fastpath)(nil)

// EachStats implements dataplane.StatsReader: List's statistics, read
// in the same order (the flow map, then the statistics slots), without
// building the flows.
func (f *Fastpath) EachStats(fn func(match netip.AddrPort, st dataplane.Stats)) error {
	type slotOf struct {
		match netip.AddrPort
		slot  uint32
	}
	f.mu.Lock()
	flows := make([]slotOf, 0, len(f.installed))
	slots := make([]uint32, 0, len(f.installed)) // the slots in use
	f.mu.Unlock()
	err := f.walkFlows(func(k *flowKey, v *relayFlowValue) {
		flows = append(flows, slotOf{addrPortOf(k.Family, k.Addr, k.Port), v.StatsIdx})
		slots = append(slots, v.StatsIdx)
	})
	if err != nil {
		return err
	}
	stats, err := f.readSlots(slots)
	if err != nil {
		return err
	}
	var shadows map[netip.AddrPort]dataplane.Stats
	if f.cfg.Punt != nil {
		if shadows, err = f.cfg.Punt.ShadowStats(); err != nil {
			f.log.Warn("read punted packet counters", zap.Error(err))
		}
	}
	mono, wall := monoNow(), f.cfg.now()
	for _, e := range flows {
		var st dataplane.Stats
		if raw := stats.of(e.slot); raw != nil {
			st = convertStats(raw, mono, wall)
		}
		st.Add(shadows[e.match])
		fn(e.match, st)
	}
	return nil
}

// Sweep returns the flows that have carried no packet for idle: since their
// last packet, or since they were installed (or adopted) if they never did.
// It removes nothing; the caller decides.
func (f *Fastpath) Sweep(idle time.Duration) ([]dataplane.FlowStats, error) {
	all, err := f.List()
	if err != nil {
		return nil, err
	}
	now := f.cfg.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []dataplane.FlowStats
	for _, fs := range all {
		since := fs.Stats.LastSeen
		if in, ok := f.installed[keyOf(fs.Flow.Match)]; ok && since.IsZero() {
			since = time.Unix(0, in.at)
		}
		if !since.IsZero() && now.Sub(since) >= idle {
			out = append(out, fs)
		}
	}
	return out, nil
}

// xdpAttachedSKB is IFLA_XDP_ATTACHED's value for generic (SKB) mode.
const xdpAttachedSKB = 2

// ensureBPFFS checks that dir (or the nearest existing parent) is on a bpf
// filesystem, mounting one on /sys/fs/bpf when that is where it belongs and
// nothing is mounted there yet (systemd normally does this at boot).
func ensureBPFFS(dir string, log *zap.Logger) error {
	on, err := bpffs.On(dir)
	if err != nil {
		return err
	}
	if on {
		return nil
	}
	const root = bpffs.Root
	if dir != root && !strings.HasPrefix(dir, root+"/") {
		return fmt.Errorf("pin path %s is not on a bpf filesystem: mount one on it before relayd starts (mount -t bpf bpffs DIR), or pin under %s", dir, root)
	}
	// A bpffs mounted in a private mount namespace (a systemd service's,
	// with ProtectSystem= and friends) vanishes when relayd exits, taking
	// the pinned program, maps and links with it: media would stop at
	// every restart. It must be mounted in the host's namespace.
	const howto = "mount it in the host's mount namespace before relayd starts: systemd does at boot; " +
		"the unit's ExecStartPre=+relayd -prepare does it, or run mount -t bpf bpffs " + root
	if private, err := privateMountNS(root); err == nil && private {
		return fmt.Errorf("%s is not a bpf filesystem and relayd runs in a private mount namespace, where a mount "+
			"would vanish with the pinned state when relayd exits: %s", root, howto)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("create %s: %w; %s", root, err, howto)
	}
	if err := unix.Mount("bpffs", root, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpf filesystem on %s: %w; %s", root, err, howto)
	}
	log.Info("mounted bpf filesystem", zap.String("path", root))
	return nil
}

// privateMountNS reports whether a mount on dir would stay in relayd's
// own mount namespace: the namespace is not init's (PID 1's, when that can
// be read), or the mount under dir is a slave ("master:" in mountinfo), as
// in a systemd service with ProtectSystem=, PrivateMounts= and friends.
func privateMountNS(dir string) (bool, error) {
	var self, init unix.Stat_t
	if unix.Stat("/proc/thread-self/ns/mnt", &self) == nil && unix.Stat("/proc/1/ns/mnt", &init) == nil &&
		(self.Ino != init.Ino || self.Dev != init.Dev) {
		return true, nil
	}
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return false, err
	}
	best, slave := "", false
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options [optional...] - fs ...
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		mp := f[4]
		if mp != "/" && dir != mp && !strings.HasPrefix(dir, mp+"/") {
			continue
		}
		if len(mp) < len(best) {
			continue
		}
		best, slave = mp, false // later lines are mounted on top
		for _, o := range f[6:] {
			if o == "-" {
				break
			}
			if strings.HasPrefix(o, "master:") {
				slave = true
			}
		}
	}
	return slave, nil
}
