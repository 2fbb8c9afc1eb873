package ng

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/relayd/relayd/control/ng/bencode"
	"github.com/relayd/relayd/internal/loglimit"
)

// Defaults of a Config.
const (
	DefaultCacheTTL       = 30 * time.Second // rtpengine's
	DefaultCacheEntries   = 100000
	DefaultQueue          = 1024
	DefaultCommandTimeout = 10 * time.Second
	DefaultMaxMessage     = 1 << 16 // a UDP datagram's payload at most
	defaultListLimit      = 32      // rtpengine's
)

// Config configures a Server.
type Config struct {
	// Listen are the listeners: "udp:IP:PORT", "tcp:IP:PORT" or
	// "http:IP:PORT" (POST /ng), with an IP literal ("[::1]" for IPv6).
	// At least one.
	Listen []string
	// Allow are the networks whose clients are answered; others are
	// ignored (no reply) and counted. Empty allows loopback only, and is
	// then valid only if every listener is on a loopback address.
	Allow []netip.Prefix
	// CacheTTL is how long a reply stays in the cookie cache; 0 means
	// DefaultCacheTTL. Kamailio resends up to 5 times 1 s apart.
	CacheTTL time.Duration
	// CacheEntries bounds the cookie cache; 0 means DefaultCacheEntries.
	CacheEntries int
	// Workers is how many commands run at once; 0 means 4 per CPU.
	Workers int
	// Queue is how many received requests may wait for a worker; a
	// request arriving when it is full is dropped (the client resends).
	// 0 means DefaultQueue.
	Queue int
	// CommandTimeout bounds each Engine call; 0 means
	// DefaultCommandTimeout.
	CommandTimeout time.Duration
	// MaxMessage bounds a request over TCP or HTTP (UDP's is the
	// datagram); 0 means DefaultMaxMessage.
	MaxMessage int
	// Now is the clock of the cookie cache; nil means time.Now. For
	// tests.
	Now func() time.Time
}

// listenSpec is a parsed Listen entry.
type listenSpec struct {
	network string // udp, tcp, http
	addr    netip.AddrPort
}

func parseListen(s string) (listenSpec, error) {
	network, addr, ok := strings.Cut(s, ":")
	if !ok {
		return listenSpec{}, fmt.Errorf("listen %q: want udp:, tcp: or http: and IP:PORT", s)
	}
	switch network {
	case "udp", "tcp", "http":
	default:
		return listenSpec{}, fmt.Errorf("listen %q: unknown transport %q (udp, tcp, http)", s, network)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return listenSpec{}, fmt.Errorf("listen %q: %w", s, err)
	}
	return listenSpec{network: network, addr: ap}, nil
}

func (c *Config) validate() ([]listenSpec, error) {
	if len(c.Listen) == 0 {
		return nil, errors.New("no listen address")
	}
	var specs []listenSpec
	for _, l := range c.Listen {
		sp, err := parseListen(l)
		if err != nil {
			return nil, err
		}
		if len(c.Allow) == 0 && !sp.addr.Addr().Unmap().IsLoopback() {
			return nil, fmt.Errorf("listen %q: not loopback, so an allow list is needed (ng is unauthenticated)", l)
		}
		specs = append(specs, sp)
	}
	for _, p := range c.Allow {
		if !p.IsValid() {
			return nil, fmt.Errorf("allow %v: invalid prefix", p)
		}
	}
	if c.CacheTTL < 0 || c.CacheEntries < 0 || c.Workers < 0 || c.Queue < 0 || c.CommandTimeout < 0 || c.MaxMessage < 0 {
		return nil, errors.New("negative limit")
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = DefaultCacheTTL
	}
	if c.CacheEntries == 0 {
		c.CacheEntries = DefaultCacheEntries
	}
	if c.Workers == 0 {
		c.Workers = 4 * runtime.GOMAXPROCS(0)
	}
	if c.Queue == 0 {
		c.Queue = DefaultQueue
	}
	if c.CommandTimeout == 0 {
		c.CommandTimeout = DefaultCommandTimeout
	}
	if c.MaxMessage == 0 {
		c.MaxMessage = DefaultMaxMessage
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return specs, nil
}

// Server answers ng requests. Make it with New, bind with Listen, run
// with Serve; Close stops it. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	specs   []listenSpec
	allow   []netip.Prefix
	engine  Engine
	log     *zap.Logger
	metrics *metrics
	loglim  *loglimit.Limiter // lines a client can trigger at will
	cache   *cookieCache
	started time.Time
	jobs    chan job
	stats   *controlStats

	mu        sync.Mutex // guards the following
	listeners []listener
	closed    bool
	done      chan struct{} // closed by Close
}

// job is a received request waiting for a worker.
type job struct {
	from netip.AddrPort
	msg  []byte
	send func([]byte) // called at most once, with the whole reply
}

// listener is one bound transport.
type listener interface {
	serve(ctx context.Context) // until closed
	close() error
	addr() string // as in Config.Listen, with the bound port
}

// New checks cfg and returns a Server that hands commands to engine.
func New(cfg Config, engine Engine, log *zap.Logger) (*Server, error) {
	specs, err := cfg.validate()
	if err != nil {
		return nil, fmt.Errorf("ng config: %w", err)
	}
	if engine == nil {
		return nil, errors.New("ng config: no engine")
	}
	s := &Server{
		cfg:     cfg,
		specs:   specs,
		allow:   slices.Clone(cfg.Allow),
		engine:  engine,
		log:     log,
		metrics: newMetrics(),
		loglim:  loglimit.New(loglimit.Config{Component: "ng"}, log),
		cache:   newCookieCache(cfg.CacheTTL, cfg.CacheEntries, cfg.Now),
		started: time.Now(),
		jobs:    make(chan job, cfg.Queue),
		stats:   newControlStats(),
		done:    make(chan struct{}),
	}
	s.metrics.more = append(s.metrics.more, s.loglim)
	return s, nil
}

// Metrics returns the server's Prometheus collectors:
// relayd_ng_commands_total{command,result}, relayd_ng_duplicates_total,
// relayd_ng_ignored_total{reason},
// relayd_ng_command_duration_seconds{command} and
// relayd_log_suppressed_total{component="ng"}.
func (s *Server) Metrics() prometheus.Collector { return s.metrics }

// Listen binds every listener. It fails, naming the address, if one
// cannot bind, and then binds none.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("ng: server closed")
	}
	if len(s.listeners) > 0 {
		return errors.New("ng: already listening")
	}
	var ls []listener
	for _, sp := range s.specs {
		l, err := s.bind(sp)
		if err != nil {
			for _, l := range ls {
				l.close()
			}
			return fmt.Errorf("ng listen %s:%s: %w", sp.network, sp.addr, err)
		}
		ls = append(ls, l)
	}
	s.listeners = ls
	return nil
}

// Addrs returns the bound listeners in Config.Listen's form, with the
// ports the kernel chose for port 0.
func (s *Server) Addrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.listeners))
	for i, l := range s.listeners {
		out[i] = l.addr()
	}
	return out
}

// Serve answers requests until ctx is done or Close is called, then
// closes the listeners and returns after the commands in progress
// finished. Listen must have succeeded.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	ls := s.listeners
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return errors.New("ng: server closed")
	}
	if len(ls) == 0 {
		return errors.New("ng: Serve before Listen")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var workers, loops sync.WaitGroup
	for range s.cfg.Workers {
		workers.Go(func() { s.work(ctx) })
	}
	for _, l := range ls {
		loops.Go(func() { l.serve(ctx) })
	}
	select {
	case <-ctx.Done():
	case <-s.done:
	}
	s.Close()
	loops.Wait()
	cancel()
	workers.Wait()
	return nil
}

// Close closes the listeners; Serve returns. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.done)
	s.loglim.Close()
	var errs []error
	for _, l := range s.listeners {
		if err := l.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// allowed reports whether a client may talk to the server.
func (s *Server) allowed(a netip.Addr) bool {
	a = a.Unmap()
	if len(s.allow) == 0 {
		return a.IsLoopback()
	}
	for _, p := range s.allow {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// submit queues a request from a transport's read loop without blocking;
// it reports false (and counts it) when the queue is full or the sender
// is not allowed.
func (s *Server) submit(j job) bool {
	if !s.allowed(j.from.Addr()) {
		s.metrics.ignored.WithLabelValues(ignoredNotAllowed).Inc()
		return false
	}
	select {
	case s.jobs <- j:
		return true
	default:
		s.metrics.ignored.WithLabelValues(ignoredOverload).Inc()
		return false
	}
}

func (s *Server) work(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-s.jobs:
			s.handle(ctx, j.from, j.msg, j.send)
		}
	}
}

// handle answers one message, "cookie payload", calling send with the
// whole reply, or not at all when there is nothing to answer (no
// cookie). A resent cookie is answered from the cache, or, while the
// first copy runs, when it is done.
func (s *Server) handle(ctx context.Context, from netip.AddrPort, msg []byte, send func([]byte)) {
	sp := -1
	for i, b := range msg {
		if b == ' ' {
			sp = i
			break
		}
	}
	if sp <= 0 {
		s.metrics.ignored.WithLabelValues(ignoredMalformed).Inc()
		s.log.Debug("ng message without a cookie", zap.Stringer("from", from), zap.Int("bytes", len(msg)))
		return
	}
	cookie := string(msg[:sp])
	key := cacheKey{client: from.Addr().Unmap(), cookie: cookie}
	if reply, inProgress := s.cache.begin(key, send); reply != nil || inProgress {
		s.metrics.duplicates.Inc()
		s.log.Debug("ng duplicate answered from the cache", zap.Stringer("from", from), zap.String("cookie", cookie), zap.Bool("in_progress", inProgress))
		if reply != nil {
			send(reply)
		}
		return
	}
	body, isJSON := s.process(ctx, from, msg[sp+1:])
	var out []byte
	if isJSON {
		out = appendJSON(append([]byte(cookie), ' '), body)
	} else {
		var err error
		out, err = bencode.Append(append([]byte(cookie), ' '), body)
		if err != nil { // a bug in the reply's making: still answer
			s.log.Error("ng reply does not encode", zap.Error(err))
			out, _ = bencode.Append(append([]byte(cookie), ' '), errorDict(ResultError, "internal error"))
		}
	}
	s.cache.finish(key, out)
	send(out)
}

func errorDict(result Result, reason string) bencode.Value {
	key := "error-reason"
	if result == ResultLoadLimit {
		key = "message"
	}
	return bencode.Dict(
		bencode.Entry{Key: "result", Value: bencode.String(string(result))},
		bencode.Entry{Key: key, Value: bencode.String(reason)},
	)
}

// process decodes and runs one payload and returns the reply dictionary,
// and whether it is to be sent as JSON.
func (s *Server) process(ctx context.Context, from netip.AddrPort, data []byte) (bencode.Value, bool) {
	if len(data) == 0 {
		return s.fail(from, nil, "", ErrNoPayload), false
	}
	var dict bencode.Value
	isJSON := false
	switch data[0] {
	case 'd':
		v, err := bencode.Unmarshal(data)
		if err != nil {
			if ce := s.loglim.Check(s.log, zap.InfoLevel, from.Addr(), "ng request does not decode"); ce != nil {
				ce.Write(zap.Stringer("from", from), zap.Error(err))
			}
			return s.fail(from, nil, "", ErrNotDict), false
		}
		dict = v
	case '{':
		isJSON = true
		v, err := decodeJSON(data)
		if err != nil {
			if ce := s.loglim.Check(s.log, zap.InfoLevel, from.Addr(), "ng JSON request does not decode"); ce != nil {
				ce.Write(zap.Stringer("from", from), zap.Error(err))
			}
			return s.fail(from, nil, "", ErrJSON), true
		}
		dict = v
	default:
		return s.fail(from, nil, "", ErrFormat), false
	}
	r, err := ParseRequest(dict)
	if err != nil {
		return s.fail(from, nil, "", err), isJSON
	}
	return s.run(ctx, from, r), isJSON
}

// fail makes the reply to a failed command and counts it.
func (s *Server) fail(from netip.AddrPort, r *Request, command string, err error) bencode.Value {
	result, reason := ResultError, ReplyText(err)
	if r != nil {
		switch {
		case errors.Is(err, ErrSessionLimit), errors.Is(err, ErrCPULimit), errors.Is(err, ErrLoadLimit), errors.Is(err, ErrBandwidthLimit):
			if r.SupportsLoadLimit {
				result = ResultLoadLimit
			} else {
				reason = ReplyText(ErrSessionLimit) // rtpengine's legacy answer
			}
		}
	}
	if command == "" {
		command = "invalid"
	}
	s.metrics.commands.WithLabelValues(command, string(result)).Inc()
	if r != nil {
		if ce := s.loglim.Check(s.log, zap.InfoLevel, from.Addr(), "ng command failed"); ce != nil {
			ce.Write(zap.Stringer("from", from), zap.String("command", r.Command), zap.String("call_id", r.CallID), zap.String("reason", reason), zap.Error(err))
		}
	} else if ce := s.loglim.Check(s.log, zap.InfoLevel, from.Addr(), "ng request refused"); ce != nil {
		ce.Write(zap.Stringer("from", from), zap.String("reason", reason))
	}
	return errorDict(result, reason)
}

// commandLabel is the metric label of a command: its name if relayd
// knows it, else "other", so that clients cannot grow the label set.
func commandLabel(c string) string {
	switch c {
	case CmdPing, CmdOffer, CmdAnswer, CmdDelete, CmdQuery, CmdList, CmdStatistics:
		return c
	}
	return "other"
}

// check applies rtpengine's checks of required keys, in its order.
func check(r *Request) error {
	switch r.Command {
	case CmdOffer, CmdAnswer:
		switch {
		case r.SDP == "":
			return ErrNoSDP
		case r.CallID == "":
			return ErrNoCallID
		case r.FromTag == "":
			return ErrNoFromTag
		case r.Command == CmdAnswer && r.ToTag == "":
			return ErrNoToTag
		}
	case CmdDelete, CmdQuery:
		if r.CallID == "" {
			return ErrNoCallID
		}
	case CmdList:
		if r.limitGiven && r.Limit < 0 {
			return ErrLimit
		}
		if !r.limitGiven {
			r.Limit = defaultListLimit
		}
	}
	return nil
}

// run runs a parsed command and returns its reply.
func (s *Server) run(ctx context.Context, from netip.AddrPort, r *Request) bencode.Value {
	label := commandLabel(r.Command)
	if len(r.UnknownFlags)+len(r.UnknownKeys)+len(r.Problems) > 0 {
		s.log.Debug("ng request has ignored parts", zap.String("command", r.Command), zap.String("call_id", r.CallID),
			zap.Strings("unknown_flags", r.UnknownFlags), zap.Strings("unknown_keys", r.UnknownKeys), zap.Strings("problems", r.Problems))
	}
	s.log.Debug("ng command", zap.String("command", r.Command), zap.String("call_id", r.CallID), zap.Stringer("from", from))
	if r.Command == CmdPing {
		s.stats.count(from.Addr(), CmdPing, 0, false)
		s.metrics.commands.WithLabelValues(label, string(ResultPong)).Inc()
		return bencode.Dict(bencode.Entry{Key: "result", Value: bencode.String(string(ResultPong))})
	}
	var call func(context.Context, *Request) (*Reply, error)
	switch r.Command {
	case CmdOffer:
		call = s.engine.Offer
	case CmdAnswer:
		call = s.engine.Answer
	case CmdDelete:
		call = s.engine.Delete
	case CmdQuery:
		call = s.engine.Query
	case CmdList:
		call = s.engine.List
	case CmdStatistics:
		call = s.engine.Statistics
	default:
		err := ErrUnknownCommand
		if isRtpengineCommand(r.Command) {
			err = ErrUnsupported
		}
		s.stats.countError(from.Addr())
		return s.fail(from, r, label, err)
	}
	if err := check(r); err != nil {
		s.stats.countError(from.Addr())
		return s.fail(from, r, label, err)
	}
	start := time.Now()
	reply, err := s.callEngine(ctx, call, r)
	took := time.Since(start)
	s.metrics.duration.WithLabelValues(label).Observe(took.Seconds())
	s.stats.count(from.Addr(), r.Command, took, err != nil)
	if err != nil {
		switch {
		case r.Command != CmdDelete || !(errors.Is(err, ErrUnknownCall) || errors.Is(err, ErrTagMismatch)):
			return s.fail(from, r, label, err)
		case r.Flags.Has("fatal"):
			return s.fail(from, r, label, ErrTagMismatch)
		default:
			reply, err = &Reply{Warning: ReplyText(ErrTagMismatch)}, nil
		}
	}
	if reply == nil {
		reply = &Reply{}
	}
	s.metrics.commands.WithLabelValues(label, string(ResultOK)).Inc()
	return s.encodeReply(r, reply)
}

// callEngine calls the Engine with the command timeout, turning a panic
// into an error.
func (s *Server) callEngine(ctx context.Context, call func(context.Context, *Request) (*Reply, error), r *Request) (reply *Reply, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CommandTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("ng engine panicked", zap.String("command", r.Command), zap.String("call_id", r.CallID), zap.Any("panic", p), zap.Stack("stack"))
			reply, err = nil, errors.New("internal error")
		}
	}()
	return call(ctx, r)
}

// encodeReply lays a successful Reply out as rtpengine does.
func (s *Server) encodeReply(r *Request, reply *Reply) bencode.Value {
	var d dict
	switch r.Command {
	case CmdOffer, CmdAnswer:
		if reply.SDP != "" {
			d.str("sdp", reply.SDP)
		}
	case CmdQuery, CmdDelete:
		if reply.Call != nil {
			d = callStatsEntries(reply.Call)
		}
	case CmdList:
		calls := reply.Calls
		if len(calls) > r.Limit {
			calls = calls[:r.Limit]
		}
		d.add("calls", bencode.Strings(calls...))
	case CmdStatistics:
		var st Statistics // a copy: the Engine's Reply is not changed
		if reply.Statistics != nil {
			st = *reply.Statistics
		}
		if st.Uptime == 0 {
			st.Uptime = time.Since(s.started)
		}
		d.add("statistics", statisticsEntries(&st, s.stats.value()))
	}
	if reply.Warning != "" {
		d.str("warning", reply.Warning)
	}
	d.str("result", string(ResultOK))
	return d.value()
}
