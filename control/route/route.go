// Package route decides where a call goes: the [[route]] tables of the
// config (a regular expression on the Request-URI user part, destinations
// in order, random or weighted order, attempt timeout, the codes that fail
// over, the SRTP policy, codecs and transcoding toward the destination) and, when one
// is configured, an HTTP route server that authorizes the call and returns
// its destinations (docs/routing.md).
package route

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/dataplane"
)

// Errors Lookup returns; the SIP front-end maps them to responses.
var (
	// ErrNoRoute: no route matches (SIP 404).
	ErrNoRoute = errors.New("no route")
	// ErrServer: the route server is down, slow or answered nonsense (SIP 503).
	ErrServer = errors.New("route server unavailable")
	// ErrForbidden: routes match the user part, but none takes calls from
	// the caller's address (SIP 403). The route server is not asked: the
	// local routes have decided.
	ErrForbidden = errors.New("forbidden")
	// ErrAuthRequired: the first route that matches the user part and
	// takes the source has auth_users, and the call carries no accepted
	// credentials (SIP 401 with a challenge, or 403 for credentials
	// refused).
	ErrAuthRequired = errors.New("authentication required")
)

// Rejected is returned when the route server refuses the call with a SIP
// code (SIP: that code).
type Rejected struct {
	Code   int
	Reason string
}

func (r *Rejected) Error() string {
	return fmt.Sprintf("rejected by route server: %d %s", r.Code, r.Reason)
}

// Policy is the SRTP policy toward a destination; the call layer applies
// it (call.Policy). A route has one of the three below.
type Policy = call.Policy

const (
	SRTPOff     = call.SRTPOff     // plain RTP/AVP, no a=crypto (relayd terminates the caller's SRTP)
	SRTPOffer   = call.SRTPOffer   // RTP/AVP with a=crypto: SRTP if the callee takes it
	SRTPRequire = call.SRTPRequire // RTP/SAVP with a=crypto: the callee must do SRTP
)

// Destination is one place to try.
type Destination struct {
	URI       string // as configured, e.g. sip:198.18.2.2:5060;transport=tcp
	User      string // user part, if the URI has one (else the caller's)
	Host      string
	Port      int    // 0: 5060, 5061 over TLS
	Transport string // udp | tcp | tls
}

// ParseDestination parses sip:[user@]host[:port][;transport=udp|tcp|tls].
func ParseDestination(s string) (Destination, error) {
	rest, ok := strings.CutPrefix(s, "sip:")
	if !ok {
		return Destination{}, fmt.Errorf("destination %q: want sip:HOST[:PORT][;transport=udp|tcp|tls]", s)
	}
	d := Destination{URI: s, Transport: "udp"}
	hostport, params, _ := strings.Cut(rest, ";")
	if u, hp, ok := strings.Cut(hostport, "@"); ok {
		d.User, hostport = u, hp
	}
	host, port := hostport, ""
	if strings.HasPrefix(hostport, "[") {
		end := strings.Index(hostport, "]")
		if end < 0 {
			return Destination{}, fmt.Errorf("destination %q: missing ]", s)
		}
		host, port = hostport[1:end], strings.TrimPrefix(hostport[end+1:], ":")
	} else if h, p, ok := strings.Cut(hostport, ":"); ok {
		host, port = h, p
	}
	if host == "" {
		return Destination{}, fmt.Errorf("destination %q: no host", s)
	}
	d.Host = host
	if port != "" {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return Destination{}, fmt.Errorf("destination %q: bad port %q", s, port)
		}
		d.Port = int(n)
	}
	for _, kv := range strings.Split(params, ";") {
		if v, ok := strings.CutPrefix(kv, "transport="); ok {
			v = strings.ToLower(v)
			if v != "udp" && v != "tcp" && v != "tls" {
				return Destination{}, fmt.Errorf("destination %q: transport %q (want udp, tcp or tls)", s, v)
			}
			d.Transport = v
		}
	}
	return d, nil
}

// HostPort returns host:port with the default port, 5060 (5061 over
// TLS).
func (d Destination) HostPort() string {
	port := d.Port
	switch {
	case port == 0 && d.Transport == "tls":
		port = 5061
	case port == 0:
		port = 5060
	}
	return net.JoinHostPort(d.Host, strconv.Itoa(port))
}

// Route is a compiled [[route]].
type Route struct {
	Name           string
	match          func(string) bool
	destinations   []Destination
	order          string
	weights        []int
	AttemptTimeout time.Duration
	FailoverOn     []int
	SRTP           Policy
	Codecs         []string
	// Transcode are the codecs (canonical PCMU, PCMA, G729) offered to
	// the callee besides the caller's, which relayd transcodes to
	// (call.CodecPolicy.Transcode).
	Transcode []string
	// CallerInterface and CalleeInterface name the media interfaces of
	// the caller's and the callee's legs; "" is the default.
	CallerInterface, CalleeInterface string
	// allow are the sources the route takes calls from; nil: any.
	allow []netip.Prefix
	// AuthUsers, when set, are the digest users who may call through the
	// route (Facts.AuthUser).
	AuthUsers []string
	// SDESTLSOnly refuses calls whose SDES keys would cross a plain
	// transport (UDP, TCP) on either leg.
	SDESTLSOnly bool
}

// Takes reports whether the route takes calls from src.
func (r *Route) Takes(src netip.Addr) bool {
	if r.allow == nil {
		return true
	}
	src = src.Unmap()
	for _, p := range r.allow {
		if p.Contains(src) {
			return true
		}
	}
	return false
}

// Fails reports whether a final code makes the call try the next
// destination.
func (r *Route) Fails(code int) bool { return slices.Contains(r.FailoverOn, code) }

// defaultRoute is what a route server's answer runs under when no local
// route matched.
var defaultRoute = Route{
	Name:           "route_server",
	AttemptTimeout: 2 * time.Second,
	FailoverOn:     config.DefaultFailoverOn,
	SRTP:           SRTPOff,
}

// Facts are what relayd knows of a call when it routes it; the route
// server receives them as JSON.
type Facts struct {
	CallID string `json:"call_id"`
	From   string `json:"from"`
	To     string `json:"to"`
	User   string `json:"user"`   // Request-URI user part
	Source string `json:"source"` // caller's signalling address
	// AuthUser is the user the caller authenticated as (digest), if it
	// did.
	AuthUser string `json:"auth_user,omitempty"`
	Route    string `json:"route,omitempty"`
}

// Decision is where a call goes.
type Decision struct {
	Route        Route // settings (name, timeouts, failover codes, SRTP, codecs)
	Destinations []Destination

	// table is the routing table's own Route when Route is a copy of it.
	table *Route
}

// Shared returns the decision's route as a pointer that every call on
// it may keep, which nobody changes: the routing table's own when Route
// is its copy (no route server), else a copy of Route.
func (d *Decision) Shared() *Route {
	if d.table != nil {
		return d.table
	}
	rt := d.Route
	return &rt
}

// Router routes calls. Create it with New, replace its routes with
// Reload; safe for concurrent use.
type Router struct {
	log *zap.Logger
	tab atomic.Pointer[table]

	mu  sync.Mutex // guards rnd
	rnd *rand.Rand
}

// MaxDestinations bounds what a route server may return.
const MaxDestinations = 16

// table is one compiled set of routes and route server; never changed
// once built.
type table struct {
	routes []Route
	server string
	client *http.Client
}

// New compiles the routes (validated by config) and the route server.
func New(routes []config.Route, rs config.RouteServer, log *zap.Logger) (*Router, error) {
	r := &Router{log: log, rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	if err := r.Reload(routes, rs); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload compiles routes and rs and, if they are valid, makes them the
// ones every later Lookup uses; lookups in progress finish with the old
// ones. On error the routes in use stay.
func (r *Router) Reload(routes []config.Route, rs config.RouteServer) error {
	t, err := compile(routes, rs)
	if err != nil {
		return err
	}
	r.tab.Store(t)
	return nil
}

func compile(routes []config.Route, rs config.RouteServer) (*table, error) {
	r := &table{server: rs.URL}
	timeout := rs.TimeoutDuration
	if timeout <= 0 {
		timeout = time.Second
	}
	r.client = &http.Client{Timeout: timeout}
	for _, c := range routes {
		rt := Route{
			Name:           c.Name,
			order:          c.Order,
			weights:        slices.Clone(c.Weights),
			AttemptTimeout: c.AttemptTimeoutDuration,
			FailoverOn:     slices.Clone(c.FailoverOn),
			SRTP:           Policy(c.SRTP),
			Codecs:         slices.Clone(c.Codecs),
			Transcode:      slices.Clone(c.Transcode),

			CallerInterface: c.CallerInterface,
			CalleeInterface: c.CalleeInterface,
			AuthUsers:       slices.Clone(c.AuthUsers),
			SDESTLSOnly:     c.SDESTLSOnly,
		}
		if c.Allow != nil {
			rt.allow = slices.Clone(c.AllowPrefixes)
			if rt.allow == nil {
				rt.allow = []netip.Prefix{} // takes nobody (config refuses it)
			}
		}
		if c.Regexp == nil {
			return nil, fmt.Errorf("route %q: not validated", c.Name)
		}
		rt.match = c.Regexp.MatchString
		if rt.AttemptTimeout <= 0 {
			rt.AttemptTimeout = 2 * time.Second
		}
		if rt.SRTP == "" {
			rt.SRTP = SRTPOff
		}
		for _, d := range c.Destinations {
			dest, err := ParseDestination(d)
			if err != nil {
				return nil, fmt.Errorf("route %q: %w", c.Name, err)
			}
			rt.destinations = append(rt.destinations, dest)
		}
		r.routes = append(r.routes, rt)
	}
	return r, nil
}

// pick returns the first route whose match accepts the user part, whose
// allow list takes the source and, when it has auth_users, that lists
// f.AuthUser. Errors: ErrNoRoute when no route matches the user;
// ErrAuthRequired when the first route that matches and takes the source
// has auth_users and f.AuthUser is empty (routes after it are not tried:
// a caller who has not yet authenticated would otherwise fall through to
// them, never challenged); ErrForbidden when routes match but none takes
// the call.
func (t *table) pick(f Facts) (*Route, error) {
	src, _ := netip.ParseAddrPort(f.Source) // unparsable: no allow list contains it
	matched := false
	for i := range t.routes {
		rt := &t.routes[i]
		if !rt.match(f.User) {
			continue
		}
		matched = true
		if !rt.Takes(src.Addr()) {
			continue
		}
		if len(rt.AuthUsers) == 0 {
			return rt, nil
		}
		if f.AuthUser == "" {
			return nil, fmt.Errorf("user %q from %s, route %q: %w", f.User, src.Addr(), rt.Name, ErrAuthRequired)
		}
		if slices.Contains(rt.AuthUsers, f.AuthUser) {
			return rt, nil
		}
	}
	if matched && f.AuthUser != "" {
		return nil, fmt.Errorf("user %q from %s, authenticated as %q: %w", f.User, src.Addr(), f.AuthUser, ErrForbidden)
	}
	if matched {
		return nil, fmt.Errorf("user %q from %s: %w", f.User, src.Addr(), ErrForbidden)
	}
	return nil, fmt.Errorf("user %q: %w", f.User, ErrNoRoute)
}

// Check reports whether the local routes refuse a call before anything
// is set up for it: ErrForbidden, ErrAuthRequired (see Lookup). nil when
// a route takes it,
// and when none matches (Lookup then answers ErrNoRoute or asks the route
// server).
func (r *Router) Check(f Facts) error {
	_, err := r.tab.Load().pick(f)
	if errors.Is(err, ErrNoRoute) {
		return nil
	}
	return err
}

// Lookup returns the route and ordered destinations for a call: the
// first route whose match accepts the user part, whose allow list takes
// the source (f.Source) and whose auth_users, if any, list f.AuthUser;
// then, with a route server, the server's answer (bounded by its timeout
// and ctx). A call that routes match but none takes is ErrForbidden or
// ErrAuthRequired (see pick), without asking the route server.
func (r *Router) Lookup(ctx context.Context, f Facts) (Decision, error) {
	t := r.tab.Load()
	var d Decision
	rt, err := t.pick(f)
	switch {
	case err == nil:
		d.Route = *rt
		d.Destinations = r.ordered(rt)
		d.table = rt
	case !errors.Is(err, ErrNoRoute):
		return d, err
	}
	if t.server != "" {
		if rt == nil {
			d.Route = defaultRoute
		}
		f.Route = d.Route.Name
		d.table = nil // the server may change the route
		return r.ask(ctx, t, f, d)
	}
	return d, err
}

// Destinations returns every configured destination (for the addresses
// relayd may connect to).
func (r *Router) Destinations() []Destination {
	t := r.tab.Load()
	var out []Destination
	for i := range t.routes {
		out = append(out, t.routes[i].destinations...)
	}
	return out
}

// ordered returns a route's destinations in the order to try them.
func (r *Router) ordered(rt *Route) []Destination {
	out := slices.Clone(rt.destinations)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch rt.order {
	case "random":
		r.rnd.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	case "weighted":
		weights := slices.Clone(rt.weights)
		res := make([]Destination, 0, len(out))
		for len(out) > 0 {
			total := 0
			for _, w := range weights {
				total += w
			}
			pick, n := 0, r.rnd.IntN(max(total, 1))
			for i, w := range weights {
				if n < w {
					pick = i
					break
				}
				n -= w
			}
			res = append(res, out[pick])
			out = slices.Delete(out, pick, pick+1)
			weights = slices.Delete(weights, pick, pick+1)
		}
		out = res
	}
	return out
}

// ServerResponse is the route server's answer (docs/routing.md).
type ServerResponse struct {
	// Destinations are SIP URIs in the order to try.
	Destinations []string `json:"destinations"`
	// Reject, when set, refuses the call with this SIP code (400-699).
	Reject int    `json:"reject,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Optional overrides of the local route's settings.
	Route          string   `json:"route,omitempty"`
	AttemptTimeout string   `json:"attempt_timeout,omitempty"`
	SRTP           string   `json:"srtp,omitempty"`
	Codecs         []string `json:"codecs,omitempty"`
	Transcode      []string `json:"transcode,omitempty"`
}

// ask posts the facts to the route server and merges its answer into d.
func (r *Router) ask(ctx context.Context, t *table, f Facts, d Decision) (Decision, error) {
	body, _ := json.Marshal(f)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.server, bytes.NewReader(body))
	if err != nil {
		return d, fmt.Errorf("%w: %w", ErrServer, err)
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := t.client.Do(req)
	if err != nil {
		return d, fmt.Errorf("%w: %w", ErrServer, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return d, fmt.Errorf("%w: read answer: %w", ErrServer, err)
	}
	if resp.StatusCode != http.StatusOK {
		return d, fmt.Errorf("%w: status %s", ErrServer, resp.Status)
	}
	var sr ServerResponse
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&sr); err != nil {
		return d, fmt.Errorf("%w: bad JSON answer: %w", ErrServer, err)
	}
	r.log.Debug("route server answered", zap.String("call_id", f.CallID), zap.Duration("took", time.Since(start)),
		zap.Strings("destinations", sr.Destinations), zap.Int("reject", sr.Reject))
	if sr.Reject != 0 {
		if sr.Reject < 400 || sr.Reject > 699 {
			return d, fmt.Errorf("%w: reject code %d is not 400-699", ErrServer, sr.Reject)
		}
		return d, &Rejected{Code: sr.Reject, Reason: sr.Reason}
	}
	if len(sr.Destinations) == 0 {
		return d, fmt.Errorf("user %q: route server returned no destination: %w", f.User, ErrNoRoute)
	}
	if len(sr.Destinations) > MaxDestinations {
		sr.Destinations = sr.Destinations[:MaxDestinations]
	}
	d.Destinations = d.Destinations[:0:0]
	for _, s := range sr.Destinations {
		dest, err := ParseDestination(s)
		if err != nil {
			return d, fmt.Errorf("%w: %w", ErrServer, err)
		}
		d.Destinations = append(d.Destinations, dest)
	}
	if sr.Route != "" {
		d.Route.Name = sr.Route
	}
	if sr.AttemptTimeout != "" {
		t, err := time.ParseDuration(sr.AttemptTimeout)
		if err != nil || t <= 0 {
			return d, fmt.Errorf("%w: attempt_timeout %q", ErrServer, sr.AttemptTimeout)
		}
		d.Route.AttemptTimeout = t
	}
	switch Policy(sr.SRTP) {
	case "":
	case SRTPOff, SRTPOffer, SRTPRequire:
		d.Route.SRTP = Policy(sr.SRTP)
	default:
		return d, fmt.Errorf("%w: srtp %q", ErrServer, sr.SRTP)
	}
	if sr.Codecs != nil {
		d.Route.Codecs = sr.Codecs
	}
	if sr.Transcode != nil {
		tc := make([]string, 0, len(sr.Transcode))
		for _, n := range sr.Transcode {
			name, ok := dataplane.TranscodeCodec(n)
			if !ok {
				return d, fmt.Errorf("%w: transcode %q is not PCMU, PCMA or G729", ErrServer, n)
			}
			tc = append(tc, name)
		}
		d.Route.Transcode = tc
	}
	return d, nil
}
