package call

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"
	"unsafe"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/sdes"
)

// Side is a leg of a call.
type Side int

const (
	A Side = iota // the caller's leg (relayd is its UAS)
	B             // the callee's leg (relayd is its UAC)
)

func (s Side) String() string {
	if s == A {
		return "a"
	}
	return "b"
}

// Other returns the other leg.
func (s Side) Other() Side { return 1 - s }

// ErrSRTPUnsupported: the call needs SRTP terminated on a leg and no
// userspace data plane runs to do it (SIP 488).
var ErrSRTPUnsupported = errors.New("SRTP termination needs the userspace data plane")

// toSRTP converts an SDES key to a flow's SRTP transform.
func toSRTP(c *sdes.Crypto) *dataplane.SRTP {
	if c == nil {
		return nil
	}
	return &dataplane.SRTP{Suite: c.Suite.String(), Key: c.Key, Salt: c.Salt, MKI: c.MKI}
}

// sameFlow compares flows, SRTP keys and transcoding by value.
func sameFlow(a, b dataplane.Flow) bool {
	if !a.Decrypt.Equal(b.Decrypt) || !a.Encrypt.Equal(b.Encrypt) || !a.Transcode.Equal(b.Transcode) {
		return false
	}
	a.Decrypt, a.Encrypt, b.Decrypt, b.Encrypt = nil, nil, nil, nil
	a.Transcode, b.Transcode = nil, nil
	return a == b
}

// End is one leg's end of a stream.
type End struct {
	Relay     netip.Addr // relay media address on this leg
	Interface string     // the media interface Port comes from (Relay's)
	Port      uint16     // relay RTP port on this leg (RTCP is Port+1); 0 until allocated
	// RTP and RTCP are the peer's addresses from its SDP; invalid while
	// unknown or on hold with c=0.0.0.0.
	RTP, RTCP netip.AddrPort
	// Recv is the key the peer encrypts with (relayd decrypts), Send the
	// key relayd encrypts with toward the peer. Both nil on a plain leg
	// and when SRTP passes through end to end.
	Recv, Send *sdes.Crypto
	// Mux: this leg multiplexes RTCP on the RTP port (rtcp-mux). Its RTCP
	// arrives with its RTP, and RTCP toward it goes to its RTP address.
	Mux bool
	// Latch is how relayd treats the addresses of this leg's peer; the
	// zero value is symmetric RTP (latching).
	Latch LatchPolicy
	// SSRC is the SSRC of the RTP relayd sends toward this leg when it
	// transcodes the stream: chosen once, kept across re-offers and
	// restarts; 0 until the stream is first transcoded.
	SSRC uint32
}

// LatchPolicy is how relayd learns where a leg's peer sends from and
// where to send to it. The zero value is LatchSymmetric.
type LatchPolicy string

const (
	// LatchSymmetric: symmetric RTP for peers behind NAT. The flows from
	// the peer learn its source (its signalled address, any port, when
	// that address is routable) and lock it; relayd sends to the learned
	// source.
	LatchSymmetric LatchPolicy = ""
	// LatchAsymmetric: no latching. Media from any source is accepted and
	// relayd sends to the address the peer's SDP gives.
	LatchAsymmetric LatchPolicy = "asymmetric"
	// LatchStrict: only the address and port of the peer's SDP may send;
	// relayd sends there.
	LatchStrict LatchPolicy = "strict"
)

func (l LatchPolicy) valid() bool {
	switch l {
	case LatchSymmetric, LatchAsymmetric, LatchStrict:
		return true
	}
	return false
}

// Stream is one media stream (m= line) of a call.
type Stream struct {
	Index int
	Ends  [2]End // by Side
	// Mux: rtcp-mux on both legs, as if both Ends had Mux set.
	Mux       bool
	ClockRate uint32 // RTP clock rate of the main codec
	Disabled  bool   // rejected or removed (port 0): no flows
	// Kind is the m= line's media (audio, video, ...) and Ptime the
	// smallest a=ptime of the offer and the answer (0: none): what the
	// flows' rate cap is a multiple of (registry.RatePolicy). Kind ""
	// (a call restored from an older snapshot) gets the default ceiling.
	Kind  string
	Ptime int
	// Transcode, when set, is the codec each leg uses (by Side): the RTP
	// flows convert between them, the RTCP ports are sinks (relayd
	// reports on each leg itself). Nil: plain relay. Never changed in
	// place: a new negotiation sets a new one.
	Transcode *[2]dataplane.Codec
}

// muxed reports whether leg s of the stream multiplexes RTCP.
func (st *Stream) muxed(s Side) bool { return st.Mux || st.Ends[s].Mux }

// flowRec is a flow relayd installed for a call.
type flowRec struct {
	// flow is the registry's (Registry.Shared): never changed in place,
	// replaced when the flow is.
	flow      *dataplane.Flow
	path      dataplane.Path
	side      Side  // the leg the packets arrive from
	installed int64 // Unix ns (a time.Time is 24 bytes)
}

// flowRecs are a call's flows, in the order they were installed: a call
// has a handful, so a slice of values (one allocation) serves better than
// a map of pointers (a map header, a group and one object per flow, each
// of the small sizes the setups' garbage fills, so each kept a page of
// it in use for as long as the call lasted).
type flowRecs []flowRec

// find returns the index of the flow with this match, or -1.
func (fr flowRecs) find(match netip.AddrPort) int {
	for i := range fr {
		if fr[i].flow.Match == match {
			return i
		}
	}
	return -1
}

// Media is the media of one call: its streams and their flows. Each Call
// holds its own (Call.Media). Safe for concurrent use.
type Media struct {
	t *Table

	// room holds the call's strings and the last SDPs sent (keep): its
	// ID, From and To, its legs' identities, the SIP dialogs' IDs. Each
	// of those on its own, made among the setups' garbage (or a
	// substring of a parsed header's, which kept the whole header), kept
	// a page of its size in use for as long as the call lasted. Written
	// once, never changed: what keep returns are views of it.
	roomMu   sync.Mutex // guards roomUsed and writes to room
	room     [mediaRoom]byte
	roomUsed int

	mu      sync.Mutex // guards the following
	streams []*Stream  // in streamPtrs while they fit; the first is stream0
	flows   flowRecs   // in flowBuf while they fit
	flowBuf [4]flowRec
	// The first stream and its pointer, part of the call's allocation
	// like room and flowBuf.
	stream0    Stream
	streamPtrs [1]*Stream
	last       map[netip.AddrPort]FlowStat // statistics of flows removed before the end
	final      []FlowStat                  // once closed: every flow's last statistics (Close's result)
	learned    map[netip.AddrPort]learned  // symmetric RTP: sources the flows learned, by match
	closed     bool
	// restoreIDs are the flow IDs of a restored call, used by the Sync
	// of Restore for flows it installs again.
	restoreIDs map[netip.AddrPort]uint64
	restoreROC map[netip.AddrPort][2]uint32    // SSRC and ROC of restored SRTP flows
	restoreOut map[netip.AddrPort]FlowSnapshot // output positions of restored transcoding flows
	revision   uint64                          // counts changes to the flows and learned sources
}

// mediaRoom is the room for a call's strings and SDPs in its allocation,
// so that a Call and the 8-byte header the runtime puts before an object
// of over 512 bytes with pointers fill the 2,048-byte size class
// (TestCallSize).
const mediaRoom = 864

// init readies empty media of the table's.
func (m *Media) init(t *Table) {
	m.t = t
	m.flows = m.flowBuf[:0]
	m.streams = m.streamPtrs[:0]
}

// newStream appends a stream: the first is m.stream0. m.mu must be held.
func (m *Media) newStream(st Stream) *Stream {
	p := &st
	if len(m.streams) == 0 {
		m.stream0 = st
		p = &m.stream0
	}
	m.streams = append(m.streams, p)
	return p
}

// keep returns s in the room when it fits (the same bytes when the room
// has s already), else a copy of its own.
func (m *Media) keep(s string) string {
	if s == "" {
		return ""
	}
	b := m.keepBytes(unsafe.Slice(unsafe.StringData(s), len(s)))
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// kind returns an m= line's media as the stream keeps it: the parsed
// SDP's string is a view of the parser's copy of the whole description's
// fields, which it would keep for as long as the call lasts.
func (m *Media) kind(media string) string {
	for _, k := range [...]string{"audio", "video", "image", "text", "application", "message"} {
		if media == k {
			return k
		}
	}
	return m.keep(media)
}

// keepBytes returns a copy of b, in the room when it fits, with no room
// to append (a view of the room, or a copy shared the same way, must not
// grow into what follows). When the room has b already, it returns those
// bytes. First come, first kept: with SDPs of a few hundred bytes what
// comes last (the callee leg's identity, the dialogs' IDs) may not fit.
func (m *Media) keepBytes(b []byte) []byte {
	m.roomMu.Lock()
	defer m.roomMu.Unlock()
	have := m.room[:m.roomUsed]
	if i := bytes.Index(have, b); i >= 0 {
		return have[i : i+len(b) : i+len(b)]
	}
	if len(b) > len(m.room)-m.roomUsed {
		c := slices.Clone(b)
		return c[:len(c):len(c)]
	}
	out := m.room[m.roomUsed : m.roomUsed+len(b) : m.roomUsed+len(b)]
	copy(out, b)
	m.roomUsed += len(b)
	return out
}

// Revision counts the changes to the media's flows and learned sources: a
// front end persists the call again when it moved.
func (m *Media) Revision() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.revision
}

// learned is a source a latching flow learned, and whether it is locked.
type learned struct {
	source netip.AddrPort
	locked bool

	// For rebinding (Rebind), not persisted: when the lock was taken,
	// and the flow's drop count at the last look (-1: not looked yet).
	lockedAt time.Time
	dropped  int64
}

// Ensure makes sure stream i exists (and the streams before it), with a
// relay port pair on each leg on the given relay addresses (an invalid
// address keeps the one set before). A leg's port comes from the media
// interface its address belongs to; a leg moved to another interface gets
// a port there. It fails with ErrNoPorts when the range is exhausted.
func (m *Media) Ensure(i int, relayA, relayB netip.Addr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("media closed")
	}
	for len(m.streams) <= i {
		m.newStream(Stream{Index: len(m.streams), ClockRate: 8000})
	}
	st := m.streams[i]
	for s, relay := range [2]netip.Addr{relayA, relayB} {
		e := &st.Ends[s]
		if relay.IsValid() {
			// A new destination may be of the other family: the flows
			// move with the next Sync.
			name, ok := m.t.reg.InterfaceOf(relay)
			if !ok {
				return fmt.Errorf("stream %d: %s is not a relay media address", i, relay)
			}
			e.Relay = relay
			if e.Port != 0 && e.Interface != name {
				m.t.reg.ReleasePort(e.Interface, e.Port)
				e.Port = 0
			}
			e.Interface = name
		}
		if e.Port == 0 {
			p, err := m.t.reg.AllocPort(e.Interface)
			if err != nil {
				return err
			}
			e.Port = p
		}
	}
	return nil
}

// Edit calls f with stream i (which must exist) under the media's lock;
// call Sync after to apply the change to the flows.
func (m *Media) Edit(i int, f func(st *Stream)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i >= 0 && i < len(m.streams) {
		f(m.streams[i])
	}
}

// Streams returns a copy of the streams.
func (m *Media) Streams() []Stream {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Stream, len(m.streams))
	for i, st := range m.streams {
		out[i] = *st
	}
	return out
}

// want returns the flows the streams call for, appended to buf.
func (m *Media) want(buf wantSet) (wantSet, error) {
	out := buf
	for _, st := range m.streams {
		if st.Disabled {
			continue
		}
		for _, from := range []Side{A, B} {
			in, out2 := &st.Ends[from], &st.Ends[from.Other()]
			if in.Port == 0 || out2.Port == 0 || !out2.RTP.IsValid() {
				continue // the destination is not known yet
			}
			dec, enc := in.Recv, out2.Send
			rtp := dataplane.Flow{
				Match:     netip.AddrPortFrom(in.Relay, in.Port),
				SendFrom:  netip.AddrPortFrom(out2.Relay, out2.Port),
				SendTo:    out2.RTP,
				Action:    dataplane.Forward,
				ClockRate: st.ClockRate,
				RateCap:   m.t.reg.Rates().MediaCap(st.Kind, st.Ptime),
			}
			m.applyLatch(&rtp, in.RTP, in.Latch, out2.Latch)
			if tc := st.Transcode; tc != nil {
				rtp.ClockRate = 8000
				rtp.Transcode = &dataplane.Transcode{In: tc[from], Out: tc[from.Other()], SSRC: out2.SSRC}
				if st.muxed(from.Other()) {
					rtp.Transcode.RTCPFrom, rtp.Transcode.RTCPTo = rtp.SendFrom, rtp.SendTo
				} else if out2.RTCP.IsValid() {
					rtp.Transcode.RTCPFrom = netip.AddrPortFrom(out2.Relay, out2.Port+1)
					rtp.Transcode.RTCPTo = out2.RTCP
					if l, ok := m.learned[rtp.Transcode.RTCPFrom]; ok && out2.Latch == LatchSymmetric {
						rtp.Transcode.RTCPTo = l.source
					}
				}
			}
			out = append(out, wanted{rtp, from, dec, enc})
			// A leg with rtcp-mux sends its RTCP with its RTP: the RTP
			// flow carries it. The data plane does not split RTCP from
			// RTP, so toward a leg without rtcp-mux it arrives on that
			// peer's RTP port.
			if st.muxed(from) {
				continue
			}
			rtcp := rtp
			rtcp.Match = netip.AddrPortFrom(in.Relay, in.Port+1)
			rtcp.ClockRate = 0
			rtcp.RateCap = m.t.reg.Rates().RTCPCap()
			rtcp.Transcode = nil
			// Across a transcoder the RTCP port is a sink: its flow
			// still names where plain RTCP would go, as flows must.
			rtcp.SinkRTCP = st.Transcode != nil
			switch {
			case st.muxed(from.Other()):
				// Toward a leg with rtcp-mux: onto its RTP address, from
				// relayd's RTP port.
				rtcp.SendFrom, rtcp.SendTo = rtp.SendFrom, out2.RTP
			case out2.RTCP.IsValid():
				rtcp.SendFrom = netip.AddrPortFrom(out2.Relay, out2.Port+1)
				rtcp.SendTo = out2.RTCP
			case rtcp.SinkRTCP:
				rtcp.SendFrom = netip.AddrPortFrom(out2.Relay, out2.Port+1)
				rtcp.SendTo = out2.RTP
			default:
				continue
			}
			sig := in.RTCP
			if !sig.IsValid() {
				sig = in.RTP
			}
			m.applyLatch(&rtcp, sig, in.Latch, out2.Latch)
			if l, ok := m.learned[rtp.Match]; ok && rtcp.Latch {
				// RTCP follows RTP: once the stream's RTP flow learned its
				// source, only that address may send its RTCP (the
				// signalled RTCP port first, else RTP's + 1).
				port := sig.Port()
				if sig.Addr() != l.source.Addr() {
					port = l.source.Port() + 1
				}
				rtcp.ExpectSource, rtcp.LatchAddress = netip.AddrPortFrom(l.source.Addr(), port), true
			}
			out = append(out, wanted{rtcp, from, dec, enc})
		}
	}
	return out.sorted(), nil
}

// applyLatch sets how fl treats its source, signalled is (the address the
// sending peer's SDP gives), and its destination, per the latch policies
// of the leg the packets come from (in) and go to (out).
//
// A symmetric in leg (peers behind NAT send from another address or port
// than their SDP says): until its source is locked the flow latches (see
// dataplane.Flow.Latch; the signalled address is the RTP Bleed guard),
// then it expects exactly that source. An asymmetric one accepts any
// source; a strict one only the signalled address and port. Toward a
// symmetric out leg the flow sends to the source its reverse flow
// learned, if any; otherwise to the signalled address.
func (m *Media) applyLatch(fl *dataplane.Flow, signalled netip.AddrPort, in, out LatchPolicy) {
	fl.ExpectSource, fl.Latch, fl.Reverse = netip.AddrPort{}, false, netip.AddrPort{}
	switch in {
	case LatchAsymmetric:
	case LatchStrict:
		fl.ExpectSource = signalled
	default:
		// The signalled address and port: latching prefers them.
		fl.ExpectSource = signalled
		if l, ok := m.learned[fl.Match]; ok && l.locked {
			fl.ExpectSource = l.source
		} else {
			fl.Latch = true
			fl.Reverse = fl.SendFrom // the reverse flow's match
		}
	}
	if out != LatchSymmetric {
		return
	}
	if l, ok := m.learned[fl.SendFrom]; ok {
		fl.SendTo = l.source
	}
}

// Latched implements registry.Holder: it records that the flow with this
// match learned source (locked: the latch window closed) and applies it
// to the flows.
func (m *Media) Latched(match, source netip.AddrPort, locked bool) {
	if err := m.latched(match, source, locked); err != nil {
		m.t.log.Warn("apply latched source", zap.Stringer("match", match), zap.Stringer("source", source), zap.Error(err))
	}
}

func (m *Media) latched(match, source netip.AddrPort, locked bool) error {
	if err := m.t.reg.CheckDestination(source); err != nil {
		// Packets from relayd itself (another flow pointing here) or a
		// source no flow may send to: the reverse flow keeps sending
		// where the SDP said.
		return fmt.Errorf("learned source not used: %w", err)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	if m.learned == nil {
		m.learned = make(map[netip.AddrPort]learned)
	}
	if l, ok := m.learned[match]; ok && l.locked {
		m.mu.Unlock()
		return nil
	}
	if isRTCP(match) {
		if r, ok := m.learned[rtpOf(match)]; ok && r.source.Addr() != source.Addr() {
			// Learned before the install that carries RTP's address
			// reached the worker: the flow latches again under it.
			m.mu.Unlock()
			return fmt.Errorf("RTCP source not used: the stream's RTP comes from %s", r.source.Addr())
		}
	} else if r, ok := m.learned[rtcpOf(match)]; ok && r.source.Addr() != source.Addr() {
		// RTP moved to another address: RTCP learns again, under it.
		delete(m.learned, rtcpOf(match))
	}
	m.learned[match] = learned{source: source, locked: locked, lockedAt: m.t.now(), dropped: -1}
	m.revision++
	m.mu.Unlock()
	return m.Sync()
}

// rebind opens learning again on the locked flows whose source has been
// silent since before cutoff while packets from elsewhere were dropped
// (a NAT that moved the peer to another port, or another address): each
// such flow goes back to latching in userspace, ranked against the
// signalled address as in its first window, and its reverse flow keeps
// sending to the old source until a new one is learned. It reports the
// flows reopened.
func (m *Media) rebind(stats map[netip.AddrPort]registry.Activity, cutoff time.Time) []netip.AddrPort {
	m.mu.Lock()
	var reopened []netip.AddrPort
	for match, l := range m.learned {
		if !l.locked {
			continue
		}
		st, ok := stats[match]
		if !ok {
			continue
		}
		dropped := int64(st.Dropped)
		before := l.dropped
		l.dropped = dropped
		m.learned[match] = l
		last := st.LastSeen
		if last.Before(l.lockedAt) {
			last = l.lockedAt
		}
		if before < 0 || dropped <= before || !last.Before(cutoff) {
			continue
		}
		l.locked = false
		m.learned[match] = l
		reopened = append(reopened, match)
	}
	if len(reopened) == 0 {
		m.mu.Unlock()
		return nil
	}
	m.revision++
	m.mu.Unlock()
	if err := m.Sync(); err != nil {
		m.t.log.Warn("rebind: reopen learning", zap.Error(err))
	}
	return reopened
}

type wanted struct {
	flow     dataplane.Flow
	side     Side
	dec, enc *sdes.Crypto
}

// wantSet is the flows the streams call for, sorted by match, one per
// match. A media's few flows are found faster in a slice than in a map,
// and it is one allocation, or none (Sync's is on its stack).
type wantSet []wanted

// sorted sorts the set by match; of flows with the same match, the last
// added stays.
func (ws wantSet) sorted() wantSet {
	slices.SortStableFunc(ws, func(a, b wanted) int { return a.flow.Match.Compare(b.flow.Match) })
	out := ws[:0]
	for i := range ws {
		if i+1 < len(ws) && ws[i+1].flow.Match == ws[i].flow.Match {
			continue
		}
		out = append(out, ws[i])
	}
	return out
}

// has reports whether the set has a flow with this match.
func (ws wantSet) has(match netip.AddrPort) bool {
	_, ok := slices.BinarySearchFunc(ws, match, func(w wanted, m netip.AddrPort) int { return w.flow.Match.Compare(m) })
	return ok
}

// Sync makes the installed flows match the streams: flows whose two ends
// are known are installed, changed ones updated in place (statistics
// kept, no packet lost), and flows no stream calls for any more removed.
// On error the flows stay as they were where the change failed.
func (m *Media) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("media closed")
	}
	var buf [8]wanted
	want, err := m.want(buf[:0])
	if err != nil {
		return err
	}
	var errs []error
	m.revision++
	// More flows wanted than flowBuf holds: room for all, in one
	// allocation.
	if n := len(want) - len(m.flows); n > 0 {
		m.flows = slices.Grow(m.flows, n)
	}
	m.flows = slices.DeleteFunc(m.flows, func(rec flowRec) bool {
		match := rec.flow.Match
		if want.has(match) {
			return false
		}
		fs, err := m.t.reg.Remove(match)
		if err != nil && !errors.Is(err, dataplane.ErrNotFound) {
			errs = append(errs, fmt.Errorf("remove flow %s: %w", match, err))
			return false
		}
		m.keepLast(&rec, fs.Stats)
		return true
	})
	for _, w := range want {
		match := w.flow.Match
		w.flow.Owner = dataplane.OwnerCall
		w.flow.Decrypt, w.flow.Encrypt = toSRTP(w.dec), toSRTP(w.enc)
		if r, ok := m.restoreROC[match]; ok {
			for _, k := range []*dataplane.SRTP{w.flow.Decrypt, w.flow.Encrypt} {
				if k != nil {
					k.SSRC, k.ROC = r[0], r[1]
				}
			}
		}
		if tc := w.flow.Transcode; tc != nil {
			if r, ok := m.restoreOut[match]; ok {
				// The output is relayd's own stream, not the input's:
				// its encryption's index is the output's (cycles of
				// the resumed sequence number).
				tc.Resume = resumeAt(r, tc.Out.Ptime, m.t.now())
				if k := w.flow.Encrypt; k != nil {
					k.SSRC, k.ROC = tc.SSRC, tc.Resume.Seq>>16
				}
			}
		}
		if w.flow.HasSRTP() && !m.t.CanSRTP() {
			errs = append(errs, fmt.Errorf("flow %s: %w", match, ErrSRTPUnsupported))
			continue
		}
		if w.flow.Transcode != nil && !m.t.CanTranscode() {
			errs = append(errs, fmt.Errorf("flow %s: %w", match, ErrTranscodeUnsupported))
			continue
		}
		if i := m.flows.find(match); i >= 0 {
			rec := &m.flows[i]
			w.flow.ID = rec.flow.ID
			if sameFlow(*rec.flow, w.flow) {
				continue
			}
			moved, err := m.t.reg.Update(w.flow)
			if moved != nil {
				// Moved between data planes (SRTP on or off).
				old := *rec
				old.path = moved.From
				m.keepLast(&old, moved.Stats)
			}
			if err != nil {
				if moved != nil {
					m.flows = slices.Delete(m.flows, i, i+1)
				}
				errs = append(errs, fmt.Errorf("update flow %s: %w", match, err))
				continue
			}
			if fl, path, ok := m.t.reg.Shared(match); ok {
				rec.flow, rec.path = fl, path
			} else {
				f := w.flow
				rec.flow = &f
			}
			m.t.log.Debug("flow updated", zap.Stringer("match", match), zap.Stringer("send_to", w.flow.SendTo))
			continue
		}
		if id, ok := m.restoreIDs[match]; ok {
			w.flow.ID = id
		}
		fl, path, err := m.t.reg.Install(w.flow, "", m)
		if err != nil {
			errs = append(errs, fmt.Errorf("install flow %s: %w", match, err))
			continue
		}
		m.flows = append(m.flows, flowRec{flow: m.shared(fl), path: path, side: w.side, installed: m.t.now().UnixNano()})
	}
	return errors.Join(errs...)
}

// shared returns the registry's copy of a flow just installed or claimed,
// else (gone again already) a copy of fl.
func (m *Media) shared(fl dataplane.Flow) *dataplane.Flow {
	if p, _, ok := m.t.reg.Shared(fl.Match); ok && p.ID == fl.ID {
		return p
	}
	return &fl
}

// keepLast keeps a removed flow's statistics for the call's totals.
func (m *Media) keepLast(rec *flowRec, st dataplane.Stats) {
	if m.last == nil {
		m.last = make(map[netip.AddrPort]FlowStat)
	}
	prev := m.last[rec.flow.Match]
	st.Add(prev.Stats)
	m.last[rec.flow.Match] = FlowStat{Flow: *rec.flow, Path: rec.path, Side: rec.side, Stats: st}
}

// FlowStat is a call's flow with its statistics.
type FlowStat struct {
	Flow  dataplane.Flow
	Path  dataplane.Path
	Side  Side // the leg its packets arrive from
	Stats dataplane.Stats
}

// Flows returns the installed flows with current statistics, sorted by
// match.
func (m *Media) Flows() []FlowStat {
	m.mu.Lock()
	recs := slices.Clone(m.flows) // copies: Sync replaces the fields
	m.mu.Unlock()
	out := make([]FlowStat, 0, len(recs))
	for _, r := range recs {
		fs, _ := m.t.reg.Stats(r.flow.Match)
		out = append(out, FlowStat{Flow: *r.flow, Path: r.path, Side: r.side, Stats: fs.Stats})
	}
	slices.SortFunc(out, func(a, b FlowStat) int { return a.Flow.Match.Compare(b.Flow.Match) })
	return out
}

// Transcoding returns how many installed flows transcode: one per stream
// and leg whose packets relayd converts to the other leg's codec (the
// RTCP flows of a transcoded stream are sinks and do not count). It reads
// no statistics, so it costs no data plane lookup.
func (m *Media) Transcoding() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, r := range m.flows {
		if r.flow.Transcode != nil {
			n++
		}
	}
	return n
}

// lastActivity returns the latest packet (or install) time over the
// call's flows, and whether it has any flow.
func (m *Media) lastActivity(seen map[netip.AddrPort]time.Time) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var last time.Time
	for _, r := range m.flows {
		t := time.Unix(0, r.installed)
		if s, ok := seen[r.flow.Match]; ok && s.After(t) {
			t = s
		}
		if t.After(last) {
			last = t
		}
	}
	return last, len(m.flows) > 0
}

// Close removes every flow, releases the ports and returns the final
// statistics of every flow the call had. Calling it again returns nil.
func (m *Media) Close() []FlowStat {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	out := make([]FlowStat, 0, len(m.flows)+len(m.last))
	for _, rec := range m.flows {
		match := rec.flow.Match
		fs, err := m.t.reg.Remove(match)
		if err != nil && !errors.Is(err, dataplane.ErrNotFound) {
			m.t.log.Warn("remove flow at call end", zap.Stringer("match", match), zap.Error(err))
		}
		st := fs.Stats
		if prev, ok := m.last[match]; ok {
			st.Add(prev.Stats)
			delete(m.last, match)
		}
		out = append(out, FlowStat{Flow: *rec.flow, Path: rec.path, Side: rec.side, Stats: st})
	}
	m.flows = nil
	clear(m.flowBuf[:]) // the registry's flows: the call may outlive them
	for _, st := range m.streams {
		for s := range st.Ends {
			if e := &st.Ends[s]; e.Port != 0 {
				m.t.reg.ReleasePort(e.Interface, e.Port)
			}
		}
	}
	for _, fs := range m.last {
		out = append(out, fs)
	}
	slices.SortFunc(out, func(a, b FlowStat) int { return a.Flow.Match.Compare(b.Flow.Match) })
	m.last, m.final = nil, out
	return out
}

// Relay ports come in pairs: RTP on the even port, RTCP on the odd one
// after it.
func isRTCP(match netip.AddrPort) bool { return match.Port()%2 == 1 }

func rtpOf(rtcp netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(rtcp.Addr(), rtcp.Port()-1)
}

func rtcpOf(rtp netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(rtp.Addr(), rtp.Port()+1)
}
