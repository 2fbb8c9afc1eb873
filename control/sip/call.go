package sip

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/route"
	"github.com/relayd/relayd/control/sdp"
)

// Timeouts of the B2BUA's own requests.
const (
	byeTimeout     = 5 * time.Second
	reofferTimeout = 32 * time.Second
	// ringTimeout bounds an attempt that got a provisional response but
	// no final one (RFC 3261 Timer C, at its minimum).
	ringTimeout = 3 * time.Minute
)

// noRoute is the route of a call not routed yet.
var noRoute route.Route

var (
	errCallerCanceled = errors.New("caller canceled")
	errNoFinalAnswer  = errors.New("no final answer")
)

// b2bCall is one call through the B2BUA.
type b2bCall struct {
	// persistMu makes each record's snapshot and write one step: two
	// writers racing (the answer's, the shutdown's) could otherwise
	// leave the older snapshot in the store.
	persistMu sync.Mutex

	s     *Server
	c     *call.Call
	log   callLog
	start time.Time
	// a is leg A's dialog (relayd is UAS). It, b and aRes are nil while
	// the call is compacted (held set): once the call is up, use them
	// through dialogs (held.go).
	a     *sipgo.DialogServerSession
	aUA   *sipgo.DialogUA
	aTx   sip.ServerTransaction // the INVITE's
	relay [2]netip.Addr         // relay media address per leg (set with setRelay)
	// authUser is the digest user the caller authenticated as, if any.
	authUser string
	// neg is the offer/answer state of the call's media: relayd's o=
	// line and last SDP per leg, the pending offer.
	neg *call.Session

	// aID and bID are the dialog IDs; written under s.mu.
	aID, bID string

	// dlgMu orders what uses the dialogs' INVITE transactions once the
	// call is up (the BYEs: read, shared) before releaseTxs (write),
	// which swaps the ended transactions out of them.
	dlgMu sync.RWMutex

	setupCancel context.CancelCauseFunc // ends the setup early (terminate before answer)
	reoffer     sync.Mutex              // one re-INVITE/UPDATE at a time

	mu sync.Mutex // guards the following
	b  *sipgo.DialogClientSession
	// rt is the call's route (route.Decision.Shared: the table's own,
	// not a copy per call); noRoute until routed.
	rt       *route.Route
	answered bool
	// negotiated: the initial offer/answer is complete (both ACKs done).
	// Re-offers before it get 491 (RFC 3261 14.1).
	negotiated bool
	earlySDP   *sdp.Description // SDP of the last 18x from B, for a 200 without one
	maxTimer   *time.Timer
	aRes       *sip.Response // the 2xx relayd sent A, once answered
	savedRev   uint64        // the media revision last persisted
	savedAt    time.Time     // when
	savedSum   uint64        // recordDigest of the record last persisted; 0 before
	// savedDialogs is the digest (dialogsDigest) of the dialogs last
	// persisted; 0 before.
	savedDialogs uint64
	restored     bool // taken back from the store after a restart
	detached     bool // kept up for the next run: this one lets go of it
	released     bool // the INVITE transactions were let go (releaseTxs)
	// compacted: the dialogs are held's text (compact); a, b and aRes
	// are nil. held is part of the call's own allocation, not an object
	// of its own: made when the setup's pages have emptied, such an
	// object still landed among them and kept one in use per call.
	compacted bool
	held      heldDialogs
	users     int // callers of dialogs not done: no compaction
	// The ACKs from A (onAck), for the late offer's answer, the end of
	// a 2xx's retransmissions and an offerless re-INVITE's answer: acks
	// counts them, ackBody is the body of the last that had one until
	// taken (takeAckBody), and ackWake, made by a waiter (ackAfter), is
	// closed by the next. No channel of each call's own: two channels
	// per call, made among the setup's garbage, kept a page of it in
	// use each for as long as the call lasted.
	acks    uint64
	ackBody []byte
	ackWake chan struct{}
}

func (s *Server) setDialog(bc *b2bCall, side call.Side, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byCall[bc.c.ID] = bc
	id = bc.c.Keep(id) // the map's key too
	if side == call.A {
		bc.aID = id
	} else {
		if bc.bID != "" {
			delete(s.byDialog, bc.bID)
		}
		bc.bID = id
	}
	s.byDialog[id] = bc
}

func (s *Server) dialogUA(transport string, peer netip.Addr) *sipgo.DialogUA {
	t := strings.ToLower(transport)
	if d, ok := s.dialogs[t+family(peer)]; ok {
		return d
	}
	for _, fam := range []string{"4", "6"} {
		if d, ok := s.dialogs[t+fam]; ok {
			return d
		}
	}
	for _, d := range s.dialogs {
		return d
	}
	return nil
}

// newCall handles an INVITE outside a dialog: it blocks until the call
// is answered (and ACKed) or has failed.
func (s *Server) newCall(req *sip.Request, tx sip.ServerTransaction) {
	src := sourceOf(req)
	if !s.checkInvite(req, tx, src) {
		return
	}
	authUser, ok := s.admit(req, tx, src)
	if !ok {
		return
	}
	var offer *sdp.Description
	if len(req.Body()) > 0 {
		var err error
		offer, err = sdp.Parse(req.Body())
		if err == nil {
			err = offer.Usable()
		}
		switch {
		case errors.Is(err, sdp.ErrMalformed):
			s.log.Debug("INVITE with bad SDP", zap.Stringer("source", src), zap.Error(err))
			respond(tx, req, sip.StatusBadRequest, "Malformed SDP")
			return
		case err != nil:
			s.log.Debug("INVITE with SDP relayd cannot relay", zap.Stringer("source", src), zap.Error(err))
			respond(tx, req, sip.StatusNotAcceptableHere, "Not Acceptable Here", warning(err))
			return
		}
	}
	from, to := "", ""
	if h := req.From(); h != nil {
		from = h.Address.String()
	}
	if h := req.To(); h != nil {
		to = h.Address.String()
	}
	// The session limit is shared with the other front ends (ng).
	c, err := s.cfg.Calls.TryNew(src, from, to)
	if err != nil {
		respond(tx, req, sip.StatusServiceUnavailable, "Too Many Calls", s.retryAfter())
		return
	}
	aUA := s.dialogUA(req.Transport(), src.Addr())
	dlg, err := aUA.ReadInvite(req, tx)
	if err != nil {
		s.cfg.Calls.Remove(c)
		c.End(call.Rejected, sip.StatusBadRequest, "Bad Request")
		respond(tx, req, sip.StatusBadRequest, "Bad Request")
		return
	}
	s.metrics.callStarted()
	bc := &b2bCall{
		s:     s,
		c:     c,
		start: time.Now(),
		a:     dlg,
		aUA:   aUA,
		aTx:   tx,
		neg:   call.NewSession(c.Media, [2]call.Local{}),
		rt:    &noRoute,
	}
	fromTag, _ := req.From().Params.Get("tag")
	c.SetLeg(call.A, call.Leg{CallID: req.CallID().Value(), FromTag: fromTag, Remote: src.String(), Transport: req.Transport()})
	bc.log = s.newCallLog(c.ID, c.Leg(call.A).CallID) // the call's own copy: not the parsed header's
	bc.authUser = authUser
	bc.setRelay(call.A, bc.local("", mediaPeer(offer, src.Addr())))
	bc.setRelay(call.B, bc.local("", src.Addr()))
	s.setDialog(bc, call.A, dlg.ID)
	if err := dlg.Respond(sip.StatusTrying, "Trying", nil); err != nil {
		bc.log.Debug("100 Trying", zap.Error(err))
	}
	bc.log.Debug("call", zap.Stringer("source", src), zap.String("from", from), zap.String("to", to),
		zap.String("call_id", req.CallID().Value()), zap.Bool("late_offer", offer == nil))
	bc.setup(req, offer)
}

// setup routes the call and tries its destinations until one answers.
func (bc *b2bCall) setup(req *sip.Request, offer *sdp.Description) {
	s := bc.s
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	bc.mu.Lock()
	bc.setupCancel = cancel
	bc.mu.Unlock()
	// An answered call outlives its setup: it keeps neither the setup's
	// context nor the map of children (the attempts) it grew, which a
	// map never gives back.
	defer func() {
		bc.mu.Lock()
		bc.setupCancel = nil
		bc.mu.Unlock()
	}()
	// The caller's dialog ends (CANCEL, the INVITE transaction gone):
	// the setup stops. A state callback rather than context.AfterFunc on
	// the dialog's context, which would give that context a done channel
	// and a map of children for the call's lifetime; once the setup is
	// over the callback finds nothing to cancel, and releaseTxs drops it.
	bc.a.OnState(func(st sip.DialogState) {
		if st == sip.DialogStateEnded {
			bc.cancelSetup(errCallerCanceled)
		}
	})
	if bc.a.LoadState() == sip.DialogStateEnded {
		cancel(errCallerCanceled)
	}

	facts := route.Facts{CallID: req.CallID().Value(), From: bc.c.From, To: bc.c.To, User: req.Recipient.User, Source: bc.c.Source.String(),
		AuthUser: bc.authUser}
	dec, err := s.cfg.Router.Lookup(ctx, facts)
	var rej *route.Rejected
	switch {
	case err != nil && context.Cause(ctx) != nil:
		bc.setupEnded(context.Cause(ctx)) // canceled while the route server thought
		return
	case errors.As(err, &rej):
		bc.fail(call.Rejected, rej.Code, rej.Reason)
		return
	case errors.Is(err, route.ErrNoRoute):
		bc.fail(call.Rejected, sip.StatusNotFound, "Not Found")
		return
	case errors.Is(err, route.ErrForbidden), errors.Is(err, route.ErrAuthRequired):
		// admit let it through; a reload since then did not.
		bc.fail(call.Rejected, sip.StatusForbidden, "Forbidden")
		return
	case err != nil:
		bc.log.Warn("routing", zap.Error(err))
		bc.fail(call.Rejected, sip.StatusServiceUnavailable, "Routing Unavailable", s.retryAfter())
		return
	}
	bc.mu.Lock()
	bc.rt = dec.Shared() // the destinations are the setup's alone
	bc.mu.Unlock()
	bc.c.SetRoute(dec.Route.Name)
	bc.setRelay(call.A, bc.local(dec.Route.CallerInterface, mediaPeer(offer, bc.c.Source.Addr())))
	bc.setRelay(call.B, bc.local(dec.Route.CalleeInterface, bc.c.Source.Addr()))
	if t, exposed := bc.sdesExposed(call.A, req.Body()); exposed {
		// The offer's keys crossed already; the answer's need not.
		r := sdesRefusal(call.A, t)
		bc.log.limited(s.loglim, zap.InfoLevel, bc.c.Source.Addr(), "call refused: SDES over a plain transport",
			zap.String("leg", "caller"), zap.String("transport", t))
		bc.fail(r.disposition, r.code, r.reason, r.headers...)
		return
	}

	code, reason := sip.StatusRequestTimeout, "Request Timeout"
	for _, dest := range dec.Destinations {
		if cause := context.Cause(ctx); cause != nil {
			bc.setupEnded(cause)
			return
		}
		res := bc.attempt(ctx, req, dest, offer)
		switch {
		case res.answered:
			return
		case res.final:
			// relayd refused the call itself (SDP, ports): no failover.
			var hdrs []sip.Header
			if res.retry {
				hdrs = append(hdrs, s.retryAfter())
			}
			hdrs = append(hdrs, res.headers...)
			bc.fail(res.disposition, res.code, res.reason, hdrs...)
			return
		case res.canceled:
			bc.setupEnded(context.Cause(ctx))
			return
		}
		if res.code != 0 {
			code, reason = res.code, res.reason
			if !dec.Route.Fails(res.code) {
				break
			}
		} else {
			code, reason = sip.StatusRequestTimeout, "Request Timeout"
		}
	}
	if cause := context.Cause(ctx); cause != nil {
		bc.setupEnded(cause)
		return
	}
	if code == sip.StatusServiceUnavailable {
		bc.fail(call.Failed, code, reason, s.retryAfter())
		return
	}
	bc.fail(call.Failed, code, reason)
}

// cancelSetup ends the setup, if one is running, with cause.
func (bc *b2bCall) cancelSetup(cause error) {
	bc.mu.Lock()
	cancel := bc.setupCancel
	bc.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
}

// setupEnded ends a call whose setup was cut short.
func (bc *b2bCall) setupEnded(cause error) {
	switch {
	case errors.Is(cause, errCallerCanceled):
		// The transaction layer answered the CANCEL and the INVITE (487).
		bc.finish(call.Canceled, sip.StatusRequestTerminated, "caller canceled")
	default:
		d := call.Shutdown
		var te terminateCause
		if errors.As(cause, &te) {
			d = te.d
		}
		bc.fail(d, sip.StatusServiceUnavailable, "Service Unavailable", bc.s.retryAfter())
	}
}

type terminateCause struct{ d call.Disposition }

func (t terminateCause) Error() string { return "terminated: " + string(t.d) }

// fail answers A with a final failure and ends the call.
func (bc *b2bCall) fail(d call.Disposition, code int, reason string, headers ...sip.Header) {
	if code < 300 {
		code, reason = sip.StatusInternalServerError, "Server Internal Error"
	}
	// Straight to the transaction: it retransmits and absorbs the ACK by
	// itself, the call need not wait for it.
	res := sip.NewResponseFromRequest(bc.a.InviteRequest, code, reason, nil)
	for _, h := range headers {
		res.AppendHeader(h)
	}
	if err := bc.aTx.Respond(res); err != nil {
		bc.log.Debug("final response to caller", zap.Int("code", code), zap.Error(err))
	}
	bc.finish(d, code, reason)
}

// finish ends the call once: flows removed, CDR handed on, dialogs
// forgotten.
func (bc *b2bCall) finish(d call.Disposition, code int, reason string) {
	bc.mu.Lock()
	if bc.detached {
		bc.mu.Unlock()
		return // the next run has it
	}
	answered := bc.answered
	if bc.maxTimer != nil {
		bc.maxTimer.Stop()
	}
	bc.mu.Unlock()
	if !bc.c.End(d, code, reason) {
		return
	}
	s := bc.s
	s.unregister(bc)
	s.cfg.Calls.Remove(bc.c)
	if answered {
		bc.forget()
	}
	bc.dropDialogs()
	s.metrics.callEnded(d, answered)
	info := bc.c.Info()
	// A stranger can have any number of calls refused: those lines are
	// rate-limited by source (their CDRs are not).
	if answered || s.loglim.Allow(bc.c.Source.Addr(), "call ended") {
		bc.log.Info("call ended", zap.String("disposition", string(d)), zap.Int("code", code), zap.String("reason", reason),
			zap.Int("attempts", len(info.Attempts)), zap.Float64("duration_s", info.DurationS),
			zap.Uint64("packets_a", info.Media[call.A].Packets), zap.Uint64("packets_b", info.Media[call.B].Packets))
	}
	if s.cfg.OnEnd != nil {
		s.cfg.OnEnd(info)
	}
}

type attemptResult struct {
	answered    bool
	canceled    bool // the caller canceled, or relayd ended the call
	final       bool // relayd refuses the call: answer A with code, no failover
	disposition call.Disposition
	code        int
	reason      string
	retry       bool         // add Retry-After
	headers     []sip.Header // more headers of the final response
}

// attempt tries one destination.
func (bc *b2bCall) attempt(ctx context.Context, req *sip.Request, dest route.Destination, offer *sdp.Description) attemptResult {
	s := bc.s
	start := time.Now()
	rec := call.Attempt{Destination: dest.URI, Start: start, FirstResponseMS: -1}
	record := func(result string, code int) {
		rec.Result, rec.Code = result, code
		rec.DurationMS = float64(time.Since(start).Microseconds()) / 1000
		bc.c.AddAttempt(rec)
		s.metrics.attempt(code)
	}
	if s.self[dest.HostPort()] {
		record("failed", sip.StatusLoopDetected)
		return attemptResult{code: sip.StatusLoopDetected, reason: "Loop Detected"}
	}
	if ip, err := netip.ParseAddr(dest.Host); err == nil {
		bc.setRelay(call.B, bc.local(bc.rt.CalleeInterface, ip))
		s.peers.allow(ip) // route server destinations too
	}
	var body []byte
	if offer != nil {
		var err error
		body, err = bc.relayOffer(call.A, offer, true)
		if err != nil {
			res := refusal(err)
			bc.log.limited(s.loglim, zap.InfoLevel, bc.c.Source.Addr(), "call refused", zap.Int("code", res.code), zap.Error(err))
			return res
		}
		if bc.rt.SDESTLSOnly && dest.Transport != "tls" && sdesIn(body) {
			bc.log.Info("call refused: SDES over a plain transport", zap.String("leg", "callee"), zap.String("destination", dest.URI))
			return sdesRefusal(call.B, dest.Transport)
		}
	}
	inv := bc.outgoingInvite(req, dest, body)
	bUA := s.dialogUA(dest.Transport, bc.relay[call.B])
	actx, acancel := context.WithCancelCause(context.Background())
	defer acancel(nil)
	var gotResponse atomic.Bool
	stop := context.AfterFunc(ctx, func() {
		if gotResponse.Load() {
			acancel(errCallerCanceled) // WaitAnswer sends CANCEL
		} else {
			acancel(sipgo.WaitAnswerForceCancelErr) // nothing to CANCEL yet
		}
	})
	defer stop()
	// One timer for both bounds: no response within the attempt timeout,
	// no final response within ringTimeout.
	var bound *time.Timer
	bound = time.AfterFunc(min(bc.rt.AttemptTimeout, ringTimeout), func() {
		switch elapsed := time.Since(start); {
		case elapsed >= ringTimeout:
			acancel(errNoFinalAnswer)
		case !gotResponse.Load():
			acancel(sipgo.WaitAnswerForceCancelErr)
		default:
			bound.Reset(ringTimeout - elapsed)
		}
	})
	defer bound.Stop()

	dlgB, err := bUA.WriteInvite(actx, inv)
	if err != nil {
		bc.log.Info("attempt", zap.String("destination", dest.URI), zap.Error(err))
		record("error", 0)
		return attemptResult{}
	}
	defer func() {
		if !bc.isB(dlgB) {
			dlgB.Close()
		}
	}()
	if v := inv.Via(); v != nil {
		if b, ok := v.Params.Get("branch"); ok {
			s.loops.add(b)
		}
	}
	if cid := inv.CallID(); cid != nil {
		tag, _ := inv.From().Params.Get("tag")
		bc.c.SetLeg(call.B, call.Leg{CallID: cid.Value(), FromTag: tag, Remote: dest.HostPort(), Transport: dest.Transport})
	}
	err = dlgB.WaitAnswer(actx, sipgo.AnswerOptions{OnResponse: func(r *sip.Response) error {
		if !gotResponse.Swap(true) {
			rec.FirstResponseMS = float64(time.Since(start).Microseconds()) / 1000
		}
		if r.StatusCode > 100 && r.StatusCode < 200 {
			bc.relayProvisional(r, offer != nil)
		}
		return nil
	}})
	var dr *sipgo.ErrDialogResponse
	switch {
	case err == nil:
	case errors.As(err, &dr):
		record("failed", dr.Res.StatusCode)
		bc.log.Debug("attempt failed", zap.String("destination", dest.URI), zap.Int("code", dr.Res.StatusCode))
		return attemptResult{code: dr.Res.StatusCode, reason: dr.Res.Reason}
	case ctx.Err() != nil:
		record("canceled", 0)
		return attemptResult{canceled: true}
	case errors.Is(context.Cause(actx), sipgo.WaitAnswerForceCancelErr):
		record("timeout", 0)
		bc.log.Info("attempt timed out", zap.String("destination", dest.URI), zap.Duration("after", time.Since(start)))
		return attemptResult{}
	default:
		record("error", 0)
		bc.log.Info("attempt", zap.String("destination", dest.URI), zap.Error(err))
		return attemptResult{}
	}
	record("answered", dlgB.InviteResponse.StatusCode)
	bc.mu.Lock()
	bc.b = dlgB
	bc.mu.Unlock()
	s.setDialog(bc, call.B, dlgB.ID)
	if tag, ok := dlgB.InviteResponse.To().Params.Get("tag"); ok {
		l := bc.c.Leg(call.B)
		l.ToTag = tag
		bc.c.SetLeg(call.B, l)
	}
	bc.answer(ctx, offer, dlgB)
	return attemptResult{answered: true}
}

func (bc *b2bCall) isB(d *sipgo.DialogClientSession) bool {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return bc.b == d
}

// refusal maps an error of relayOffer to the answer A gets.
func refusal(err error) attemptResult {
	switch {
	case errors.Is(err, call.ErrNoPorts):
		return attemptResult{final: true, disposition: call.Rejected, code: sip.StatusServiceUnavailable, reason: "Media Ports Exhausted", retry: true}
	case call.Reason(err) != "":
		// An offer relayd cannot honour as it is: refused, never relayed
		// in a form the peers did not ask for.
		return attemptResult{final: true, disposition: call.Rejected, code: sip.StatusNotAcceptableHere, reason: "Not Acceptable Here",
			headers: []sip.Header{warning(err)}}
	case errors.Is(err, sdp.ErrMalformed):
		return attemptResult{final: true, disposition: call.Rejected, code: sip.StatusBadRequest, reason: "Malformed SDP"}
	}
	return attemptResult{final: true, disposition: call.Rejected, code: sip.StatusInternalServerError, reason: "Server Internal Error"}
}

// warning is the Warning header of a 488 (RFC 3261 20.43): code 399, a
// miscellaneous warning for a person reading the trace, with
// call.Reason's words, or sdp.ErrNotAcceptable's when it has none.
func warning(err error) sip.Header {
	text := call.Reason(err)
	if text == "" {
		text = sdp.ErrNotAcceptable.Error()
	}
	return sip.NewHeader("Warning", `399 relayd "`+quoted(text)+`"`)
}

// quoted makes text the inside of a SIP quoted-string: printable ASCII,
// quotes and backslashes escaped, at most 160 bytes. Reasons may hold
// tokens of a peer's SDP.
func quoted(text string) string {
	var b strings.Builder
	for _, r := range text {
		if b.Len() >= 160 {
			b.WriteString("...")
			break
		}
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < ' ' || r > '~':
			b.WriteByte('?')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// mediaPeer returns the address of the offer's first stream, else
// signalled: a leg's media address is chosen in the family of the media,
// which need not be that of the signalling.
func mediaPeer(offer *sdp.Description, signalled netip.Addr) netip.Addr {
	if offer != nil {
		for i := range offer.Streams {
			if st := &offer.Streams[i]; st.Enabled() && st.Addr.IsValid() && !st.Addr.IsUnspecified() {
				return st.Addr
			}
		}
	}
	return signalled
}

// outgoingInvite builds leg B's INVITE: its own Call-ID, From tag and
// CSeq; the caller's From and To URIs; Max-Forwards one less.
func (bc *b2bCall) outgoingInvite(req *sip.Request, dest route.Destination, body []byte) *sip.Request {
	user := dest.User
	if user == "" {
		user = req.Recipient.User
	}
	uri := sip.Uri{Scheme: "sip", User: user, Host: dest.Host, Port: dest.Port}
	if dest.Transport != "udp" {
		uri.UriParams = sip.HeaderParams{{K: "transport", V: dest.Transport}}
	}
	inv := sip.NewRequest(sip.INVITE, uri)
	from := sip.FromHeader{DisplayName: req.From().DisplayName, Address: *req.From().Address.Clone()}
	from.Params.Add("tag", sip.GenerateTagN(16))
	inv.AppendHeader(&from)
	to := sip.ToHeader{DisplayName: req.To().DisplayName, Address: *req.To().Address.Clone()}
	inv.AppendHeader(&to)
	mf := sip.MaxForwardsHeader(70)
	if h := req.MaxForwards(); h != nil {
		mf = sip.MaxForwardsHeader(h.Val() - 1)
	}
	inv.AppendHeader(&mf)
	inv.AppendHeader(sip.NewHeader("User-Agent", bc.s.cfg.UserAgent))
	inv.AppendHeader(sip.NewHeader("Allow", allowed))
	if body != nil {
		inv.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	}
	inv.SetBody(body)
	inv.SetTransport(upperTransport(dest.Transport))
	inv.SetDestination(dest.HostPort())
	if dest.Transport == "udp" {
		if la, ok := bc.s.laddr[family(bc.relay[call.B])]; ok {
			inv.Laddr = la
		}
	}
	return inv
}

// relayProvisional relays a 18x from B to A; one with SDP anchors early
// media.
func (bc *b2bCall) relayProvisional(r *sip.Response, haveOffer bool) {
	var body []byte
	if len(r.Body()) > 0 && haveOffer {
		d, err := sdp.Parse(r.Body())
		if err == nil {
			body, err = bc.relayAnswer(call.B, d)
		}
		if err != nil {
			bc.log.Debug("early SDP ignored", zap.Int("code", r.StatusCode), zap.Error(err))
			body = nil
		} else {
			bc.mu.Lock()
			bc.earlySDP = d
			bc.mu.Unlock()
			bc.c.SetState(call.StateEarly)
		}
	}
	var headers []sip.Header
	if body != nil {
		headers = append(headers, sip.NewHeader("Content-Type", "application/sdp"))
	}
	if err := bc.a.Respond(r.StatusCode, r.Reason, body, headers...); err != nil {
		bc.log.Debug("relay provisional", zap.Int("code", r.StatusCode), zap.Error(err))
	}
}

// answer completes a call B answered: SDP both ways, ACK to B, 200 to A.
func (bc *b2bCall) answer(ctx context.Context, offer *sdp.Description, dlgB *sipgo.DialogClientSession) {
	res := dlgB.InviteResponse
	// An ACK goes out at once, on no transaction: nothing to wait for (a
	// deadline for it would cost a timer per call).
	ackCtx := context.Background()
	abandon := func(code int, reason string, err error, headers ...sip.Header) {
		bc.log.Info("answer not usable", zap.Int("code", code), zap.Error(err))
		dlgB.Ack(ackCtx)
		byeCtx, cancel := context.WithTimeout(context.Background(), byeTimeout)
		defer cancel()
		dlgB.Bye(byeCtx)
		bc.fail(call.Failed, code, reason, headers...)
	}
	var bodyA []byte
	var d *sdp.Description
	var err error
	if len(res.Body()) > 0 {
		d, err = sdp.Parse(res.Body())
		if err == nil {
			err = d.Usable()
		}
		if err != nil {
			abandon(sip.StatusBadGateway, "Bad Answer From Destination", err)
			return
		}
	}
	if offer != nil {
		if d == nil {
			bc.mu.Lock()
			d = bc.earlySDP
			bc.mu.Unlock()
		}
		if d == nil {
			abandon(sip.StatusBadGateway, "No Answer SDP From Destination", errors.New("200 without SDP"))
			return
		}
		if bodyA, err = bc.relayAnswer(call.B, d); err != nil {
			abandon(sip.StatusNotAcceptableHere, "Not Acceptable Here", err, warning(err))
			return
		}
		if err := dlgB.Ack(ackCtx); err != nil {
			bc.log.Warn("ACK to callee", zap.Error(err))
		}
	} else {
		// Late offer: B offers in its 200, A answers in its ACK.
		if d == nil {
			abandon(sip.StatusBadGateway, "No Offer From Destination", errors.New("late offer: 200 without SDP"))
			return
		}
		if bodyA, err = bc.relayOffer(call.B, d, false); err != nil {
			r := refusal(err)
			abandon(r.code, r.reason, err, r.headers...)
			return
		}
		// B's offer crossed leg B; relayd's to A and A's answer would
		// cross leg A.
		for _, leg := range []struct {
			side call.Side
			body []byte
		}{{call.B, res.Body()}, {call.A, bodyA}} {
			if t, exposed := bc.sdesExposed(leg.side, leg.body); exposed {
				r := sdesRefusal(leg.side, t)
				abandon(r.code, r.reason, errors.New("late offer: SDES over a plain transport"), r.headers...)
				return
			}
		}
	}
	ok := sip.NewResponseFromRequest(bc.a.InviteRequest, sip.StatusOK, "OK", bodyA)
	ok.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	ok.AppendHeader(sip.NewHeader("Allow", allowed))
	ok.AppendHeader(sip.NewHeader("Server", bc.s.cfg.UserAgent))
	// WriteResponse would add it; the stored 2xx must have it.
	contact := bc.aUA.ContactHDR
	ok.AppendHeader(&contact)
	bc.mu.Lock()
	bc.answered = true
	bc.aRes = ok
	bc.mu.Unlock()
	bc.c.SetState(call.StateAnswered)
	// The call is durable before the caller hears it answered: a kill -9
	// from here on loses no answered call (see docs/state.md).
	bc.persist()
	bc.s.metrics.setup.Observe(time.Since(bc.start).Seconds())
	if max := bc.s.cfg.MaxDuration; max > 0 {
		bc.mu.Lock()
		bc.maxTimer = time.AfterFunc(max, func() { bc.terminate(call.MaxDuration, 0, "maximum call duration") })
		bc.mu.Unlock()
	}
	if err := bc.a.WriteResponse(ok); err != nil {
		if bc.a.LoadState() == sip.DialogStateEnded || bc.c.State() == call.StateEnded || bc.isDetached() {
			return // the caller hung up before its ACK was seen
		}
		bc.log.Info("200 OK to caller not acknowledged", zap.Error(err))
		if offer != nil {
			bc.terminate(call.Failed, sip.StatusRequestTimeout, "no ACK from caller")
			return
		}
	}
	if offer == nil {
		// The ACK carries A's answer to B's offer.
		d, err := sdp.Parse(bc.takeAckBody())
		var bodyB []byte
		if err == nil {
			bodyB, err = bc.relayAnswer(call.A, d)
		}
		if err != nil {
			bc.log.Info("late offer: no usable answer in the caller's ACK", zap.Error(err))
			dlgB.Ack(ackCtx)
			bc.terminate(call.Failed, sip.StatusNotAcceptableHere, "no answer in ACK")
			return
		}
		ack := sip.NewRequest(sip.ACK, ackTarget(dlgB))
		ack.SetBody(bodyB)
		ack.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
		if err := dlgB.WriteAck(ackCtx, ack); err != nil {
			bc.log.Warn("ACK to callee", zap.Error(err))
		}
	}
	// The negotiation is over: keep no parsed SDP for the call's lifetime.
	bc.neg.Complete()
	bc.mu.Lock()
	bc.earlySDP = nil
	bc.negotiated = true
	bc.mu.Unlock()
	bc.persist()
	bc.log.Info("call answered", zap.Duration("setup", time.Since(bc.start)), zap.String("route", bc.rt.Name))
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, errCallerCanceled) {
		bc.terminate(call.Shutdown, 0, "relayd stopping")
	}
}

func ackTarget(d *sipgo.DialogClientSession) sip.Uri {
	if c := d.InviteResponse.Contact(); c != nil {
		return *c.Address.Clone()
	}
	return *d.InviteRequest.Recipient.Clone()
}

// terminate ends the call from relayd's side: BYE on both legs once
// answered, else the setup is cut short.
func (bc *b2bCall) terminate(d call.Disposition, code int, reason string) {
	bc.mu.Lock()
	answered, cancel, detached := bc.answered, bc.setupCancel, bc.detached
	bc.mu.Unlock()
	if detached {
		return
	}
	if !answered {
		if cancel != nil {
			cancel(terminateCause{d})
		}
		return
	}
	a, b, used, err := bc.dialogs()
	defer used()
	if err != nil {
		bc.log.Error("hang up without BYEs", zap.Error(err))
		bc.finish(d, code, reason)
		return
	}
	ctx, done := context.WithTimeout(context.Background(), byeTimeout)
	defer done()
	bc.dlgMu.RLock()
	defer bc.dlgMu.RUnlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := a.Bye(ctx); err != nil {
			bc.log.Debug("BYE to caller", zap.Error(err))
		}
	}()
	go func() {
		defer wg.Done()
		if b != nil {
			if err := b.Bye(ctx); err != nil {
				bc.log.Debug("BYE to callee", zap.Error(err))
			}
		}
	}()
	wg.Wait()
	bc.finish(d, code, reason)
}

func (bc *b2bCall) onAck(req *sip.Request) {
	// sipgo handles each request on a goroutine of its own, so a BYE
	// sent just after the ACK can be handled first; sipgo's ReadAck would
	// then take the ended dialog back to confirmed, and the answer would
	// take the caller's hang-up for a missing ACK.
	bc.mu.Lock()
	a := bc.a
	if a != nil && a.LoadState() == sip.DialogStateEnded {
		bc.mu.Unlock()
		return
	}
	bc.acks++
	if body := req.Body(); len(body) > 0 {
		bc.ackBody = body
	}
	if bc.ackWake != nil {
		close(bc.ackWake)
		bc.ackWake = nil
	}
	bc.mu.Unlock()
	if a != nil {
		// A compacted call's dialog is confirmed: a retransmitted ACK
		// has nothing to change in it.
		a.ReadAck(req, nil)
	}
}

// ackCount returns how many ACKs A has sent so far, for ackAfter.
func (bc *b2bCall) ackCount() uint64 {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return bc.acks
}

// ackAfter returns a channel that is closed once A has sent more than n
// ACKs (at once if it has).
func (bc *b2bCall) ackAfter(n uint64) <-chan struct{} {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	if bc.acks > n {
		return closedChan
	}
	if bc.ackWake == nil {
		bc.ackWake = make(chan struct{})
	}
	return bc.ackWake
}

// takeAckBody returns the body of the last ACK from A that had one, and
// forgets it.
func (bc *b2bCall) takeAckBody() []byte {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	b := bc.ackBody
	bc.ackBody = nil
	return b
}

func (bc *b2bCall) onBye(side call.Side, req *sip.Request, tx sip.ServerTransaction) {
	a, b, used, err := bc.dialogs()
	defer used()
	if err != nil {
		bc.log.Error("BYE", zap.Error(err))
		respond(tx, req, sip.StatusInternalServerError, "Server Internal Error")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), byeTimeout)
	defer cancel()
	bc.dlgMu.RLock()
	defer bc.dlgMu.RUnlock()
	if side == call.A {
		if err := a.ReadBye(req, tx); err != nil {
			respond(tx, req, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist")
			return
		}
		if b != nil {
			if err := b.Bye(ctx); err != nil {
				bc.log.Debug("BYE to callee", zap.Error(err))
			}
		}
		bc.finish(call.Answered, sip.StatusOK, "caller hung up")
		return
	}
	if b == nil {
		respond(tx, req, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist")
		return
	}
	if err := b.ReadBye(req, tx); err != nil {
		respond(tx, req, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist")
		return
	}
	if err := a.Bye(ctx); err != nil {
		bc.log.Debug("BYE to caller", zap.Error(err))
	}
	bc.finish(call.Answered, sip.StatusOK, "callee hung up")
}

// errReofferFailed carries the other leg's final code.
type errReofferFailed struct {
	code   int
	reason string
}

func (e errReofferFailed) Error() string { return fmt.Sprintf("%d %s", e.code, e.reason) }

// upperTransport is strings.ToUpper(t) without an allocation for a
// route's transports: sipgo keeps the INVITE's for as long as the dialog.
func upperTransport(t string) string {
	switch t {
	case "udp":
		return "UDP"
	case "tcp":
		return "TCP"
	case "tls":
		return "TLS"
	}
	return strings.ToUpper(t)
}
