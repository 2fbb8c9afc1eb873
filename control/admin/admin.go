// Package admin serves relayd's admin HTTP API (docs/api.md): health,
// Prometheus metrics and static flows.
package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/relayd/relayd/control"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/cdr"
	"github.com/relayd/relayd/dataplane"
)

// MaxBodyBytes limits request bodies.
const MaxBodyBytes = 64 << 10

// DefaultClockRate is the clock_rate of a flow request that has none.
const DefaultClockRate = 8000

// Config configures the admin server.
type Config struct {
	// Observers expose data plane counters and attachments for /metrics.
	Observers []dataplane.Observer
	// Version is reported by /healthz.
	Version string
	// Calls, when set, serves /v1/calls (the SIP B2BUA's call table).
	Calls *call.Table
	// Collectors are further Prometheus collectors for /metrics (the
	// B2BUA's call metrics).
	Collectors []prometheus.Collector
	// Control, when set, serves hangup and drain (the SIP B2BUA).
	Control CallControl
	// CDRStats, when set, exports the CDR writer's counters.
	CDRStats func() cdr.Stats
	// Token, when set, is the bearer token every request must carry
	// (Authorization: Bearer TOKEN) but GET /healthz, which without it
	// says only whether relayd is up. SetToken changes it.
	Token string
}

// CallControl acts on calls: the SIP B2BUA implements it.
type CallControl interface {
	// Hangup ends the call with relayd's call id (BYE on both legs, CDR
	// written); an error wrapping the B2BUA's "no such call" when unknown.
	Hangup(id string) error
	// Drain makes new INVITEs get 503 with Retry-After; calls in progress
	// go on until they end or timeout passes, then they are hung up with
	// their CDRs written.
	Drain(timeout time.Duration)
	// DrainStatus reports whether a drain is on and how many calls remain.
	DrainStatus() (draining bool, calls int)
}

// Server is the admin HTTP API. Create it with New; it is safe for
// concurrent use.
type Server struct {
	cfg     Config
	mgr     *control.Manager
	log     *zap.Logger
	handler http.Handler
	srv     *http.Server

	token        atomic.Pointer[[sha256.Size]byte] // nil: no token asked for
	unauthorized atomic.Uint64
}

// New returns a server for mgr.
func New(cfg Config, mgr *control.Manager, log *zap.Logger) *Server {
	s := &Server{cfg: cfg, mgr: mgr, log: log}
	s.SetToken(cfg.Token)

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		// The live heap marked by the last GC (go_gc_heap_live_bytes) on
		// top of the default set: it is the heap after GC, a leak's
		// measure, without forcing a collection from outside (the runtime
		// collects at least every two minutes).
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&collector{mgr: mgr, observers: cfg.Observers, calls: cfg.Calls, cdr: cfg.CDRStats, log: log},
		buildInfo(cfg.Version),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "relayd_admin_unauthorized_requests_total",
			Help: "Admin API requests refused for a missing or wrong bearer token.",
		}, func() float64 { return float64(s.unauthorized.Load()) }),
	)
	for _, c := range cfg.Collectors {
		reg.MustRegister(c)
	}
	errLog, _ := zap.NewStdLogAt(log.Named("metrics"), zap.WarnLevel)

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.health)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      errLog,
	}))
	mux.HandleFunc("GET /v1/flows", s.listFlows)
	mux.HandleFunc("POST /v1/flows", s.addFlow)
	mux.HandleFunc("GET /v1/flows/{id}", s.getFlow)
	mux.HandleFunc("DELETE /v1/flows/{id}", s.deleteFlow)
	mux.HandleFunc("GET /v1/calls", s.listCalls)
	mux.HandleFunc("GET /v1/calls/{id}", s.getCall)
	mux.HandleFunc("POST /v1/calls/{id}/hangup", s.hangup)
	mux.HandleFunc("GET /v1/drain", s.drainStatus)
	mux.HandleFunc("POST /v1/drain", s.drain)
	// Method-less patterns are less specific than the ones above: they
	// catch the other methods on known paths, and "/" every other path,
	// so that every error has a JSON body.
	for p, allow := range map[string]string{
		"/healthz": "GET", "/metrics": "GET", "/v1/flows": "GET, POST", "/v1/flows/{id}": "GET, DELETE",
		"/v1/calls": "GET", "/v1/calls/{id}": "GET", "/v1/calls/{id}/hangup": "POST", "/v1/drain": "GET, POST",
	} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint %s", r.URL.Path))
	})
	s.handler = s.recoverer(s.authorize(mux))
	// The http.Server is made here, not in Serve: Shutdown may come
	// before Serve's goroutine runs (relayd stopped as it starts), and
	// then Serve must return at once rather than serve for ever.
	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          mustStdLog(s.log),
	}
	return s
}

// SetToken sets the bearer token requests must carry; "" asks for none.
// Requests in flight finish under the token they were checked against.
func (s *Server) SetToken(token string) {
	if token == "" {
		s.token.Store(nil)
		return
	}
	h := sha256.Sum256([]byte(token))
	s.token.Store(&h)
}

// authorized reports whether r carries the token, or none is asked for.
// The hashes of both are compared in constant time: neither the token's
// bytes nor its length show in how long a refusal takes.
func (s *Server) authorized(r *http.Request) bool {
	want := s.token.Load()
	if want == nil {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(got)))
	return subtle.ConstantTimeCompare(h[:], want[:]) == 1
}

// authorize refuses requests without the token with 401 (RFC 6750), but
// GET /healthz: a liveness probe needs no token, and gets no detail.
func (s *Server) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.authorized(r) {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method == http.MethodGet && r.URL.Path == "/healthz" {
			writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
			return
		}
		s.unauthorized.Add(1)
		w.Header().Set("WWW-Authenticate", `Bearer realm="relayd"`)
		writeError(w, http.StatusUnauthorized, "this API needs a bearer token: Authorization: Bearer TOKEN (admin.token_file)")
	})
}

// Handler returns the API's handler, for tests and embedding.
func (s *Server) Handler() http.Handler { return s.handler }

// Listen opens a listener for addr: "host:port" (TCP) or "unix:/path"
// (a unix socket file, which unlike an abstract socket is reachable from
// every network namespace that sees the file system). A stale socket file
// is removed first; the socket is made mode 0660.
func Listen(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("admin listen: %w", err)
		}
		return l, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("admin listen: %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("admin listen: remove stale socket: %w", err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	return l, nil
}

// Serve serves the API on l until Shutdown. It returns nil after
// Shutdown, at once if Shutdown came first.
func (s *Server) Serve(l net.Listener) error {
	s.log.Info("admin API listening", zap.String("addr", l.Addr().Network()+":"+l.Addr().String()))
	if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("admin serve: %w", err)
	}
	return nil
}

// Shutdown stops the server gracefully, waiting for requests in flight
// until ctx is done.
func (s *Server) Shutdown(ctx context.Context) error {
	if err := s.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("admin shutdown: %w", err)
	}
	return nil
}

func mustStdLog(log *zap.Logger) *stdlog.Logger {
	l, _ := zap.NewStdLogAt(log.Named("http"), zap.WarnLevel)
	return l
}

func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("admin handler panic", zap.Any("panic", v), zap.String("method", r.Method),
					zap.String("path", r.URL.Path), zap.ByteString("stack", debug.Stack()))
				writeError(w, http.StatusInternalServerError, "internal error")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "version": s.cfg.Version, "flows": flowCounts(s.mgr, s.cfg.Calls)})
}

// flowCounts counts static and call flows by data path.
func flowCounts(mgr *control.Manager, calls *call.Table) map[dataplane.Path]int {
	out := mgr.Counts()
	if calls != nil {
		for p, n := range calls.FlowCounts() {
			out[p] += n
		}
	}
	return out
}

func (s *Server) listFlows(w http.ResponseWriter, r *http.Request) {
	list, err := s.mgr.List()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := FlowList{Flows: make([]Flow, 0, len(list))}
	for _, f := range list {
		out.Flows = append(out.Flows, toWire(f))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getFlow(w http.ResponseWriter, r *http.Request) {
	id, ok := flowID(w, r)
	if !ok {
		return
	}
	f, err := s.mgr.Get(id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toWire(f))
}

func (s *Server) deleteFlow(w http.ResponseWriter, r *http.Request) {
	id, ok := flowID(w, r)
	if !ok {
		return
	}
	f, err := s.mgr.Remove(id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toWire(f))
}

func (s *Server) addFlow(w http.ResponseWriter, r *http.Request) {
	var req FlowRequest
	if err := decodeJSON(w, r, &req); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", mbe.Limit))
			return
		}
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	spec, err := toSpec(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	f, err := s.mgr.Add(spec)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := toWire(f)
	w.Header().Set("Location", "/v1/flows/"+strconv.FormatUint(f.Flow.ID, 10))
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listCalls(w http.ResponseWriter, r *http.Request) {
	out := CallList{Calls: []call.Info{}}
	if s.cfg.Calls != nil {
		for _, c := range s.cfg.Calls.List() {
			out.Calls = append(out.Calls, c.Info())
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getCall(w http.ResponseWriter, r *http.Request) {
	if c := s.findCall(r.PathValue("id")); c != nil {
		writeJSON(w, http.StatusOK, c.Info())
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no call %q in progress", r.PathValue("id")))
}

// findCall finds a call by relayd's call id or by either leg's SIP
// Call-ID.
func (s *Server) findCall(id string) *call.Call {
	if s.cfg.Calls == nil || id == "" {
		return nil
	}
	if c, ok := s.cfg.Calls.Get(id); ok {
		return c
	}
	for _, c := range s.cfg.Calls.List() {
		if c.Leg(call.A).CallID == id || c.Leg(call.B).CallID == id {
			return c
		}
	}
	return nil
}

func (s *Server) hangup(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Control == nil {
		writeError(w, http.StatusNotImplemented, "no SIP B2BUA: calls cannot be hung up")
		return
	}
	id := r.PathValue("id")
	c := s.findCall(id)
	if c == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no call %q in progress", id))
		return
	}
	if err := s.cfg.Control.Hangup(c.ID); err != nil {
		if _, still := s.cfg.Calls.Get(c.ID); !still {
			// It ended meanwhile.
			writeError(w, http.StatusNotFound, fmt.Sprintf("no call %q in progress: %v", id, err))
			return
		}
		s.log.Warn("hang up", zap.String("call", c.ID), zap.Error(err))
		writeError(w, http.StatusInternalServerError, fmt.Sprintf("hang up %s: %v", c.ID, err))
		return
	}
	s.log.Info("call hung up through the admin API", zap.String("call", c.ID), zap.String("sip_call_id", c.Leg(call.A).CallID))
	writeJSON(w, http.StatusOK, c.Info())
}

// DefaultDrainTimeout is the drain timeout of a POST /v1/drain without one.
const DefaultDrainTimeout = 10 * time.Minute

func (s *Server) drainStatus(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Control == nil {
		writeError(w, http.StatusNotImplemented, "no SIP B2BUA: nothing to drain")
		return
	}
	draining, calls := s.cfg.Control.DrainStatus()
	writeJSON(w, http.StatusOK, DrainStatus{Draining: draining, Calls: calls})
}

func (s *Server) drain(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Control == nil {
		writeError(w, http.StatusNotImplemented, "no SIP B2BUA: nothing to drain")
		return
	}
	var req DrainRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", mbe.Limit))
			return
		}
		writeError(w, http.StatusBadRequest, fmt.Sprintf("read body: %v", err))
		return
	}
	if len(bytes.TrimSpace(body)) > 0 { // no body: the default timeout
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("bad JSON: %v", err))
			return
		}
	}
	timeout := DefaultDrainTimeout
	if req.Timeout != "" {
		d, err := time.ParseDuration(req.Timeout)
		if err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout: %q is not a positive duration (such as 10m)", req.Timeout))
			return
		}
		timeout = d
	}
	s.cfg.Control.Drain(timeout)
	draining, calls := s.cfg.Control.DrainStatus()
	s.log.Info("drain started through the admin API", zap.Duration("timeout", timeout), zap.Int("calls", calls))
	writeJSON(w, http.StatusAccepted, DrainStatus{Draining: draining, Calls: calls, Timeout: timeout.String()})
}

// fail answers with the status for err.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := StatusFor(err)
	if code >= 500 && code != http.StatusNotImplemented {
		s.log.Warn("admin request", zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Error(err))
	}
	writeError(w, code, err.Error())
}

// StatusFor maps flow manager and data plane errors to HTTP status codes.
func StatusFor(err error) int {
	switch {
	case errors.Is(err, control.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, control.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, control.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, control.ErrNotRelayAddress), errors.Is(err, control.ErrDeniedDestination):
		return http.StatusUnprocessableEntity
	case errors.Is(err, control.ErrNotImplemented), errors.Is(err, dataplane.ErrNotSupported):
		return http.StatusNotImplemented
	case errors.Is(err, dataplane.ErrFull):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func flowID(w http.ResponseWriter, r *http.Request) (uint64, bool) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil || id == 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("flow id %q is not a positive integer", r.PathValue("id")))
		return 0, false
	}
	return id, true
}

// decodeJSON decodes exactly one JSON object with no unknown fields.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		if errors.Is(err, io.EOF) {
			return errors.New("empty body: want a JSON object")
		}
		return fmt.Errorf("bad JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return errors.New("bad JSON: data after the object")
	}
	return nil
}

func parseAddrPort(field, s string, required bool) (netip.AddrPort, error) {
	if s == "" {
		if required {
			return netip.AddrPort{}, fmt.Errorf("%s: required", field)
		}
		return netip.AddrPort{}, nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%s: %q is not address:port (IPv6 as [addr]:port)", field, s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// toSpec converts a request to a flow spec; errors are 400s.
func toSpec(req FlowRequest) (control.FlowSpec, error) {
	var spec control.FlowSpec
	var err error
	if spec.Match, err = parseAddrPort("match", req.Match, true); err != nil {
		return spec, err
	}
	if spec.ExpectSource, err = parseAddrPort("expect_source", req.ExpectSource, false); err != nil {
		return spec, err
	}
	if spec.SendFrom, err = parseAddrPort("send_from", req.SendFrom, false); err != nil {
		return spec, err
	}
	if spec.SendTo, err = parseAddrPort("send_to", req.SendTo, false); err != nil {
		return spec, err
	}
	if spec.Reverse, err = parseAddrPort("reverse", req.Reverse, false); err != nil {
		return spec, err
	}
	spec.Latch = req.Latch
	switch req.Mode {
	case "", "xdp", "userspace":
		spec.Mode = dataplane.Path(req.Mode)
	default:
		return spec, fmt.Errorf("mode: %q is not xdp or userspace", req.Mode)
	}
	spec.Action = dataplane.Forward
	switch req.Action {
	case "", "forward":
	case "drop":
		spec.Action = dataplane.Drop
	case "reflect":
		spec.Action = dataplane.Reflect
	default:
		return spec, fmt.Errorf("action: %q is not forward, drop or reflect", req.Action)
	}
	spec.ClockRate = DefaultClockRate
	if req.ClockRate != nil {
		spec.ClockRate = *req.ClockRate
	}
	spec.RateCap = req.RateCapPPS
	if req.Decrypt != nil {
		spec.Decrypt = &control.Crypto{Suite: req.Decrypt.Suite, Key: req.Decrypt.Key}
	}
	if req.Transcode != nil {
		if spec.Transcode, err = toTranscode(*req.Transcode); err != nil {
			return spec, fmt.Errorf("transcode: %w", err)
		}
	}
	if req.Encrypt != nil {
		spec.Encrypt = &control.Crypto{Suite: req.Encrypt.Suite, Key: req.Encrypt.Key}
	}
	return spec, nil
}

// staticPT is the static RTP payload type of each codec relayd transcodes.
var staticPT = map[string]uint8{"PCMU": 0, "PCMA": 8, "G729": 18}

// toTranscode converts the wire form; the data plane's Validate checks
// the rest (ptimes, distinct payload types).
func toTranscode(t Transcode) (*dataplane.Transcode, error) {
	codec := func(field, name string, pt *uint8, ptime, event, cn uint8, vad bool) (dataplane.Codec, error) {
		n, ok := dataplane.TranscodeCodec(name)
		if !ok {
			return dataplane.Codec{}, fmt.Errorf("%s: %q is not PCMU, PCMA or G729", field, name)
		}
		c := dataplane.Codec{Name: n, PT: staticPT[n], Ptime: ptime, Event: event, CN: cn, VAD: vad}
		if pt != nil {
			c.PT = *pt
		}
		if c.Ptime == 0 {
			c.Ptime = 20
		}
		return c, nil
	}
	in, err := codec("from", t.From, t.PTFrom, t.PtimeFrom, t.EventFrom, t.CNFrom, t.VADFrom)
	if err != nil {
		return nil, err
	}
	out, err := codec("to", t.To, t.PTTo, t.PtimeTo, t.EventTo, t.CNTo, t.VADTo)
	if err != nil {
		return nil, err
	}
	dt := &dataplane.Transcode{In: in, Out: out, SSRC: t.SSRC}
	if dt.RTCPFrom, err = parseAddrPort("rtcp_from", t.RTCPFrom, false); err != nil {
		return nil, err
	}
	if dt.RTCPTo, err = parseAddrPort("rtcp_to", t.RTCPTo, false); err != nil {
		return nil, err
	}
	return dt, nil
}

// fromTranscode is the wire form of t.
func fromTranscode(t *dataplane.Transcode) *Transcode {
	in, out := t.In.PT, t.Out.PT
	return &Transcode{
		From: t.In.Name, To: t.Out.Name, PtimeFrom: t.In.Ptime, PtimeTo: t.Out.Ptime,
		PTFrom: &in, PTTo: &out, EventFrom: t.In.Event, EventTo: t.Out.Event,
		CNFrom: t.In.CN, CNTo: t.Out.CN, VADFrom: t.In.VAD, VADTo: t.Out.VAD, SSRC: t.SSRC,
		RTCPFrom: addrPortString(t.RTCPFrom), RTCPTo: addrPortString(t.RTCPTo),
	}
}

func addrPortString(ap netip.AddrPort) string {
	if !ap.IsValid() {
		return ""
	}
	return ap.String()
}

func toWire(f control.FlowState) Flow {
	fl, st := f.Flow, f.Stats
	out := Flow{
		ID:           fl.ID,
		Match:        addrPortString(fl.Match),
		ExpectSource: addrPortString(fl.ExpectSource),
		SendFrom:     addrPortString(fl.SendFrom),
		SendTo:       addrPortString(fl.SendTo),
		Latch:        fl.Latch,
		Reverse:      addrPortString(fl.Reverse),
		Mode:         string(f.Path),
		Action:       fl.Action.String(),
		ClockRate:    fl.ClockRate,
		RateCapPPS:   fl.RateCap.PPS,
		Path:         string(f.Path),
		Packets:      st.Packets,
		Bytes:        st.Bytes,
		Dropped:      st.Dropped,
		Lost:         st.Lost,
		JitterMS:     math.Round(st.JitterMillis(fl.ClockRate)*1000) / 1000,
		SSRC:         st.SSRC,
		Received:     st.Received,
	}
	if !st.LastSeen.IsZero() {
		ts := st.LastSeen.UTC().Format(TimeFormat)
		out.LastSeen = &ts
	}
	if fl.Transcode != nil {
		out.Transcode = fromTranscode(fl.Transcode)
		out.TranscodeStats = &TranscodeStats{
			FramesIn: st.FramesIn, FramesOut: st.FramesOut, Concealed: st.Concealed,
			SentPackets: st.SentPackets, Events: st.Events, RTCPSent: st.RTCPSent,
			MaxHoldMS: float64(st.MaxHoldNanos) / 1e6,
		}
	}
	// The suite, never the key: keys go in, they do not come out.
	if fl.Decrypt != nil {
		out.Decrypt = &Crypto{Suite: fl.Decrypt.Suite}
	}
	if fl.Encrypt != nil {
		out.Encrypt = &Crypto{Suite: fl.Encrypt.Suite}
	}
	return out
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		code = http.StatusInternalServerError
		b, _ = json.Marshal(ErrorBody{Error: "encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, ErrorBody{Error: msg})
}
