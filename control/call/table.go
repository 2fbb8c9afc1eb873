package call

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/dataplane"
)

// Config is what the call table needs to know about the relay.
type Config struct {
	// Addr and Addr6 are the relay media addresses; at least one valid.
	Addr, Addr6 netip.Addr
	// PortMin (even) and PortMax (odd) bound the relay ports.
	PortMin, PortMax uint16
	// FlowIDBase is the first flow ID given to call flows, kept apart from
	// the IDs of static flows. Default 1<<40.
	FlowIDBase uint64
}

func (c *Config) validate() error {
	if !c.Addr.IsValid() && !c.Addr6.IsValid() {
		return errors.New("need a media address")
	}
	if c.FlowIDBase == 0 {
		c.FlowIDBase = 1 << 40
	}
	return nil
}

// Sweeper is implemented by data planes that find idle flows themselves
// (fastpath does). It matches control.Sweeper.
type Sweeper interface {
	Sweep(idle time.Duration) ([]dataplane.FlowStats, error)
}

// Table holds the calls in progress, the relay ports and the data planes
// their flows go to. Create it with NewTable; it is safe for concurrent
// use.
type Table struct {
	cfg    Config
	log    *zap.Logger
	planes map[dataplane.Path]dataplane.DataPlane
	ports  *Ports
	now    func() time.Time

	nextFlow atomic.Uint64
	nextCall atomic.Uint64

	mu     sync.Mutex // guards the following
	calls  map[string]*Call
	owners map[netip.AddrPort]*Media // which call's media installed a flow
}

// NewTable returns a call table over the given data planes (at most one
// per path).
func NewTable(cfg Config, log *zap.Logger, planes ...dataplane.DataPlane) (*Table, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("call table: %w", err)
	}
	ports, err := NewPorts(cfg.PortMin, cfg.PortMax)
	if err != nil {
		return nil, fmt.Errorf("call table: %w", err)
	}
	t := &Table{
		cfg:    cfg,
		log:    log,
		planes: make(map[dataplane.Path]dataplane.DataPlane),
		ports:  ports,
		now:    time.Now,
		calls:  make(map[string]*Call),
	}
	for _, p := range planes {
		if p != nil {
			t.planes[p.Path()] = p
		}
	}
	// Continue after flow IDs found in the data planes (a previous run's
	// call flows, adopted as static flows), so that IDs never collide.
	t.nextFlow.Store(cfg.FlowIDBase)
	for _, p := range t.planes {
		list, err := p.List()
		if err != nil {
			continue
		}
		for _, fs := range list {
			if fs.Flow.ID >= t.nextFlow.Load() {
				t.nextFlow.Store(fs.Flow.ID + 1)
			}
			if fs.Flow.Match.Addr() == cfg.Addr || fs.Flow.Match.Addr() == cfg.Addr6 {
				ports.Reserve(fs.Flow.Match.Port() &^ 1)
			}
		}
	}
	return t, nil
}

// Addr returns the relay media address for a peer address: the same
// family when relayd has one, else the other.
func (t *Table) Addr(peer netip.Addr) netip.Addr {
	if peer.Is6() && !peer.Is4In6() && t.cfg.Addr6.IsValid() {
		return t.cfg.Addr6
	}
	if t.cfg.Addr.IsValid() {
		return t.cfg.Addr
	}
	return t.cfg.Addr6
}

// CanSRTP reports whether calls can have SRTP terminated on a leg (a
// userspace data plane runs).
func (t *Table) CanSRTP() bool {
	_, ok := t.planes[dataplane.PathUserspace]
	return ok
}

// Ports returns the port allocator.
func (t *Table) Ports() *Ports { return t.ports }

func (t *Table) allocPort() (uint16, error) { return t.ports.Alloc() }

func (t *Table) flowID() uint64 { return t.nextFlow.Add(1) - 1 }

// own records that m installed the flow with this match.
func (t *Table) own(match netip.AddrPort, m *Media) {
	t.mu.Lock()
	if t.owners == nil {
		t.owners = make(map[netip.AddrPort]*Media)
	}
	t.owners[match] = m
	t.mu.Unlock()
}

// disown forgets that m installed the flow with this match.
func (t *Table) disown(match netip.AddrPort, m *Media) {
	t.mu.Lock()
	if t.owners[match] == m {
		delete(t.owners, match)
	}
	t.mu.Unlock()
}

// Latched passes a data plane's latching event (a flow learned a source,
// or locked it) to the call whose flow it is. Events for flows no call
// owns (static flows, calls ended) are ignored.
func (t *Table) Latched(match, source netip.AddrPort, locked bool) {
	t.mu.Lock()
	m := t.owners[match]
	t.mu.Unlock()
	if m == nil {
		return
	}
	if err := m.Latched(match, source, locked); err != nil {
		t.log.Warn("apply latched source", zap.Stringer("match", match), zap.Stringer("source", source), zap.Error(err))
	}
}

// planeFor returns the data plane for a flow: XDP where it runs, else
// userspace; always userspace for SRTP.
func (t *Table) planeFor(f dataplane.Flow) dataplane.DataPlane {
	if f.HasSRTP() {
		return t.planes[dataplane.PathUserspace]
	}
	if p, ok := t.planes[dataplane.PathXDP]; ok {
		return p
	}
	return t.planes[dataplane.PathUserspace]
}

// NewMedia returns empty media for a call.
func (t *Table) NewMedia() *Media {
	return &Media{t: t, flows: make(map[netip.AddrPort]*flowRec)}
}

// New creates a call in state trying and adds it to the table.
func (t *Table) New(source netip.AddrPort, from, to string) *Call {
	n := t.nextCall.Add(1)
	c := &Call{
		ID:      strconv.FormatInt(t.now().Unix(), 36) + "-" + strconv.FormatUint(n, 10),
		Created: t.now(),
		Source:  source,
		From:    from,
		To:      to,
		Media:   t.NewMedia(),
		state:   StateTrying,
	}
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	t.mu.Lock()
	// A call restored from the previous run may have the ID this run's
	// counter just made (a restart within the second the call began).
	for _, taken := t.calls[c.ID]; taken; _, taken = t.calls[c.ID] {
		c.ID = strconv.FormatInt(c.Created.Unix(), 36) + "-" + strconv.FormatUint(t.nextCall.Add(1), 10)
	}
	t.calls[c.ID] = c
	t.mu.Unlock()
	return c
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

// Idle returns the answered calls none of whose flows has carried a
// packet for idle (flows never used count from their installation).
// Calls without flows are not idle. Data planes that implement Sweeper
// are asked for their idle flows; the others are listed.
func (t *Table) Idle(idle time.Duration) ([]*Call, error) {
	now := t.now()
	// seen: last packet per match; only flows the data plane considers
	// active get a recent time, idle ones keep theirs.
	seen := make(map[netip.AddrPort]time.Time)
	var errs []error
	for path, p := range t.planes {
		list, err := p.List()
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s flows: %w", path, err))
			continue
		}
		active := make(map[netip.AddrPort]bool, len(list))
		if s, ok := p.(Sweeper); ok {
			idleList, err := s.Sweep(idle)
			if err != nil {
				errs = append(errs, fmt.Errorf("sweep %s flows: %w", path, err))
				continue
			}
			for _, fs := range list {
				active[fs.Flow.Match] = true
			}
			for _, fs := range idleList {
				active[fs.Flow.Match] = false
			}
		}
		for _, fs := range list {
			last := fs.Stats.LastSeen
			if active[fs.Flow.Match] && !last.IsZero() {
				last = now // the data plane says it is not idle
			}
			if last.After(seen[fs.Flow.Match]) {
				seen[fs.Flow.Match] = last
			}
		}
	}
	cutoff := now.Add(-idle)
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
	return out, errors.Join(errs...)
}
