package call

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/relayd/relayd/control/destpolicy"
	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/sdes"
)

// Policy is the SRTP policy toward the leg that receives an offer. The
// zero value is SRTPPass. The B2BUA applies a route's policy toward the
// callee and SRTPPass toward the caller; an ng front end maps
// transport-protocol=RTP/AVP on an offer with a=crypto to SRTPOff and
// RTP/SAVP on a plain offer to SRTPRequire.
type Policy string

const (
	// SRTPPass: the offer's keys, or their absence, pass end to end.
	SRTPPass Policy = ""
	// SRTPOff: plain RTP/AVP toward the receiving leg. When the offer
	// has a=crypto, relayd terminates the offerer's SRTP.
	SRTPOff Policy = "off"
	// SRTPOffer: best effort. A plain offer goes out on RTP/AVP with
	// relayd's a=crypto: SRTP on that leg if its peer takes the key,
	// plain otherwise. An offer with a=crypto passes end to end.
	SRTPOffer Policy = "offer"
	// SRTPRequire: RTP/SAVP toward the receiving leg. A plain offer goes
	// out with relayd's key, which the answer must take; an offer with
	// a=crypto passes end to end on RTP/SAVP.
	SRTPRequire Policy = "require"
)

func (p Policy) valid() bool {
	switch p {
	case SRTPPass, SRTPOff, SRTPOffer, SRTPRequire:
		return true
	}
	return false
}

// Errors of the negotiation, besides those of control/sdp (ErrNotAcceptable
// when nothing is left to relay) and ErrSRTPUnsupported.
var (
	// ErrTranscodeUnsupported: the options ask for a codec the offer does
	// not carry, which only transcoding could provide.
	ErrTranscodeUnsupported = errors.New("transcoding is not available")
	// ErrICEUnsupported: the options ask for ICE toward a leg; relayd
	// anchors media on plain UDP and does no ICE.
	ErrICEUnsupported = errors.New("ICE is not available: relayd anchors media on plain UDP")
)

// Reason returns, for an error of Offer or Answer that refuses the SDP
// (SIP 488: sdp.ErrNotAcceptable, destpolicy.ErrDenied,
// ErrSRTPUnsupported, ErrTranscodeUnsupported), a short reason a front
// end can send back to the peer (a SIP Warning, an ng error-reason); ""
// for other errors. It names no configuration.
func Reason(err error) string {
	var de *destpolicy.DeniedError
	switch {
	case errors.As(err, &de):
		return fmt.Sprintf("media destination %s is %s", de.Dest, de.Reason)
	case errors.Is(err, ErrTranscodeUnsupported):
		return ErrTranscodeUnsupported.Error()
	case errors.Is(err, ErrSRTPUnsupported):
		return "SRTP termination is not available"
	case errors.Is(err, ErrICEUnsupported):
		return "ICE is not available"
	case sdp.Reason(err) != "":
		return sdp.Reason(err)
	case errors.Is(err, sdp.ErrNotAcceptable):
		return sdp.ErrNotAcceptable.Error()
	}
	return ""
}

// Local is relayd's media address on one leg of a call.
type Local struct {
	// Interface names the media interface the address belongs to; empty
	// for the default one.
	Interface string
	// Addr is where the leg's flows match and send from.
	Addr netip.Addr
	// Advertise is the address the SDP toward the leg gives (a 1:1 NAT's
	// public address); invalid means Addr.
	Advertise netip.Addr
}

// Advertised returns the address the SDP toward the leg gives.
func (l Local) Advertised() netip.Addr {
	if l.Advertise.IsValid() {
		return l.Advertise
	}
	return l.Addr
}

// CodecPolicy selects the codecs of an offer that go on to the answerer.
// Names compare case-insensitively, as "name" or "name/rate" (channels,
// if given, are ignored); "all" in Strip or Mask matches every codec. The
// zero value keeps every codec.
type CodecPolicy struct {
	// Allowed, when not empty, is the only codecs relayd relays (a
	// route's codecs). It applies before the others.
	Allowed []string
	// Strip removes codecs from the offer.
	Strip []string
	// Mask hides codecs from the answerer while the offerer may still
	// use them: relayd can answer the offerer with a masked codec when
	// it transcodes from a codec in Transcode. Without transcoding the
	// answerer could never send or receive a masked codec, so a mask has
	// the effect of Strip.
	Mask []string
	// Offer keeps (re-adds after Strip or Mask) the named codecs of the
	// offer; names the offer does not carry are ignored.
	Offer []string
	// Transcode is Offer for codecs the offer carries, even those
	// Allowed leaves out. One it does not carry (PCMU, PCMA or G729) is
	// added after the offer's codecs when relayd can transcode
	// (OfferOptions.Transcoding) and the offer has one of those three to
	// make it from; the offer's telephone-event then goes on too. Without
	// transcoding nothing is added, and an offer left with nothing to
	// relay fails with an error wrapping ErrTranscodeUnsupported and
	// sdp.ErrNotAcceptable.
	Transcode []string
	// G729AnnexB offers an added G.729 with annexb=yes (relayd's encoder
	// then sends SID frames in silence); the zero value offers
	// annexb=no.
	G729AnnexB bool
}

// MuxPolicy is how relayd handles rtcp-mux (RFC 5761) on an offer. The
// zero value passes it through: offered to the answerer if the offerer
// offered it, used on both legs if the answerer accepts it.
//
// The data plane carries a leg's multiplexed RTCP on the leg's RTP flow
// and cannot split it out: RTCP from a leg with rtcp-mux toward a leg
// without it arrives on that peer's RTP port. So relayd never answers
// the offerer with rtcp-mux when the answerer's leg does not use it
// (Accept behaves as the zero value, Demux strips rtcp-mux on both
// legs), and only Offer and Require can leave the legs differing (the
// offerer without rtcp-mux, the answerer with it: RTCP toward the
// answerer is right, RTCP from it reaches the offerer's RTP port).
type MuxPolicy struct {
	// Offer offers rtcp-mux to the answerer even if the offerer did not.
	Offer bool
	// Require is Offer, and the answerer's leg uses rtcp-mux even if its
	// answer lacks it.
	Require bool
	// Demux does not offer rtcp-mux to the answerer.
	Demux bool
	// Accept accepts the offerer's rtcp-mux (as the zero value does when
	// the answerer accepts it; see above).
	Accept bool
	// Reject answers the offerer without rtcp-mux and, unless Offer or
	// Require is set, does not offer it to the answerer.
	Reject bool
}

// ICEPolicy is what relayd does with ICE toward a leg. The zero value is
// ICERemove.
type ICEPolicy string

const (
	// ICERemove removes the peer's ICE attributes: the relay anchors the
	// media, the peer's candidates would bypass it.
	ICERemove ICEPolicy = ""
	// ICEForce would make relayd an ICE agent: ErrICEUnsupported.
	ICEForce ICEPolicy = "force"
)

// Render are the knobs of the SDP relayd sends. The zero value is the
// B2BUA's: relayd's own o= line per leg, the session-level c= replaced,
// ICE removed.
type Render struct {
	// KeepOrigin leaves the peer's o= line as it is.
	KeepOrigin bool
	// OriginAddress, with KeepOrigin, keeps the peer's o= line but puts
	// relayd's address in it (rtpengine's "replace origin").
	OriginAddress bool
	// RTPEngineLayout lays the attributes out as rtpengine does: a=rtcp
	// without its address when that is the c= address, relayd's
	// attributes before a=ptime, which ends the media section.
	RTPEngineLayout bool
	// KeepSessionConnection leaves the session-level c= line as it is;
	// every stream gets a media-level c= with relayd's address.
	KeepSessionConnection bool
	ICE                   ICEPolicy
}

func (r Render) check() error {
	switch r.ICE {
	case ICERemove:
		return nil
	case ICEForce:
		return ErrICEUnsupported
	}
	return fmt.Errorf("ICE policy %q", r.ICE)
}

// OfferOptions are the policy for one offer. The zero value relays the
// offer as it is: keys end to end, every codec, rtcp-mux passed through,
// symmetric RTP, the B2BUA's SDP rendering.
type OfferOptions struct {
	// SRTP is the policy toward the leg that receives the offer.
	SRTP Policy
	// SRTPTermination: relayd can decrypt and encrypt SRTP (a userspace
	// data plane runs). Without it a policy that needs SRTP on one leg
	// only fails with ErrSRTPUnsupported, and SRTPOffer stays plain.
	SRTPTermination bool
	// Suites are the SDES suites relayd offers, in order, when it keys
	// a leg: one a=crypto line each, and the answer picks one. Empty
	// offers AES_CM_128_HMAC_SHA1_80 alone. A re-offer keeps the key the
	// leg uses.
	Suites []sdes.Suite
	Codecs CodecPolicy
	// Transcoding: relayd can transcode (Table.CanTranscode). Without it
	// no codec is added to the offer.
	Transcoding bool
	RTCPMux     MuxPolicy
	// Latch is the policy for the offerer's leg.
	Latch LatchPolicy
	// Render shapes the SDP toward the answerer.
	Render Render
	// Install puts in the flows toward the offerer at once (early media
	// from the answerer, whose addresses a re-offer knows); otherwise
	// the flows change with the answer.
	Install bool
}

// AnswerOptions are the policy for one answer. The zero value is the
// B2BUA's.
type AnswerOptions struct {
	// Latch is the policy for the answerer's leg.
	Latch LatchPolicy
	// Render shapes the SDP toward the offerer.
	Render Render
}

// decision is what relayd decided for one stream of the pending offer.
type decision struct {
	made       bool   // the stream has one (an enabled stream of the offer)
	pass       bool   // a=crypto passes end to end (or no SRTP at all)
	offerProto string // the offerer's profile, for the answer relayd sends it
	// terminate: relayd decrypts the offerer's SRTP (its key in Recv,
	// relayd's key for it in Send, answered with the offer's tag).
	terminate bool
	// keyed: relayd offered its own key to the answerer (Send of the
	// answerer's end); require: the answerer must take it. offered are
	// the keys relayd offered, one per suite: the answer picks one.
	keyed, require bool
	offered        []*sdes.Crypto
	offerMux       bool // the offerer offered rtcp-mux
	sentMux        bool // relayd offered rtcp-mux to the answerer
	codecs         codecPlan
}

type pendingOffer struct {
	from    Side
	offer   *sdp.Description
	streams []decision // by stream index
	mux     MuxPolicy
}

// decision returns the decision for stream i, if there is one.
func (p *pendingOffer) decision(i int) (decision, bool) {
	if i < len(p.streams) && p.streams[i].made {
		return p.streams[i], true
	}
	return decision{}, false
}

// Session is the offer/answer state of one call's media (RFC 3264): for
// each leg relayd's media address, its o= line and the last SDP sent,
// and the offer being negotiated with what relayd decided for each of
// its streams. Offer and Answer anchor the streams on the relay through
// the call's Media. Front ends (the SIP B2BUA, the ng protocol) turn
// their syntax into OfferOptions and AnswerOptions and send the SDP the
// session renders.
//
// Create it with NewSession or RestoreSession; the zero value is not
// usable. Safe for concurrent use; offers and answers are serialized.
type Session struct {
	media *Media

	mu       sync.Mutex // guards the following
	local    [2]Local
	origin   [2]sdp.Origin
	lastSent [2][]byte
	pend     *pendingOffer
}

// NewSession returns the session of a call's media with relayd's media
// address per leg and new o= lines.
func NewSession(m *Media, local [2]Local) *Session {
	return &Session{media: m, local: local, origin: [2]sdp.Origin{sdp.NewOrigin(), sdp.NewOrigin()}}
}

// SessionSnapshot is what a session keeps across a restart of relayd
// (encoding/json works; the field names are part of the stored schema).
type SessionSnapshot struct {
	Origin   [2]OriginSnap `json:"origin"`
	LastSent [2][]byte     `json:"last_sent"`
}

// OriginSnap is an sdp.Origin.
type OriginSnap struct {
	SessionID uint64 `json:"session_id"`
	Version   uint64 `json:"version"`
}

// Snapshot returns the session's state for persisting. A pending offer
// is not part of it: a restored call has none.
func (s *Session) Snapshot() SessionSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	var snap SessionSnapshot
	for i, o := range s.origin {
		snap.Origin[i] = OriginSnap{o.SessionID, o.Version}
		snap.LastSent[i] = slices.Clone(s.lastSent[i])
	}
	return snap
}

// RestoreSession is NewSession for a call taken back after a restart.
func RestoreSession(m *Media, local [2]Local, snap SessionSnapshot) *Session {
	s := &Session{media: m, local: local}
	for i, o := range snap.Origin {
		s.origin[i] = sdp.Origin{SessionID: o.SessionID, Version: o.Version}
	}
	s.lastSent[B] = snap.LastSent[B]
	s.keepSent(A, snap.LastSent[A])
	return s
}

// SetLocal sets relayd's media address on a leg (the B2BUA picks leg B's
// once it knows the destination). The next offer moves the streams.
func (s *Session) SetLocal(side Side, l Local) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.local[side] = l
}

// Local returns relayd's media address on a leg.
func (s *Session) Local(side Side) Local {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.local[side]
}

// LastSent returns the last SDP relayd sent to a leg (the answer to an
// offerless re-INVITE), nil if none.
func (s *Session) LastSent(side Side) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastSent[side]
}

// Pending reports whether an offer awaits its answer.
func (s *Session) Pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pend != nil
}

// Complete ends the offer/answer exchange: the pending offer is dropped,
// and an answer without a new offer is an error.
func (s *Session) Complete() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pend = nil
}

// Offer takes an offer from one leg (d: filtered per o.Codecs in place;
// when relayd adds codecs, a copy is: see CodecPolicy.Transcode),
// anchors its streams on the relay (ports, the offerer's addresses, SRTP
// per o.SRTP, rtcp-mux per o.RTCPMux) and returns the SDP to offer the
// other leg. A new offer replaces a pending one.
func (s *Session) Offer(from Side, d *sdp.Description, o OfferOptions) ([]byte, error) {
	switch {
	case !o.SRTP.valid():
		return nil, fmt.Errorf("SRTP policy %q", o.SRTP)
	case !o.Latch.valid():
		return nil, fmt.Errorf("latch policy %q", o.Latch)
	}
	if err := o.Render.check(); err != nil {
		return nil, err
	}
	to := from.Other()
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.media
	// A leg that gets transcoded media keeps its codec across re-offers.
	var current []string
	for _, st := range m.Streams() {
		name := ""
		if st.Transcode != nil && !st.Disabled {
			name = st.Transcode[to].Name
		}
		current = append(current, name)
	}
	d, plans, err := planCodecs(d, o.Codecs, o.Transcoding, current)
	if err != nil {
		return nil, err
	}
	// Refuse before anything changes: ports, streams, flows.
	for i := range d.Streams {
		if err := s.acceptable(from, &d.Streams[i]); err != nil {
			return nil, fmt.Errorf("stream %d: %w", i, err)
		}
	}
	plan := sdp.Plan{
		Addr:                  s.local[to].Advertised(),
		KeepSessionConnection: o.Render.KeepSessionConnection,
		OriginAddress:         o.Render.KeepOrigin && o.Render.OriginAddress,
		RTPEngineLayout:       o.Render.RTPEngineLayout,
		Streams:               make([]sdp.StreamPlan, len(d.Streams)),
	}
	mp := o.RTCPMux
	decs := make([]decision, len(d.Streams))
	for i := range d.Streams {
		st := &d.Streams[i]
		if !st.Enabled() {
			m.Edit(i, func(ms *Stream) { ms.Disabled = true })
			continue
		}
		if err := m.Ensure(i, s.local[A].Addr, s.local[B].Addr); err != nil {
			return nil, err
		}
		dec, sp, err := decideOffer(st, o, m.keyed(i, to))
		if err != nil {
			return nil, fmt.Errorf("stream %d: %w", i, err)
		}
		dec.offerMux, dec.sentMux = st.RTCPMux, st.RTCPMux
		dec.codecs = plans[i]
		switch {
		case mp.Offer, mp.Require:
			dec.sentMux = true
		case mp.Demux, mp.Reject:
			dec.sentMux = false
		}
		sp.RTCPMux = dec.sentMux
		var relayKey *sdes.Crypto
		var moreKeys []*sdes.Crypto
		m.Edit(i, func(ms *Stream) {
			ms.Disabled = false
			fe, te := &ms.Ends[from], &ms.Ends[to]
			fe.RTP, fe.RTCP = st.RTP(), st.RTCP()
			fe.Latch = o.Latch
			// Until the answer: as if the answerer accepts what relayd
			// offered it.
			ms.Mux = false
			fe.Mux = dec.offerMux && dec.sentMux && !mp.Demux && !mp.Reject
			te.Mux = dec.sentMux
			ms.ClockRate = st.ClockRate()
			ms.Kind, ms.Ptime = m.kind(st.Media), st.Ptime
			sp.Port = int(te.Port)
			switch {
			case dec.terminate:
				fe.Recv = st.Crypto[0]
				fe.Send, err = keyFor(fe.Send, st.Crypto[0].Suite, st.Crypto[0].Tag)
				te.Recv, te.Send = nil, nil
			case dec.keyed && te.Send == nil && len(o.Suites) > 1:
				fe.Recv, fe.Send = nil, nil
				for k, suite := range o.Suites {
					key, kerr := sdes.Generate(k+1, suite)
					if kerr != nil {
						err = kerr
						return
					}
					dec.offered = append(dec.offered, key)
				}
				te.Send = dec.offered[0]
				relayKey, moreKeys = dec.offered[0], dec.offered[1:]
			case dec.keyed:
				fe.Recv, fe.Send = nil, nil
				suite, tag := sdes.AES_CM_128_HMAC_SHA1_80, 1
				if len(o.Suites) == 1 {
					suite = o.Suites[0]
				}
				if te.Send != nil {
					suite, tag = te.Send.Suite, te.Send.Tag
				}
				te.Send, err = keyFor(te.Send, suite, tag)
				relayKey = te.Send
				dec.offered = []*sdes.Crypto{te.Send}
			default:
				fe.Recv, fe.Send, te.Recv, te.Send = nil, nil, nil, nil
			}
		})
		if err != nil {
			return nil, fmt.Errorf("stream %d: %w", i, err)
		}
		sp.Crypto, sp.MoreCrypto = relayKey, moreKeys
		dec.made = true
		decs[i] = dec
		plan.Streams[i] = sp
	}
	body, err := d.Rewrite(plan, s.originFor(to, o.Render))
	if err != nil {
		return nil, err
	}
	s.pend = &pendingOffer{from: from, offer: d, streams: decs, mux: mp}
	s.keepSent(to, body)
	if o.Install {
		if err := m.Sync(); err != nil {
			return nil, err
		}
	}
	return body, nil
}

// acceptable refuses a stream from leg side that relayd cannot honour
// as it is, rather than relaying a broken one: media toward an address
// the destination policy denies (relayd's own, loopback, broadcast...),
// an address of a family the leg's media interface has no address of,
// and a secure profile without a key relayd can use (it can neither pass
// it on nor decrypt it, and RTP/SAVP without a=crypto is no offer).
// Called with s.mu held.
func (s *Session) acceptable(side Side, st *sdp.Stream) error {
	if !st.Enabled() {
		return nil
	}
	local := s.local[side].Addr
	for _, a := range []netip.Addr{st.Addr, st.RTCPAddr} {
		if !a.IsValid() || a.IsUnspecified() {
			continue // hold
		}
		if six := a.Is6() && !a.Is4In6(); !local.IsValid() || local.Is6() != six {
			family := "IPv4"
			if six {
				family = "IPv6"
			}
			return sdp.NotAcceptable("no %s media address", family)
		}
	}
	for _, dst := range []netip.AddrPort{st.RTP(), st.RTCP()} {
		if !dst.IsValid() {
			continue
		}
		if err := s.media.t.reg.CheckDestination(dst); err != nil {
			return err
		}
	}
	if st.SRTP() && len(st.Crypto) == 0 {
		return sdp.NotAcceptable("%s without a usable a=crypto", st.Proto)
	}
	return nil
}

func (s *Session) originFor(to Side, r Render) *sdp.Origin {
	if r.KeepOrigin {
		return nil
	}
	return &s.origin[to]
}

// decideOffer decides the SRTP of one stream of an offer; keyedTo: relayd
// encrypts toward the receiving leg already (it terminates its SRTP).
func decideOffer(st *sdp.Stream, o OfferOptions, keyedTo bool) (decision, sdp.StreamPlan, error) {
	keys := len(st.Crypto) > 0
	dec := decision{offerProto: st.Proto}
	sp := sdp.StreamPlan{Proto: st.Proto}
	switch {
	case o.SRTP == SRTPPass && !keys && keyedTo:
		// A re-offer from a plain leg to one whose SRTP relayd
		// terminates: that leg keeps relayd's key.
		dec.keyed, dec.require = true, true
		sp.Proto = savp(st.Proto)
	case o.SRTP == SRTPPass:
		dec.pass = true
		sp.KeepCrypto = keys
	case keys && o.SRTP == SRTPOff, !keys && o.SRTP == SRTPRequire:
		// SRTP on one leg only: relayd terminates it in userspace.
		if !o.SRTPTermination {
			return dec, sp, ErrSRTPUnsupported
		}
		if keys {
			dec.terminate = true
			sp.Proto = avp(st.Proto)
		} else {
			dec.keyed, dec.require = true, true
			sp.Proto = savp(st.Proto)
		}
	case !keys && o.SRTP == SRTPOffer && o.SRTPTermination:
		// Best effort: relayd's key offered on RTP/AVP; plain if the
		// answerer does not take it.
		dec.keyed = true
	case keys:
		dec.pass = true
		sp.KeepCrypto = true
		if o.SRTP == SRTPRequire {
			sp.Proto = savp(st.Proto)
		}
	default:
		dec.pass = true
	}
	return dec, sp, nil
}

// keyed reports whether relayd encrypts toward leg side on stream i.
func (m *Media) keyed(i int, side Side) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return i < len(m.streams) && m.streams[i].Ends[side].Send != nil
}

// Answer takes the answer from one leg to the pending offer, learns its
// addresses and keys, installs or updates the flows and returns the SDP
// to answer the offerer with. The offer stays pending (a provisional
// answer may be followed by the final one) until the next offer or
// Complete.
func (s *Session) Answer(from Side, d *sdp.Description, o AnswerOptions) ([]byte, error) {
	if !o.Latch.valid() {
		return nil, fmt.Errorf("latch policy %q", o.Latch)
	}
	if err := o.Render.check(); err != nil {
		return nil, err
	}
	to := from.Other()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pend
	switch {
	case p == nil:
		return nil, errors.New("answer without a pending offer")
	case p.from == from:
		return nil, fmt.Errorf("answer from leg %s to its own offer", from)
	}
	m := s.media
	plan := sdp.Plan{
		Addr:                  s.local[to].Advertised(),
		KeepSessionConnection: o.Render.KeepSessionConnection,
		OriginAddress:         o.Render.KeepOrigin && o.Render.OriginAddress,
		RTPEngineLayout:       o.Render.RTPEngineLayout,
		Streams:               make([]sdp.StreamPlan, len(d.Streams)),
	}
	for i := range d.Streams {
		if _, ok := p.decision(i); ok && i < len(p.offer.Streams) {
			if err := s.acceptable(from, &d.Streams[i]); err != nil {
				return nil, fmt.Errorf("stream %d: %w", i, err)
			}
		}
	}
	var errs []error
	out, cloned := d, false
	for i := range d.Streams {
		st := &d.Streams[i]
		dec, ok := p.decision(i)
		if i >= len(p.offer.Streams) || !ok || !st.Enabled() {
			m.Edit(i, func(ms *Stream) { ms.Disabled = true })
			continue
		}
		tc, codecs, ptime, err := transcodeAnswer(st, dec.codecs, from)
		if err != nil {
			errs = append(errs, fmt.Errorf("stream %d: %w", i, err))
			continue
		}
		if codecs != nil {
			if !cloned {
				// The answer may be answered again (a 200 after an 18x
				// with the same SDP): it stays as the answerer sent it.
				if out = d.Clone(); out == nil {
					return nil, fmt.Errorf("%w: the answer does not render again", sdp.ErrMalformed)
				}
				cloned = true
			}
			out.SetCodecs(i, codecs, ptime)
		}
		// rtcp-mux on the answerer's leg, then on the offerer's: never
		// on the offerer's alone (see MuxPolicy).
		ansMux := dec.sentMux && (st.RTCPMux || p.mux.Require)
		offMux := dec.offerMux && ansMux && !p.mux.Reject && !p.mux.Demux
		sp := sdp.StreamPlan{RTCPMux: offMux, Proto: dec.offerProto}
		m.Edit(i, func(ms *Stream) {
			ms.Disabled = false
			fe, te := &ms.Ends[from], &ms.Ends[to]
			fe.RTP, fe.RTCP = st.RTP(), st.RTCP()
			fe.Latch = o.Latch
			ms.Mux = false
			fe.Mux, te.Mux = ansMux, offMux
			if c := st.ClockRate(); c != 0 {
				ms.ClockRate = c
			}
			if st.Ptime > 0 && (ms.Ptime == 0 || st.Ptime < ms.Ptime) {
				ms.Ptime = st.Ptime
			}
			ms.Transcode = tc
			if tc != nil {
				for side := range ms.Ends {
					if ms.Ends[side].SSRC == 0 {
						ms.Ends[side].SSRC = newSSRC()
					}
				}
			}
			sp.Port = int(te.Port)
			switch {
			case dec.terminate:
				sp.Crypto = te.Send
			case dec.keyed:
				key, offered := matchOffered(st.Crypto, dec.offered)
				switch {
				case key != nil:
					fe.Recv, fe.Send = key, offered
				case dec.require:
					errs = append(errs, fmt.Errorf("stream %d: %w", i, sdp.NotAcceptable("SRTP required and the answer has no matching a=crypto")))
				default:
					fe.Recv, fe.Send = nil, nil // plain after all
				}
			case dec.pass:
				sp.KeepCrypto = len(st.Crypto) > 0
			}
		})
		plan.Streams[i] = sp
	}
	// Streams the answer lacks are rejected.
	for i := len(d.Streams); i < len(p.offer.Streams); i++ {
		m.Edit(i, func(ms *Stream) { ms.Disabled = true })
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := m.Sync(); err != nil {
		return nil, err
	}
	body, err := out.Rewrite(plan, s.originFor(to, o.Render))
	if err != nil {
		return nil, err
	}
	s.keepSent(to, body)
	return body, nil
}

// keepSent records body as the last SDP sent to a leg. The body itself
// goes out in a SIP message, among that message's objects, and a few
// hundred bytes kept from them for as long as the call lasts would keep
// a page of them in use (the calls' setups leave them everywhere): it is
// copied into the call's own allocation while there is room
// (Media.keepBytes), else into an allocation of its own. The origins
// share it.
func (s *Session) keepSent(to Side, body []byte) {
	s.lastSent[to] = s.media.keepBytes(body)
	for side, b := range &s.lastSent {
		if len(b) == 0 {
			s.lastSent[side] = nil // none sent
			continue
		}
		s.origin[side].ShareLast(b)
	}
}

// keyFor keeps a leg's relayd key across re-offers when the suite stays,
// else makes a new one.
func keyFor(old *sdes.Crypto, suite sdes.Suite, tag int) (*sdes.Crypto, error) {
	if old != nil && old.Suite == suite {
		k := *old
		k.Tag = tag
		return &k, nil
	}
	return sdes.Generate(tag, suite)
}

// matchOffered returns the answer's key for one of relayd's offered keys
// and that offered key: same tag and suite (RFC 4568), or else, like
// rtpengine, the same suite under another tag (answerers that renumber).
func matchOffered(keys, offered []*sdes.Crypto) (answer, relay *sdes.Crypto) {
	for _, o := range offered {
		if k := matchKey(keys, o); k != nil {
			return k, o
		}
	}
	for _, o := range offered {
		for _, k := range keys {
			if k.Suite == o.Suite {
				return k, o
			}
		}
	}
	return nil, nil
}

// matchKey returns the answer's key for relayd's offered one: same tag
// and suite.
func matchKey(keys []*sdes.Crypto, offered *sdes.Crypto) *sdes.Crypto {
	if offered == nil {
		return nil
	}
	for _, k := range keys {
		if k.Tag == offered.Tag && k.Suite == offered.Suite {
			return k
		}
	}
	return nil
}

func savp(proto string) string {
	switch proto {
	case "RTP/AVP":
		return "RTP/SAVP"
	case "RTP/AVPF":
		return "RTP/SAVPF"
	}
	return proto
}

func avp(proto string) string {
	switch proto {
	case "RTP/SAVP":
		return "RTP/AVP"
	case "RTP/SAVPF":
		return "RTP/AVPF"
	}
	return proto
}

// planCodecs applies a codec policy to an offer: it keeps the codecs the
// policy lets through and, with transcoding, adds the codecs of
// p.Transcode (and those the receiving leg uses now, current by stream)
// that the offer lacks and relayd can make from one of its codecs. The
// description is filtered in place; when codecs are added, a copy is,
// so that the offer stays as the offerer sent it (a B2BUA offers it to
// each destination in turn). It returns the description to offer and
// the plan of each stream.
func planCodecs(d *sdp.Description, p CodecPolicy, transcoding bool, current []string) (*sdp.Description, []codecPlan, error) {
	in := func(list []string, c sdp.Codec) bool {
		return slices.ContainsFunc(list, func(n string) bool { return codecIs(n, c) })
	}
	all := func(list []string) bool {
		return slices.ContainsFunc(list, func(n string) bool { return strings.EqualFold(n, "all") })
	}
	keep := func(c sdp.Codec) bool {
		if in(p.Transcode, c) {
			return true
		}
		if len(p.Allowed) > 0 && !in(p.Allowed, c) {
			return false
		}
		hidden := in(p.Strip, c) || in(p.Mask, c) || all(p.Strip) || all(p.Mask)
		return !hidden || in(p.Offer, c)
	}
	stripped := func(c sdp.Codec) bool {
		return (in(p.Strip, c) || all(p.Strip)) && !in(p.Offer, c) && !in(p.Transcode, c)
	}
	plans := make([]codecPlan, len(d.Streams))
	keepEvent := make([]bool, len(d.Streams))
	refused, adding := false, false
	for i := range d.Streams {
		st := &d.Streams[i]
		if !st.Enabled() {
			continue
		}
		pl := &plans[i]
		pl.ptime, pl.maxptime = st.Ptime, st.MaxPtime
		var rest []sdp.Codec
		for _, c := range st.Codecs {
			switch {
			case stripped(c):
			case keep(c):
				pl.offered = append(pl.offered, c)
			default:
				rest = append(rest, c)
			}
		}
		pl.offered = append(pl.offered, rest...)
		names := slices.Clone(p.Transcode)
		if i < len(current) && current[i] != "" {
			names = append(names, current[i])
		}
		for _, n := range names {
			n, _, _ = strings.Cut(n, "/")
			name, ok := dataplane.TranscodeCodec(n)
			if !ok || slices.ContainsFunc(st.Codecs, func(c sdp.Codec) bool { return strings.EqualFold(c.Name, name) }) ||
				slices.ContainsFunc(pl.added, func(c sdp.Codec) bool { return c.Name == name }) {
				continue // not a codec relayd makes, or the offer has it
			}
			if !slices.ContainsFunc(pl.offered, func(c sdp.Codec) bool { _, ok := transcodable(c); return ok }) {
				continue // nothing to make it from
			}
			if !transcoding {
				refused = true
				continue
			}
			pt, free := freePT(name, append(slices.Clone(st.Codecs), pl.added...))
			if !free {
				continue
			}
			c := sdp.Codec{PT: pt, Name: name, ClockRate: 8000}
			if name == "G729" {
				c.Fmtp = "annexb=no"
				if p.G729AnnexB {
					c.Fmtp = "annexb=yes"
				}
			}
			pl.added = append(pl.added, c)
		}
		if len(pl.added) > 0 {
			adding = true
			// DTMF keeps working: the offer's telephone-event goes on.
			keepEvent[i] = slices.ContainsFunc(pl.offered, isEvent)
		}
	}
	if adding {
		d = d.Clone()
		if d == nil {
			return nil, nil, fmt.Errorf("%w: the offer does not render again", sdp.ErrMalformed)
		}
		for i := range plans {
			d.AddCodecs(i, plans[i].added)
		}
	}
	var err error
	if len(p.Allowed) == 0 && len(p.Strip) == 0 && len(p.Mask) == 0 {
		err = d.Usable()
	} else {
		err = d.FilterCodecsFunc(func(i int, c sdp.Codec) bool {
			return keep(c) || keepEvent[i] && isEvent(c) ||
				slices.ContainsFunc(plans[i].added, func(a sdp.Codec) bool { return a.PT == c.PT && a.Name == c.Name })
		})
	}
	if err != nil && refused {
		err = fmt.Errorf("%w: %w", ErrTranscodeUnsupported, err)
	}
	return d, plans, err
}

// codecIs reports whether c is the codec name ("PCMA", "opus/48000",
// "opus/48000/2") names.
func codecIs(name string, c sdp.Codec) bool {
	n, rest, _ := strings.Cut(name, "/")
	if !strings.EqualFold(n, c.Name) {
		return false
	}
	rate, _, _ := strings.Cut(rest, "/")
	return rate == "" || rate == strconv.FormatUint(uint64(c.ClockRate), 10)
}
