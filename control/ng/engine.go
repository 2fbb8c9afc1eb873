package ng

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/rtp/emodel"
	"github.com/relayd/relayd/sdes"
)

// EngineConfig configures the ng Engine on relayd's call layer.
type EngineConfig struct {
	// Calls is the call table, shared with the SIP B2BUA: ng calls show
	// in /v1/calls and count toward its session limit.
	Calls *call.Table
	// MediaTimeout ends a call whose flows carried nothing for this
	// long (and an offer never answered, this long after its last
	// command). Default 60s.
	MediaTimeout time.Duration
	// SweepInterval is how often Run looks for such calls; default 5s.
	SweepInterval time.Duration
	// MaxLoad, when above zero, refuses new calls with "load limit"
	// while Load reports more (the 1-minute load average per CPU, as
	// rtpengine's max-load).
	MaxLoad float64
	Load    func() (float64, error)
	// OnEnd receives each call's final record (CDR); optional.
	OnEnd func(call.Info)
	// Store, when set, keeps answered calls across a restart: Close
	// leaves them up for the next run, whose Restore takes them back.
	Store Store
}

func (c *EngineConfig) validate() error {
	if c.Calls == nil {
		return errors.New("ng engine: no call table")
	}
	if c.MediaTimeout <= 0 {
		c.MediaTimeout = 60 * time.Second
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = 5 * time.Second
	}
	if c.MaxLoad > 0 && c.Load == nil {
		return errors.New("ng engine: max load without a load source")
	}
	return nil
}

// CallEngine is the Engine of relayd: ng's offer and answer anchor a
// call's media through the same call layer as the SIP B2BUA
// (call.Session): XDP for plain RTP, the userspace workers for SRTP,
// latching with the RTP Bleed guard, named media interfaces per leg.
// A call's leg A is the party that made the first offer (its from-tag),
// B the other. Create it with NewEngine; it is safe for concurrent use.
type CallEngine struct {
	cfg   EngineConfig
	log   *zap.Logger
	start time.Time
	now   func() time.Time

	mu    sync.Mutex // guards the following
	calls map[string]*ngCall
	stats engineStats
}

type engineStats struct {
	managed, rejected, timeouts, offerTimeouts, regular int64
	totalDuration                                       time.Duration
	answeredCalls                                       int64
}

// ngCall is one call of the ng protocol.
type ngCall struct {
	id string // the ng call-id
	c  *call.Call

	mu         sync.Mutex // guards the following (and serializes commands on the call)
	sess       *call.Session
	tags       [2]string
	labels     [2]string
	via        [2]string         // the via-branch of each side; the offer's names the callee's branch
	protos     [2]map[int]string // each side's transport protocol by m= line
	created    [2]time.Time
	lastSignal time.Time
	answers    [2]string // the last answer SDP from each side, for resent answers
	ifaces     [2]string
	savedRev   uint64 // the media revision last persisted
}

// setProtos records the transport protocol of each of d's m= lines for
// side s; override, when set, replaces them (transport-protocol toward s).
func (nc *ngCall) setProtos(s call.Side, d *sdp.Description, override string) {
	m := make(map[int]string, len(d.Streams))
	for _, st := range d.Streams {
		m[st.Index] = st.Proto
		if override != "" {
			m[st.Index] = override
		}
	}
	nc.protos[s] = m
}

// NewEngine returns the ng engine over the call table.
func NewEngine(cfg EngineConfig, log *zap.Logger) (*CallEngine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &CallEngine{cfg: cfg, log: log, start: time.Now(), now: time.Now, calls: make(map[string]*ngCall)}, nil
}

var _ Engine = (*CallEngine)(nil)

func (e *CallEngine) lookup(id string) *ngCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[id]
}

// side returns the side of a tag in the call, or -1.
func (nc *ngCall) side(tag string) call.Side {
	switch {
	case tag == "":
		return -1
	case tag == nc.tags[call.A]:
		return call.A
	case tag == nc.tags[call.B]:
		return call.B
	}
	return -1
}

// Offer implements Engine.
func (e *CallEngine) Offer(ctx context.Context, r *Request) (*Reply, error) {
	switch {
	case r.CallID == "":
		return nil, ErrNoCallID
	case r.FromTag == "":
		return nil, ErrNoFromTag
	case r.SDP == "":
		return nil, ErrNoSDP
	}
	d, err := parseSDP(r.SDP)
	if err != nil {
		return nil, err
	}
	opts, err := e.offerOptions(r, d)
	if err != nil {
		return nil, err
	}
	nc, fresh, err := e.callFor(r)
	if err != nil {
		return nil, err
	}
	nc.mu.Lock()
	defer nc.mu.Unlock()
	from := nc.side(r.FromTag)
	if from < 0 {
		if nc.tags[call.B] != "" {
			return nil, fmt.Errorf("%w: from-tag %q is neither party of the call", ErrDialogue, r.FromTag)
		}
		from = call.B
		nc.tags[call.B] = r.FromTag
		nc.created[call.B] = e.now()
	}
	to := from.Other()
	if r.ToTag != "" && nc.tags[to] == "" {
		nc.tags[to] = r.ToTag
		nc.created[to] = e.now()
	}
	if r.Label != "" {
		nc.labels[from] = r.Label
	}
	if r.ViaBranch != "" {
		// As rtpengine: the via-branch of an offer names the branch it
		// goes out on, the answerer's side.
		nc.via[to] = r.ViaBranch
	}
	nc.setProtos(from, d, "")
	nc.setProtos(to, d, r.TransportProtocol)
	if err := e.placeLegs(nc, r, d, from, fresh); err != nil {
		e.abandon(nc, fresh)
		return nil, err
	}
	body, err := nc.sess.Offer(from, d, opts)
	if err != nil {
		e.abandon(nc, fresh)
		return nil, engineError(err)
	}
	nc.lastSignal = e.now()
	nc.c.SetLeg(from, e.leg(nc, from, r))
	return &Reply{SDP: string(body)}, nil
}

// Answer implements Engine.
func (e *CallEngine) Answer(ctx context.Context, r *Request) (*Reply, error) {
	switch {
	case r.CallID == "":
		return nil, ErrNoCallID
	case r.FromTag == "":
		return nil, ErrNoFromTag
	case r.ToTag == "":
		return nil, ErrNoToTag
	case r.SDP == "":
		return nil, ErrNoSDP
	}
	nc := e.lookup(r.CallID)
	if nc == nil {
		return nil, ErrUnknownCall
	}
	d, err := parseSDP(r.SDP)
	if err != nil {
		return nil, err
	}
	nc.mu.Lock()
	defer nc.mu.Unlock()
	offerer := nc.side(r.FromTag)
	if offerer < 0 {
		return nil, fmt.Errorf("%w: from-tag %q did not offer", ErrDialogue, r.FromTag)
	}
	answerer := offerer.Other()
	switch nc.tags[answerer] {
	case "":
		nc.tags[answerer] = r.ToTag
		nc.created[answerer] = e.now()
	case r.ToTag:
	default:
		// Another branch of a forked call answers: relayd keeps one
		// answerer per call, the last one.
		e.log.Debug("answer from another to-tag", zap.String("call_id", r.CallID), zap.String("was", nc.tags[answerer]),
			zap.String("to_tag", r.ToTag))
		nc.tags[answerer] = r.ToTag
	}
	if r.Label != "" {
		nc.labels[answerer] = r.Label
	}
	if r.ViaBranch != "" {
		nc.via[answerer] = r.ViaBranch
	}
	nc.setProtos(answerer, d, "")
	if !nc.sess.Pending() {
		// The same answer again (a 200 retransmitted through the proxy):
		// the same SDP back.
		if nc.answers[answerer] == r.SDP {
			return &Reply{SDP: string(nc.sess.LastSent(offerer))}, nil
		}
		return nil, fmt.Errorf("%w: answer without an offer", ErrDialogue)
	}
	if r.MediaAddress != "" {
		l := nc.sess.Local(offerer)
		a, err := netip.ParseAddr(r.MediaAddress)
		if err != nil {
			return nil, fmt.Errorf("media-address %q: %w", r.MediaAddress, err)
		}
		l.Advertise = a
		nc.sess.SetLocal(offerer, l)
	}
	body, err := nc.sess.Answer(answerer, d, call.AnswerOptions{Latch: latchOf(r), Render: renderOf(r)})
	if err != nil {
		return nil, engineError(err)
	}
	nc.sess.Complete()
	nc.answers[answerer] = r.SDP
	nc.lastSignal = e.now()
	nc.c.SetLeg(answerer, e.leg(nc, answerer, r))
	if nc.c.State() != call.StateAnswered {
		nc.c.SetState(call.StateAnswered)
		e.mu.Lock()
		e.stats.answeredCalls++
		e.mu.Unlock()
	}
	e.persist(nc)
	return &Reply{SDP: string(body)}, nil
}

// Delete implements Engine: the whole call goes, whichever of its tags
// (or none) the request names.
func (e *CallEngine) Delete(ctx context.Context, r *Request) (*Reply, error) {
	if r.CallID == "" {
		return nil, ErrNoCallID
	}
	nc := e.lookup(r.CallID)
	if nc == nil {
		return nil, ErrUnknownCall
	}
	nc.mu.Lock()
	for _, tag := range []string{r.FromTag, r.ToTag} {
		if tag != "" && nc.side(tag) < 0 {
			nc.mu.Unlock()
			return nil, ErrTagMismatch
		}
	}
	disp := call.Failed
	if nc.c.State() == call.StateAnswered {
		disp = call.Answered
	}
	// The statistics are the final ones the flows' removal returned: no
	// second round of reads from the data planes.
	e.end(nc, disp, "deleted")
	st := e.callStats(nc)
	nc.mu.Unlock()
	return &Reply{Call: st}, nil
}

// Query implements Engine.
func (e *CallEngine) Query(ctx context.Context, r *Request) (*Reply, error) {
	if r.CallID == "" {
		return nil, ErrNoCallID
	}
	nc := e.lookup(r.CallID)
	if nc == nil {
		return nil, ErrUnknownCall
	}
	nc.mu.Lock()
	defer nc.mu.Unlock()
	return &Reply{Call: e.callStats(nc)}, nil
}

// List implements Engine: call-ids, oldest first, up to r.Limit.
func (e *CallEngine) List(ctx context.Context, r *Request) (*Reply, error) {
	e.mu.Lock()
	all := make([]*ngCall, 0, len(e.calls))
	for _, nc := range e.calls {
		all = append(all, nc)
	}
	e.mu.Unlock()
	slices.SortFunc(all, func(a, b *ngCall) int {
		return cmp.Or(a.c.Created.Compare(b.c.Created), cmp.Compare(a.id, b.id))
	})
	ids := []string{}
	for _, nc := range all {
		if len(ids) >= r.Limit {
			break
		}
		ids = append(ids, nc.id)
	}
	return &Reply{Calls: ids}, nil
}

// Statistics implements Engine.
func (e *CallEngine) Statistics(ctx context.Context, r *Request) (*Reply, error) {
	e.mu.Lock()
	s := e.stats
	own := int64(len(e.calls))
	e.mu.Unlock()
	st := &Statistics{
		SessionsOwn:               own,
		SessionsForeign:           int64(e.cfg.Calls.Len()) - own,
		Uptime:                    e.now().Sub(e.start),
		ManagedSessions:           s.managed,
		RejectedSessions:          s.rejected,
		TimeoutSessions:           s.timeouts + s.offerTimeouts,
		OfferTimeoutSessions:      s.offerTimeouts,
		RegularTerminatedSessions: s.regular,
		TotalCallsDuration:        s.totalDuration,
		TranscodedMedia:           int64(transcodedMedia(e.cfg.Calls)),
	}
	if s.answeredCalls > 0 {
		st.AverageCallDuration = s.totalDuration / time.Duration(s.answeredCalls)
	}
	reg := e.cfg.Calls.Registry()
	for _, p := range reg.Ports() {
		in, err := reg.Interface(p.Interface)
		if err != nil {
			continue
		}
		for _, a := range []netip.Addr{in.Addr, in.Addr6} {
			if !a.IsValid() {
				continue
			}
			st.Interfaces = append(st.Interfaces, InterfaceStats{
				Name: cmp.Or(p.Interface, "default"), Address: a, PortMin: int(in.PortMin), PortMax: int(in.PortMax),
				PortsUsed: 2 * (p.Pairs - p.Free),
			})
		}
	}
	return &Reply{Statistics: st}, nil
}

// transcodedMedia counts, as rtpengine's "transcodedmedia", the media
// (one stream of one party) whose packets relayd transcodes, over every
// call of the table: ng calls and the B2BUA's, as rtpengine counts its
// foreign calls too. A call transcoded both ways counts 2 per stream.
func transcodedMedia(t *call.Table) int {
	n := 0
	for _, c := range t.List() {
		n += c.Media.Transcoding()
	}
	return n
}

// Run ends, until ctx is done, the calls whose media stopped for the
// media timeout and the offers never answered.
func (e *CallEngine) Run(ctx context.Context) {
	t := time.NewTicker(e.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.Sweep()
		}
	}
}

// Sweep ends the calls whose media stopped for the media timeout, and the
// offers not answered for as long after their last command.
func (e *CallEngine) Sweep() {
	idle, err := e.cfg.Calls.Idle(e.cfg.MediaTimeout)
	if err != nil {
		e.log.Warn("media timeout sweep", zap.Error(err))
	}
	isIdle := make(map[*call.Call]bool, len(idle))
	for _, c := range idle {
		isIdle[c] = true
	}
	// The calls' locks are taken after the engine's is released (a
	// command holds its call's lock while it ends the call).
	e.mu.Lock()
	all := make([]*ngCall, 0, len(e.calls))
	for _, nc := range e.calls {
		all = append(all, nc)
	}
	e.mu.Unlock()
	var ended, offers []*ngCall
	cutoff := e.now().Add(-e.cfg.MediaTimeout)
	for _, nc := range all {
		switch {
		case isIdle[nc.c]:
			ended = append(ended, nc)
		case nc.c.State() != call.StateAnswered:
			nc.mu.Lock()
			if nc.lastSignal.Before(cutoff) {
				offers = append(offers, nc)
			}
			nc.mu.Unlock()
		}
	}
	for _, nc := range ended {
		e.log.Info("media timeout", zap.String("call_id", nc.id), zap.Duration("timeout", e.cfg.MediaTimeout))
		e.end(nc, call.MediaTimeout, "no media")
	}
	for _, nc := range offers {
		e.log.Info("offer not answered", zap.String("call_id", nc.id), zap.Duration("timeout", e.cfg.MediaTimeout))
		e.end(nc, call.Failed, "offer timeout")
	}
	e.persistChanged()
}

// Close is for relayd stopping: with a Store the answered calls stay up
// for the next run (Detach), the others end; without one every call ends
// with a record.
func (e *CallEngine) Close() {
	if e.cfg.Store != nil {
		e.Detach()
		return
	}
	for _, nc := range e.snapshot() {
		e.end(nc, call.Shutdown, "relayd stopped")
	}
}

// callFor returns the call of r's call-id, made anew (within the load and
// session limits) when there is none.
func (e *CallEngine) callFor(r *Request) (*ngCall, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if nc, ok := e.calls[r.CallID]; ok {
		return nc, false, nil
	}
	if e.cfg.MaxLoad > 0 {
		if load, err := e.cfg.Load(); err == nil && load > e.cfg.MaxLoad {
			e.stats.rejected++
			return nil, false, fmt.Errorf("%w: load %.2f per CPU, limit %.2f", ErrLoadLimit, load, e.cfg.MaxLoad)
		}
	}
	var src netip.AddrPort
	if r.ReceivedFrom.IsValid() {
		src = netip.AddrPortFrom(r.ReceivedFrom, 0)
	}
	c, err := e.cfg.Calls.TryNew(src, "", "")
	if err != nil {
		e.stats.rejected++
		return nil, false, ErrSessionLimit
	}
	nc := &ngCall{id: r.CallID, c: c, sess: call.NewSession(c.Media, [2]call.Local{})}
	nc.tags[call.A] = r.FromTag
	nc.created[call.A] = e.now()
	e.calls[r.CallID] = nc
	e.stats.managed++
	e.log.Debug("ng call", zap.String("call_id", r.CallID), zap.String("call", c.ID))
	return nc, true, nil
}

// abandon drops a call whose first offer failed.
func (e *CallEngine) abandon(nc *ngCall, fresh bool) {
	if !fresh {
		return
	}
	e.mu.Lock()
	delete(e.calls, nc.id)
	e.stats.managed--
	e.stats.rejected++
	e.mu.Unlock()
	nc.c.End(call.Rejected, 0, "offer refused")
	e.cfg.Calls.Remove(nc.c)
}

// end ends a call, takes it out of the tables and writes its record.
func (e *CallEngine) end(nc *ngCall, d call.Disposition, reason string) {
	e.mu.Lock()
	if e.calls[nc.id] != nc {
		e.mu.Unlock()
		return
	}
	delete(e.calls, nc.id)
	switch d {
	case call.MediaTimeout:
		e.stats.timeouts++
	case call.Failed:
		if reason == "offer timeout" {
			e.stats.offerTimeouts++
		} else {
			e.stats.regular++
		}
	default:
		e.stats.regular++
	}
	e.mu.Unlock()
	if !nc.c.End(d, 0, reason) {
		return
	}
	e.unpersist(nc)
	e.cfg.Calls.Remove(nc.c)
	info := nc.c.Info()
	if info.Answer != nil {
		e.mu.Lock()
		e.stats.totalDuration += time.Duration(info.DurationS * float64(time.Second))
		e.mu.Unlock()
	}
	if e.cfg.OnEnd != nil {
		e.cfg.OnEnd(info)
	}
}

func (e *CallEngine) leg(nc *ngCall, s call.Side, r *Request) call.Leg {
	l := call.Leg{CallID: nc.id, FromTag: nc.tags[s], ToTag: nc.tags[s.Other()], Transport: "ng"}
	if r.ReceivedFrom.IsValid() {
		l.Remote = r.ReceivedFrom.String()
	}
	return l
}

// placeLegs chooses each leg's media interface and address: direction
// names the offerer's and the answerer's interfaces (interface both),
// the family follows the offer (address-family for the answerer's leg),
// media-address is what the SDP toward the answerer names.
func (e *CallEngine) placeLegs(nc *ngCall, r *Request, d *sdp.Description, from call.Side, fresh bool) error {
	names := [2]string{r.Interface, r.Interface}
	if len(r.Direction) > 0 {
		names[0] = r.Direction[0]
		names[1] = r.Direction[0]
		if len(r.Direction) > 1 {
			names[1] = r.Direction[1]
		}
	}
	peer := offerAddr(d)
	peers := [2]netip.Addr{peer, peer}
	switch r.AddressFamily {
	case "IP4":
		peers[1] = netip.IPv4Unspecified()
	case "IP6":
		peers[1] = netip.IPv6Unspecified()
	}
	sides := [2]call.Side{from, from.Other()}
	for i, s := range sides {
		if !fresh && nc.ifaces[s] == names[i] && r.AddressFamily == "" && r.MediaAddress == "" {
			cur := nc.sess.Local(s)
			if cur.Addr.IsValid() && cur.Addr.Is6() == (peers[i].Is6() && !peers[i].Is4In6()) {
				continue
			}
		}
		l, err := e.cfg.Calls.Local(names[i], peers[i])
		if err != nil {
			return err
		}
		if i == 1 && r.MediaAddress != "" {
			a, err := netip.ParseAddr(r.MediaAddress)
			if err != nil {
				return fmt.Errorf("media-address %q: %w", r.MediaAddress, err)
			}
			l.Advertise = a
		}
		nc.ifaces[s] = names[i]
		nc.sess.SetLocal(s, l)
	}
	return nil
}

// offerAddr returns the address of the offer's first enabled stream.
func offerAddr(d *sdp.Description) netip.Addr {
	for i := range d.Streams {
		if st := &d.Streams[i]; st.Enabled() && st.Addr.IsValid() {
			return st.Addr
		}
	}
	return netip.Addr{}
}

func parseSDP(body string) (*sdp.Description, error) {
	d, err := sdp.Parse([]byte(body))
	if err == nil {
		err = d.Usable()
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSDP, err)
	}
	return d, nil
}

// offerOptions turns ng's flags into the call layer's policy.
func (e *CallEngine) offerOptions(r *Request, d *sdp.Description) (call.OfferOptions, error) {
	o := call.OfferOptions{
		SRTPTermination: e.cfg.Calls.CanSRTP(),
		Transcoding:     e.cfg.Calls.CanTranscode(),
		Latch:           latchOf(r),
		Render:          renderOf(r),
		Install:         true,
		Codecs: call.CodecPolicy{
			Strip: r.Codec.Strip, Mask: r.Codec.Mask, Offer: r.Codec.Offer, Transcode: r.Codec.Transcode,
		},
	}
	if d := strings.ToLower(r.DTLS); d != "" && d != "off" && d != "no" && d != "disable" {
		return o, fmt.Errorf("DTLS=%s: relayd does not do DTLS-SRTP (SDES only)", r.DTLS)
	}
	for _, m := range r.RTCPMux {
		switch m {
		case "offer":
			o.RTCPMux.Offer = true
		case "require":
			o.RTCPMux.Require = true
		case "demux":
			o.RTCPMux.Demux = true
		case "accept":
			o.RTCPMux.Accept = true
		case "reject":
			o.RTCPMux.Reject = true
		}
	}
	keys := false
	for i := range d.Streams {
		if len(d.Streams[i].Crypto) > 0 {
			keys = true
		}
	}
	switch tp := strings.ToUpper(r.TransportProtocol); {
	case tp == "RTP/AVP" || tp == "RTP/AVPF":
		if keys {
			o.SRTP = call.SRTPOff // relayd terminates the offerer's SRTP
		}
	case tp == "RTP/SAVP" || tp == "RTP/SAVPF":
		if !keys {
			o.SRTP = call.SRTPRequire // relayd keys the answerer's leg
		}
	case tp == "", tp == "ACCEPT":
	default:
		return o, fmt.Errorf("transport-protocol %s: relayd relays RTP/AVP, RTP/AVPF, RTP/SAVP and RTP/SAVPF", r.TransportProtocol)
	}
	if slices.Contains(r.SDES, "off") && keys {
		o.SRTP = call.SRTPOff
	}
	o.Suites = offerSuites(r.SDES)
	return o, nil
}

// rtpengineSuites are the SDES suites relayd offers when it keys a leg, in
// rtpengine's order (it offers AES_192_CM, F8 and NULL too, which relayd
// does not implement).
var rtpengineSuites = []sdes.Suite{
	sdes.AEAD_AES_256_GCM, sdes.AEAD_AES_128_GCM, sdes.AES_256_CM_HMAC_SHA1_80, sdes.AES_256_CM_HMAC_SHA1_32,
	sdes.AES_CM_128_HMAC_SHA1_80, sdes.AES_CM_128_HMAC_SHA1_32,
}

// offerSuites applies the SDES options "no-SUITE" (leave it out) and
// "only-SUITE" (offer only those) to rtpengineSuites.
func offerSuites(opts []string) []sdes.Suite {
	var only []sdes.Suite
	no := make(map[sdes.Suite]bool)
	for _, opt := range opts {
		name, isOnly := strings.CutPrefix(opt, "only-")
		if !isOnly {
			name, _ = strings.CutPrefix(opt, "no-")
		}
		suite, err := sdes.ParseSuite(name)
		switch {
		case err != nil:
		case isOnly:
			only = append(only, suite)
		case name != opt:
			no[suite] = true
		}
	}
	out := []sdes.Suite{}
	for _, s := range rtpengineSuites {
		if (len(only) == 0 || slices.Contains(only, s)) && !no[s] {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return rtpengineSuites[:1]
	}
	return out
}

func latchOf(r *Request) call.LatchPolicy {
	switch {
	case r.Flags.Has("strict-source"):
		return call.LatchStrict
	case r.Flags.Has("asymmetric"):
		return call.LatchAsymmetric
	}
	return call.LatchSymmetric
}

// renderOf: the SDP as rtpengine 10.5 writes it. The peer's o= line
// stays, with relayd's address when "replace" names origin; the
// session-level c= names relayd (rtpengine rewrites it with or without
// "replace session-connection" when the media sections have no c= of
// their own, and relayd's flows need the peer to send to relayd either
// way); rtpengine's attribute layout; ICE goes (relayd anchors on plain
// UDP) unless ICE=force, which relayd cannot do.
func renderOf(r *Request) call.Render {
	ren := call.Render{
		KeepOrigin:      true,
		OriginAddress:   slices.Contains(r.Replace, "origin"),
		RTPEngineLayout: true,
	}
	if ice := strings.ToLower(r.ICE); ice == "force" || ice == "force-relay" {
		ren.ICE = call.ICEForce
	}
	return ren
}

// engineError maps the call layer's errors to ng's.
func engineError(err error) error {
	switch {
	case errors.Is(err, call.ErrNoPorts):
		return fmt.Errorf("%w: %w", ErrNoPorts, err)
	case errors.Is(err, call.ErrSessionLimit):
		return ErrSessionLimit
	case errors.Is(err, sdp.ErrMalformed):
		return fmt.Errorf("%w: %w", ErrBadSDP, err)
	case errors.Is(err, call.ErrTranscodeUnsupported):
		return fmt.Errorf("%w: %w", ErrTranscode, err)
	case call.Reason(err) != "":
		return refused{call.Reason(err), err}
	}
	return err
}

// refused is an offer or answer relayd cannot honour as it is (media
// toward relayd itself, a family without a media address, SRTP without
// a usable key): its error-reason is call.Reason's words.
type refused struct {
	reason string
	err    error
}

func (r refused) Error() string { return r.reason }
func (r refused) Unwrap() error { return r.err }

// callStats is the call as query and delete report it; nc.mu held.
func (e *CallEngine) callStats(nc *ngCall) *CallStats {
	cs := &CallStats{Created: nc.c.Created, LastSignal: nc.lastSignal}
	flows := nc.c.FlowStats()
	byMatch := make(map[netip.AddrPort]call.FlowStat, len(flows))
	for _, f := range flows {
		byMatch[f.Flow.Match] = f
		c := Counters{Packets: int64(f.Stats.Packets), Bytes: int64(f.Stats.Bytes), Errors: int64(f.Stats.Dropped)}
		if f.Flow.ClockRate == 0 {
			cs.TotalRTCP.add(c)
		} else {
			cs.TotalRTP.add(c)
			if f.Stats.SSRC != 0 {
				cs.SSRC = append(cs.SSRC, ssrcStats(f))
			}
		}
	}
	streams := nc.c.Media.Streams()
	for _, s := range []call.Side{call.A, call.B} {
		if nc.tags[s] == "" {
			continue
		}
		ts := TagStats{Tag: nc.tags[s], ViaBranch: nc.via[s], Label: nc.labels[s], Created: nc.created[s]}
		if o := nc.tags[s.Other()]; o != "" {
			ts.Subscriptions = []Subscription{{Tag: o}}
			ts.Subscribers = []Subscription{{Tag: o}}
		}
		for _, st := range streams {
			end := st.Ends[s]
			ms := MediaStats{Index: st.Index + 1, Type: "audio", Protocol: nc.protos[s][st.Index]}
			// The RTP flow of the party's packets: rtpengine flags a
			// media "transcoding" when what it receives from it is
			// transcoded, and names as its codec the one it received
			// most of (here the one decoded, once a frame was; the
			// codecs relayd transcodes all have an 8 kHz clock).
			var tc *dataplane.Transcode
			if f, ok := byMatch[netip.AddrPortFrom(end.Relay, end.Port)]; ok && end.Port != 0 && !st.Disabled {
				tc = f.Flow.Transcode
				if tc != nil && f.Stats.FramesIn > 0 {
					ms.Codec = tc.In.Name + "/8000"
				}
			}
			if st.Disabled {
				ms.Flags = []string{}
			} else {
				ms.Flags = []string{"initialized", "send", "recv"}
				if end.Mux || st.Mux {
					ms.Flags = append(ms.Flags, "rtcp-mux")
				}
				if end.Recv != nil || end.Send != nil {
					ms.Flags = append(ms.Flags, "SDES")
				}
				if end.Latch == call.LatchAsymmetric {
					ms.Flags = append(ms.Flags, "asymmetric")
				}
				if tc != nil {
					ms.Flags = append(ms.Flags, "transcoding") // last, as rtpengine lists it
				}
			}
			for k, peer := range []netip.AddrPort{end.RTP, end.RTCP} {
				if end.Port == 0 {
					continue
				}
				local := netip.AddrPortFrom(end.Relay, end.Port+uint16(k))
				ss := StreamStats{Local: local, Endpoint: peer, Advertised: peer, Flags: []string{"RTP"}}
				if k == 1 {
					ss.Flags = []string{"RTCP"}
				}
				if f, ok := byMatch[local]; ok {
					ss.Stats = Counters{Packets: int64(f.Stats.Packets), Bytes: int64(f.Stats.Bytes), Errors: int64(f.Stats.Dropped)}
					ss.LastPacket = f.Stats.LastSeen
					ss.SSRC = f.Stats.SSRC
					if f.Stats.Packets > 0 {
						ss.Flags = append(ss.Flags, "filled", "confirmed")
					}
					if f.Path == dataplane.PathXDP {
						ss.Flags = append(ss.Flags, "kernelized")
					}
					if f.Flow.Decrypt != nil {
						ss.CryptoSuite = f.Flow.Decrypt.Suite
					}
				}
				ms.Streams = append(ms.Streams, ss)
			}
			ts.Medias = append(ts.Medias, ms)
		}
		cs.Tags = append(cs.Tags, ts)
	}
	return cs
}

func (c *Counters) add(o Counters) {
	c.Packets += o.Packets
	c.Bytes += o.Bytes
	c.Errors += o.Errors
}

// ssrcStats is one RTP flow's quality, from the RFC 3550 statistics the
// data plane keeps (XDP included): loss and jitter as received by relayd,
// MOS from the E-model (G.711, no delay: relayd does not see the
// round trip without RTCP).
func ssrcStats(f call.FlowStat) SSRCStats {
	st := f.Stats
	lost := max(st.Lost, 0)
	var loss float64
	if total := float64(st.Received) + float64(lost); total > 0 {
		loss = 100 * float64(lost) / total
	}
	mos := emodel.MOS(emodel.R(emodel.Input{Codec: emodel.G711, LossPercent: loss, BurstR: 1}))
	m := MOS{
		MOS:        int64(math.Round(mos * 10)),
		Jitter:     int64(math.Round(st.JitterMillis(f.Flow.ClockRate))),
		PacketLoss: int64(math.Round(loss)),
		ReportedAt: st.LastSeen,
	}
	return SSRCStats{SSRC: st.SSRC, CumulativeLoss: st.Lost, Average: m, Lowest: m, Highest: m, Samples: 1}
}
