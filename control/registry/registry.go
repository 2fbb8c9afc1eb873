// Package registry is the one owner of relayd's media flows and relay
// ports. Every front end (the admin API's static flows, the SIP B2BUA, the
// rtpengine ng protocol) installs, updates and removes flows through one
// Registry, which
//   - holds the named media interfaces and one port allocator per
//     interface,
//   - gives every flow its ID from one counter,
//   - chooses the data plane of each flow (XDP where it runs, userspace for
//     SRTP or when asked),
//   - refuses flows toward a destination the destination policy denies
//     (control/destpolicy): relayd's own addresses, loopback, multicast,
//     the operator's denied networks,
//   - passes each latching event of a data plane to the holder of the flow,
//   - after a restart, adopts the flows the data planes still carry: a
//     restored call claims its own, static flows stay static, and the
//     call flows nobody claims keep their media until idle.
//
// See docs/architecture.md for where it sits. Like the rest of control/ it
// talks to data planes only through dataplane.DataPlane.
package registry

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/destpolicy"
	"github.com/relayd/relayd/dataplane"
)

// Errors the registry returns; callers branch on them with errors.Is.
var (
	// ErrNoPlane: no data plane runs that can carry the flow.
	ErrNoPlane = errors.New("no data plane for this flow")
	// ErrPortInUse: the port pair is allocated to something else.
	ErrPortInUse = errors.New("port pair in use")
	// ErrUnknownInterface: no media interface has this name.
	ErrUnknownInterface = errors.New("no such media interface")
	// ErrNoAddress: the interface has no address of the wanted family.
	ErrNoAddress = errors.New("media interface has no address of this family")
)

// Interface is a named media interface: the addresses a leg's media uses
// on the relay and the ports it takes them from.
type Interface struct {
	// Name is how front ends choose it (SIP routes, ng direction and
	// interface); "" is the unnamed default of [media].
	Name string
	// Addr and Addr6 are its IPv4 and IPv6 relay media addresses; at
	// least one is valid. No two interfaces share an address.
	Addr, Addr6 netip.Addr
	// Advertise and Advertise6, when valid, are what SDP names instead of
	// Addr and Addr6 (the public side of a 1:1 NAT).
	Advertise, Advertise6 netip.Addr
	// PortMin (even) and PortMax (odd) bound its relay ports.
	PortMin, PortMax uint16
}

// Address returns the interface's address for a peer: of the peer's
// family when the interface has one, else the other (an invalid peer
// prefers IPv4). The second result is what SDP names.
func (i *Interface) Address(peer netip.Addr) (addr, advertise netip.Addr) {
	six := peer.IsValid() && peer.Is6() && !peer.Is4In6()
	if (six && i.Addr6.IsValid()) || !i.Addr.IsValid() {
		return i.Addr6, cmp.Or(i.Advertise6, i.Addr6)
	}
	return i.Addr, cmp.Or(i.Advertise, i.Addr)
}

// Family returns the interface's address of one family (six: IPv6) and
// what SDP names, or ErrNoAddress.
func (i *Interface) Family(six bool) (addr, advertise netip.Addr, err error) {
	if six {
		if !i.Addr6.IsValid() {
			return netip.Addr{}, netip.Addr{}, fmt.Errorf("media interface %q: %w (IPv6)", i.Name, ErrNoAddress)
		}
		return i.Addr6, cmp.Or(i.Advertise6, i.Addr6), nil
	}
	if !i.Addr.IsValid() {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("media interface %q: %w (IPv4)", i.Name, ErrNoAddress)
	}
	return i.Addr, cmp.Or(i.Advertise, i.Addr), nil
}

func (i *Interface) has(a netip.Addr) bool {
	return a.IsValid() && (a == i.Addr || a == i.Addr6)
}

// Config is what the registry needs to know about the relay.
type Config struct {
	// Interfaces are the media interfaces; the first is the default, used
	// when a front end names none.
	Interfaces []Interface
	// LegacyCallIDBase: flows found at start without an owner whose ID is
	// at least this were installed by calls of a relayd from before flows
	// recorded their owner (call flow IDs then started at 1<<40). Zero
	// means 1<<40.
	LegacyCallIDBase uint64
	// Own are relayd's addresses besides those of the interfaces (which
	// count already, advertised ones included): the signalling
	// listeners'. No flow sends media to them.
	Own []netip.Addr
	// Deny are the operator's denied destination networks ([media]
	// deny_destinations).
	Deny []netip.Prefix
	// Rates is how front ends cap their flows' packet rates; the zero
	// value caps nothing.
	Rates RatePolicy
}

func (c *Config) validate() error {
	if len(c.Interfaces) == 0 {
		return errors.New("need a media interface")
	}
	names := make(map[string]bool)
	addrs := make(map[netip.Addr]string)
	for _, in := range c.Interfaces {
		if names[in.Name] {
			return fmt.Errorf("media interface %q: defined twice", in.Name)
		}
		names[in.Name] = true
		if !in.Addr.IsValid() && !in.Addr6.IsValid() {
			return fmt.Errorf("media interface %q: need an address", in.Name)
		}
		if in.Addr.IsValid() && !in.Addr.Is4() {
			return fmt.Errorf("media interface %q: %s is not IPv4", in.Name, in.Addr)
		}
		if in.Addr6.IsValid() && (!in.Addr6.Is6() || in.Addr6.Is4In6()) {
			return fmt.Errorf("media interface %q: %s is not IPv6", in.Name, in.Addr6)
		}
		for _, a := range []netip.Addr{in.Addr, in.Addr6} {
			if !a.IsValid() {
				continue
			}
			if other, dup := addrs[a]; dup {
				return fmt.Errorf("media interfaces %q and %q share the address %s", other, in.Name, a)
			}
			addrs[a] = in.Name
		}
		if in.PortMin == 0 || in.PortMin%2 != 0 || in.PortMax%2 != 1 || in.PortMin >= in.PortMax {
			return fmt.Errorf("media interface %q: port range %d-%d: want even first and odd last port", in.Name, in.PortMin, in.PortMax)
		}
	}
	if c.LegacyCallIDBase == 0 {
		c.LegacyCallIDBase = 1 << 40
	}
	return nil
}

// Holder holds flows in the registry and hears their latching events.
type Holder interface {
	// Latched is called when the flow with this match learned source
	// (locked false) or locked it (locked true). The registry's lock is
	// not held: the holder may call the registry.
	Latched(match, source netip.AddrPort, locked bool)
}

// FlowState is a flow, where it runs and its statistics.
type FlowState struct {
	Flow  dataplane.Flow
	Path  dataplane.Path
	Stats dataplane.Stats
}

// Registry owns the flows and ports. Create it with New; it is safe for
// concurrent use.
type Registry struct {
	cfg    Config
	log    *zap.Logger
	policy *destpolicy.Policy
	planes map[dataplane.Path]dataplane.DataPlane
	ifaces []*iface
	byName map[string]*iface
	now    func() time.Time
	nextID atomic.Uint64

	mu      sync.Mutex // guards the following
	flows   map[netip.AddrPort]*rec
	byID    map[uint64]*rec
	found   map[netip.AddrPort]*rec // call flows found at start, not claimed yet
	statics map[pairKey]int         // port pairs held by static flows: how many flows
}

type iface struct {
	Interface
	ports *Ports
}

type pairKey struct {
	iface string
	port  uint16 // the even port
}

type rec struct {
	// flow is never changed in place (an update replaces the rec):
	// holders keep a pointer to it (Shared) instead of a copy of their
	// own. It is part of the rec's allocation: one object per flow, of a
	// size the setups' garbage hardly uses, instead of two.
	flow    dataplane.Flow
	plane   dataplane.DataPlane
	mode    dataplane.Path // what the holder asked for; "" = the default
	holder  Holder         // nil for found flows nobody holds yet
	created int64          // install or adoption, Unix ns (a time.Time is 24 bytes)
}

// New returns a registry over the given data planes (at most one per
// path; none is fine: every Install then fails with ErrNoPlane). It adopts
// the flows the data planes carry, such as pinned XDP flows left by a
// previous run: their ports are taken and their IDs kept, and new IDs
// follow the highest one found. Static flows are adopted as such (see
// AdoptStatic); call flows wait for the restored calls to Claim them.
func New(cfg Config, log *zap.Logger, planes ...dataplane.DataPlane) (*Registry, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("flow registry: %w", err)
	}
	r := &Registry{
		cfg:     cfg,
		log:     log,
		planes:  make(map[dataplane.Path]dataplane.DataPlane),
		byName:  make(map[string]*iface),
		now:     time.Now,
		flows:   make(map[netip.AddrPort]*rec),
		byID:    make(map[uint64]*rec),
		found:   make(map[netip.AddrPort]*rec),
		statics: make(map[pairKey]int),
	}
	for _, in := range cfg.Interfaces {
		p, err := NewPorts(in.PortMin, in.PortMax)
		if err != nil {
			return nil, fmt.Errorf("flow registry: media interface %q: %w", in.Name, err)
		}
		i := &iface{Interface: in, ports: p}
		r.ifaces = append(r.ifaces, i)
		r.byName[in.Name] = i
	}
	own := slices.Clone(cfg.Own)
	for _, in := range cfg.Interfaces {
		own = append(own, in.Addr, in.Addr6, in.Advertise, in.Advertise6)
	}
	r.policy = destpolicy.New(own, cfg.Deny)
	for _, p := range planes {
		if p == nil {
			continue
		}
		if _, dup := r.planes[p.Path()]; dup {
			return nil, fmt.Errorf("flow registry: two data planes for path %s", p.Path())
		}
		r.planes[p.Path()] = p
	}
	r.nextID.Store(1)
	if err := r.adopt(); err != nil {
		return nil, err
	}
	return r, nil
}

// SetClock replaces time.Now, for tests.
func (r *Registry) SetClock(now func() time.Time) { r.now = now }

// adopt takes over the flows the data planes carry.
func (r *Registry) adopt() error {
	now := r.now()
	var renumber []*rec
	for _, path := range []dataplane.Path{dataplane.PathXDP, dataplane.PathUserspace} {
		p, ok := r.planes[path]
		if !ok {
			continue
		}
		list, err := p.List()
		if err != nil {
			return fmt.Errorf("adopt %s flows: %w", path, err)
		}
		for _, fs := range list {
			fl := fs.Flow
			if err := r.checkFlow(fl); err != nil {
				// Installed by a relayd without the policy, or before the
				// operator denied the network: kept (a call may own it),
				// and the data planes drop what it would loop.
				r.log.Warn("adopted flow sends where the destination policy denies", zap.Stringer("match", fl.Match),
					zap.Uint64("id", fl.ID), zap.Error(err))
			}
			if _, dup := r.flows[fl.Match]; dup {
				r.log.Warn("flow present in two data planes; keeping the first",
					zap.Stringer("match", fl.Match), zap.String("also_in", string(path)))
				continue
			}
			if _, dup := r.found[fl.Match]; dup {
				r.log.Warn("flow present in two data planes; keeping the first",
					zap.Stringer("match", fl.Match), zap.String("also_in", string(path)))
				continue
			}
			if fl.Owner == dataplane.OwnerStatic && fl.ID >= r.cfg.LegacyCallIDBase {
				fl.Owner = dataplane.OwnerCall
			}
			e := &rec{flow: fl, plane: p, mode: path, created: now.UnixNano()}
			if fl.Owner == dataplane.OwnerCall {
				e.mode = ""
				r.found[fl.Match] = e
				r.reservePair(fl.Match)
			} else {
				if _, taken := r.byID[fl.ID]; fl.ID == 0 || taken {
					renumber = append(renumber, e)
					continue
				}
				r.flows[fl.Match] = e
				r.byID[fl.ID] = e
				r.holdStaticLocked(fl.Match)
			}
			if fl.ID >= r.nextID.Load() {
				r.nextID.Store(fl.ID + 1)
			}
		}
	}
	for _, e := range renumber {
		old := e.flow.ID
		e.flow.ID = r.newID() // nobody holds it yet
		if err := e.plane.Update(e.flow); err != nil {
			return fmt.Errorf("adopt flow %s: give it id %d: %w", e.flow.Match, e.flow.ID, err)
		}
		r.flows[e.flow.Match] = e
		r.byID[e.flow.ID] = e
		r.holdStaticLocked(e.flow.Match)
		r.log.Warn("adopted flow renumbered", zap.Stringer("match", e.flow.Match), zap.Uint64("old_id", old), zap.Uint64("id", e.flow.ID))
	}
	if len(r.flows) > 0 || len(r.found) > 0 {
		r.log.Info("adopted flows from the data planes", zap.Int("static", len(r.flows)),
			zap.Int("calls", len(r.found)), zap.Uint64("next_id", r.nextID.Load()))
	}
	return nil
}

func (r *Registry) newID() uint64 { return r.nextID.Add(1) - 1 }

// Interfaces returns the media interfaces, the default first.
func (r *Registry) Interfaces() []Interface {
	out := make([]Interface, len(r.ifaces))
	for i, in := range r.ifaces {
		out[i] = in.Interface
	}
	return out
}

// DefaultName is how front ends name the unnamed interface of [media]
// (rtpengine calls an interface given without a name "default").
const DefaultName = "default"

// Interface returns the media interface with this name; "" is the
// default (the first), and so is DefaultName when no interface has that
// name.
func (r *Registry) Interface(name string) (Interface, error) {
	in, ok := r.lookup(name)
	if !ok {
		return Interface{}, fmt.Errorf("%w: %q (have %s)", ErrUnknownInterface, name, r.names())
	}
	return in.Interface, nil
}

func (r *Registry) names() string {
	var names []string
	for _, in := range r.ifaces {
		names = append(names, fmt.Sprintf("%q", cmp.Or(in.Name, DefaultName)))
	}
	return strings.Join(names, ", ")
}

// ifaceOf returns the interface an address belongs to.
func (r *Registry) ifaceOf(a netip.Addr) *iface {
	for _, in := range r.ifaces {
		if in.has(a) {
			return in
		}
	}
	return nil
}

// InterfaceOf returns the name of the interface an address belongs to.
func (r *Registry) InterfaceOf(a netip.Addr) (string, bool) {
	in := r.ifaceOf(a)
	if in == nil {
		return "", false
	}
	return in.Name, true
}

// IsRelay reports whether ap is a relay media address with a port in its
// interface's range.
func (r *Registry) IsRelay(ap netip.AddrPort) bool {
	in := r.ifaceOf(ap.Addr())
	return in != nil && ap.Port() >= in.PortMin && ap.Port() <= in.PortMax
}

// Describe names the relay's media addresses and port ranges, for errors.
func (r *Registry) Describe() string {
	var parts []string
	for _, in := range r.ifaces {
		var addrs []string
		for _, a := range []netip.Addr{in.Addr, in.Addr6} {
			if a.IsValid() {
				addrs = append(addrs, a.String())
			}
		}
		name := cmp.Or(in.Name, DefaultName)
		parts = append(parts, fmt.Sprintf("%s %v ports %d-%d", name, addrs, in.PortMin, in.PortMax))
	}
	return "relay media interfaces: " + strings.Join(parts, "; ")
}

// lookup returns the named interface; "" is the default (the first).
func (r *Registry) lookup(name string) (*iface, bool) {
	if in, ok := r.byName[name]; ok {
		return in, true
	}
	if name == "" || name == DefaultName {
		return r.ifaces[0], true
	}
	return nil, false
}

// AllocPort takes a free port pair of the named interface ("" the
// default) and returns its RTP (even) port; ErrNoPorts when none is free.
func (r *Registry) AllocPort(name string) (uint16, error) {
	in, ok := r.lookup(name)
	if !ok {
		return 0, fmt.Errorf("%w: %q", ErrUnknownInterface, name)
	}
	p, err := in.ports.Alloc()
	if err != nil {
		return 0, fmt.Errorf("media interface %q: %w", name, err)
	}
	return p, nil
}

// ReservePort takes the pair of port on the named interface (a restored
// call's); it reports whether it was free.
func (r *Registry) ReservePort(name string, port uint16) bool {
	in, ok := r.lookup(name)
	return ok && in.ports.Reserve(port)
}

// ReleasePort gives the pair of port on the named interface back.
func (r *Registry) ReleasePort(name string, port uint16) {
	if in, ok := r.lookup(name); ok {
		in.ports.Release(port)
	}
}

// PortUsage is how many port pairs an interface has and how many are free.
type PortUsage struct {
	Interface   string
	Pairs, Free int
}

// Ports returns the port usage of every interface, the default first.
func (r *Registry) Ports() []PortUsage {
	out := make([]PortUsage, len(r.ifaces))
	for i, in := range r.ifaces {
		out[i] = PortUsage{Interface: in.Name, Pairs: in.ports.Pairs(), Free: in.ports.Free()}
	}
	return out
}

// reservePair takes the pair of a found flow's match, if it is a relay
// port.
func (r *Registry) reservePair(match netip.AddrPort) {
	if in := r.ifaceOf(match.Addr()); in != nil {
		in.ports.Reserve(match.Port() &^ 1)
	}
}

// HoldStatic takes the port pair of a static flow's match: free, or held
// by static flows already (RTP and RTCP of one stream share a pair). A
// pair a call holds is ErrPortInUse.
func (r *Registry) HoldStatic(match netip.AddrPort) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := r.ifaceOf(match.Addr())
	if in == nil {
		return nil
	}
	k := pairKey{in.Name, match.Port() &^ 1}
	if r.statics[k] > 0 {
		r.statics[k]++
		return nil
	}
	if !in.ports.Reserve(k.port) {
		return fmt.Errorf("%s: %w by a call", match, ErrPortInUse)
	}
	r.statics[k] = 1
	return nil
}

// holdStaticLocked is HoldStatic for adopted flows: their pair is theirs
// whether or not it looked free.
func (r *Registry) holdStaticLocked(match netip.AddrPort) {
	in := r.ifaceOf(match.Addr())
	if in == nil {
		return
	}
	k := pairKey{in.Name, match.Port() &^ 1}
	if r.statics[k] == 0 {
		in.ports.Reserve(k.port)
	}
	r.statics[k]++
}

// ReleaseStatic gives back what HoldStatic took.
func (r *Registry) ReleaseStatic(match netip.AddrPort) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := r.ifaceOf(match.Addr())
	if in == nil {
		return
	}
	k := pairKey{in.Name, match.Port() &^ 1}
	if r.statics[k] == 0 {
		return
	}
	r.statics[k]--
	if r.statics[k] == 0 {
		delete(r.statics, k)
		in.ports.Release(k.port)
	}
}

// HasPlane reports whether a data plane for path runs.
func (r *Registry) HasPlane(path dataplane.Path) bool {
	_, ok := r.planes[path]
	return ok
}

// PlaneFor chooses the data plane of a flow. mode "" is the default: XDP
// where it runs, else userspace. A flow with SRTP or transcoding always
// runs in userspace, whatever mode says.
func (r *Registry) PlaneFor(f dataplane.Flow, mode dataplane.Path) (dataplane.DataPlane, error) {
	switch {
	case f.NeedsUserspace():
		mode = dataplane.PathUserspace
	case mode == "":
		mode = dataplane.PathXDP
		if _, ok := r.planes[mode]; !ok {
			mode = dataplane.PathUserspace
		}
	case mode != dataplane.PathXDP && mode != dataplane.PathUserspace:
		return nil, fmt.Errorf("mode %q (want xdp or userspace): %w", mode, ErrNoPlane)
	}
	p, ok := r.planes[mode]
	if !ok {
		return nil, fmt.Errorf("no %s data plane is running: %w", mode, ErrNoPlane)
	}
	return p, nil
}

// CheckDestination returns nil when relayd may send media to dst, else
// an error wrapping destpolicy.ErrDenied (a *destpolicy.DeniedError says
// why). Front ends call it on the addresses peers give before they build
// flows; Install and Update call it on every flow.
func (r *Registry) CheckDestination(dst netip.AddrPort) error { return r.policy.Check(dst) }

// checkFlow checks every destination f sends to: SendTo of a flow that
// forwards, and where a transcoding flow sends relayd's own RTCP. A
// reflecting flow answers its source, which only the data plane knows.
func (r *Registry) checkFlow(f dataplane.Flow) error {
	if f.Action != dataplane.Forward && f.Action != dataplane.Userspace {
		return nil
	}
	if err := r.policy.Check(f.SendTo); err != nil {
		return fmt.Errorf("flow %s: send_to: %w", f.Match, err)
	}
	if t := f.Transcode; t != nil && t.RTCPTo.IsValid() {
		if err := r.policy.Check(t.RTCPTo); err != nil {
			return fmt.Errorf("flow %s: transcode rtcp_to: %w", f.Match, err)
		}
	}
	return nil
}

// Install gives f an ID (unless it has one, a restored flow's) and
// installs it on the data plane PlaneFor chooses, held by h. A match
// already in use is dataplane.ErrExists; a destination the policy denies
// is destpolicy.ErrDenied.
func (r *Registry) Install(f dataplane.Flow, mode dataplane.Path, h Holder) (dataplane.Flow, dataplane.Path, error) {
	if err := r.checkFlow(f); err != nil {
		return f, "", err
	}
	p, err := r.PlaneFor(f, mode)
	if err != nil {
		return f, "", err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.flows[f.Match]; ok {
		return f, "", fmt.Errorf("match %s: %w (flow %d)", f.Match, dataplane.ErrExists, e.flow.ID)
	}
	if _, ok := r.found[f.Match]; ok {
		return f, "", fmt.Errorf("match %s: %w (a call of the previous run)", f.Match, dataplane.ErrExists)
	}
	if f.ID == 0 {
		f.ID = r.newID()
	} else if f.ID >= r.nextID.Load() {
		r.nextID.Store(f.ID + 1)
	}
	e := &rec{flow: f, plane: p, mode: mode, holder: h, created: r.now().UnixNano()}
	if err := installShared(p, &e.flow); err != nil {
		return f, "", err
	}
	r.flows[f.Match] = e
	r.byID[f.ID] = e
	return f, p.Path(), nil
}

// installShared installs *f on p, handing p the flow the registry keeps
// when p can share it (dataplane.SharedInstaller): the registry never
// changes a flow in place (rec.flow): an update makes a new rec.
func installShared(p dataplane.DataPlane, f *dataplane.Flow) error {
	if sp, ok := p.(dataplane.SharedInstaller); ok {
		return sp.InstallShared(f)
	}
	return p.Install(*f)
}

// updateShared is installShared's Update.
func updateShared(p dataplane.DataPlane, f *dataplane.Flow) error {
	if sp, ok := p.(dataplane.SharedInstaller); ok {
		return sp.UpdateShared(f)
	}
	return p.Update(*f)
}

// Moved is what Update returns when a flow changed data plane: the old
// one's last statistics.
type Moved struct {
	From  dataplane.Path
	Stats dataplane.Stats
}

// Update replaces the flow with f.Match (its ID is kept). When the new
// flow belongs on another data plane (SRTP turned on or off) it moves
// there and the old plane's last statistics are returned. A destination
// the policy denies is destpolicy.ErrDenied, and the flow stays as it
// was.
func (r *Registry) Update(f dataplane.Flow) (*Moved, error) {
	if err := r.checkFlow(f); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.flows[f.Match]
	if !ok {
		return nil, fmt.Errorf("match %s: %w", f.Match, dataplane.ErrNotFound)
	}
	f.ID = e.flow.ID
	p, err := r.PlaneFor(f, e.mode)
	if err != nil {
		return nil, err
	}
	ne := &rec{flow: f, plane: p, mode: e.mode, holder: e.holder, created: e.created}
	if p == e.plane {
		if err := updateShared(p, &ne.flow); err != nil {
			return nil, err
		}
		r.flows[f.Match], r.byID[f.ID] = ne, ne
		return nil, nil
	}
	st, err := e.plane.Remove(f.Match)
	if err != nil && !errors.Is(err, dataplane.ErrNotFound) {
		return nil, fmt.Errorf("move flow %s: %w", f.Match, err)
	}
	moved := &Moved{From: e.plane.Path(), Stats: st}
	if err := installShared(p, &ne.flow); err != nil {
		delete(r.flows, f.Match)
		delete(r.byID, f.ID)
		return moved, fmt.Errorf("move flow %s to %s: %w", f.Match, p.Path(), err)
	}
	r.flows[f.Match], r.byID[f.ID] = ne, ne
	return moved, nil
}

// Remove deletes the flow with this match and returns its last
// statistics. A flow the data plane lost already is forgotten too.
func (r *Registry) Remove(match netip.AddrPort) (FlowState, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.flows[match]
	if !ok {
		return FlowState{}, fmt.Errorf("match %s: %w", match, dataplane.ErrNotFound)
	}
	st, err := e.plane.Remove(match)
	if err != nil && !errors.Is(err, dataplane.ErrNotFound) {
		return FlowState{}, fmt.Errorf("remove flow %d: %w", e.flow.ID, err)
	}
	delete(r.flows, match)
	delete(r.byID, e.flow.ID)
	return FlowState{Flow: e.flow, Path: e.plane.Path(), Stats: st}, nil
}

// Forget drops the flow from the registry and leaves it in its data plane
// (relayd is stopping and a call lives on).
func (r *Registry) Forget(match netip.AddrPort) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.flows[match]; ok {
		delete(r.flows, match)
		delete(r.byID, e.flow.ID)
	}
}

// Get returns the flow with this match and where it runs.
func (r *Registry) Get(match netip.AddrPort) (dataplane.Flow, dataplane.Path, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.flows[match]
	if !ok {
		return dataplane.Flow{}, "", false
	}
	return e.flow, e.plane.Path(), true
}

// Shared is Get without the copy: the flow as the registry holds it,
// which nobody changes (an update replaces it). A holder that keeps its
// flows keeps these instead of a copy each.
func (r *Registry) Shared(match netip.AddrPort) (*dataplane.Flow, dataplane.Path, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.flows[match]
	if !ok {
		return nil, "", false
	}
	return &e.flow, e.plane.Path(), true
}

// ByID returns the match of the flow with this ID.
func (r *Registry) ByID(id uint64) (netip.AddrPort, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.byID[id]; ok {
		return e.flow.Match, true
	}
	return netip.AddrPort{}, false
}

// Stats returns the statistics of the flow with this match.
func (r *Registry) Stats(match netip.AddrPort) (FlowState, error) {
	r.mu.Lock()
	e, ok := r.flows[match]
	var fl *dataplane.Flow
	var plane dataplane.DataPlane
	if ok {
		fl, plane = &e.flow, e.plane
	}
	r.mu.Unlock()
	if !ok {
		return FlowState{}, fmt.Errorf("match %s: %w", match, dataplane.ErrNotFound)
	}
	st, err := plane.Stats(match)
	if err != nil {
		return FlowState{}, err
	}
	return FlowState{Flow: *fl, Path: plane.Path(), Stats: st}, nil
}

// List returns the flows of one owner with their statistics, sorted by
// ID; statistics come from one read of every flow's per data plane.
func (r *Registry) List(owner dataplane.Owner) ([]FlowState, error) {
	r.mu.Lock()
	out := []FlowState{}
	for _, e := range r.flows {
		if e.flow.Owner == owner {
			out = append(out, FlowState{Flow: e.flow, Path: e.plane.Path()})
		}
	}
	r.mu.Unlock()
	if len(out) == 0 {
		return out, nil
	}
	stats := make(map[netip.AddrPort]dataplane.Stats, len(out))
	for _, fs := range out {
		stats[fs.Flow.Match] = dataplane.Stats{}
	}
	for path, p := range r.planes {
		err := eachStats(p, func(match netip.AddrPort, st dataplane.Stats) {
			if _, ok := stats[match]; ok {
				stats[match] = st
			}
		})
		if err != nil {
			return nil, fmt.Errorf("list %s flows: %w", path, err)
		}
	}
	for i := range out {
		out[i].Stats = stats[out[i].Flow.Match]
	}
	slices.SortFunc(out, func(a, b FlowState) int { return cmp.Compare(a.Flow.ID, b.Flow.ID) })
	return out, nil
}

// Counts returns the number of flows per path and owner, for metrics.
func (r *Registry) Counts() map[dataplane.Path]map[dataplane.Owner]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[dataplane.Path]map[dataplane.Owner]int)
	for _, path := range []dataplane.Path{dataplane.PathXDP, dataplane.PathUserspace} {
		out[path] = map[dataplane.Owner]int{dataplane.OwnerStatic: 0, dataplane.OwnerCall: 0}
	}
	for _, e := range r.flows {
		out[e.plane.Path()][e.flow.Owner]++
	}
	return out
}

// Latched passes a data plane's latching event to the holder of the flow;
// events for flows nobody holds are ignored.
func (r *Registry) Latched(match, source netip.AddrPort, locked bool) {
	r.mu.Lock()
	var h Holder
	if e, ok := r.flows[match]; ok {
		h = e.holder
	}
	r.mu.Unlock()
	if h != nil {
		h.Latched(match, source, locked)
	}
}

// Claim hands a call flow found at start to the restored call that holds
// it now. It returns the flow and where it runs, or false when no such
// flow was found.
func (r *Registry) Claim(match netip.AddrPort, h Holder) (dataplane.Flow, dataplane.Path, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.found[match]
	if !ok {
		return dataplane.Flow{}, "", false
	}
	delete(r.found, match)
	e.holder = h
	e.created = r.now().UnixNano()
	r.flows[match] = e
	r.byID[e.flow.ID] = e
	return e.flow, e.plane.Path(), true
}

// Unclaimed returns how many call flows found at start no call claimed.
func (r *Registry) Unclaimed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.found)
}

// SweepUnclaimed removes the call flows found at start that no restored
// call claimed and that carried no packet for idle (since adoption if
// they never did); their ports go back.
func (r *Registry) SweepUnclaimed(idle time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cutoff := r.now().Add(-idle)
	for match, e := range r.found {
		st, err := e.plane.Stats(match)
		if errors.Is(err, dataplane.ErrNotFound) {
			delete(r.found, match)
			r.releaseFound(match)
			continue
		}
		if err != nil {
			continue
		}
		last := st.LastSeen
		if created := time.Unix(0, e.created); last.IsZero() || last.Before(created) {
			last = created
		}
		if last.After(cutoff) {
			continue
		}
		if _, err := e.plane.Remove(match); err != nil && !errors.Is(err, dataplane.ErrNotFound) {
			r.log.Warn("remove idle flow of a previous run", zap.Stringer("match", match), zap.Error(err))
			continue
		}
		delete(r.found, match)
		r.releaseFound(match)
		r.log.Info("removed idle flow of a call from before the restart", zap.Stringer("match", match),
			zap.Uint64("id", e.flow.ID), zap.Uint64("packets", st.Packets))
	}
}

// releaseFound gives back the pair of a removed found flow unless another
// found flow (its RTCP or RTP) still uses it.
func (r *Registry) releaseFound(match netip.AddrPort) {
	pair := match.Port() &^ 1
	for m := range r.found {
		if m.Addr() == match.Addr() && m.Port()&^1 == pair {
			return
		}
	}
	if in := r.ifaceOf(match.Addr()); in != nil {
		in.ports.Release(pair)
	}
}

// LastSeen returns, for every flow the data planes carry, the time of its
// last packet. Flows that never carried a packet are absent.
func (r *Registry) LastSeen() (map[netip.AddrPort]time.Time, error) {
	seen := make(map[netip.AddrPort]time.Time)
	var errs []error
	for path, p := range r.planes {
		err := eachStats(p, func(match netip.AddrPort, st dataplane.Stats) {
			if st.LastSeen.After(seen[match]) {
				seen[match] = st.LastSeen
			}
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s flows: %w", path, err))
		}
	}
	return seen, errors.Join(errs...)
}

// Activity is what the rebinding sweep reads of a flow's statistics.
type Activity struct {
	LastSeen time.Time // arrival of the last matching packet
	Dropped  uint64    // packets dropped
}

// Activity returns every flow's last packet and drops by match, over all
// data planes (a match listed by two, while a flow moves, keeps the later
// LastSeen and the sum of drops). Only these two of the statistics: the
// map of every flow is built every sweep, and a whole dataplane.Stats
// per flow made it five times larger.
func (r *Registry) Activity() (map[netip.AddrPort]Activity, error) {
	out := make(map[netip.AddrPort]Activity)
	var errs []error
	for path, p := range r.planes {
		err := eachStats(p, func(match netip.AddrPort, st dataplane.Stats) {
			prev, ok := out[match]
			if !ok {
				out[match] = Activity{LastSeen: st.LastSeen, Dropped: st.Dropped}
				return
			}
			prev.Dropped += st.Dropped
			if st.LastSeen.After(prev.LastSeen) {
				prev.LastSeen = st.LastSeen
			}
			out[match] = prev
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s flows: %w", path, err))
		}
	}
	return out, errors.Join(errs...)
}

// eachStats calls fn with the statistics of every flow p carries: through
// dataplane.StatsReader when p has it, from its List otherwise.
func eachStats(p dataplane.DataPlane, fn func(netip.AddrPort, dataplane.Stats)) error {
	if sr, ok := p.(dataplane.StatsReader); ok {
		return sr.EachStats(fn)
	}
	list, err := p.List()
	for _, fs := range list {
		fn(fs.Flow.Match, fs.Stats)
	}
	return err
}

// Created returns when the flow with this match was installed or adopted.
func (r *Registry) Created(match netip.AddrPort) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.flows[match]
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, e.created), true
}

// Plane returns the data plane for path, for what only it can tell (the
// userspace shadows of XDP flows).
func (r *Registry) Plane(path dataplane.Path) (dataplane.DataPlane, bool) {
	p, ok := r.planes[path]
	return p, ok
}
