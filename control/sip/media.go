package sip

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/sdp"
)

// relayOffer takes an offer from one leg and hands it to the call's
// negotiation (call.Session) with the route's policy: toward the callee
// its SRTP policy, codecs and the codecs it transcodes to; toward the
// caller (late offer, re-offers from the callee) keys pass as they come
// and only the codec the caller uses now is added when the stream is
// transcoded. It returns the SDP to offer
// the other leg. With install set, the flows toward the offerer go in at
// once (early media from the answerer); otherwise they wait for the
// answer.
func (bc *b2bCall) relayOffer(from call.Side, d *sdp.Description, install bool) ([]byte, error) {
	bc.mu.Lock()
	rt := bc.rt
	bc.mu.Unlock()
	opts := call.OfferOptions{
		SRTPTermination: bc.s.cfg.Calls.CanSRTP(),
		Transcoding:     bc.s.cfg.Calls.CanTranscode(),
		Codecs:          call.CodecPolicy{Allowed: rt.Codecs},
		Install:         install,
	}
	if from == call.A {
		opts.SRTP = rt.SRTP
		opts.Codecs.Transcode = rt.Transcode
	}
	return bc.neg.Offer(from, d, opts)
}

// relayAnswer takes the answer from one leg to the pending offer, learns
// its addresses and keys, installs or updates the flows and returns the
// SDP to answer the offerer with.
func (bc *b2bCall) relayAnswer(from call.Side, d *sdp.Description) ([]byte, error) {
	return bc.neg.Answer(from, d, call.AnswerOptions{})
}

// setRelay sets relayd's media address on a leg, for signalling (the
// dialog's local address family) and for the negotiation.
func (bc *b2bCall) setRelay(side call.Side, l call.Local) {
	bc.relay[side] = l.Addr
	bc.neg.SetLocal(side, l)
}

// replace moves a leg's media to the other family of its interface when
// a re-offer's media is of that family (an IPv4 call resumed over IPv6):
// the flows follow with the negotiation. When the interface has no
// address of that family, the leg stays and the negotiation refuses the
// offer.
func (bc *b2bCall) replace(side call.Side, d *sdp.Description) {
	cur := bc.neg.Local(side)
	peer := mediaPeer(d, netip.Addr{})
	if !peer.IsValid() || !cur.Addr.IsValid() || (peer.Is6() && !peer.Is4In6()) == cur.Addr.Is6() {
		return
	}
	bc.mu.Lock()
	iface := bc.rt.CallerInterface
	if side == call.B {
		iface = bc.rt.CalleeInterface
	}
	bc.mu.Unlock()
	if l := bc.local(iface, peer); l.Addr.Is6() != cur.Addr.Is6() {
		bc.setRelay(side, l)
	}
}

// local returns where a leg's media sits: on the named media interface
// (the route's caller_interface or callee_interface; "" the default), of
// the peer's family when it has one. An unknown name (a route server's
// answer) falls back to the default interface.
func (bc *b2bCall) local(iface string, peer netip.Addr) call.Local {
	l, err := bc.s.cfg.Calls.Local(iface, peer)
	if err != nil {
		bc.log.Warn("media interface", zap.Error(err))
		l, _ = bc.s.cfg.Calls.Local("", peer)
	}
	return l
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
	for wait := 0; ; wait++ {
		bc.mu.Lock()
		negotiated = bc.negotiated
		answered := bc.answered
		bc.mu.Unlock()
		if negotiated || !answered || wait == 50 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !negotiated {
		respond(tx, req, sip.StatusRequestPending, "Request Pending")
		return
	}
	// The dialogs stay as they are (not compacted) until the re-offer
	// is over.
	a, b, used, err := bc.dialogs()
	defer used()
	if err != nil {
		bc.log.Error("re-offer", zap.Error(err))
		respond(tx, req, sip.StatusInternalServerError, "Server Internal Error")
		return
	}
	if b == nil {
		respond(tx, req, sip.StatusRequestPending, "Request Pending")
		return
	}
	if !bc.reoffer.TryLock() {
		respond(tx, req, sip.StatusRequestPending, "Request Pending")
		return
	}
	defer bc.reoffer.Unlock()
	if from == call.A {
		err = a.ReadRequest(req, tx)
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
		if errors.Is(err, sdp.ErrMalformed) {
			respond(tx, req, sip.StatusBadRequest, "Malformed SDP")
		} else {
			respond(tx, req, sip.StatusNotAcceptableHere, "Not Acceptable Here", warning(err))
		}
		return
	}
	if t, exposed := bc.sdesExposed(from, req.Body()); exposed {
		r := sdesRefusal(from, t)
		respond(tx, req, r.code, r.reason, r.headers...)
		return
	}
	saved := bc.c.Media.Streams()
	savedLocal := bc.neg.Local(from)
	restore := func() {
		bc.setRelay(from, savedLocal)
		for _, st := range saved {
			bc.c.Media.Edit(st.Index, func(ms *call.Stream) { *ms = st })
		}
		if err := bc.c.Media.Sync(); err != nil {
			bc.log.Warn("restore media after a refused re-offer", zap.Error(err))
		}
	}
	bc.replace(from, d)
	body, err := bc.relayOffer(from, d, false)
	if err != nil {
		restore()
		r := refusal(err)
		respond(tx, req, r.code, r.reason, r.headers...)
		return
	}
	if t, exposed := bc.sdesExposed(from.Other(), body); exposed {
		restore()
		r := sdesRefusal(from.Other(), t)
		respond(tx, req, r.code, r.reason, r.headers...)
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
		respond(tx, req, sip.StatusNotAcceptableHere, "Not Acceptable Here", warning(err))
		return
	}
	bc.neg.Complete()
	bc.respond2xx(from, req, tx, answer)
}

// sendReoffer sends a re-INVITE or UPDATE with body to a leg, ACKs a 2xx
// of an INVITE and returns the 2xx. A final failure is errReofferFailed.
// The caller holds the dialogs (dialogs).
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
	acked := bc.ackCount()
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
		case <-bc.ackAfter(acked):
			return
		case <-deadline:
			return
		case <-bc.c.Done():
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
	body := bc.neg.LastSent(from)
	bc.takeAckBody() // an earlier ACK's
	acked := bc.ackCount()
	bc.respond2xx(from, req, tx, body)
	if from != call.A {
		return
	}
	select {
	case <-bc.ackAfter(acked):
	case <-time.After(64 * sip.T1):
	case <-bc.c.Done():
	}
	d, err := sdp.Parse(bc.takeAckBody())
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
