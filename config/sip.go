package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/relayd/relayd/dataplane"
)

// SIP is the [sip] section. Without listen addresses the B2BUA is off.
// The string fields are what the file says; the fields below them are
// filled in by validation (only when the B2BUA is on).
type SIP struct {
	// Listen lists "udp:ADDR:PORT", "tcp:ADDR:PORT" and "tls:ADDR:PORT"
	// (IPv6 as [addr]).
	Listen []string `toml:"listen"`
	// TLSCert and TLSKey are the PEM certificate (chain) and private key
	// of the tls: listeners; required by them. The key file must be
	// private, like AuthFile.
	TLSCert string `toml:"tls_cert"`
	TLSKey  string `toml:"tls_key"`
	// TLSCA is a PEM file of the CAs that sign the certificates of TLS
	// destinations (transport=tls); empty: the system's roots.
	TLSCA string `toml:"tls_ca"`
	// MaxCallDuration ends answered calls after this long; "0s" or unset:
	// no limit.
	MaxCallDuration string `toml:"max_call_duration"`
	// RateLimit is the number of new INVITEs per second accepted from one
	// source address (a burst of RateBurst); more get 503. 0: no limit.
	RateLimit float64 `toml:"rate_limit"`
	RateBurst int     `toml:"rate_burst"` // default 2 x rate_limit, at least 1
	// MaxCalls bounds concurrent calls (503 beyond); 0: no limit.
	MaxCalls int `toml:"max_calls"`
	// RetryAfter is the Retry-After of 503s for exhausted ports, rate
	// limits and max_calls; default "5s".
	RetryAfter string `toml:"retry_after"`
	// WaitTimer is how long a transaction that ended with a final
	// response stays over UDP to absorb retransmissions: RFC 3261's
	// Timer D (an INVITE relayd sent that was refused) and Timer J (a
	// non-INVITE request relayd answered). Default "32s", the RFC's
	// values; 1s to 32s. Kamailio's tm keeps such transactions 5s
	// (wt_timer). The transactions of answered INVITEs keep 64*T1
	// whatever this says (their 2xx retransmissions and ACKs need it),
	// or until their call ends if that comes first.
	WaitTimer string `toml:"wait_timer"`
	// AuthFile holds the digest credentials of the routes' auth_users:
	// "user:password" lines, "#" comments. It must be a regular file of
	// root's (or of the user relayd runs as) that nobody else may read or
	// write: Load refuses it otherwise. Absolute; required by auth_users.
	AuthFile string `toml:"auth_file"`
	// AuthRealm is the realm of relayd's digest challenges; default
	// "relayd". Passwords are per realm: changing it invalidates nothing
	// in the file (it holds passwords, not hashes).
	AuthRealm string `toml:"auth_realm"`
	// AuthAlgorithms are the digest algorithms relayd challenges with,
	// most preferred first (RFC 8760): "SHA-256", "MD5"; default both, in
	// that order. UAs that read only the first challenge and know only
	// MD5 need ["MD5"].
	AuthAlgorithms []string `toml:"auth_algorithms"`

	// Credentials are AuthFile's users, read by Load; nil from Parse.
	Credentials *Credentials `toml:"-"`
	// TLSCertificate is TLSCert and TLSKey, TLSRoots TLSCA, read by Load;
	// nil from Parse and when unset.
	TLSCertificate *tls.Certificate `toml:"-"`
	TLSRoots       *x509.CertPool   `toml:"-"`

	Listeners       []Listener    `toml:"-"`
	MaxDuration     time.Duration `toml:"-"`
	RetryAfterDur   time.Duration `toml:"-"`
	RateBurstParsed int           `toml:"-"`
	WaitDuration    time.Duration `toml:"-"` // parsed WaitTimer
}

// Listener is a parsed sip.listen entry.
type Listener struct {
	Network string // udp | tcp | tls
	Addr    netip.AddrPort
}

// Enabled reports whether the B2BUA runs.
func (s *SIP) Enabled() bool { return len(s.Listen) > 0 }

// Route is one [[route]] table.
type Route struct {
	Name           string   `toml:"name"`
	Match          string   `toml:"match"`           // regular expression on the Request-URI user part
	Destinations   []string `toml:"destinations"`    // SIP URIs, tried in order
	Order          string   `toml:"order"`           // ordered (default) | random | weighted
	Weights        []int    `toml:"weights"`         // with order = "weighted": one per destination
	AttemptTimeout string   `toml:"attempt_timeout"` // default 2s
	FailoverOn     []int    `toml:"failover_on"`     // default 404 408 480 500 502 503 603
	SRTP           string   `toml:"srtp"`            // off (default) | offer | require, toward the destination
	Codecs         []string `toml:"codecs"`          // allowed codecs; empty: all
	// Transcode lists codecs (PCMU, PCMA, G729) offered to the callee when
	// the caller's offer lacks them, which relayd makes by transcoding
	// (docs/routing.md). Validation turns the names into canonical case.
	Transcode []string `toml:"transcode"`
	// CallerInterface and CalleeInterface name the media interfaces of the
	// caller's and the callee's legs ([[media.interface]]); empty: the
	// default.
	CallerInterface string `toml:"caller_interface"`
	CalleeInterface string `toml:"callee_interface"`
	// Allow lists the sources this route takes calls from: addresses
	// ("198.18.0.2") and networks ("198.18.0.0/24"), or "any". A call
	// from elsewhere skips the route; one that no matching route takes
	// gets 403. Unset: any source, for configs written before the key
	// existed, with a warning (Warnings).
	Allow []string `toml:"allow"`
	// AuthUsers, when set, are the users (of [sip] auth_file) who may call
	// through this route: a call without their digest credentials gets a
	// challenge (401), one with wrong ones 403 (docs/routing.md).
	AuthUsers []string `toml:"auth_users"`
	// SDESTLSOnly keeps SDES keys (a=crypto) off plain transports: a call
	// whose offer or answer would carry keys over UDP or TCP, on either
	// leg, gets 488 with a Warning instead (docs/routing.md).
	SDESTLSOnly bool `toml:"sdes_tls_only"`

	Regexp                 *regexp.Regexp `toml:"-"`
	AttemptTimeoutDuration time.Duration  `toml:"-"`
	// AllowPrefixes is the parsed Allow; nil when Allow is unset (any
	// source). "any" is 0.0.0.0/0 and ::/0.
	AllowPrefixes []netip.Prefix `toml:"-"`
}

// Open reports whether the route takes calls from anyone without the
// operator having said so: no allow list and no auth_users.
func (r *Route) Open() bool { return r.Allow == nil && len(r.AuthUsers) == 0 }

// DefaultAuthAlgorithms are the digest algorithms offered when
// auth_algorithms is not set, in RFC 8760's order of preference.
var DefaultAuthAlgorithms = []string{"SHA-256", "MD5"}

// DefaultFailoverOn are the final codes that make a route try its next
// destination when failover_on is not set.
var DefaultFailoverOn = []int{404, 408, 480, 500, 502, 503, 603}

// RouteServer is the [route_server] section.
type RouteServer struct {
	URL     string `toml:"url"`     // http(s) URL; empty: no route server
	Timeout string `toml:"timeout"` // default 1s

	TimeoutDuration time.Duration `toml:"-"`
}

// CDR is the [cdr] section.
type CDR struct {
	Path          string `toml:"path"`           // JSON lines file; empty: no CDR file
	PostURL       string `toml:"post_url"`       // POST each CDR here; empty: off
	MaxSize       int64  `toml:"max_size"`       // rotate past this many bytes; default 100 MiB
	Keep          int    `toml:"keep"`           // rotated files kept; default 10
	FsyncInterval string `toml:"fsync_interval"` // default 1s
	QueueSize     int    `toml:"queue_size"`     // CDRs waiting for post_url; default 10000

	FsyncDuration time.Duration `toml:"-"`
}

// validateSIP checks [sip], [[route]], [route_server] and [cdr] and fills
// in their parsed fields.
func (c *Config) validateSIP(bad, warn func(key, format string, args ...any)) {
	s := &c.SIP
	for _, l := range s.Listen {
		ln, err := ParseListener(l)
		if err != nil {
			bad("sip.listen", "%v", err)
			continue
		}
		s.Listeners = append(s.Listeners, ln)
	}
	if s.MaxCallDuration != "" {
		d, err := time.ParseDuration(s.MaxCallDuration)
		if err != nil || d < 0 {
			bad("sip.max_call_duration", "%q is not a non-negative duration (like 2h)", s.MaxCallDuration)
		}
		s.MaxDuration = d
	}
	if s.WaitTimer != "" {
		d, err := time.ParseDuration(s.WaitTimer)
		if err != nil || d < time.Second || d > 32*time.Second {
			bad("sip.wait_timer", "%q is not a duration from 1s to 32s", s.WaitTimer)
		}
		s.WaitDuration = d
	}
	if s.RateLimit < 0 {
		bad("sip.rate_limit", "%v is negative", s.RateLimit)
	}
	if s.RateBurst < 0 {
		bad("sip.rate_burst", "%d is negative", s.RateBurst)
	}
	if s.MaxCalls < 0 {
		bad("sip.max_calls", "%d is negative", s.MaxCalls)
	}
	if s.Enabled() {
		if s.WaitDuration == 0 {
			s.WaitDuration = 32 * time.Second
		}
		s.RateBurstParsed = s.RateBurst
		if s.RateBurstParsed == 0 {
			s.RateBurstParsed = max(1, int(2*s.RateLimit))
		}
		ra := s.RetryAfter
		if ra == "" {
			ra = "5s"
		}
		d, err := time.ParseDuration(ra)
		if err != nil || d < time.Second {
			bad("sip.retry_after", "%q is not a duration of at least 1s", ra)
		}
		s.RetryAfterDur = d
	} else if s.RetryAfter != "" {
		if _, err := time.ParseDuration(s.RetryAfter); err != nil {
			bad("sip.retry_after", "%q is not a duration", s.RetryAfter)
		}
	}

	hasTLS := slices.ContainsFunc(s.Listeners, func(l Listener) bool { return l.Network == "tls" })
	for _, k := range []struct{ key, path string }{{"sip.tls_cert", s.TLSCert}, {"sip.tls_key", s.TLSKey}, {"sip.tls_ca", s.TLSCA}} {
		if k.path != "" && !filepath.IsAbs(k.path) {
			bad(k.key, "%q is not an absolute path", k.path)
		}
	}
	switch {
	case hasTLS && (s.TLSCert == "" || s.TLSKey == ""):
		bad("sip.tls_cert", "a tls: listener needs tls_cert and tls_key")
	case !hasTLS && (s.TLSCert != "" || s.TLSKey != ""):
		bad("sip.tls_cert", "tls_cert and tls_key are for tls: listeners, and sip.listen has none")
	}
	if s.AuthFile != "" && !filepath.IsAbs(s.AuthFile) {
		bad("sip.auth_file", "%q is not an absolute path", s.AuthFile)
	}
	if s.AuthRealm == "" {
		s.AuthRealm = "relayd"
	} else if strings.ContainsAny(s.AuthRealm, "\"\\") || strings.ContainsFunc(s.AuthRealm, unicode.IsControl) {
		bad("sip.auth_realm", "%q: no quotes, backslashes or control characters", s.AuthRealm)
	}
	if s.AuthAlgorithms == nil {
		s.AuthAlgorithms = slices.Clone(DefaultAuthAlgorithms)
	} else if len(s.AuthAlgorithms) == 0 {
		bad("sip.auth_algorithms", "empty: name SHA-256, MD5 or both (most preferred first)")
	}
	for k, a := range s.AuthAlgorithms {
		u := strings.ToUpper(a)
		switch {
		case u != "SHA-256" && u != "MD5":
			bad("sip.auth_algorithms", "%q is not SHA-256 or MD5", a)
		case slices.Contains(s.AuthAlgorithms[:k], u):
			bad("sip.auth_algorithms", "%q listed twice", a)
		}
		s.AuthAlgorithms[k] = u
	}

	names := make(map[string]bool)
	for i := range c.Routes {
		r := &c.Routes[i]
		key := func(k string) string { return fmt.Sprintf("route[%d].%s", i, k) }
		if r.Name == "" {
			bad(key("name"), "required")
		} else if names[r.Name] {
			bad(key("name"), "route %q defined twice", r.Name)
		}
		names[r.Name] = true
		re, err := regexp.Compile(r.Match)
		if err != nil {
			bad(key("match"), "%q is not a regular expression: %v", r.Match, err)
		}
		r.Regexp = re
		if len(r.Destinations) == 0 && c.RouteServer.URL == "" {
			bad(key("destinations"), "need at least one destination (or a [route_server])")
		}
		for _, d := range r.Destinations {
			tr, err := checkSIPURI(d)
			switch {
			case err != nil:
				bad(key("destinations"), "%v", err)
			case tr == "tls" && !hasTLS && s.Enabled():
				bad(key("destinations"), "%q is over TLS: sip.listen needs a tls: address, where the callee sends its requests", d)
			case tr != "tls" && r.SDESTLSOnly && (r.SRTP == "offer" || r.SRTP == "require"):
				bad(key("destinations"), "%q is over %s, and with srtp = %q relayd always offers keys toward the destination, which sdes_tls_only refuses: use transport=tls", d, tr, r.SRTP)
			}
		}
		switch r.Order {
		case "":
			r.Order = "ordered"
		case "ordered", "random":
		case "weighted":
			if len(r.Weights) != len(r.Destinations) {
				bad(key("weights"), "order weighted needs one weight per destination (%d, got %d)", len(r.Destinations), len(r.Weights))
			}
		default:
			bad(key("order"), "%q is not one of ordered, random, weighted", r.Order)
		}
		for _, w := range r.Weights {
			if w <= 0 {
				bad(key("weights"), "weight %d is not positive", w)
			}
		}
		if r.AttemptTimeout == "" {
			r.AttemptTimeout = "2s"
		}
		if d, err := time.ParseDuration(r.AttemptTimeout); err != nil || d <= 0 {
			bad(key("attempt_timeout"), "%q is not a positive duration (like 2s)", r.AttemptTimeout)
		} else {
			r.AttemptTimeoutDuration = d
		}
		if r.FailoverOn == nil {
			r.FailoverOn = slices.Clone(DefaultFailoverOn)
		}
		for _, code := range r.FailoverOn {
			if code < 300 || code > 699 {
				bad(key("failover_on"), "%d is not a final failure code (300-699)", code)
			}
		}
		switch r.SRTP {
		case "":
			r.SRTP = "off"
		case "off", "offer", "require":
		default:
			bad(key("srtp"), "%q is not one of off, offer, require", r.SRTP)
		}
		for _, codec := range r.Codecs {
			if codec == "" || strings.ContainsAny(codec, " /\t") {
				bad(key("codecs"), "%q is not a codec name (like PCMU)", codec)
			}
		}
		for k, codec := range r.Transcode {
			name, ok := dataplane.TranscodeCodec(codec)
			if !ok {
				bad(key("transcode"), "%q is not a codec relayd transcodes (PCMU, PCMA or G729)", codec)
				continue
			}
			r.Transcode[k] = name
		}
		r.AllowPrefixes = nil
		if r.Allow != nil && len(r.Allow) == 0 {
			// Not "nobody": a route no call can take is a mistake.
			bad(key("allow"), "empty: list the addresses or networks this route takes calls from, or \"any\"")
		}
		for _, a := range r.Allow {
			ps, err := parseSources(a)
			if err != nil {
				bad(key("allow"), "%v", err)
				continue
			}
			r.AllowPrefixes = append(r.AllowPrefixes, ps...)
		}
		for k, u := range r.AuthUsers {
			switch {
			case u == "" || strings.ContainsFunc(u, func(c rune) bool {
				return c == ':' || c == '"' || c == '\\' || unicode.IsSpace(c) || unicode.IsControl(c)
			}):
				bad(key("auth_users"), "%q is not a user name (no colon, quote, backslash or space)", u)
			case slices.Contains(r.AuthUsers[:k], u):
				bad(key("auth_users"), "%q listed twice", u)
			}
		}
		if len(r.AuthUsers) > 0 && s.AuthFile == "" {
			bad(key("auth_users"), "needs [sip] auth_file, which holds the users' passwords")
		}
		if s.Enabled() && r.Open() {
			warn(fmt.Sprintf("route[%d]", i), "route %q takes calls from any source: anyone who reaches the SIP listeners can call its destinations (toll fraud, if they are carriers); "+
				"set allow to the trusted peers or auth_users to the users who may call, or allow = [\"any\"] if something in front of relayd filters", r.Name)
		}
	}

	rs := &c.RouteServer
	if rs.URL != "" {
		if u, err := url.Parse(rs.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("route_server.url", "%q is not an http(s) URL", rs.URL)
		}
	}
	to := rs.Timeout
	if to == "" {
		to = "1s"
	}
	if d, err := time.ParseDuration(to); err != nil || d <= 0 {
		bad("route_server.timeout", "%q is not a positive duration", to)
	} else if rs.URL != "" || rs.Timeout != "" {
		rs.TimeoutDuration = d
	}

	cd := &c.CDR
	if cd.Path != "" && !filepath.IsAbs(cd.Path) {
		bad("cdr.path", "%q is not an absolute path", cd.Path)
	}
	if cd.PostURL != "" {
		if u, err := url.Parse(cd.PostURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("cdr.post_url", "%q is not an http(s) URL", cd.PostURL)
		}
	}
	if cd.MaxSize < 0 {
		bad("cdr.max_size", "%d is negative", cd.MaxSize)
	}
	if cd.Keep < 0 {
		bad("cdr.keep", "%d is negative", cd.Keep)
	}
	if cd.QueueSize < 0 {
		bad("cdr.queue_size", "%d is negative", cd.QueueSize)
	}
	if cd.FsyncInterval != "" {
		d, err := time.ParseDuration(cd.FsyncInterval)
		if err != nil || d <= 0 {
			bad("cdr.fsync_interval", "%q is not a positive duration", cd.FsyncInterval)
		}
		cd.FsyncDuration = d
	}
}

// parseSources parses an allow entry: an address, a network or "any".
func parseSources(a string) ([]netip.Prefix, error) {
	if a == "any" {
		return []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}, nil
	}
	p, err := netip.ParsePrefix(a)
	if err != nil {
		addr, aerr := netip.ParseAddr(a)
		if aerr != nil || addr.Zone() != "" {
			return nil, fmt.Errorf("%q is neither an address nor a network (like 198.18.0.0/24) nor \"any\"", a)
		}
		addr = addr.Unmap()
		p = netip.PrefixFrom(addr, addr.BitLen())
	}
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return []netip.Prefix{p.Masked()}, nil
}

// ParseListener parses "udp:ADDR:PORT", "tcp:ADDR:PORT" or
// "tls:ADDR:PORT".
func ParseListener(s string) (Listener, error) {
	network, addr, ok := strings.Cut(s, ":")
	if !ok || (network != "udp" && network != "tcp" && network != "tls") {
		return Listener{}, fmt.Errorf("%q: want udp:ADDR:PORT, tcp:ADDR:PORT or tls:ADDR:PORT", s)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return Listener{}, fmt.Errorf("%q: %q is not ADDR:PORT (IPv6 as [addr]:port)", s, addr)
	}
	if ap.Port() == 0 || ap.Addr().Zone() != "" {
		return Listener{}, fmt.Errorf("%q: need a non-zero port and no zone", s)
	}
	return Listener{Network: network, Addr: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}, nil
}

// checkSIPURI checks a destination, sip:HOST[:PORT][;transport=udp|tcp|tls],
// and returns its transport.
func checkSIPURI(s string) (string, error) {
	rest, ok := strings.CutPrefix(s, "sip:")
	if !ok {
		return "", fmt.Errorf("%q: want sip:HOST[:PORT][;transport=udp|tcp|tls]", s)
	}
	hostport, params, _ := strings.Cut(rest, ";")
	if _, hp, ok := strings.Cut(hostport, "@"); ok {
		hostport = hp
	}
	if hostport == "" {
		return "", fmt.Errorf("%q: no host", s)
	}
	if strings.HasPrefix(hostport, "[") || strings.Count(hostport, ":") == 1 {
		h, p, err := splitHostPort(hostport)
		if err != nil || h == "" {
			return "", fmt.Errorf("%q: bad host:port", s)
		}
		if p != "" {
			if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
				return "", fmt.Errorf("%q: port %q is not within 1-65535", s, p)
			}
		}
	}
	transport := "udp"
	for _, kv := range strings.Split(params, ";") {
		if v, ok := strings.CutPrefix(kv, "transport="); ok {
			if v != "udp" && v != "tcp" && v != "tls" {
				return "", fmt.Errorf("%q: transport %q (want udp, tcp or tls)", s, v)
			}
			transport = v
		}
	}
	return transport, nil
}

func splitHostPort(hp string) (host, port string, err error) {
	if strings.HasPrefix(hp, "[") {
		end := strings.Index(hp, "]")
		if end < 0 {
			return "", "", fmt.Errorf("missing ]")
		}
		host, rest := hp[1:end], hp[end+1:]
		if rest == "" {
			return host, "", nil
		}
		if !strings.HasPrefix(rest, ":") {
			return "", "", fmt.Errorf("junk after ]")
		}
		return host, rest[1:], nil
	}
	h, p, _ := strings.Cut(hp, ":")
	return h, p, nil
}
