package fastpath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/internal/rtnl"
)

// The XDP program caches each flow's bpf_fib_lookup result (bpf/relay.c,
// struct route_entry). A cached result holds while the program's route
// generation (route_gen) does, and while relayd's lease on the cache
// (route_until) runs. routeWatch keeps both: it moves the generation on at
// every change of the kernel's state that a result depends on, and renews
// the lease; the program looks routes up afresh after either.
//
// Announced changes are rtnetlink events: routes, policy rules and
// nexthop objects (which route where), links (MTU, MAC, up or down),
// addresses (local routes), netconf (forwarding on a device) and
// neighbours. Of the neighbour events only those that take a valid entry
// away or change its MAC count: the common ones (an entry turning stale,
// probed, confirmed, or resolved for the first time) change no result a
// lookup could have cached, since only successful lookups are. What the
// kernel does not announce (a multipath hash policy changed by sysctl, say)
// is seen within routeRefresh: the generation moves on then too.

// routeRefresh is how often the generation moves on without an event, and
// the lease is renewed.
const routeRefresh = time.Second

// routeLease is how long the program trusts its cache after a renewal: if
// relayd stops renewing (stopped, killed, stuck), the cache turns itself
// off this long after the last renewal and every packet is looked up.
const routeLease = 3 * routeRefresh

// routeGroups are the rtnetlink groups whose events may change a lookup's
// result.
var routeGroups = []uint{
	unix.RTNLGRP_LINK, unix.RTNLGRP_NEIGH,
	unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
	unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE,
	unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE,
	unix.RTNLGRP_IPV4_NETCONF, unix.RTNLGRP_IPV6_NETCONF,
	unix.RTNLGRP_NEXTHOP,
}

// nudValid are the neighbour states bpf_fib_lookup accepts (NUD_VALID).
const nudValid = netlink.NUD_PERMANENT | netlink.NUD_NOARP | netlink.NUD_REACHABLE |
	netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE

// maxNeighbours bounds the neighbours routeWatch follows; the kernel's
// tables hold far fewer (gc_thresh3, 1,024 by default). An event of a
// neighbour it does not follow moves the generation on.
const maxNeighbours = 1 << 16

type neighKey struct {
	link int
	ip   netip.Addr
}

// routeGen is what routeWatch writes: the program's route_gen and
// route_until.
type routeGen struct {
	gen, until *ebpf.Variable
	n          uint32 // the generation last written
}

// bump moves the generation on and renews the lease.
func (g *routeGen) bump() error {
	g.n++
	if g.n == 0 {
		g.n = 1 // 0 is "off"
	}
	// Each is a single aligned store into the map's memory: the program
	// reads either the old or the new value, never a mix.
	if err := g.gen.Set(g.n); err != nil {
		return fmt.Errorf("route generation: %w", err)
	}
	until := uint64(monoNow()) + uint64(routeLease)
	if err := g.until.Set(until); err != nil {
		return fmt.Errorf("route cache lease: %w", err)
	}
	return nil
}

// off turns the cache off: every packet is looked up.
func (g *routeGen) off() error {
	return errors.Join(g.gen.Set(uint32(0)), g.until.Set(uint64(0)))
}

// routeWatch follows the kernel's routing state in one network namespace
// for the program's route cache.
type routeWatch struct {
	log     *zap.Logger
	ns      netns.NsHandle
	g       *routeGen
	refresh time.Duration
	sock    *nl.NetlinkSocket
	neigh   map[neighKey]string // valid neighbours and their MACs

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// startRouteWatch subscribes to the events of ns (which it keeps: the
// caller may close its handle), reads the neighbours it has and turns the
// cache on. Until it returns without an error the cache stays off. refresh
// is routeRefresh but in tests.
func startRouteWatch(g *routeGen, ns netns.NsHandle, refresh time.Duration, log *zap.Logger) (*routeWatch, error) {
	ns, err := rtnl.DupNS(ns)
	if err != nil {
		return nil, err
	}
	w := &routeWatch{log: log, ns: ns, g: g, refresh: refresh, stop: make(chan struct{}), done: make(chan struct{})}
	// Subscribed before the neighbours are read: a change in between is
	// in what is read or in an event after it.
	if w.sock, err = rtnl.Subscribe(ns, refresh, routeGroups...); err != nil {
		ns.Close()
		return nil, fmt.Errorf("routing events: %w", err)
	}
	// Room for a burst (a routing daemon installing a table): an overflow
	// costs a rescan of the neighbours and, until then, events.
	if err := w.sock.SetReceiveBufferSize(4<<20, true); err != nil {
		log.Debug("routing events: receive buffer stays the default", zap.Error(err))
	}
	if err := w.scanNeighbours(); err != nil {
		w.sock.Close()
		ns.Close()
		return nil, err
	}
	if err := g.bump(); err != nil {
		w.sock.Close()
		ns.Close()
		return nil, err
	}
	go w.run()
	return w, nil
}

// scanNeighbours reads the valid neighbours the program's lookups may use.
func (w *routeWatch) scanNeighbours() error {
	var h *netlink.Handle
	err := rtnl.InNamespace(w.ns, func() (err error) {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return fmt.Errorf("read neighbours: %w", err)
	}
	defer h.Close()
	w.neigh = make(map[neighKey]string)
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		ns, err := h.NeighList(0, family)
		if err != nil {
			return fmt.Errorf("read neighbours: %w", err)
		}
		for i := range ns {
			w.neighbour(&ns[i], false)
		}
	}
	return nil
}

// neighbour follows one neighbour event (or entry read) and reports
// whether a cached result may have used what it changed.
func (w *routeWatch) neighbour(n *netlink.Neigh, deleted bool) bool {
	if (n.Family != unix.AF_INET && n.Family != unix.AF_INET6) || n.Flags&unix.NTF_PROXY != 0 {
		return false // bridge forwarding entries, proxy entries: no lookup uses them
	}
	ip, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return false
	}
	k := neighKey{n.LinkIndex, ip.Unmap()}
	mac, known := w.neigh[k]
	if deleted || n.State&nudValid == 0 {
		delete(w.neigh, k)
		return known
	}
	if !known && len(w.neigh) >= maxNeighbours {
		return true // its previous state is unknown
	}
	w.neigh[k] = string(n.HardwareAddr)
	return known && mac != string(n.HardwareAddr)
}

func (w *routeWatch) run() {
	defer close(w.done)
	last := time.Now()
	for {
		msgs, _, err := w.sock.Receive()
		select {
		case <-w.stop:
			return
		default:
		}
		changed := false
		switch {
		case errors.Is(err, unix.EAGAIN): // a quiet refresh period
		case errors.Is(err, unix.ENOBUFS):
			// Events were lost: whatever they were, the neighbours are
			// read again and the cache starts over.
			w.log.Debug("routing events overflowed; reading the neighbours again")
			if err := w.scanNeighbours(); err != nil {
				w.fail(err)
				return
			}
			changed = true
		case err != nil:
			w.fail(fmt.Errorf("routing events: %w", err))
			return
		}
		for i := range msgs {
			changed = w.changes(&msgs[i]) || changed
		}
		if changed || time.Since(last) >= w.refresh {
			if err := w.g.bump(); err != nil {
				w.fail(err)
				return
			}
			last = time.Now()
		}
	}
}

// changes reports whether the event m may change a cached lookup's result.
func (w *routeWatch) changes(m *syscall.NetlinkMessage) bool {
	switch m.Header.Type {
	case unix.NLMSG_DONE, unix.NLMSG_NOOP, unix.NLMSG_ERROR:
		return false
	case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
		n, err := netlink.NeighDeserialize(m.Data)
		if err != nil {
			return true
		}
		return w.neighbour(n, m.Header.Type == unix.RTM_DELNEIGH)
	}
	return true
}

// fail turns the cache off for good: nothing watches the routing state
// any more.
func (w *routeWatch) fail(err error) {
	w.log.Error("route cache off: XDP looks every packet's route up", zap.Error(err))
	if err := w.g.off(); err != nil {
		w.log.Error("route cache: cannot turn it off", zap.Error(err))
	}
}

// close stops the watch and turns the cache off: the program forwards on
// after relayd exits, with nothing watching the kernel's routing state.
func (w *routeWatch) close() error {
	var err error
	w.once.Do(func() {
		close(w.stop)
		w.sock.Close()
		<-w.done
		err = w.g.off()
		w.ns.Close()
	})
	return err
}

// isRealtime is realtimeKernel; tests replace it.
var isRealtime = realtimeKernel

// realtimeKernel reports whether the kernel is PREEMPT_RT, where two runs
// of the program may interleave on one CPU and the route cache's entries,
// which need no lock because they never do elsewhere, could be read half
// written.
func realtimeKernel() bool {
	b, err := os.ReadFile("/sys/kernel/realtime")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

// routeEntrySize is the size of struct route_entry.
const routeEntrySize = 64

// routeCacheBytes bounds the route cache's memory over all CPUs.
const routeCacheBytes = 64 << 20

// routeSlots is the route cache's entries per CPU for maxFlows flows: as
// many as there may be flows (a power of two: a flow's entry is its
// statistics slot modulo this), within routeCacheBytes over cpus CPUs; 0,
// no cache, on a realtime kernel.
func routeSlots(maxFlows, cpus int, realtime bool) uint32 {
	if realtime || cpus < 1 {
		return 0
	}
	n := uint64(1)
	for n < uint64(maxFlows) {
		n <<= 1
	}
	for n > 1 && n*uint64(cpus)*routeEntrySize > routeCacheBytes {
		n >>= 1
	}
	return uint32(n)
}

// sizeRouteCache sizes the program's route cache for maxFlows flows and
// returns its entries per CPU.
func sizeRouteCache(spec *ebpf.CollectionSpec, maxFlows int) (uint32, error) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return 0, fmt.Errorf("count CPUs: %w", err)
	}
	slots := routeSlots(maxFlows, cpus, isRealtime())
	spec.Maps["routes"].MaxEntries = max(1, uint32(cpus)*slots)
	if err := spec.Variables["route_slots"].Set(slots); err != nil {
		return 0, fmt.Errorf("size the route cache: %w", err)
	}
	return slots, nil
}

// watchRoutes turns the program's route cache on, following the routing
// state of ns (the data plane's network namespace). The cache stays off,
// and the program looks every packet's route up, when it cannot.
func (f *Fastpath) watchRoutes(ns netns.NsHandle, refresh time.Duration) {
	if f.routeSlots == 0 {
		return
	}
	// One generation counter for the program's life: a watch started
	// again goes on from where the last one stopped, and never makes an
	// entry of an earlier generation current again.
	if f.rgen == nil {
		f.rgen = &routeGen{gen: f.objs.RouteGen, until: f.objs.RouteUntil}
	}
	w, err := startRouteWatch(f.rgen, ns, refresh, f.log.Named("routes"))
	if err != nil {
		f.log.Warn("route cache off: XDP looks every packet's route up", zap.Error(err))
		return
	}
	f.routes = w
	f.log.Info("route cache on", zap.Uint32("entries_per_cpu", f.routeSlots), zap.Duration("refresh", refresh))
}
