// Package sip is relayd's SIP front-end: a B2BUA on github.com/emiago/sipgo
// that anchors every call's media on the relay. An INVITE from a caller
// (leg A) is routed (control/route), tried on each destination in turn
// (leg B, its own Call-ID, tags and CSeq), its SDP negotiated both ways by
// the call layer (call.Session, with the route's SRTP policy and codecs
// as options) and its media carried by flows (control/call); at the end a
// CDR is handed to the sink. The B2BUA keeps the SIP side: dialogs,
// transactions, which leg offers, re-offers refused and rolled back.
//
// Malformed SIP is answered (400, 505, 416, ...; see vetconn.go and
// vet.go), or dropped when there is no Via to answer by, and never
// disturbs other calls: every call runs in its own goroutines and shares
// only the call table. What strangers can make it log is rate-limited
// per source (internal/loglimit).
package sip

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/route"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/loglimit"
)

// MaxMessageSize is the largest SIP message relayd sends over UDP: the
// stack's default (1300 bytes) is too small for INVITEs with several
// a=crypto lines; IP fragments them as needed.
const MaxMessageSize = 65000

// Config configures the B2BUA.
type Config struct {
	Listeners []config.Listener
	Router    *route.Router
	Calls     *call.Table
	// MediaTimeout ends answered calls whose flows carried no packet this
	// long; 0: off.
	MediaTimeout time.Duration
	// MaxDuration ends answered calls after this long; 0: no limit.
	MaxDuration time.Duration
	// RateLimit is new INVITEs per second per source address (burst
	// RateBurst); 0: no limit.
	RateLimit float64
	RateBurst int
	// MaxCalls bounds concurrent calls; 0: no limit.
	MaxCalls int
	// RetryAfter is sent with 503s for exhausted resources; default 5s.
	RetryAfter time.Duration
	// OnEnd receives each call's final record (CDR); optional. It must not
	// block for long.
	OnEnd func(call.Info)
	// UserAgent is sent in User-Agent and Server headers; default relayd.
	UserAgent string
	// SweepInterval is how often media timeouts are checked (and changed
	// media persisted) and ended INVITE transactions of answered calls
	// let go; default 2s.
	SweepInterval time.Duration
	// Store keeps answered calls across restarts; optional. With it,
	// New takes back the calls stored by the previous run and Shutdown
	// keeps answered calls up; without it, Shutdown hangs them up.
	Store Store
	// Auth authenticates the callers of routes with auth_users.
	Auth Auth
	// TLS is the server side of the tls listeners (their certificate);
	// required by them.
	TLS *tls.Config
	// TLSClient verifies TLS destinations; nil: the system's roots.
	TLSClient *tls.Config
}

func (c *Config) validate() error {
	if len(c.Listeners) == 0 {
		return errors.New("no listeners")
	}
	if c.Router == nil || c.Calls == nil {
		return errors.New("need a router and a call table")
	}
	for _, l := range c.Listeners {
		if l.Network == "tls" && (c.TLS == nil || len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil) {
			return fmt.Errorf("listener tls:%s needs a certificate", l.Addr)
		}
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = 5 * time.Second
	}
	if c.UserAgent == "" {
		c.UserAgent = "relayd"
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = 2 * time.Second
	}
	if c.RateLimit > 0 && c.RateBurst <= 0 {
		c.RateBurst = max(1, int(2*c.RateLimit))
	}
	return nil
}

// Server is the B2BUA. Create it with New, run it with Serve, stop it
// with Shutdown. Safe for concurrent use.
type Server struct {
	cfg     Config
	log     *zap.Logger
	clog    *zap.Logger // log for callLog, skipping its frames
	ua      *sipgo.UserAgent
	srv     *sipgo.Server
	client  *sipgo.Client
	dialogs map[string]*sipgo.DialogUA // by "udp4", "tcp6", ...
	laddr   map[string]sip.Addr        // UDP listen address by family, to send from
	self    map[string]bool            // our listen host:ports, for loop detection
	metrics *Metrics
	limiter *limiter
	vet     *vetter           // UDP pre-parser
	loglim  *loglimit.Limiter // lines strangers can trigger
	loops   *branchSet
	peers   *peerSet // where relayd may open TCP connections
	auth    *digestAuth

	wg       sync.WaitGroup // call setups
	inflight sync.WaitGroup // request handlers; Add only under mu while !drained

	stopped  chan struct{} // closed by Shutdown
	stopOnce sync.Once

	mu       sync.Mutex          // guards the following
	byDialog map[string]*b2bCall // by leg A's and leg B's dialog IDs
	byCall   map[string]*b2bCall // by call ID
	closing  bool
	drained  bool    // Shutdown waits for inflight: no new handlers
	draining bool    // Drain: new INVITEs get 503
	drainGen int     // the latest Drain
	bound    []bound // by Listen
}

// ErrNoCall: Hangup was given an id no call has.
var ErrNoCall = errors.New("no such call")

// New returns a B2BUA; it does not listen yet.
func New(cfg Config, log *zap.Logger) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("sip: %w", err)
	}
	slog := newSlog(log)
	peers := newPeerSet()
	for _, rt := range cfg.Router.Destinations() {
		if ip, err := netip.ParseAddr(rt.Host); err == nil {
			peers.allow(ip)
		}
	}
	ua, err := sipgo.NewUA(
		sipgo.WithUserAgent(cfg.UserAgent),
		sipgo.WithUserAgentTransportLayerOptions(sip.WithTransportLayerLogger(slog),
			sip.WithTransportLayerReadFilter(func(p sip.TransportReadProps, data []byte) ([]byte, error) {
				peers.seen(p.RemoteAddr)
				return data, nil
			}),
			sip.WithTransportLayerTransports(sip.TransportsConfig{
				TCP: &sip.TransportTCP{DialerCreate: peers.dialer},
				TLS: &sip.TransportTLS{TransportTCP: &sip.TransportTCP{DialerCreate: peers.dialer}},
			})),
		sipgo.WithUserAgenTLSConfig(clientTLS(cfg.TLSClient)),
		sipgo.WithUserAgentTransactionLayerOptions(sip.WithTransactionLayerLogger(slog),
			sip.WithTransactionLayerUnhandledResponseHandler(func(*sip.Response) {})),
	)
	if err != nil {
		return nil, fmt.Errorf("sip: user agent: %w", err)
	}
	s := &Server{
		cfg:      cfg,
		log:      log,
		clog:     log.WithOptions(zap.AddCallerSkip(callLogSkip)),
		ua:       ua,
		dialogs:  make(map[string]*sipgo.DialogUA),
		laddr:    make(map[string]sip.Addr),
		self:     make(map[string]bool),
		metrics:  newMetrics(),
		peers:    peers,
		loops:    newBranchSet(),
		auth:     newDigestAuth(cfg.Auth),
		byDialog: make(map[string]*b2bCall),
		byCall:   make(map[string]*b2bCall),
		stopped:  make(chan struct{}),
	}
	s.metrics.active = cfg.Calls.Len
	s.loglim = loglimit.New(loglimit.Config{Component: "sip"}, log)
	s.vet = newVetter(cfg.UserAgent, log, s.loglim)
	s.metrics.more = append(s.metrics.more, s.vet.counters, s.loglim)
	if cfg.RateLimit > 0 {
		s.limiter = newLimiter(cfg.RateLimit, cfg.RateBurst)
	}
	first := cfg.Listeners[0].Addr
	s.client, err = sipgo.NewClient(ua, sipgo.WithClientLogger(slog), sipgo.WithClientHostname(first.Addr().String()),
		sipgo.WithClientPort(int(first.Port())))
	if err != nil {
		return nil, fmt.Errorf("sip: client: %w", err)
	}
	s.srv, err = sipgo.NewServer(ua, sipgo.WithServerLogger(slog))
	if err != nil {
		return nil, fmt.Errorf("sip: server: %w", err)
	}
	for _, l := range cfg.Listeners {
		fam := family(l.Addr.Addr())
		key := l.Network + fam
		s.self[l.Addr.String()] = true
		if _, ok := s.dialogs[key]; !ok {
			contact := sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "relayd", Host: l.Addr.Addr().String(), Port: int(l.Addr.Port())}}
			if l.Network != "udp" {
				contact.Address.UriParams = sip.HeaderParams{{K: "transport", V: l.Network}}
			}
			s.dialogs[key] = &sipgo.DialogUA{Client: s.client, ContactHDR: contact}
		}
		if l.Network == "udp" {
			if _, ok := s.laddr[fam]; !ok {
				s.laddr[fam] = sip.Addr{IP: net.IP(l.Addr.Addr().AsSlice()), Port: int(l.Addr.Port())}
			}
		}
	}
	s.srv.OnInvite(s.recovered(s.onInvite))
	s.srv.OnAck(s.recovered(s.onAck))
	s.srv.OnBye(s.recovered(s.onBye))
	s.srv.OnCancel(s.recovered(s.onCancel))
	s.srv.OnOptions(s.recovered(s.onOptions))
	s.srv.OnUpdate(s.recovered(s.onUpdate))
	s.srv.OnNoRoute(s.recovered(s.noRoute))
	s.restore()
	return s, nil
}

func init() {
	// The stack refuses to send UDP messages over UDPMTUSize-200 bytes; it
	// is a process-wide setting, set once before any user agent runs.
	sip.UDPMTUSize = MaxMessageSize + 200
}

const allowed = "INVITE, ACK, BYE, CANCEL, OPTIONS, UPDATE"

func family(a netip.Addr) string {
	if a.Is4() || a.Is4In6() {
		return "4"
	}
	return "6"
}

// Metrics returns the B2BUA's metrics collector.
func (s *Server) Metrics() *Metrics { return s.metrics }

// recovered keeps a panic in one request's handling from taking the
// daemon down: it is logged and answered 500.
func (s *Server) recovered(h sipgo.RequestHandler) sipgo.RequestHandler {
	return func(req *sip.Request, tx sip.ServerTransaction) {
		if s.refused(req, tx) {
			return
		}
		s.mu.Lock()
		// A new call's handler lasts as long as its setup: s.wg counts
		// those, inflight the others. Both are added to under mu only
		// while Shutdown has not begun waiting for them.
		setup := req.IsInvite() && (req.To() == nil || !req.To().Params.Has("tag"))
		switch {
		case setup && s.closing, !setup && s.drained && !req.IsAck(): // ACKs still count: a 2xx waits for one
			s.mu.Unlock()
			if !req.IsAck() {
				respond(tx, req, sip.StatusServiceUnavailable, "Shutting Down", s.retryAfter())
			}
			return
		case setup:
			s.wg.Add(1)
			defer s.wg.Done()
		case !s.drained:
			s.inflight.Add(1)
			defer s.inflight.Done()
		}
		s.mu.Unlock()
		defer func() {
			if v := recover(); v != nil {
				s.log.Error("SIP handler panic", zap.Any("panic", v), zap.String("method", string(req.Method)), zap.Stack("stack"))
				if !req.IsAck() {
					tx.Respond(sip.NewResponseFromRequest(req, sip.StatusInternalServerError, "Server Internal Error", nil))
				}
			}
		}()
		h(req, tx)
	}
}

// bound is one listener opened by Listen.
type bound struct {
	l  config.Listener
	pc net.PacketConn // udp
	ln net.Listener   // tcp, tls
}

func (b bound) close() error {
	if b.pc != nil {
		return b.pc.Close()
	}
	return b.ln.Close()
}

// Listen binds every configured listener and returns the first bind error
// (closing what it had bound), so that a daemon can refuse to start, and
// report ready only once SIP is reachable. Serve calls it if it was not
// called.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bound != nil {
		return nil
	}
	var out []bound
	for _, l := range s.cfg.Listeners {
		network := l.Network + family(l.Addr.Addr())
		b := bound{l: l}
		var err error
		switch l.Network {
		case "udp":
			b.pc, err = net.ListenPacket(network, l.Addr.String())
		case "tls":
			b.ln, err = net.Listen("tcp"+family(l.Addr.Addr()), l.Addr.String())
			if err == nil {
				b.ln = tls.NewListener(b.ln, serverTLS(s.cfg.TLS))
			}
		default:
			b.ln, err = net.Listen(network, l.Addr.String())
		}
		if err != nil {
			for _, o := range out {
				o.close()
			}
			return fmt.Errorf("sip listen %s:%s: %w", l.Network, l.Addr, err)
		}
		s.log.Info("SIP listening", zap.String("network", l.Network), zap.Stringer("addr", l.Addr))
		out = append(out, b)
	}
	s.bound = out
	return nil
}

// Serve serves the listeners bound by Listen (binding them first if
// needed) until ctx is done or a listener fails. Call Shutdown after it
// returns.
func (s *Server) Serve(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	listeners := s.bound
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(listeners))
	var wg sync.WaitGroup
	for _, b := range listeners {
		l, pc, ln := b.l, b.pc, b.ln
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-ctx.Done()
			b.close()
		}()
		go func() {
			defer wg.Done()
			var err error
			switch {
			case pc != nil:
				err = s.srv.ServeUDP(s.vet.conn(pc))
			case l.Network == "tls":
				err = s.srv.ServeTLS(ln)
			default:
				err = s.srv.ServeTCP(ln)
			}
			if err != nil && ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				errc <- fmt.Errorf("sip serve %s:%s: %w", l.Network, l.Addr, err)
			}
		}()
	}
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		s.sweep(ctx)
	}()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	wg.Wait()
	<-sweepDone
	return err
}

// sweep ends calls without media for MediaTimeout (persisting those whose
// media changed), lets go of the ended INVITE transactions of the calls
// that are up and compacts those that are quiet (held.go).
func (s *Server) sweep(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.releaseTxs()
		s.compact()
		if s.cfg.MediaTimeout <= 0 {
			continue
		}
		idle, err := s.cfg.Calls.Idle(s.cfg.MediaTimeout)
		if err != nil {
			s.log.Warn("media timeout sweep", zap.Error(err))
		}
		for _, c := range idle {
			if bc := s.lookupCall(c.ID); bc != nil {
				bc.log.Info("media timeout", zap.Duration("timeout", s.cfg.MediaTimeout))
				go bc.terminate(call.MediaTimeout, 0, "no media")
			}
		}
		s.persistChanged()
	}
}

// countsInterval is how often a call with userspace flows is written
// again for their counters, which die with the process: what a kill -9
// may lose of them.
const countsInterval = 10 * time.Second

// persistChanged writes the calls whose media changed since their last
// record (latched sources, flows moved by the data planes), and those
// with userspace flows every countsInterval.
func (s *Server) persistChanged() {
	if s.cfg.Store == nil {
		return
	}
	for _, bc := range s.calls() {
		rev := bc.c.Media.Revision()
		bc.mu.Lock()
		due := bc.negotiated && (bc.savedRev != rev || time.Since(bc.savedAt) >= countsInterval)
		bc.mu.Unlock()
		if due && (bc.savedRev != rev || bc.c.Media.HasPath(dataplane.PathUserspace)) {
			bc.persist()
		}
	}
}

func (s *Server) calls() []*b2bCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*b2bCall, 0, len(s.byCall))
	for _, bc := range s.byCall {
		out = append(out, bc)
	}
	return out
}

// Shutdown stops the B2BUA, bounded by ctx. New INVITEs get 503; calls
// being set up get a final response (503 to the caller, CANCEL toward the
// callee) and a CDR. With a Store, answered calls stay up: their records
// are written a last time and their flows keep carrying media for the
// next run to take back. Without one they are hung up (BYE on both legs,
// CDR). It then closes the SIP stack.
func (s *Server) Shutdown(ctx context.Context) error {
	keep := s.cfg.Store != nil
	s.mu.Lock()
	s.closing = true
	if keep {
		// In-dialog requests from now on get 503: their senders retry,
		// and the next run, which has the calls, answers them.
		s.drained = true
	}
	calls := make([]*b2bCall, 0, len(s.byCall))
	for _, bc := range s.byCall {
		calls = append(calls, bc)
	}
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stopped) })
	for _, bc := range calls {
		if keep && bc.isAnswered() {
			continue
		}
		go bc.terminate(call.Shutdown, 0, "relayd stopping")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if keep {
			// Handlers in progress (a BYE, a re-INVITE) finish; setups
			// end or reach the answer.
			s.inflight.Wait()
			for {
				pending := 0
				for _, bc := range s.calls() {
					if !bc.isAnswered() {
						pending++
					}
				}
				if pending == 0 {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		s.wg.Wait()
		s.mu.Lock()
		s.drained = true
		s.mu.Unlock()
		s.inflight.Wait()
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("sip shutdown: %w", ctx.Err())
	}
	if keep {
		kept := 0
		for _, bc := range s.calls() {
			if bc.detach() {
				kept++
			}
		}
		s.log.Info("calls kept for the next run", zap.Int("calls", kept))
	}
	s.loglim.Close()
	if cerr := s.ua.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("sip close: %w", cerr))
	}
	return err
}

// Drain stops taking calls: from now new INVITEs get 503 with
// Retry-After, while calls in progress go on until they end or timeout
// passes; then they are hung up (BYE on both legs, CDR with disposition
// drained). A later Drain restarts the timeout from its own call.
func (s *Server) Drain(timeout time.Duration) {
	s.mu.Lock()
	s.draining = true
	s.drainGen++
	gen := s.drainGen
	n := len(s.byCall)
	s.mu.Unlock()
	s.log.Info("draining", zap.Int("calls", n), zap.Duration("timeout", timeout))
	go func() {
		deadline := time.NewTimer(timeout)
		defer deadline.Stop()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stopped:
				return
			case <-tick.C:
				s.mu.Lock()
				later, left := s.drainGen != gen, len(s.byCall)
				s.mu.Unlock()
				if later {
					return
				}
				if left == 0 {
					s.log.Info("drained: no call left")
					return
				}
			case <-deadline.C:
				calls := s.calls()
				s.log.Info("drain timeout: hanging up the calls left", zap.Int("calls", len(calls)))
				var wg sync.WaitGroup
				for _, bc := range calls {
					wg.Go(func() { bc.terminate(call.Drained, 0, "drain timeout") })
				}
				wg.Wait()
				return
			}
		}
	}()
}

// DrainStatus reports whether the B2BUA drains and how many calls it has
// (in setup or answered).
func (s *Server) DrainStatus() (draining bool, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining, len(s.byCall)
}

// LookupCall finds a call by relayd's call id or by either leg's SIP
// Call-ID.
func (s *Server) LookupCall(id string) (*call.Call, bool) {
	if bc := s.find(id); bc != nil {
		return bc.c, true
	}
	return nil, false
}

func (s *Server) find(id string) *b2bCall {
	if id == "" {
		return nil
	}
	if bc := s.lookupCall(id); bc != nil {
		return bc
	}
	for _, bc := range s.calls() {
		if bc.c.Leg(call.A).CallID == id || bc.c.Leg(call.B).CallID == id {
			return bc
		}
	}
	return nil
}

// Hangup ends a call (id: relayd's call id or either leg's SIP Call-ID):
// an answered call gets BYE on both legs, one being set up 503 toward
// the caller and CANCEL toward the callee; the CDR (disposition hangup)
// is written before Hangup returns, or within a few seconds when a peer
// does not answer. ErrNoCall when no call has the id.
func (s *Server) Hangup(id string) error {
	bc := s.find(id)
	if bc == nil {
		return fmt.Errorf("hang up %q: %w", id, ErrNoCall)
	}
	bc.log.Info("hangup requested", zap.String("id", id))
	bc.terminate(call.Hangup, 0, "hung up by the operator")
	select {
	case <-bc.c.Done():
	case <-time.After(byeTimeout + time.Second):
	}
	return nil
}

func (s *Server) unregister(bc *b2bCall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range []string{bc.aID, bc.bID} {
		if id != "" && s.byDialog[id] == bc {
			delete(s.byDialog, id)
		}
	}
	delete(s.byCall, bc.c.ID)
}

// lookup finds the call and leg an in-dialog request belongs to.
func (s *Server) lookup(req *sip.Request) (*b2bCall, call.Side) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, err := sip.DialogIDFromRequestUAS(req); err == nil {
		if bc, ok := s.byDialog[id]; ok && bc.aID == id {
			return bc, call.A
		}
	}
	if id, err := sip.DialogIDFromRequestUAC(req); err == nil {
		if bc, ok := s.byDialog[id]; ok && bc.bID == id {
			return bc, call.B
		}
	}
	return nil, 0
}

func (s *Server) lookupCall(id string) *b2bCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byCall[id]
}

func respond(tx sip.ServerTransaction, req *sip.Request, code int, reason string, headers ...sip.Header) {
	res := sip.NewResponseFromRequest(req, code, reason, nil)
	for _, h := range headers {
		res.AppendHeader(h)
	}
	tx.Respond(res)
}

func (s *Server) retryAfter() sip.Header {
	return sip.NewHeader("Retry-After", strconv.Itoa(int(s.cfg.RetryAfter/time.Second)))
}

func (s *Server) onOptions(req *sip.Request, tx sip.ServerTransaction) {
	res := sip.NewResponseFromRequest(req, sip.StatusOK, "OK", nil)
	res.AppendHeader(sip.NewHeader("Allow", allowed))
	res.AppendHeader(sip.NewHeader("Accept", "application/sdp"))
	res.AppendHeader(sip.NewHeader("Server", s.cfg.UserAgent))
	tx.Respond(res)
}

func (s *Server) onCancel(req *sip.Request, tx sip.ServerTransaction) {
	// The transaction layer answers CANCELs that match an INVITE; this one
	// matched nothing.
	respond(tx, req, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist")
}

func (s *Server) onAck(req *sip.Request, tx sip.ServerTransaction) {
	bc, side := s.lookup(req)
	if bc == nil || side != call.A {
		return // ACK of a non-2xx is absorbed by the transaction layer; stray ACKs are dropped
	}
	bc.onAck(req)
}

func (s *Server) onBye(req *sip.Request, tx sip.ServerTransaction) {
	bc, side := s.lookup(req)
	if bc == nil {
		s.noDialog(req, tx)
		return
	}
	bc.onBye(side, req, tx)
}

func (s *Server) onUpdate(req *sip.Request, tx sip.ServerTransaction) {
	bc, side := s.lookup(req)
	if bc == nil {
		s.noDialog(req, tx)
		return
	}
	bc.onReoffer(side, req, tx)
	bc.persist()
}

func (s *Server) onInvite(req *sip.Request, tx sip.ServerTransaction) {
	if to := req.To(); to != nil && to.Params.Has("tag") {
		bc, side := s.lookup(req)
		if bc == nil {
			s.noDialog(req, tx)
			return
		}
		bc.onReoffer(side, req, tx)
		bc.persist() // CSeq, media, SDP versions
		return
	}
	s.newCall(req, tx)
}

// checkInvite answers INVITEs relayd refuses before creating a call. It
// reports whether the INVITE may go on.
func (s *Server) checkInvite(req *sip.Request, tx sip.ServerTransaction, src netip.AddrPort) bool {
	s.mu.Lock()
	closing, draining := s.closing, s.draining
	s.mu.Unlock()
	switch {
	case closing:
		respond(tx, req, sip.StatusServiceUnavailable, "Shutting Down", s.retryAfter())
		return false
	case draining:
		respond(tx, req, sip.StatusServiceUnavailable, "Draining", s.retryAfter())
		return false
	case req.From() == nil || req.To() == nil || req.CallID() == nil || req.CSeq() == nil:
		respond(tx, req, sip.StatusBadRequest, "Missing Mandatory Header")
		return false
	case req.Contact() == nil:
		respond(tx, req, sip.StatusBadRequest, "Missing Contact")
		return false
	case req.Recipient.Scheme != "sip" && req.Recipient.Scheme != "sips":
		respond(tx, req, 416, "Unsupported URI Scheme")
		return false
	}
	if mf := req.MaxForwards(); mf != nil && mf.Val() == 0 {
		respond(tx, req, sip.StatusTooManyHops, "Too Many Hops")
		return false
	}
	for _, h := range req.GetHeaders("Via") {
		if v, ok := h.(*sip.ViaHeader); ok {
			if b, ok := v.Params.Get("branch"); ok && s.loops.has(b) {
				respond(tx, req, sip.StatusLoopDetected, "Loop Detected")
				return false
			}
		}
	}
	if s.limiter != nil && !s.limiter.allow(src.Addr()) {
		s.metrics.rateLimited.Add(1)
		respond(tx, req, sip.StatusServiceUnavailable, "Rate Limited", s.retryAfter())
		return false
	}
	if s.cfg.MaxCalls > 0 && s.cfg.Calls.Len() >= s.cfg.MaxCalls {
		respond(tx, req, sip.StatusServiceUnavailable, "Too Many Calls", s.retryAfter())
		return false
	}
	if len(req.Body()) > 0 {
		ct := req.ContentType()
		if ct == nil || !strings.EqualFold(strings.TrimSpace(strings.Split(ct.Value(), ";")[0]), "application/sdp") {
			respond(tx, req, sip.StatusUnsupportedMediaType, "Unsupported Media Type", sip.NewHeader("Accept", "application/sdp"))
			return false
		}
	}
	return true
}

// SetCredentials replaces the digest users and passwords (a reload of
// the auth_file); calls being authenticated finish with either.
func (s *Server) SetCredentials(c *config.Credentials) { s.auth.creds.Store(c) }

// admit refuses, before a call exists, INVITEs that the routes refuse
// (route.Router.Check): from a source outside the allow list of every
// route that matches the user part, 403; for a route with auth_users,
// without credentials or with a stale nonce 401 and a challenge, with
// credentials refused 403 (see docs/routing.md for why not a new 401).
// They reach no destination, make no CDR and are counted
// (relayd_sip_refused_total). It returns whether the INVITE may go on
// and the user it authenticated as, if any.
func (s *Server) admit(req *sip.Request, tx sip.ServerTransaction, src netip.AddrPort) (authUser string, ok bool) {
	f := route.Facts{User: req.Recipient.User, Source: src.String()}
	var auth authResult
	if req.GetHeader("Authorization") != nil {
		auth = s.auth.verify(req, src.Addr())
		if auth.state == authOK {
			f.AuthUser = auth.user
		}
	}
	err := s.cfg.Router.Check(f)
	if err == nil {
		return f.AuthUser, true
	}
	log := s.log.With(zap.Stringer("source", src), zap.String("user", f.User), zap.String("sip_call_id", req.CallID().Value()))
	switch {
	case errors.Is(err, route.ErrAuthRequired):
		switch auth.state {
		case authBad:
			s.metrics.refused(refusedCredentials)
			if ce := s.loglim.Check(log, zap.InfoLevel, src.Addr(), "INVITE refused: credentials"); ce != nil {
				ce.Write(zap.String("auth_user", auth.user), zap.String("why", auth.why))
			}
			respond(tx, req, sip.StatusForbidden, "Forbidden")
		case authBadURI:
			s.metrics.refused(refusedCredentials)
			if ce := s.loglim.Check(log, zap.InfoLevel, src.Addr(), "INVITE refused: credentials"); ce != nil {
				ce.Write(zap.String("auth_user", auth.user), zap.String("why", auth.why))
			}
			respond(tx, req, sip.StatusBadRequest, "Digest URI Is Not The Request-URI")
		default:
			s.metrics.refused(refusedChallenged)
			log.Debug("INVITE challenged", zap.Bool("stale", auth.state == authStale), zap.String("why", auth.why))
			respond(tx, req, sip.StatusUnauthorized, "Unauthorized", s.auth.challenge(src.Addr(), auth.state == authStale)...)
		}
	case errors.Is(err, route.ErrForbidden):
		reason := refusedSource
		if f.AuthUser != "" {
			reason = refusedUser
		}
		s.metrics.refused(reason)
		if ce := s.loglim.Check(log, zap.InfoLevel, src.Addr(), "INVITE refused: "+reason+" not allowed"); ce != nil {
			ce.Write(zap.String("auth_user", f.AuthUser), zap.Error(err))
		}
		respond(tx, req, sip.StatusForbidden, "Forbidden")
	default:
		log.Warn("admission", zap.Error(err))
		respond(tx, req, sip.StatusInternalServerError, "Server Internal Error")
	}
	return "", false
}

func sourceOf(req *sip.Request) netip.AddrPort {
	ap, err := netip.ParseAddrPort(req.Source())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
