// Package control is relayd's control plane. This file holds the flow
// manager: it owns static flows (installed through the admin API), checks
// them against the relay's media addresses and port range, hands them to
// the data plane that carries them and assigns their IDs.
//
// control never imports cilium/ebpf or golang.org/x/sys/unix: it talks to
// data planes only through dataplane.DataPlane.
package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/sdes"
)

// Errors the flow manager returns; callers (the admin API) branch on them
// with errors.Is. The returned errors wrap them with details.
var (
	// ErrInvalid: the request is malformed or inconsistent (HTTP 400).
	ErrInvalid = errors.New("invalid flow")
	// ErrNotRelayAddress: an address that must be one of the relay's media
	// addresses with a port in the media range is not (HTTP 422).
	ErrNotRelayAddress = errors.New("not a relay media address")
	// ErrConflict: a flow with this match exists (HTTP 409).
	ErrConflict = errors.New("match already in use")
	// ErrNotFound: no flow with this ID (HTTP 404).
	ErrNotFound = errors.New("no such flow")
	// ErrNotImplemented: the flow needs a data plane or feature relayd
	// does not have (yet) (HTTP 501).
	ErrNotImplemented = errors.New("not implemented")
)

// ManagerConfig is what the flow manager needs to know about the relay.
type ManagerConfig struct {
	// Addr and Addr6 are the relay's IPv4 and IPv6 media addresses; at
	// least one must be valid.
	Addr, Addr6 netip.Addr
	// PortMin and PortMax bound the relay's media ports (inclusive).
	PortMin, PortMax uint16
	// CallFlowIDBase, when not zero, is where the B2BUA's flow ids start.
	// Flows at or above it found in the data planes at start belong to
	// calls of a previous run: those the restored calls claim
	// (ClaimCallFlows) are theirs; the others, whose calls are gone, keep
	// carrying media and are removed once idle (SweepIdle), instead of
	// being adopted as static flows.
	CallFlowIDBase uint64
}

func (c *ManagerConfig) validate() error {
	if !c.Addr.IsValid() && !c.Addr6.IsValid() {
		return errors.New("need a media address")
	}
	if c.PortMin == 0 || c.PortMin > c.PortMax {
		return fmt.Errorf("bad media port range %d-%d", c.PortMin, c.PortMax)
	}
	return nil
}

// Crypto is an SRTP transform requested for a flow.
type Crypto struct {
	Suite string // e.g. AES_CM_128_HMAC_SHA1_80
	Key   string // base64 of master key || master salt
}

// FlowSpec is a request for a static flow.
type FlowSpec struct {
	Match        netip.AddrPort // relay address and port packets arrive on
	ExpectSource netip.AddrPort // optional; zero port accepts any port
	SendFrom     netip.AddrPort // relay address and port packets leave from
	SendTo       netip.AddrPort // where they go
	// Mode is the requested data plane: PathXDP or PathUserspace. Empty
	// means xdp, or userspace when Decrypt or Encrypt is set.
	Mode      dataplane.Path
	Action    dataplane.Action // Forward, Drop or Reflect
	ClockRate uint32           // RTP clock rate; 0 = no RTP statistics
	Decrypt   *Crypto          // optional SRTP decryption of arriving packets
	Encrypt   *Crypto          // optional SRTP encryption of leaving packets
	Latch     bool             // symmetric RTP: learn and lock the source (see dataplane.Flow)
	Reverse   netip.AddrPort   // match of the flow whose send_to follows the learned source
}

// FlowState is a flow, where it runs and its statistics.
type FlowState struct {
	Flow  dataplane.Flow
	Path  dataplane.Path
	Stats dataplane.Stats
}

// Sweeper is implemented by data planes that can find idle flows
// themselves (fastpath does, from its per-flow last-seen times).
type Sweeper interface {
	Sweep(idle time.Duration) ([]dataplane.FlowStats, error)
}

// Manager owns static flows. Create it with NewManager; it is safe for
// concurrent use.
type Manager struct {
	cfg    ManagerConfig
	log    *zap.Logger
	planes map[dataplane.Path]dataplane.DataPlane
	now    func() time.Time

	mu      sync.Mutex // guards the following
	nextID  uint64
	flows   map[uint64]*entry
	byMatch map[netip.AddrPort]uint64
	orphans map[netip.AddrPort]*entry // call flows of a previous run
}

type entry struct {
	flow    dataplane.Flow
	plane   dataplane.DataPlane
	created time.Time // install or adoption time
	idle    bool      // reported idle by the last sweep
}

// NewManager returns a manager for the given data planes (at most one per
// Path; none is fine: every Add then fails with ErrNotImplemented). It
// adopts the flows the data planes already carry, such as pinned XDP flows
// left by a previous run, keeping their IDs, and assigns new IDs after the
// highest one found.
func NewManager(cfg ManagerConfig, log *zap.Logger, planes ...dataplane.DataPlane) (*Manager, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("flow manager: %w", err)
	}
	m := &Manager{
		cfg:     cfg,
		log:     log,
		planes:  make(map[dataplane.Path]dataplane.DataPlane),
		now:     time.Now,
		nextID:  1,
		flows:   make(map[uint64]*entry),
		byMatch: make(map[netip.AddrPort]uint64),
		orphans: make(map[netip.AddrPort]*entry),
	}
	for _, p := range planes {
		if p == nil {
			continue
		}
		if _, dup := m.planes[p.Path()]; dup {
			return nil, fmt.Errorf("flow manager: two data planes for path %s", p.Path())
		}
		m.planes[p.Path()] = p
	}
	if err := m.adopt(); err != nil {
		return nil, err
	}
	return m, nil
}

// adopt takes over the flows the data planes carry. Flows without an ID or
// with an ID already taken get a new one, written back with Update.
func (m *Manager) adopt() error {
	type found struct {
		fs    dataplane.FlowStats
		plane dataplane.DataPlane
	}
	var all []found
	for _, path := range []dataplane.Path{dataplane.PathXDP, dataplane.PathUserspace} {
		p, ok := m.planes[path]
		if !ok {
			continue
		}
		list, err := p.List()
		if err != nil {
			return fmt.Errorf("adopt %s flows: %w", path, err)
		}
		for _, fs := range list {
			if b := m.cfg.CallFlowIDBase; b != 0 && fs.Flow.ID >= b {
				m.orphans[fs.Flow.Match] = &entry{flow: fs.Flow, plane: p, created: m.now()}
				continue
			}
			all = append(all, found{fs, p})
			m.nextID = max(m.nextID, fs.Flow.ID+1)
		}
	}
	now := m.now()
	var renumber []found
	for _, f := range all {
		fl := f.fs.Flow
		if id, ok := m.byMatch[fl.Match]; ok {
			m.log.Warn("flow present in two data planes; keeping the first",
				zap.Stringer("match", fl.Match), zap.Uint64("id", id), zap.String("also_in", string(f.plane.Path())))
			continue
		}
		if _, taken := m.flows[fl.ID]; fl.ID == 0 || taken {
			renumber = append(renumber, f)
			continue
		}
		m.flows[fl.ID] = &entry{flow: fl, plane: f.plane, created: now}
		m.byMatch[fl.Match] = fl.ID
	}
	for _, f := range renumber {
		fl := f.fs.Flow
		old := fl.ID
		fl.ID = m.nextID
		if err := f.plane.Update(fl); err != nil {
			return fmt.Errorf("adopt flow %s: give it id %d: %w", fl.Match, fl.ID, err)
		}
		m.nextID++
		m.flows[fl.ID] = &entry{flow: fl, plane: f.plane, created: now}
		m.byMatch[fl.Match] = fl.ID
		m.log.Warn("adopted flow renumbered", zap.Stringer("match", fl.Match), zap.Uint64("old_id", old), zap.Uint64("id", fl.ID))
	}
	if len(m.flows) > 0 {
		m.log.Info("adopted flows from data planes", zap.Int("flows", len(m.flows)), zap.Uint64("next_id", m.nextID))
	}
	if len(m.orphans) > 0 {
		m.log.Info("flows of calls from before the restart keep their media until idle",
			zap.Int("flows", len(m.orphans)))
	}
	return nil
}

// ClaimCallFlows hands call flows of a previous run to the calls restored
// from the store (control/state): the manager forgets them and no longer
// removes them when idle; the flows no restored call claims stay its to
// sweep. It returns how many of matches it held.
func (m *Manager) ClaimCallFlows(matches []netip.AddrPort) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, match := range matches {
		if _, ok := m.orphans[match]; ok {
			delete(m.orphans, match)
			n++
		}
	}
	if n > 0 || len(m.orphans) > 0 {
		m.log.Info("call flows of the previous run", zap.Int("claimed_by_restored_calls", n),
			zap.Int("unclaimed_removed_once_idle", len(m.orphans)))
	}
	return n
}

// sweepOrphans removes the call flows of a previous run that carried no
// packet for idle (since adoption if they never did).
func (m *Manager) sweepOrphans(idle time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cutoff := m.now().Add(-idle)
	for match, e := range m.orphans {
		st, err := e.plane.Stats(match)
		if errors.Is(err, dataplane.ErrNotFound) {
			delete(m.orphans, match)
			continue
		}
		if err != nil {
			continue
		}
		last := st.LastSeen
		if last.IsZero() || last.Before(e.created) {
			last = e.created
		}
		if last.After(cutoff) {
			continue
		}
		if _, err := e.plane.Remove(match); err != nil && !errors.Is(err, dataplane.ErrNotFound) {
			m.log.Warn("remove idle flow of a previous run", zap.Stringer("match", match), zap.Error(err))
			continue
		}
		delete(m.orphans, match)
		m.log.Info("removed idle flow of a call from before the restart", zap.Stringer("match", match),
			zap.Uint64("id", e.flow.ID), zap.Uint64("packets", st.Packets))
	}
}

// isRelay reports whether ap is a relay media address with a port in range.
func (m *Manager) isRelay(ap netip.AddrPort) bool {
	a := ap.Addr()
	if a != m.cfg.Addr && a != m.cfg.Addr6 {
		return false
	}
	return ap.Port() >= m.cfg.PortMin && ap.Port() <= m.cfg.PortMax
}

func (m *Manager) relayDesc() string {
	var addrs []string
	for _, a := range []netip.Addr{m.cfg.Addr, m.cfg.Addr6} {
		if a.IsValid() {
			addrs = append(addrs, a.String())
		}
	}
	return fmt.Sprintf("relay media addresses %v, ports %d-%d", addrs, m.cfg.PortMin, m.cfg.PortMax)
}

// check validates spec and returns the flow to install and the data plane.
func (m *Manager) check(spec FlowSpec) (dataplane.Flow, dataplane.DataPlane, error) {
	fl := dataplane.Flow{
		Match:        spec.Match,
		ExpectSource: spec.ExpectSource,
		SendFrom:     spec.SendFrom,
		SendTo:       spec.SendTo,
		Action:       spec.Action,
		ClockRate:    spec.ClockRate,
		Latch:        spec.Latch,
		Reverse:      spec.Reverse,
	}
	switch spec.Action {
	case dataplane.Forward, dataplane.Drop, dataplane.Reflect:
	default:
		return fl, nil, fmt.Errorf("%w: action %s not allowed (want forward, drop or reflect)", ErrInvalid, spec.Action)
	}
	if err := fl.Validate(); err != nil {
		return fl, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if spec.ExpectSource.IsValid() && spec.ExpectSource.Addr().Zone() != "" {
		return fl, nil, fmt.Errorf("%w: expect_source: zoned addresses are not supported", ErrInvalid)
	}
	if fl.SendFrom.IsValid() && fl.SendFrom.Addr().Is4() != fl.Match.Addr().Is4() {
		return fl, nil, fmt.Errorf("%w: send_from: address family differs from match (no IPv4/IPv6 translation)", ErrInvalid)
	}
	if !m.isRelay(fl.Match) {
		return fl, nil, fmt.Errorf("match %s: %w (%s)", fl.Match, ErrNotRelayAddress, m.relayDesc())
	}
	if fl.Reverse.IsValid() && !m.isRelay(fl.Reverse) {
		return fl, nil, fmt.Errorf("reverse %s: %w (%s)", fl.Reverse, ErrNotRelayAddress, m.relayDesc())
	}
	if fl.Latch && fl.Action != dataplane.Forward {
		return fl, nil, fmt.Errorf("%w: latch: only forwarded flows latch", ErrInvalid)
	}
	if fl.SendFrom.IsValid() && !m.isRelay(fl.SendFrom) {
		return fl, nil, fmt.Errorf("send_from %s: %w (%s)", fl.SendFrom, ErrNotRelayAddress, m.relayDesc())
	}
	for _, c := range []struct {
		name string
		c    *Crypto
		dst  **dataplane.SRTP
	}{{"decrypt", spec.Decrypt, &fl.Decrypt}, {"encrypt", spec.Encrypt, &fl.Encrypt}} {
		if c.c == nil {
			continue
		}
		if fl.Action != dataplane.Forward {
			return fl, nil, fmt.Errorf("%w: %s: only forwarded flows take SRTP", ErrInvalid, c.name)
		}
		suite, err := sdes.ParseSuite(c.c.Suite)
		if err != nil {
			return fl, nil, fmt.Errorf("%w: %s: %w", ErrInvalid, c.name, err)
		}
		key, salt, err := sdes.DecodeKey(suite, c.c.Key)
		if err != nil {
			return fl, nil, fmt.Errorf("%w: %s: %w", ErrInvalid, c.name, err)
		}
		*c.dst = &dataplane.SRTP{Suite: suite.String(), Key: key, Salt: salt}
	}
	mode := spec.Mode
	switch {
	case mode == "" && fl.HasSRTP():
		mode = dataplane.PathUserspace
	case mode == "":
		// The default: XDP where it runs, else the userspace data plane
		// (dataplane.mode = "userspace").
		mode = dataplane.PathXDP
		if _, ok := m.planes[mode]; !ok {
			mode = dataplane.PathUserspace
		}
	case mode != dataplane.PathXDP && mode != dataplane.PathUserspace:
		return fl, nil, fmt.Errorf("%w: mode %q (want xdp or userspace)", ErrInvalid, mode)
	case fl.HasSRTP():
		// A flow with SRTP always runs in userspace, whatever mode says.
		mode = dataplane.PathUserspace
	}
	p, ok := m.planes[mode]
	if !ok {
		return fl, nil, fmt.Errorf("mode %s: no %s data plane is running: %w", mode, mode, ErrNotImplemented)
	}
	return fl, p, nil
}

// Add validates spec, assigns an ID and installs the flow.
func (m *Manager) Add(spec FlowSpec) (FlowState, error) {
	fl, p, err := m.check(spec)
	if err != nil {
		return FlowState{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if id, ok := m.byMatch[fl.Match]; ok {
		return FlowState{}, fmt.Errorf("match %s: %w by flow %d", fl.Match, ErrConflict, id)
	}
	fl.ID = m.nextID
	if err := p.Install(fl); err != nil {
		if errors.Is(err, dataplane.ErrExists) {
			return FlowState{}, fmt.Errorf("match %s: %w: %w", fl.Match, ErrConflict, err)
		}
		return FlowState{}, fmt.Errorf("install flow %d: %w", fl.ID, err)
	}
	m.nextID++
	m.flows[fl.ID] = &entry{flow: fl, plane: p, created: m.now()}
	m.byMatch[fl.Match] = fl.ID
	m.log.Info("flow added", zap.Uint64("id", fl.ID), zap.Stringer("match", fl.Match),
		zap.Stringer("send_to", fl.SendTo), zap.Stringer("action", fl.Action), zap.String("path", string(p.Path())))
	return FlowState{Flow: fl, Path: p.Path()}, nil
}

// Get returns the flow with this ID and its current statistics.
func (m *Manager) Get(id uint64) (FlowState, error) {
	m.mu.Lock()
	e, ok := m.flows[id]
	m.mu.Unlock()
	if !ok {
		return FlowState{}, fmt.Errorf("flow %d: %w", id, ErrNotFound)
	}
	st, err := e.plane.Stats(e.flow.Match)
	if err != nil {
		return FlowState{}, fmt.Errorf("stats of flow %d: %w", id, err)
	}
	return FlowState{Flow: e.flow, Path: e.plane.Path(), Stats: st}, nil
}

// List returns every flow the manager owns with its statistics, sorted by
// ID. Statistics come from one List call per data plane.
func (m *Manager) List() ([]FlowState, error) {
	stats := make(map[netip.AddrPort]dataplane.Stats)
	for path, p := range m.planes {
		list, err := p.List()
		if err != nil {
			return nil, fmt.Errorf("list %s flows: %w", path, err)
		}
		for _, fs := range list {
			stats[fs.Flow.Match] = fs.Stats
		}
	}
	m.mu.Lock()
	out := make([]FlowState, 0, len(m.flows))
	for _, e := range m.flows {
		out = append(out, FlowState{Flow: e.flow, Path: e.plane.Path(), Stats: stats[e.flow.Match]})
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b FlowState) int { return cmp.Compare(a.Flow.ID, b.Flow.ID) })
	return out, nil
}

// Remove deletes the flow with this ID and returns it with its last
// statistics.
func (m *Manager) Remove(id uint64) (FlowState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.flows[id]
	if !ok {
		return FlowState{}, fmt.Errorf("flow %d: %w", id, ErrNotFound)
	}
	st, err := e.plane.Remove(e.flow.Match)
	if err != nil && !errors.Is(err, dataplane.ErrNotFound) {
		return FlowState{}, fmt.Errorf("remove flow %d: %w", id, err)
	}
	// ErrNotFound: the data plane lost it already (e.g. pinned maps
	// removed by relayd -detach); forget it too.
	delete(m.flows, id)
	delete(m.byMatch, e.flow.Match)
	m.log.Info("flow removed", zap.Uint64("id", id), zap.Stringer("match", e.flow.Match),
		zap.Uint64("packets", st.Packets), zap.Uint64("bytes", st.Bytes))
	return FlowState{Flow: e.flow, Path: e.plane.Path(), Stats: st}, nil
}

// Counts returns the number of flows per path, for metrics.
func (m *Manager) Counts() map[dataplane.Path]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[dataplane.Path]int{dataplane.PathXDP: 0, dataplane.PathUserspace: 0}
	for _, e := range m.flows {
		out[e.plane.Path()]++
	}
	return out
}

// Idle returns the flows that have carried no packet for longer than idle:
// last seen before now-idle, or never seen and installed (or adopted)
// before it. Data planes that implement Sweeper are asked directly; for
// the others the manager compares times itself. Static flows are not
// removed.
func (m *Manager) Idle(idle time.Duration) ([]FlowState, error) {
	now := m.now()
	cutoff := now.Add(-idle)
	idleMatch := make(map[netip.AddrPort]dataplane.Stats)
	var errs []error
	for path, p := range m.planes {
		var list []dataplane.FlowStats
		var err error
		if s, ok := p.(Sweeper); ok {
			list, err = s.Sweep(idle)
		} else {
			list, err = p.List()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sweep %s flows: %w", path, err))
			continue
		}
		for _, fs := range list {
			idleMatch[fs.Flow.Match] = fs.Stats
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []FlowState
	for _, e := range m.flows {
		st, ok := idleMatch[e.flow.Match]
		if !ok {
			continue
		}
		last := st.LastSeen
		if last.IsZero() {
			last = e.created
		}
		if last.Before(cutoff) {
			out = append(out, FlowState{Flow: e.flow, Path: e.plane.Path(), Stats: st})
		}
	}
	slices.SortFunc(out, func(a, b FlowState) int { return cmp.Compare(a.Flow.ID, b.Flow.ID) })
	return out, errors.Join(errs...)
}

// SweepIdle logs, at info level, each flow that became idle for longer
// than idle since the last call, and at debug level each that became
// active again. It returns the flows idle now.
func (m *Manager) SweepIdle(idle time.Duration) ([]FlowState, error) {
	m.sweepOrphans(idle)
	flows, err := m.Idle(idle)
	now := m.now()
	isIdle := make(map[uint64]bool, len(flows))
	for _, f := range flows {
		isIdle[f.Flow.ID] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range flows {
		e := m.flows[f.Flow.ID]
		if e == nil || e.idle {
			continue
		}
		e.idle = true
		fields := []zap.Field{zap.Uint64("id", f.Flow.ID), zap.Stringer("match", f.Flow.Match),
			zap.String("path", string(f.Path)), zap.Duration("timeout", idle), zap.Uint64("packets", f.Stats.Packets)}
		if !f.Stats.LastSeen.IsZero() {
			fields = append(fields, zap.Duration("idle_for", now.Sub(f.Stats.LastSeen).Round(time.Millisecond)))
		}
		m.log.Info("flow idle", fields...)
	}
	if err == nil {
		for id, e := range m.flows {
			if e.idle && !isIdle[id] {
				e.idle = false
				m.log.Debug("flow active again", zap.Uint64("id", id), zap.Stringer("match", e.flow.Match))
			}
		}
	}
	return flows, err
}

// RunIdleSweep calls SweepIdle every interval until ctx is done. Errors
// are logged, not returned.
func (m *Manager) RunIdleSweep(ctx context.Context, interval, idle time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := m.SweepIdle(idle); err != nil {
				m.log.Warn("idle sweep", zap.Error(err))
			}
		}
	}
}

// Latched is called when a latching flow learned a source (locked false):
// the reverse flow, if any, now sends there; and when its window closed
// (locked true): the flow now expects exactly that source and stops
// latching, so an XDP flow goes back to XDP.
func (m *Manager) Latched(match, source netip.AddrPort, locked bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.byMatch[match]
	if !ok {
		return
	}
	e := m.flows[id]
	fl := e.flow
	if locked {
		fl.Latch = false
		fl.ExpectSource = source
		if err := e.plane.Update(fl); err != nil {
			m.log.Warn("lock latched source", zap.Uint64("id", id), zap.Stringer("source", source), zap.Error(err))
			return
		}
		e.flow = fl
		m.log.Info("source latched", zap.Uint64("id", id), zap.Stringer("match", match), zap.Stringer("source", source),
			zap.String("path", string(e.plane.Path())))
	}
	if !fl.Reverse.IsValid() {
		return
	}
	rid, ok := m.byMatch[fl.Reverse]
	if !ok {
		return
	}
	re := m.flows[rid]
	rfl := re.flow
	if rfl.SendTo == source {
		return
	}
	rfl.SendTo = source
	if err := re.plane.Update(rfl); err != nil {
		m.log.Warn("send reverse flow to latched source", zap.Uint64("id", rid), zap.Stringer("source", source), zap.Error(err))
		return
	}
	re.flow = rfl
	m.log.Debug("reverse flow follows the source", zap.Uint64("id", rid), zap.Stringer("send_to", source))
}
