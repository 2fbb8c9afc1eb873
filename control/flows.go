// Package control is relayd's control plane. This file holds the static
// flow manager: it checks the admin API's flows against the relay's media
// interfaces and keeps them in the flow registry (control/registry), the
// one owner of flows, IDs and ports, which chooses their data plane. See
// docs/architecture.md.
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
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/destpolicy"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// Errors the flow manager returns; callers (the admin API) branch on them
// with errors.Is. The returned errors wrap them with details.
var (
	// ErrInvalid: the request is malformed or inconsistent (HTTP 400).
	ErrInvalid = errors.New("invalid flow")
	// ErrNotRelayAddress: an address that must be one of the relay's media
	// addresses with a port in the media range is not (HTTP 422).
	ErrNotRelayAddress = errors.New("not a relay media address")
	// ErrDeniedDestination: send_to or a transcoding flow's rtcp_to is a
	// destination the destination policy refuses (HTTP 422); the error
	// wraps destpolicy.ErrDenied too.
	ErrDeniedDestination = destpolicy.ErrDenied
	// ErrConflict: a flow with this match exists (HTTP 409).
	ErrConflict = errors.New("match already in use")
	// ErrNotFound: no flow with this ID (HTTP 404).
	ErrNotFound = errors.New("no such flow")
	// ErrNotImplemented: the flow needs a data plane or feature relayd
	// does not have (yet) (HTTP 501).
	ErrNotImplemented = errors.New("not implemented")
)

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
	// Transcode, when set, converts the flow's RTP between codecs (see
	// dataplane.Transcode); such a flow runs in userspace.
	Transcode *dataplane.Transcode
	// RateCap, when set, is the flow's packet-rate cap in packets per
	// second (0: none); unset, the registry's default ceiling.
	RateCap *uint32
}

// FlowState is a flow, where it runs and its statistics.
type FlowState = registry.FlowState

// Manager owns the static flows of the admin API. It keeps them in the
// flow registry, which every front end shares: a static flow takes its
// port pair there, so no call is given it, and a call's port cannot be
// taken by a static flow. Create it with NewManager; it is safe for
// concurrent use.
type Manager struct {
	reg *registry.Registry
	log *zap.Logger
	now func() time.Time

	mu     sync.Mutex                     // guards the following
	idle   map[uint64]bool                // reported idle by the last sweep
	locked map[netip.AddrPort]*lockedFlow // latching flows locked, by match
}

// lockedFlow is what Rebind needs of a latching flow that locked: the
// source it was asked to expect (the signalled one), when it locked, and
// its drop count at the last look (-1: not looked yet).
type lockedFlow struct {
	signalled netip.AddrPort
	source    netip.AddrPort
	at        time.Time
	dropped   int64
}

// NewManager returns the manager of the registry's static flows (those it
// adopted from the data planes at start included).
func NewManager(reg *registry.Registry, log *zap.Logger) *Manager {
	return &Manager{reg: reg, log: log, now: time.Now, idle: make(map[uint64]bool), locked: make(map[netip.AddrPort]*lockedFlow)}
}

// check validates spec and returns the flow to install and its mode.
func (m *Manager) check(spec FlowSpec) (dataplane.Flow, dataplane.Path, error) {
	fl := dataplane.Flow{
		Match:        spec.Match,
		ExpectSource: spec.ExpectSource,
		SendFrom:     spec.SendFrom,
		SendTo:       spec.SendTo,
		Action:       spec.Action,
		ClockRate:    spec.ClockRate,
		Latch:        spec.Latch,
		Reverse:      spec.Reverse,
		// relayd knows nothing of a static flow's codec: the default
		// ceiling, unless the request says.
		RateCap: m.reg.Rates().DefaultCap(),
	}
	if spec.RateCap != nil {
		fl.RateCap = registry.CapOf(*spec.RateCap)
	}
	if spec.Transcode != nil {
		t := *spec.Transcode
		fl.Transcode = &t
		if spec.Action != dataplane.Forward {
			return fl, "", fmt.Errorf("%w: transcode: only forwarded flows transcode", ErrInvalid)
		}
		if (t.In.Name == "G729" || t.Out.Name == "G729") && !g729.Available {
			return fl, "", fmt.Errorf("%w: transcode: %w", ErrNotImplemented, g729.ErrUnavailable)
		}
		if t.RTCPFrom.IsValid() && !m.reg.IsRelay(t.RTCPFrom) {
			return fl, "", fmt.Errorf("transcode rtcp_from %s: %w (%s)", t.RTCPFrom, ErrNotRelayAddress, m.reg.Describe())
		}
	}
	switch spec.Action {
	case dataplane.Forward, dataplane.Drop, dataplane.Reflect:
	default:
		return fl, "", fmt.Errorf("%w: action %s not allowed (want forward, drop or reflect)", ErrInvalid, spec.Action)
	}
	if err := fl.Validate(); err != nil {
		return fl, "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if spec.ExpectSource.IsValid() && spec.ExpectSource.Addr().Zone() != "" {
		return fl, "", fmt.Errorf("%w: expect_source: zoned addresses are not supported", ErrInvalid)
	}
	if fl.SendFrom.IsValid() && fl.SendFrom.Addr().Is4() != fl.Match.Addr().Is4() {
		return fl, "", fmt.Errorf("%w: send_from: address family differs from match (no IPv4/IPv6 translation)", ErrInvalid)
	}
	if !m.reg.IsRelay(fl.Match) {
		return fl, "", fmt.Errorf("match %s: %w (%s)", fl.Match, ErrNotRelayAddress, m.reg.Describe())
	}
	if fl.Reverse.IsValid() && !m.reg.IsRelay(fl.Reverse) {
		return fl, "", fmt.Errorf("reverse %s: %w (%s)", fl.Reverse, ErrNotRelayAddress, m.reg.Describe())
	}
	if fl.Latch && fl.Action != dataplane.Forward {
		return fl, "", fmt.Errorf("%w: latch: only forwarded flows latch", ErrInvalid)
	}
	if fl.SendFrom.IsValid() && !m.reg.IsRelay(fl.SendFrom) {
		return fl, "", fmt.Errorf("send_from %s: %w (%s)", fl.SendFrom, ErrNotRelayAddress, m.reg.Describe())
	}
	// Where the flow sends: never back into relayd (a loop at the data
	// plane's speed), nor to loopback, broadcast and the like.
	if fl.Action == dataplane.Forward {
		if err := m.reg.CheckDestination(fl.SendTo); err != nil {
			return fl, "", fmt.Errorf("send_to: %w", err)
		}
		if t := fl.Transcode; t != nil && t.RTCPTo.IsValid() {
			if err := m.reg.CheckDestination(t.RTCPTo); err != nil {
				return fl, "", fmt.Errorf("transcode rtcp_to: %w", err)
			}
		}
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
			return fl, "", fmt.Errorf("%w: %s: only forwarded flows take SRTP", ErrInvalid, c.name)
		}
		suite, err := sdes.ParseSuite(c.c.Suite)
		if err != nil {
			return fl, "", fmt.Errorf("%w: %s: %w", ErrInvalid, c.name, err)
		}
		key, salt, err := sdes.DecodeKey(suite, c.c.Key)
		if err != nil {
			return fl, "", fmt.Errorf("%w: %s: %w", ErrInvalid, c.name, err)
		}
		*c.dst = &dataplane.SRTP{Suite: suite.String(), Key: key, Salt: salt}
	}
	mode := spec.Mode
	if mode != "" && mode != dataplane.PathXDP && mode != dataplane.PathUserspace {
		return fl, "", fmt.Errorf("%w: mode %q (want xdp or userspace)", ErrInvalid, mode)
	}
	// The registry chooses the plane: the default is XDP where it runs;
	// a flow with SRTP or transcoding always runs in userspace, whatever
	// mode says.
	fl.Owner = dataplane.OwnerStatic
	if _, err := m.reg.PlaneFor(fl, mode); err != nil {
		return fl, "", fmt.Errorf("mode %s: %w: %w", cmp.Or(mode, "default"), ErrNotImplemented, err)
	}
	return fl, mode, nil
}

// Add validates spec, takes the match's port pair, assigns an ID and
// installs the flow.
func (m *Manager) Add(spec FlowSpec) (FlowState, error) {
	fl, mode, err := m.check(spec)
	if err != nil {
		return FlowState{}, err
	}
	if _, _, ok := m.reg.Get(fl.Match); ok {
		return FlowState{}, fmt.Errorf("match %s: %w", fl.Match, ErrConflict)
	}
	if err := m.reg.HoldStatic(fl.Match); err != nil {
		return FlowState{}, fmt.Errorf("match %s: %w: %w", fl.Match, ErrConflict, err)
	}
	fl, path, err := m.reg.Install(fl, mode, m)
	if err != nil {
		m.reg.ReleaseStatic(fl.Match)
		if errors.Is(err, dataplane.ErrExists) {
			return FlowState{}, fmt.Errorf("match %s: %w: %w", fl.Match, ErrConflict, err)
		}
		return FlowState{}, fmt.Errorf("install flow: %w", err)
	}
	m.log.Info("flow added", zap.Uint64("id", fl.ID), zap.Stringer("match", fl.Match),
		zap.Stringer("send_to", fl.SendTo), zap.Stringer("action", fl.Action), zap.String("path", string(path)))
	return FlowState{Flow: fl, Path: path}, nil
}

// static returns the match of the static flow with this ID.
func (m *Manager) static(id uint64) (netip.AddrPort, error) {
	match, ok := m.reg.ByID(id)
	if ok {
		if fl, _, ok := m.reg.Get(match); ok && fl.Owner == dataplane.OwnerStatic {
			return match, nil
		}
	}
	return netip.AddrPort{}, fmt.Errorf("flow %d: %w", id, ErrNotFound)
}

// Get returns the static flow with this ID and its current statistics.
func (m *Manager) Get(id uint64) (FlowState, error) {
	match, err := m.static(id)
	if err != nil {
		return FlowState{}, err
	}
	fs, err := m.reg.Stats(match)
	if err != nil {
		return FlowState{}, fmt.Errorf("stats of flow %d: %w", id, err)
	}
	return fs, nil
}

// List returns every static flow with its statistics, sorted by ID.
func (m *Manager) List() ([]FlowState, error) {
	return m.reg.List(dataplane.OwnerStatic)
}

// Remove deletes the static flow with this ID and returns it with its
// last statistics.
func (m *Manager) Remove(id uint64) (FlowState, error) {
	match, err := m.static(id)
	if err != nil {
		return FlowState{}, err
	}
	fs, err := m.reg.Remove(match)
	if errors.Is(err, dataplane.ErrNotFound) {
		return FlowState{}, fmt.Errorf("flow %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return FlowState{}, err
	}
	m.reg.ReleaseStatic(match)
	m.mu.Lock()
	delete(m.idle, id)
	m.mu.Unlock()
	m.log.Info("flow removed", zap.Uint64("id", id), zap.Stringer("match", match),
		zap.Uint64("packets", fs.Stats.Packets), zap.Uint64("bytes", fs.Stats.Bytes))
	return fs, nil
}

// Counts returns the number of static flows per path, for metrics.
func (m *Manager) Counts() map[dataplane.Path]int {
	out := make(map[dataplane.Path]int)
	for path, byOwner := range m.reg.Counts() {
		out[path] = byOwner[dataplane.OwnerStatic]
	}
	return out
}

// Idle returns the static flows that have carried no packet for longer
// than idle: last seen before now-idle, or never seen and installed (or
// adopted) before it. Static flows are not removed.
func (m *Manager) Idle(idle time.Duration) ([]FlowState, error) {
	cutoff := m.now().Add(-idle)
	flows, err := m.List()
	if err != nil {
		return nil, err
	}
	var out []FlowState
	for _, f := range flows {
		last := f.Stats.LastSeen
		if last.IsZero() {
			last, _ = m.reg.Created(f.Flow.Match)
		}
		if last.Before(cutoff) {
			out = append(out, f)
		}
	}
	return out, nil
}

// SweepIdle removes the unclaimed call flows of a previous run that are
// idle, logs at info level each static flow that became idle for longer
// than idle since the last call, and at debug level each that became
// active again. It returns the static flows idle now.
func (m *Manager) SweepIdle(idle time.Duration) ([]FlowState, error) {
	m.reg.SweepUnclaimed(idle)
	flows, err := m.Idle(idle)
	now := m.now()
	isIdle := make(map[uint64]bool, len(flows))
	for _, f := range flows {
		isIdle[f.Flow.ID] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range flows {
		if m.idle[f.Flow.ID] {
			continue
		}
		m.idle[f.Flow.ID] = true
		fields := []zap.Field{zap.Uint64("id", f.Flow.ID), zap.Stringer("match", f.Flow.Match),
			zap.String("path", string(f.Path)), zap.Duration("timeout", idle), zap.Uint64("packets", f.Stats.Packets)}
		if !f.Stats.LastSeen.IsZero() {
			fields = append(fields, zap.Duration("idle_for", now.Sub(f.Stats.LastSeen).Round(time.Millisecond)))
		}
		m.log.Info("flow idle", fields...)
	}
	if err == nil {
		for id := range m.idle {
			if !isIdle[id] {
				delete(m.idle, id)
				m.log.Debug("flow active again", zap.Uint64("id", id))
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

// Latched implements registry.Holder for static flows. When a latching
// flow learned a source (locked false) the reverse flow, if any, now sends
// there; when its window closed (locked true) the flow expects exactly
// that source and stops latching, so an XDP flow goes back to XDP.
func (m *Manager) Latched(match, source netip.AddrPort, locked bool) {
	fl, path, ok := m.reg.Get(match)
	if !ok {
		return
	}
	if locked {
		signalled := fl.ExpectSource
		fl.Latch = false
		fl.ExpectSource = source
		if _, err := m.reg.Update(fl); err != nil {
			m.log.Warn("lock latched source", zap.Uint64("id", fl.ID), zap.Stringer("source", source), zap.Error(err))
			return
		}
		m.mu.Lock()
		if prev, ok := m.locked[match]; ok {
			signalled = prev.signalled // locked again after a rebinding
		}
		m.locked[match] = &lockedFlow{signalled: signalled, source: source, at: m.now(), dropped: -1}
		m.mu.Unlock()
		m.log.Info("source latched", zap.Uint64("id", fl.ID), zap.Stringer("match", match), zap.Stringer("source", source),
			zap.String("path", string(path)))
	}
	if !fl.Reverse.IsValid() {
		return
	}
	rfl, _, ok := m.reg.Get(fl.Reverse)
	if !ok || rfl.Owner != dataplane.OwnerStatic || rfl.SendTo == source {
		return
	}
	rfl.SendTo = source
	if _, err := m.reg.Update(rfl); err != nil {
		m.log.Warn("send reverse flow to latched source", zap.Uint64("id", rfl.ID), zap.Stringer("source", source), zap.Error(err))
		return
	}
	m.log.Debug("reverse flow follows the source", zap.Uint64("id", rfl.ID), zap.Stringer("send_to", source))
}

// Rebind opens learning again on the locked static flows whose source has
// been silent for after while packets from other sources were dropped (a
// NAT that moved the peer): each goes back to latching in userspace,
// ranked against the source it was first asked to expect; its reverse
// flow keeps sending to the old source until a new one is learned. stats
// are the flows' activity (Registry.Activity).
func (m *Manager) Rebind(stats map[netip.AddrPort]registry.Activity, after time.Duration) {
	cutoff := m.now().Add(-after)
	var reopen []netip.AddrPort
	m.mu.Lock()
	for match, l := range m.locked {
		fl, _, ok := m.reg.Get(match)
		if !ok || fl.Latch || fl.ExpectSource != l.source {
			delete(m.locked, match) // removed, or changed through the API
			continue
		}
		st, ok := stats[match]
		if !ok {
			continue
		}
		before := l.dropped
		l.dropped = int64(st.Dropped)
		last := st.LastSeen
		if last.Before(l.at) {
			last = l.at
		}
		if before >= 0 && l.dropped > before && last.Before(cutoff) {
			reopen = append(reopen, match)
		}
	}
	m.mu.Unlock()
	for _, match := range reopen {
		fl, _, ok := m.reg.Get(match)
		m.mu.Lock()
		l := m.locked[match]
		m.mu.Unlock()
		if !ok || l == nil {
			continue
		}
		fl.Latch, fl.ExpectSource = true, l.signalled
		if _, err := m.reg.Update(fl); err != nil {
			m.log.Warn("rebind: reopen learning", zap.Uint64("id", fl.ID), zap.Error(err))
			continue
		}
		m.log.Info("locked source silent, packets from elsewhere: learning again", zap.Uint64("id", fl.ID),
			zap.Stringer("match", match), zap.Stringer("source", l.source), zap.Duration("silent_for", after))
	}
}
