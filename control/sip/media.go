package sip

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/route"
	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/sdes"
)

// neg is what relayd decided for one stream of the pending offer.
type neg struct {
	pass       bool   // a=crypto passes end to end (or no SRTP at all)
	offerProto string // the offerer's profile, for the answer relayd sends it
	// terminate: relayd decrypts the offerer's SRTP (its key in Recv,
	// relayd's key for it in Send, answered with the offer's tag).
	terminate bool
	// keyed: relayd offered its own key to the answerer (Send of the
	// answerer's end); require: the answerer must take it.
	keyed, require bool
}

// relayOffer takes an offer from one leg, anchors its streams on the
// relay (ports, the offerer's addresses, SRTP per the route's policy)
// and returns the SDP to offer the other leg. With install set, the flows
// toward the offerer go in at once (early media from the answerer);
// otherwise they wait for the answer.
func (bc *b2bCall) relayOffer(from call.Side, d *sdp.Description, install bool) ([]byte, error) {
	to := from.Other()
	bc.mu.Lock()
	dec := bc.dec
	bc.mu.Unlock()
	if err := d.FilterCodecs(dec.Route.Codecs); err != nil {
		return nil, err
	}
	// Toward the callee the route's policy applies; toward the caller
	// (late offer, re-offers from the callee) keys pass as they come.
	policy := dec.Route.SRTP
	canSRTP := bc.s.cfg.Calls.CanSRTP()
	m := bc.c.Media
	plan := sdp.Plan{Addr: bc.relay[to], Streams: make([]sdp.StreamPlan, len(d.Streams))}
	negs := make(map[int]neg)
	for i := range d.Streams {
		st := &d.Streams[i]
		if !st.Enabled() {
			m.Edit(i, func(ms *call.Stream) { ms.Disabled = true })
			continue
		}
		if err := m.Ensure(i, bc.relay[call.A], bc.relay[call.B]); err != nil {
			return nil, err
		}
		keys := len(st.Crypto) > 0
		n := neg{offerProto: st.Proto}
		sp := sdp.StreamPlan{RTCPMux: st.RTCPMux, Proto: st.Proto}
		switch {
		case to == call.A && !keys && terminatedA(m, i):
			// A re-offer from the plain callee to a caller whose SRTP
			// relayd terminates: the caller keeps relayd's key.
			n.keyed, n.require = true, true
			sp.Proto = savp(st.Proto)
		case to == call.A:
			n.pass = true
			sp.KeepCrypto = keys
		case keys && policy == route.SRTPOff, !keys && policy == route.SRTPRequire:
			// SRTP on one leg only: relayd terminates it in userspace.
			if !canSRTP {
				return nil, fmt.Errorf("stream %d: %w", i, call.ErrSRTPUnsupported)
			}
			if keys {
				n.terminate = true
				sp.Proto = avp(st.Proto)
			} else {
				n.keyed, n.require = true, true
				sp.Proto = savp(st.Proto)
			}
		case !keys && policy == route.SRTPOffer && canSRTP:
			// Best effort: relayd's key offered on RTP/AVP; plain if the
			// callee does not take it.
			n.keyed = true
		case keys:
			n.pass = true
			sp.KeepCrypto = true
			if policy == route.SRTPRequire {
				sp.Proto = savp(st.Proto)
			}
		default:
			n.pass = true
		}
		var relayKey *sdes.Crypto
		var err error
		m.Edit(i, func(ms *call.Stream) {
			ms.Disabled = false
			ms.Ends[from].RTP, ms.Ends[from].RTCP = st.RTP(), st.RTCP()
			ms.Mux = st.RTCPMux
			ms.ClockRate = st.ClockRate()
			sp.Port = int(ms.Ends[to].Port)
			fe, te := &ms.Ends[from], &ms.Ends[to]
			switch {
			case n.terminate:
				fe.Recv = st.Crypto[0]
				fe.Send, err = keyFor(fe.Send, st.Crypto[0].Suite, st.Crypto[0].Tag)
				te.Recv, te.Send = nil, nil
			case n.keyed:
				fe.Recv, fe.Send = nil, nil
				suite, tag := sdes.AES_CM_128_HMAC_SHA1_80, 1
				if te.Send != nil {
					suite, tag = te.Send.Suite, te.Send.Tag
				}
				te.Send, err = keyFor(te.Send, suite, tag)
				relayKey = te.Send
			default:
				fe.Recv, fe.Send, te.Recv, te.Send = nil, nil, nil, nil
			}
		})
		if err != nil {
			return nil, fmt.Errorf("stream %d: %w", i, err)
		}
		sp.Crypto = relayKey
		negs[i] = n
		plan.Streams[i] = sp
	}
	bc.mu.Lock()
	body, err := d.Rewrite(plan, &bc.origin[to])
	if err == nil {
		bc.pending = d
		bc.negs = negs
		bc.lastSent[to] = body
	}
	bc.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if install {
		if err := m.Sync(); err != nil {
			return nil, err
		}
	}
	return body, nil
}

// terminatedA reports whether relayd terminates SRTP on the caller's end
// of stream i.
func terminatedA(m *call.Media, i int) bool {
	for _, st := range m.Streams() {
		if st.Index == i {
			return st.Ends[call.A].Send != nil
		}
	}
	return false
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

// relayAnswer takes the answer from one leg to the pending offer, learns
// its addresses and keys, installs or updates the flows and returns the
// SDP to answer the offerer with.
func (bc *b2bCall) relayAnswer(from call.Side, d *sdp.Description) ([]byte, error) {
	to := from.Other()
	bc.mu.Lock()
	offer, negs := bc.pending, bc.negs
	bc.mu.Unlock()
	if offer == nil {
		return nil, errors.New("answer without a pending offer")
	}
	m := bc.c.Media
	plan := sdp.Plan{Addr: bc.relay[to], Streams: make([]sdp.StreamPlan, len(d.Streams))}
	var errs []error
	for i := range d.Streams {
		st := &d.Streams[i]
		n, ok := negs[i]
		if i >= len(offer.Streams) || !ok || !st.Enabled() {
			m.Edit(i, func(ms *call.Stream) { ms.Disabled = true })
			continue
		}
		mux := offer.Streams[i].RTCPMux && st.RTCPMux
		sp := sdp.StreamPlan{RTCPMux: mux, Proto: n.offerProto}
		m.Edit(i, func(ms *call.Stream) {
			ms.Disabled = false
			ms.Ends[from].RTP, ms.Ends[from].RTCP = st.RTP(), st.RTCP()
			ms.Mux = mux
			if c := st.ClockRate(); c != 0 {
				ms.ClockRate = c
			}
			sp.Port = int(ms.Ends[to].Port)
			fe, te := &ms.Ends[from], &ms.Ends[to]
			switch {
			case n.terminate:
				sp.Crypto = te.Send
			case n.keyed:
				key := matchKey(st.Crypto, fe.Send)
				switch {
				case key != nil:
					fe.Recv = key
				case n.require:
					errs = append(errs, fmt.Errorf("stream %d: SRTP required and the answer has no matching a=crypto: %w", i, sdp.ErrNotAcceptable))
				default:
					fe.Recv, fe.Send = nil, nil // plain after all
				}
			case n.pass:
				sp.KeepCrypto = len(st.Crypto) > 0
			}
		})
		plan.Streams[i] = sp
	}
	// Streams the answer lacks are rejected.
	for i := len(d.Streams); i < len(offer.Streams); i++ {
		m.Edit(i, func(ms *call.Stream) { ms.Disabled = true })
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := m.Sync(); err != nil {
		return nil, err
	}
	bc.mu.Lock()
	defer bc.mu.Unlock()
	body, err := d.Rewrite(plan, &bc.origin[to])
	if err != nil {
		return nil, err
	}
	bc.lastSent[to] = body
	return body, nil
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

// onReoffer relays a re-INVITE or UPDATE from one leg to the other: hold,
// resume, new ports or codecs. The flows change only when the other leg
// accepts; if it refuses, the old media stays.
func (bc *b2bCall) onReoffer(from call.Side, req *sip.Request, tx sip.ServerTransaction) {
	// Until the initial offer/answer is complete (the caller's ACK seen),
	// a new offer would race it. An answered call is normally a moment
	// from it (the ACK in flight, or being handled in another goroutine):
	// wait a little; then 491, and the peer retries (RFC 3261 14.1).
	var negotiated bool
	var b *sipgo.DialogClientSession
	for wait := 0; ; wait++ {
		bc.mu.Lock()
		negotiated, b = bc.negotiated, bc.b
		answered := bc.answered
		bc.mu.Unlock()
		if negotiated || !answered || wait == 50 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !negotiated || b == nil {
		respond(tx, req, sip.StatusRequestPending, "Request Pending")
		return
	}
	if !bc.reoffer.TryLock() {
		respond(tx, req, sip.StatusRequestPending, "Request Pending")
		return
	}
	defer bc.reoffer.Unlock()
	var err error
	if from == call.A {
		err = bc.a.ReadRequest(req, tx)
	} else {
		err = b.ReadRequest(req, tx)
	}
	if err != nil {
		respond(tx, req, sip.StatusInternalServerError, "CSeq Out Of Order")
		return
	}
	if len(req.Body()) > 0 {
		if ct := req.ContentType(); ct == nil || ct.Value() != "application/sdp" {
			respond(tx, req, sip.StatusUnsupportedMediaType, "Unsupported Media Type", sip.NewHeader("Accept", "application/sdp"))
			return
		}
	}
	if req.IsInvite() {
		respond(tx, req, sip.StatusTrying, "Trying")
	}
	if len(req.Body()) == 0 {
		bc.offerlessReinvite(from, req, tx)
		return
	}
	d, err := sdp.Parse(req.Body())
	if err == nil {
		err = d.Usable()
	}
	if err != nil {
		code, reason := sip.StatusNotAcceptableHere, "Not Acceptable Here"
		if errors.Is(err, sdp.ErrMalformed) {
			code, reason = sip.StatusBadRequest, "Malformed SDP"
		}
		respond(tx, req, code, reason)
		return
	}
	saved := bc.c.Media.Streams()
	restore := func() {
		for _, st := range saved {
			bc.c.Media.Edit(st.Index, func(ms *call.Stream) { *ms = st })
		}
		if err := bc.c.Media.Sync(); err != nil {
			bc.log.Warn("restore media after a refused re-offer", zap.Error(err))
		}
	}
	body, err := bc.relayOffer(from, d, false)
	if err != nil {
		restore()
		r := refusal(err)
		respond(tx, req, r.code, r.reason)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), reofferTimeout)
	defer cancel()
	res, err := bc.sendReoffer(ctx, from.Other(), req.Method, body)
	if err != nil {
		restore()
		var rf errReofferFailed
		if errors.As(err, &rf) {
			respond(tx, req, rf.code, rf.reason)
		} else {
			bc.log.Info("re-offer", zap.Error(err))
			respond(tx, req, sip.StatusServiceUnavailable, "Service Unavailable")
		}
		return
	}
	ans, err := sdp.Parse(res.Body())
	var answer []byte
	if err == nil {
		answer, err = bc.relayAnswer(from.Other(), ans)
	}
	if err != nil {
		bc.log.Info("re-offer answer not usable", zap.Error(err))
		restore()
		respond(tx, req, sip.StatusNotAcceptableHere, "Not Acceptable Here")
		return
	}
	bc.mu.Lock()
	bc.pending, bc.negs = nil, nil
	bc.mu.Unlock()
	bc.respond2xx(from, req, tx, answer)
}

// sendReoffer sends a re-INVITE or UPDATE with body to a leg, ACKs a 2xx
// of an INVITE and returns the 2xx. A final failure is errReofferFailed.
func (bc *b2bCall) sendReoffer(ctx context.Context, to call.Side, method sip.RequestMethod, body []byte) (*sip.Response, error) {
	bc.mu.Lock()
	b := bc.b
	bc.mu.Unlock()
	var target sip.Uri
	if to == call.B {
		target = ackTarget(b)
	} else {
		target = *bc.a.InviteRequest.Contact().Address.Clone()
	}
	r := sip.NewRequest(method, target)
	r.SetBody(body)
	if body != nil {
		r.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	}
	var res *sip.Response
	var err error
	if to == call.B {
		res, err = b.Do(ctx, r)
	} else {
		res, err = bc.a.Do(ctx, r)
	}
	if err != nil {
		return nil, err
	}
	if !res.IsSuccess() {
		return nil, errReofferFailed{res.StatusCode, res.Reason}
	}
	if method == sip.INVITE {
		ack := sip.NewRequest(sip.ACK, target)
		if to == call.B {
			err = b.WriteRequest(ack)
		} else {
			err = bc.a.WriteRequest(ack)
		}
		if err != nil {
			bc.log.Warn("ACK of re-INVITE", zap.Error(err))
		}
	}
	return res, nil
}

// respond2xx answers a re-offer with SDP; for an INVITE from A over an
// unreliable transport the 2xx is retransmitted until the ACK arrives
// (RFC 3261 13.3.1.4).
func (bc *b2bCall) respond2xx(from call.Side, req *sip.Request, tx sip.ServerTransaction, body []byte) {
	res := sip.NewResponseFromRequest(req, sip.StatusOK, "OK", body)
	res.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	contact := bc.aUA.ContactHDR
	res.AppendHeader(&contact)
	select {
	case <-bc.reAck:
	default:
	}
	if err := tx.Respond(res); err != nil {
		bc.log.Debug("2xx to re-offer", zap.Error(err))
		return
	}
	if !req.IsInvite() || sip.IsReliable(req.Transport()) || from != call.A {
		return
	}
	interval := sip.T1
	deadline := time.After(64 * sip.T1)
	for {
		select {
		case <-bc.reAck:
			return
		case <-deadline:
			return
		case <-bc.c.Context().Done():
			return
		case <-time.After(interval):
			tx.Respond(res)
			interval = min(2*interval, sip.T2)
		}
	}
}

// offerlessReinvite answers a re-INVITE without SDP with relayd's current
// SDP toward that leg; the answer in the ACK updates the leg's addresses.
func (bc *b2bCall) offerlessReinvite(from call.Side, req *sip.Request, tx sip.ServerTransaction) {
	if !req.IsInvite() {
		respond(tx, req, sip.StatusOK, "OK")
		return
	}
	bc.mu.Lock()
	body := bc.lastSent[from]
	bc.mu.Unlock()
	select {
	case <-bc.ackBody:
	default:
	}
	bc.respond2xx(from, req, tx, body)
	if from != call.A {
		return
	}
	var ackSDP []byte
	select {
	case ackSDP = <-bc.ackBody:
	case <-time.After(64 * sip.T1):
	case <-bc.c.Context().Done():
	}
	d, err := sdp.Parse(ackSDP)
	if err != nil {
		return
	}
	for i := range d.Streams {
		st := &d.Streams[i]
		if st.Enabled() {
			bc.c.Media.Edit(i, func(ms *call.Stream) { ms.Ends[from].RTP, ms.Ends[from].RTCP = st.RTP(), st.RTCP() })
		}
	}
	if err := bc.c.Media.Sync(); err != nil {
		bc.log.Warn("media after an offerless re-INVITE", zap.Error(err))
	}
}
