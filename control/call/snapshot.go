package call

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/sdes"
)

// Snapshot is what a call needs to be rebuilt after a restart of relayd:
// its identity, the CDR so far and its media (streams, keys, learned
// sources, flow IDs). It is plain data for a front end to persist
// (encoding/json works; the field names are part of the stored schema).
type Snapshot struct {
	ID       string         `json:"id"`
	Created  time.Time      `json:"created"`
	Answered time.Time      `json:"answered,omitzero"`
	State    State          `json:"state"`
	Source   netip.AddrPort `json:"source"`
	From     string         `json:"from"`
	To       string         `json:"to"`
	Route    string         `json:"route,omitempty"`
	Legs     [2]Leg         `json:"legs"`
	Attempts []Attempt      `json:"attempts"`
	Media    MediaSnapshot  `json:"media"`
}

// MediaSnapshot is a call's media.
type MediaSnapshot struct {
	Streams []StreamSnapshot `json:"streams"`
	Flows   []FlowSnapshot   `json:"flows"`
	Learned []LearnedSource  `json:"learned,omitempty"`
	// Counted are packet counts relayd keeps itself: flows removed before
	// the snapshot, and flows of the userspace data plane (whose counters
	// a restart resets). XDP flows keep theirs in pinned maps.
	Counted []FlowCount `json:"counted,omitempty"`
}

// StreamSnapshot is a Stream.
type StreamSnapshot struct {
	Index     int        `json:"index"`
	Ends      [2]EndSnap `json:"ends"`
	Mux       bool       `json:"mux,omitempty"`
	ClockRate uint32     `json:"clock_rate"`
	Disabled  bool       `json:"disabled,omitempty"`
	Kind      string     `json:"kind,omitempty"`
	Ptime     int        `json:"ptime,omitempty"`
	// Transcode is Stream.Transcode: the codec of leg a, then of leg b;
	// absent for plain relay.
	Transcode []CodecSnap `json:"transcode,omitempty"`
}

// CodecSnap is a dataplane.Codec.
type CodecSnap struct {
	Name  string `json:"name"`
	PT    uint8  `json:"pt"`
	Ptime uint8  `json:"ptime"`
	Event uint8  `json:"event,omitempty"`
	CN    uint8  `json:"cn,omitempty"`
	VAD   bool   `json:"vad,omitempty"`
}

// EndSnap is an End.
type EndSnap struct {
	Relay netip.Addr     `json:"relay"`
	Port  uint16         `json:"port"`
	RTP   netip.AddrPort `json:"rtp,omitzero"`
	RTCP  netip.AddrPort `json:"rtcp,omitzero"`
	Recv  *KeySnap       `json:"recv,omitempty"`
	Send  *KeySnap       `json:"send,omitempty"`
	// Mux is rtcp-mux on this leg only (StreamSnapshot.Mux: on both).
	Mux   bool        `json:"mux,omitempty"`
	Latch LatchPolicy `json:"latch,omitempty"`
	// SSRC is End.SSRC: relayd's SSRC toward the leg when transcoding.
	SSRC uint32 `json:"ssrc,omitempty"`
}

// KeySnap is an SDES key; the suite by its RFC 4568 name.
type KeySnap struct {
	Tag           int      `json:"tag"`
	Suite         string   `json:"suite"`
	Key           []byte   `json:"key"`
	Salt          []byte   `json:"salt"`
	Lifetime      uint64   `json:"lifetime,omitempty"`
	MKI           []byte   `json:"mki,omitempty"`
	SessionParams []string `json:"session_params,omitempty"`
}

// FlowSnapshot names an installed flow: the ID it keeps across the
// restart and the leg its packets come from.
type FlowSnapshot struct {
	Match netip.AddrPort `json:"match"`
	ID    uint64         `json:"id"`
	Side  Side           `json:"side"`
	Path  dataplane.Path `json:"path"`
	// SSRC and ROC of an SRTP flow's stream: its transforms, made again
	// after a restart, continue the packet index (ROC 0: nothing to do).
	SSRC uint32 `json:"ssrc,omitempty"`
	ROC  uint32 `json:"roc,omitempty"`
	// Where a transcoding flow's output stream was (dataplane.Stats
	// OutSeq, OutTimestamp, OutAt): installed again, it continues from
	// there, moved on by the time since.
	OutSeq uint32 `json:"out_seq,omitempty"`
	OutTS  uint32 `json:"out_ts,omitempty"`
	OutAt  int64  `json:"out_at,omitempty"` // Unix ns; 0: not transcoding
}

// LearnedSource is a source a latching flow learned.
type LearnedSource struct {
	Match  netip.AddrPort `json:"match"`
	Source netip.AddrPort `json:"source"`
	Locked bool           `json:"locked"`
}

// FlowCount is a flow's packet counters relayd carries over.
type FlowCount struct {
	Match   netip.AddrPort `json:"match"`
	ID      uint64         `json:"id"`
	Side    Side           `json:"side"`
	Path    dataplane.Path `json:"path"`
	Clock   uint32         `json:"clock_rate,omitempty"`
	Packets uint64         `json:"packets"`
	Bytes   uint64         `json:"bytes"`
	Dropped uint64         `json:"dropped"`
	Lost    int64          `json:"lost,omitempty"`
}

func keySnap(c *sdes.Crypto) *KeySnap {
	if c == nil {
		return nil
	}
	return &KeySnap{Tag: c.Tag, Suite: c.Suite.String(), Key: c.Key, Salt: c.Salt, Lifetime: c.Lifetime, MKI: c.MKI, SessionParams: c.SessionParams}
}

func (k *KeySnap) crypto() (*sdes.Crypto, error) {
	if k == nil {
		return nil, nil
	}
	suite, err := sdes.ParseSuite(k.Suite)
	if err != nil {
		return nil, err
	}
	return &sdes.Crypto{Tag: k.Tag, Suite: suite, Key: k.Key, Salt: k.Salt, Lifetime: k.Lifetime, MKI: k.MKI, SessionParams: k.SessionParams}, nil
}

// Snapshot returns the call's state for persisting.
func (c *Call) Snapshot() Snapshot {
	c.mu.Lock()
	s := Snapshot{
		ID: c.ID, Created: c.Created, Answered: c.answered, State: c.state, Source: c.Source,
		From: c.From, To: c.To, Route: c.route, Legs: c.legs, Attempts: slices.Clone(c.attempts),
	}
	c.mu.Unlock()
	s.Media = c.Media.snapshot()
	return s
}

func (m *Media) snapshot() MediaSnapshot {
	m.mu.Lock()
	var ms MediaSnapshot
	for _, st := range m.streams {
		// Mux on both legs is stored as the stream's, as before legs
		// could differ.
		both := st.muxed(A) && st.muxed(B)
		ss := StreamSnapshot{Index: st.Index, Mux: both, ClockRate: st.ClockRate, Disabled: st.Disabled, Kind: st.Kind, Ptime: st.Ptime}
		for i, e := range st.Ends {
			ss.Ends[i] = EndSnap{
				Relay: e.Relay, Port: e.Port, RTP: e.RTP, RTCP: e.RTCP, Recv: keySnap(e.Recv), Send: keySnap(e.Send),
				Mux: !both && e.Mux, Latch: e.Latch, SSRC: e.SSRC,
			}
		}
		if tc := st.Transcode; tc != nil {
			for _, c := range tc {
				ss.Transcode = append(ss.Transcode, CodecSnap{Name: c.Name, PT: c.PT, Ptime: c.Ptime, Event: c.Event, CN: c.CN, VAD: c.VAD})
			}
		}
		ms.Streams = append(ms.Streams, ss)
	}
	recs := slices.Clone(m.flows) // copies: Sync replaces the fields
	for match, l := range m.learned {
		ms.Learned = append(ms.Learned, LearnedSource{Match: match, Source: l.source, Locked: l.locked})
	}
	counted := make(map[netip.AddrPort]FlowCount)
	for match, fs := range m.last {
		counted[match] = flowCount(fs)
	}
	for _, fs := range m.final {
		counted[fs.Flow.Match] = flowCount(fs)
	}
	m.mu.Unlock()
	// Userspace counters die with the process: carry them over, for
	// userspace flows and for the userspace shadows of XDP flows (punted
	// packets, latching), whose counts the XDP flow's include. Stats
	// outside the media's lock, as Flows does.
	up, _ := m.t.reg.Plane(dataplane.PathUserspace)
	shadows, _ := up.(dataplane.PuntRelay)
	for _, r := range recs {
		fsn := FlowSnapshot{Match: r.flow.Match, ID: r.flow.ID, Side: r.side, Path: r.path}
		var st dataplane.Stats
		var err error
		switch {
		case r.path == dataplane.PathUserspace:
			var fs registry.FlowState
			fs, err = m.t.reg.Stats(r.flow.Match)
			st = fs.Stats
			if err == nil && r.flow.HasSRTP() {
				fsn.SSRC, fsn.ROC = rolloverCounter(*r.flow, st)
			}
			if err == nil && r.flow.Transcode != nil && st.OutAt != 0 {
				fsn.OutSeq, fsn.OutTS, fsn.OutAt = st.OutSeq, st.OutTimestamp, st.OutAt
			}
			ms.Flows = append(ms.Flows, fsn)
		case shadows != nil:
			ms.Flows = append(ms.Flows, fsn)
			st, err = shadows.ShadowStat(r.flow.Match)
		default:
			ms.Flows = append(ms.Flows, fsn)
			continue
		}
		if err != nil || st.Packets == 0 && st.Dropped == 0 {
			continue
		}
		fc := counted[r.flow.Match]
		if fc.Match != r.flow.Match {
			fc = flowCount(FlowStat{Flow: *r.flow, Path: r.path, Side: r.side})
		}
		fc.Packets += st.Packets
		fc.Bytes += st.Bytes
		fc.Dropped += st.Dropped
		counted[r.flow.Match] = fc
	}
	for _, fc := range counted {
		ms.Counted = append(ms.Counted, fc)
	}
	slices.SortFunc(ms.Flows, func(a, b FlowSnapshot) int { return a.Match.Compare(b.Match) })
	slices.SortFunc(ms.Learned, func(a, b LearnedSource) int { return a.Match.Compare(b.Match) })
	slices.SortFunc(ms.Counted, func(a, b FlowCount) int { return a.Match.Compare(b.Match) })
	return ms
}

// rolloverCounter returns the SSRC of an SRTP flow's stream and its
// rollover counter now: the one the flow was installed with (after a
// restart) plus the sequence number cycles counted since. The RTP
// statistics of the flow count the very packets its transforms handle
// (the same sequence numbers both ways), so their cycles are the ROC's.
func rolloverCounter(f dataplane.Flow, st dataplane.Stats) (ssrc, roc uint32) {
	if f.ClockRate == 0 || st.Received == 0 {
		return 0, 0
	}
	roc = st.ExtHighestSeq >> 16
	for _, k := range []*dataplane.SRTP{f.Decrypt, f.Encrypt} {
		if k != nil && k.ROC != 0 && k.SSRC == st.SSRC {
			roc += k.ROC
			break
		}
	}
	return st.SSRC, roc
}

// resumeMargin is how many packets a restored transcoding flow skips
// beyond those its stream could have sent since its position was read:
// the stream is paced at its ptime, but a burst after concealment or a
// reading taken just before a few packets left must never make numbers
// repeat (a repeated index under SRTP reuses keystream, and the
// receiver's replay check drops the packets).
const resumeMargin = 50

// resumeAt is where the output stream of a transcoding flow continues at
// now, from its last known position: the RTP timestamp moved on by the
// time since at 8 kHz (what the receiver's clock expects), the sequence
// number by the most packets the stream could have sent in that time at
// its ptime, plus resumeMargin. The receiver sees a gap, as for loss.
func resumeAt(f FlowSnapshot, ptime uint8, now time.Time) dataplane.Resume {
	elapsed := max(now.UnixNano()-f.OutAt, 0)
	per := int64(max(ptime, 10)) * int64(time.Millisecond)
	return dataplane.Resume{
		Valid:     true,
		Seq:       f.OutSeq + uint32(elapsed/per) + resumeMargin,
		Timestamp: f.OutTS + uint32(elapsed/(int64(time.Second)/8000)),
		At:        now.UnixNano(),
	}
}

func flowCount(fs FlowStat) FlowCount {
	return FlowCount{
		Match: fs.Flow.Match, ID: fs.Flow.ID, Side: fs.Side, Path: fs.Path, Clock: fs.Flow.ClockRate,
		Packets: fs.Stats.Packets, Bytes: fs.Stats.Bytes, Dropped: fs.Stats.Dropped, Lost: fs.Stats.Lost,
	}
}

// Restore puts a call of a previous run back in the table: its ports
// taken, its flows owned again. Flows the data planes still carry (XDP
// flows in pinned maps) are adopted as they are, with their statistics,
// and updated only where the call wants them otherwise; missing ones
// (userspace flows, SRTP) are installed again with their IDs and keys.
// The call is in the table even when some flows failed: the error says
// which.
func (t *Table) Restore(s Snapshot) (*Call, error) {
	if s.ID == "" {
		return nil, errors.New("restore call: no id")
	}
	t.mu.Lock()
	_, dup := t.calls[s.ID]
	t.mu.Unlock()
	if dup {
		return nil, fmt.Errorf("restore call %s: already in the table", s.ID)
	}
	c := t.emptyCall()
	m := c.Media
	for _, ss := range s.Media.Streams {
		st := &Stream{Index: len(m.streams), ClockRate: ss.ClockRate, Disabled: ss.Disabled, Kind: m.kind(ss.Kind), Ptime: ss.Ptime}
		for i, e := range ss.Ends {
			recv, err := e.Recv.crypto()
			if err != nil {
				return nil, fmt.Errorf("restore call %s: stream %d: %w", s.ID, ss.Index, err)
			}
			send, err := e.Send.crypto()
			if err != nil {
				return nil, fmt.Errorf("restore call %s: stream %d: %w", s.ID, ss.Index, err)
			}
			if !e.Latch.valid() {
				return nil, fmt.Errorf("restore call %s: stream %d: latch %q", s.ID, ss.Index, e.Latch)
			}
			name, _ := t.reg.InterfaceOf(e.Relay)
			st.Ends[i] = End{Relay: e.Relay, Interface: name, Port: e.Port, RTP: e.RTP, RTCP: e.RTCP, Recv: recv, Send: send, Mux: ss.Mux || e.Mux, Latch: e.Latch, SSRC: e.SSRC}
			if e.Port != 0 {
				// Taken already when a pinned flow uses it (the
				// registry's adoption).
				t.reg.ReservePort(name, e.Port)
			}
		}
		switch len(ss.Transcode) {
		case 0:
		case 2:
			var tc [2]dataplane.Codec
			for i, c := range ss.Transcode {
				tc[i] = dataplane.Codec{Name: c.Name, PT: c.PT, Ptime: c.Ptime, Event: c.Event, CN: c.CN, VAD: c.VAD}
			}
			st.Transcode = &tc
		default:
			return nil, fmt.Errorf("restore call %s: stream %d: transcode has %d codecs, want 2", s.ID, ss.Index, len(ss.Transcode))
		}
		m.newStream(*st)
	}
	for _, l := range s.Media.Learned {
		if m.learned == nil {
			m.learned = make(map[netip.AddrPort]learned)
		}
		m.learned[l.Match] = learned{source: l.Source, locked: l.Locked, lockedAt: t.now(), dropped: -1}
	}
	for _, fc := range s.Media.Counted {
		if m.last == nil {
			m.last = make(map[netip.AddrPort]FlowStat)
		}
		m.last[fc.Match] = FlowStat{
			Flow: dataplane.Flow{ID: fc.ID, Match: fc.Match, ClockRate: fc.Clock}, Path: fc.Path, Side: fc.Side,
			Stats: dataplane.Stats{Packets: fc.Packets, Bytes: fc.Bytes, Dropped: fc.Dropped, Lost: fc.Lost},
		}
	}
	ids := make(map[netip.AddrPort]uint64, len(s.Media.Flows))
	for _, f := range s.Media.Flows {
		ids[f.Match] = f.ID
		if f.ROC != 0 {
			if m.restoreROC == nil {
				m.restoreROC = make(map[netip.AddrPort][2]uint32)
			}
			m.restoreROC[f.Match] = [2]uint32{f.SSRC, f.ROC}
		}
		if f.OutAt != 0 {
			if m.restoreOut == nil {
				m.restoreOut = make(map[netip.AddrPort]FlowSnapshot)
			}
			m.restoreOut[f.Match] = f
		}
	}
	state := s.State
	if state == "" || state == StateEnded {
		state = StateAnswered
	}
	// c is not shared yet.
	c.ID, c.Created, c.Source, c.From, c.To = c.media.keep(s.ID), s.Created, s.Source, c.media.keep(s.From), c.media.keep(s.To)
	c.state, c.route, c.attempts, c.answered = state, s.Route, slices.Clone(s.Attempts), s.Answered
	for i, l := range s.Legs {
		c.legs[i] = c.media.keepLeg(l)
	}
	t.mu.Lock()
	t.calls[c.ID] = c
	t.mu.Unlock()
	err := m.adopt(ids)
	if err != nil {
		err = fmt.Errorf("restore call %s: %w", s.ID, err)
	}
	return c, err
}

// adopt takes over the flows the data planes carry for the media's
// streams, then syncs: what is missing is installed with its old ID.
func (m *Media) adopt(ids map[netip.AddrPort]uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	want, err := m.want(nil)
	if err != nil {
		return err
	}
	for _, w := range want {
		match := w.flow.Match
		f, path, ok := m.t.reg.Claim(match, m)
		if !ok {
			continue
		}
		if id, ok := ids[match]; ok && id != f.ID {
			m.t.log.Warn("restored flow has another id in the data plane; keeping the data plane's",
				zap.Stringer("match", match), zap.Uint64("stored", id), zap.Uint64("data_plane", f.ID))
		}
		m.flows = append(m.flows, flowRec{flow: m.shared(f), path: path, side: w.side, installed: m.t.now().UnixNano()})
	}
	m.restoreIDs = ids
	m.mu.Unlock()
	err = m.Sync()
	m.mu.Lock()
	m.restoreIDs, m.restoreROC, m.restoreOut = nil, nil, nil
	return err
}

// Detach forgets the media without touching its flows or ports: relayd is
// stopping and the call lives on in the data planes and the store. The
// media is closed after (Sync fails, Close does nothing).
func (m *Media) Detach() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.closed = true
	for _, r := range m.flows {
		m.t.reg.Forget(r.flow.Match)
	}
	m.flows = nil
	clear(m.flowBuf[:])
}

// Detach lets go of the call without ending it: its flows keep carrying
// media while relayd restarts (see Media.Detach), End does nothing after.
// The caller takes it out of the table. It reports false if the call had
// ended.
func (c *Call) Detach() bool {
	c.mu.Lock()
	if c.state == StateEnded {
		c.mu.Unlock()
		return false
	}
	c.state = StateEnded // End is a no-op from now on
	c.mu.Unlock()
	c.Media.Detach()
	c.mu.Lock()
	c.finishLocked()
	c.mu.Unlock()
	return true
}

// Matches returns the matches of every flow the calls in the table own.
func (t *Table) Matches() []netip.AddrPort {
	var out []netip.AddrPort
	for _, c := range t.List() {
		c.Media.mu.Lock()
		for _, r := range c.Media.flows {
			out = append(out, r.flow.Match)
		}
		c.Media.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return out
}

// HasPath reports whether any of the media's flows runs on that path.
func (m *Media) HasPath(p dataplane.Path) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.flows {
		if r.path == p {
			return true
		}
	}
	return false
}
