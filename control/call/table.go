package call

import (
	"cmp"
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// Table holds the calls in progress. Their flows and ports are in the
// flow registry the table is made over, which the other front ends share.
// Create it with NewTable; it is safe for concurrent use.
type Table struct {
	reg *registry.Registry
	log *zap.Logger
	now func() time.Time

	nextCall atomic.Uint64
	maxCalls atomic.Int64 // 0: no limit
	codecs   atomic.Bool  // the transcoding workers have their codecs (G.729)

	mu    sync.Mutex // guards the following
	calls map[string]*Call
}

// ErrSessionLimit is returned by TryNew when the table holds
// SetMaxSessions calls: the SIP front end answers 503, ng "Parallel
// session limit reached".
var ErrSessionLimit = errors.New("session limit reached")

// SetMaxSessions bounds the calls in the table, whichever front end made
// them; 0 lifts the bound.
func (t *Table) SetMaxSessions(n int) { t.maxCalls.Store(int64(n)) }

// TryNew is New within the session limit: it fails with ErrSessionLimit
// when the table is full.
func (t *Table) TryNew(source netip.AddrPort, from, to string) (*Call, error) {
	return t.newCall(source, from, to, true)
}

// NewTable returns a call table over the registry.
func NewTable(reg *registry.Registry, log *zap.Logger) *Table {
	t := &Table{reg: reg, log: log, now: time.Now, calls: make(map[string]*Call)}
	t.codecs.Store(g729.Available)
	return t
}

// Registry returns the flow registry the table's calls use.
func (t *Table) Registry() *registry.Registry { return t.reg }

// Addr returns the relay media address of the default interface for a
// peer address: the same family when it has one, else the other.
func (t *Table) Addr(peer netip.Addr) netip.Addr {
	in, _ := t.reg.Interface("")
	a, _ := in.Address(peer)
	return a
}

// Local returns where a leg's media sits on the named media interface
// ("" the default) for a peer address: the address of the peer's family
// when the interface has one, else the other.
func (t *Table) Local(iface string, peer netip.Addr) (Local, error) {
	in, err := t.reg.Interface(iface)
	if err != nil {
		return Local{}, err
	}
	a, adv := in.Address(peer)
	return Local{Interface: in.Name, Addr: a, Advertise: adv}, nil
}

// LocalOf returns the Local of a relay media address: its interface and
// what SDP names for it (a restored call's leg). An address no interface
// has any more is returned as is.
func (t *Table) LocalOf(a netip.Addr) Local {
	name, ok := t.reg.InterfaceOf(a)
	if !ok {
		return Local{Addr: a}
	}
	in, _ := t.reg.Interface(name)
	_, adv, _ := in.Family(a.Is6())
	return Local{Interface: name, Addr: a, Advertise: adv}
}

// CanSRTP reports whether calls can have SRTP terminated on a leg (a
// userspace data plane runs).
func (t *Table) CanSRTP() bool { return t.reg.HasPlane(dataplane.PathUserspace) }

// CanTranscode reports whether calls can be transcoded between G.711 and
// G.729: a userspace data plane runs and relayd was built with G.729
// (g729.Available, unless SetCodecsAvailable said otherwise).
func (t *Table) CanTranscode() bool {
	return t.codecs.Load() && t.reg.HasPlane(dataplane.PathUserspace)
}

// SetCodecsAvailable overrides whether the transcoding workers have their
// codecs (g729.Available by default): tests of the control plane, and a
// daemon whose codecs failed to start.
func (t *Table) SetCodecsAvailable(ok bool) { t.codecs.Store(ok) }

// emptyCall returns a call with its media, not in the table yet.
func (t *Table) emptyCall() *Call {
	c := new(Call)
	c.Media = &c.media
	c.media.init(t)
	return c
}

// New creates a call in state trying and adds it to the table.
func (t *Table) New(source netip.AddrPort, from, to string) *Call {
	c, _ := t.newCall(source, from, to, false)
	return c
}

func (t *Table) newCall(source netip.AddrPort, from, to string, limited bool) (*Call, error) {
	now := t.now()
	c := t.emptyCall()
	c.Created, c.Source, c.state = now, source, StateTrying
	t.mu.Lock()
	if max := t.maxCalls.Load(); limited && max > 0 && int64(len(t.calls)) >= max {
		t.mu.Unlock()
		return nil, ErrSessionLimit
	}
	// A call restored from the previous run may have the ID this run's
	// counter just made (a restart within the second the call began).
	id := callID(now, t.nextCall.Add(1))
	for _, taken := t.calls[id]; taken; _, taken = t.calls[id] {
		id = callID(now, t.nextCall.Add(1))
	}
	c.ID, c.From, c.To = c.media.keep(id), c.media.keep(from), c.media.keep(to) // c not shared yet
	t.calls[c.ID] = c
	t.mu.Unlock()
	return c, nil
}

// callID is a call's ID: its start's Unix second in base 36, "-", and n.
func callID(start time.Time, n uint64) string {
	return strconv.FormatInt(start.Unix(), 36) + "-" + strconv.FormatUint(n, 10)
}

// Remove takes the call out of the table (its media must be closed by
// the caller).
func (t *Table) Remove(c *Call) {
	t.mu.Lock()
	delete(t.calls, c.ID)
	t.mu.Unlock()
}

// Get returns the call with this ID.
func (t *Table) Get(id string) (*Call, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.calls[id]
	return c, ok
}

// List returns the calls, oldest first.
func (t *Table) List() []*Call {
	t.mu.Lock()
	out := make([]*Call, 0, len(t.calls))
	for _, c := range t.calls {
		out = append(out, c)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b *Call) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// Len returns the number of calls.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.calls)
}

// Rebind opens learning again, in every call, on the locked flows whose
// source has been silent for after while packets from other sources were
// dropped (see Media.rebind). stats are the flows' statistics
// (Registry.Activity).
func (t *Table) Rebind(stats map[netip.AddrPort]registry.Activity, after time.Duration) {
	cutoff := t.now().Add(-after)
	for _, c := range t.List() {
		for _, match := range c.Media.rebind(stats, cutoff) {
			t.log.Info("locked source silent, packets from elsewhere: learning again",
				zap.String("call", c.ID), zap.Stringer("match", match), zap.Duration("silent_for", after))
		}
	}
}

// Idle returns the answered calls none of whose flows has carried a
// packet for idle (flows never used count from their installation).
// Calls without flows are not idle.
func (t *Table) Idle(idle time.Duration) ([]*Call, error) {
	seen, err := t.reg.LastSeen()
	cutoff := t.now().Add(-idle)
	var out []*Call
	for _, c := range t.List() {
		if c.State() != StateAnswered {
			continue
		}
		last, ok := c.Media.lastActivity(seen)
		if ok && last.Before(cutoff) {
			out = append(out, c)
		}
	}
	return out, err
}
