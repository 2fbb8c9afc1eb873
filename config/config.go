// Package config reads relayd's TOML configuration file.
//
// Decoding is strict: a key relayd does not know, or a value of the wrong
// type, is an error naming the key and its line. Missing keys take the
// defaults documented on each field. After decoding, the values are
// validated and the parsed forms (addresses, port range, durations) are
// filled in, so callers never parse strings again.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/relayd/relayd/internal/secret"

	"github.com/pelletier/go-toml/v2"
)

// Config is relayd's configuration. Load and Parse return it validated,
// with defaults applied. The zero value is not valid; use Default for a
// base to modify.
type Config struct {
	// warnings are what validation let through but an operator most
	// likely does not mean (Warnings).
	warnings []string

	Log       Log       `toml:"log"`
	Admin     Admin     `toml:"admin"`
	Dataplane Dataplane `toml:"dataplane"`
	Media     Media     `toml:"media"`

	// The SIP B2BUA (control/sip); off without [sip] listen addresses.
	SIP         SIP         `toml:"sip"`
	Routes      []Route     `toml:"route"`
	RouteServer RouteServer `toml:"route_server"`
	CDR         CDR         `toml:"cdr"`
	// Calls kept across restarts; off without [state] path.
	State State `toml:"state"`
	// The rtpengine ng protocol (control/ng); off without [ng] listen.
	NG NG `toml:"ng"`
}

// Log is the [log] section.
type Log struct {
	Level  string `toml:"level"`  // debug | info | warn | error; default info
	Format string `toml:"format"` // json | console; default json
}

// Admin is the [admin] section.
type Admin struct {
	// Listen is where the admin HTTP API listens: "host:port" for TCP or
	// "unix:/path/to.sock" for a unix socket. Default 127.0.0.1:9900.
	Listen string `toml:"listen"`
	// TokenFile, when set, is a file (mode 0600 or stricter, root's)
	// whose first line is the bearer token every request but /healthz
	// must carry. Required when Listen is a TCP address other than
	// loopback. Read at start and again at every reload.
	TokenFile string `toml:"token_file"`
}

// MaxCoalesce bounds dataplane.coalesce (the userspace data plane's own
// bound, slowpath.MaxCoalesce).
const MaxCoalesce = 5 * time.Millisecond

// Dataplane is the [dataplane] section.
type Dataplane struct {
	Mode             string   `toml:"mode"`              // xdp | userspace; default xdp
	XDPMode          string   `toml:"xdp_mode"`          // native | generic; default native
	Interfaces       []string `toml:"interfaces"`        // where XDP attaches; required in mode xdp
	Workers          int      `toml:"workers"`           // userspace workers, 0 = one per online CPU
	CPUs             []int    `toml:"cpus"`              // explicit CPUs, one worker pinned on each; overrides workers
	EnableForwarding bool     `toml:"enable_forwarding"` // turn IP forwarding on for the interfaces; default false
	PinPath          string   `toml:"pin_path"`          // bpffs directory; default /sys/fs/bpf/relayd
	MaxFlows         int      `toml:"max_flows"`         // flow table size; default 65536
	// Coalesce is how long a busy userspace worker naps between reads
	// while packets gather (see relayd.toml(5)); default 200us,
	// "0s" off.
	Coalesce string `toml:"coalesce"`
	// PackFlows is how many flows a userspace worker takes before the
	// next one gets any (a transcoded flow counts as
	// slowpath.TranscodeLoad, an RTCP port's as none); past it on every
	// worker, the least loaded takes the call. Default 1024; 0 spreads
	// every call over the workers.
	PackFlows int `toml:"pack_flows"`
	// UserspaceIO is how the userspace workers receive: "socket"
	// (default: UDP sockets, the kernel's receive path) or "afxdp" (an
	// XDP program on interfaces redirects their flows' packets into
	// AF_XDP sockets; in mode xdp the relay program does it for the flows
	// it punts to the workers; see docs/architecture.md).
	UserspaceIO string `toml:"userspace_io"`
	// ControlProcs is how many Go Ps (GOMAXPROCS) the control plane (SIP,
	// ng, the admin API) runs on, beside the userspace workers that hold
	// one: 0 (default) by the control plane's load, from one up to one
	// per online CPU (or $GOMAXPROCS); N: N (fewer Ps cost less CPU per
	// SIP call and cap its throughput; see relayd.toml(5)).
	ControlProcs int `toml:"control_procs"`
	// WorkerScheduling is the userspace workers' scheduling policy, as
	// rtpengine's --scheduling: "default" (as relayd was started),
	// "other", "batch", "fifo" or "rr". WorkerPriority is their nice
	// value (-20 to 19) under default, other and batch, their real-time
	// priority (1 to 99) under fifo and rr. See relayd.toml(5).
	WorkerScheduling string `toml:"worker_scheduling"`
	WorkerPriority   int    `toml:"worker_priority"`

	CoalesceDuration time.Duration `toml:"-"` // parsed Coalesce
}

// Media is the [media] section. The string fields are what the file says;
// the fields below them are filled in by validation.
type Media struct {
	Address     string `toml:"address"`      // relay IPv4 media address
	Address6    string `toml:"address6"`     // relay IPv6 media address
	Ports       string `toml:"ports"`        // "A-B", A even, B odd; default 30000-39999
	Timeout     string `toml:"timeout"`      // no media this long ends a call; default 60s
	LatchWindow string `toml:"latch_window"` // symmetric RTP latching window; default 3s
	// RebindAfter is how long a locked source must be silent, while
	// packets from elsewhere arrive, before learning opens again (a NAT
	// that moved the peer); default 5s, "0s" never.
	RebindAfter string `toml:"rebind_after"`
	// RTCPInterval is the mean interval of the RTCP reports relayd sends
	// on each leg of a transcoded stream (it terminates RTCP there);
	// default 5s, RFC 3550's minimum. From 100ms to 60s.
	RTCPInterval string `toml:"rtcp_interval"`
	// Advertise and Advertise6 are what SDP names instead of Address and
	// Address6: the public side of a 1:1 NAT. Optional.
	Advertise  string `toml:"advertise"`
	Advertise6 string `toml:"advertise6"`
	// MaxSessions bounds the calls relayd carries at once, whichever
	// front end (SIP, ng) set them up: ng answers "Parallel session limit
	// reached", SIP 503. [sip] max_calls, when lower, bounds them for SIP
	// alone. 0: no limit.
	MaxSessions int `toml:"max_sessions"`
	// Interfaces are named media interfaces ([[media.interface]]), for a
	// relay with more than one media network. See MediaInterface.
	Interfaces []MediaInterface `toml:"interface"`
	// DenyDestinations are addresses or networks ("198.51.100.7",
	// "203.0.113.0/24", "2001:db8::/32") relayd never sends media to,
	// on top of what it always refuses: its own addresses, loopback,
	// multicast, broadcast, unspecified and link-local addresses (see
	// control/destpolicy). An offer or flow toward one is refused.
	DenyDestinations []string `toml:"deny_destinations"`
	// RateLimitFactor caps the packet rate of each flow at this multiple
	// of its codec's (4: a 20 ms stream, 50 packets/s, is capped at 200,
	// a 10 ms one at 400); what comes faster is dropped and counted. 0
	// turns every cap off. From 2 to 100 otherwise.
	RateLimitFactor uint32 `toml:"rate_limit_factor"`
	// RateLimitDefaultPPS caps a flow whose codec rate relayd does not
	// know (video and other streams, static flows); default 2000.
	RateLimitDefaultPPS uint32 `toml:"rate_limit_default_pps"`
	// RateLimitRTCPPPS caps the flow of an RTCP port (legs without
	// rtcp-mux); default 100.
	RateLimitRTCPPPS uint32 `toml:"rate_limit_rtcp_pps"`

	Addr            netip.Addr     `toml:"-"` // parsed Address; invalid when unset
	Addr6           netip.Addr     `toml:"-"` // parsed Address6; invalid when unset
	AdvertiseAddr   netip.Addr     `toml:"-"` // parsed Advertise; invalid when unset
	AdvertiseAddr6  netip.Addr     `toml:"-"` // parsed Advertise6; invalid when unset
	PortMin         uint16         `toml:"-"` // first port of Ports (even)
	PortMax         uint16         `toml:"-"` // last port of Ports (odd)
	TimeoutDuration time.Duration  `toml:"-"` // parsed Timeout
	LatchDuration   time.Duration  `toml:"-"` // parsed LatchWindow
	RebindDuration  time.Duration  `toml:"-"` // parsed RebindAfter; 0: never
	RTCPDuration    time.Duration  `toml:"-"` // parsed RTCPInterval
	DenyPrefixes    []netip.Prefix `toml:"-"` // parsed DenyDestinations, masked
}

// Limits on values.
const (
	MinPort     = 1024
	MaxMaxFlows = 1 << 24
	ifNameSize  = 16 // IFNAMSIZ, including the terminating NUL
)

// Default returns the configuration an empty file gives, before
// validation. It is not valid on its own: mode xdp needs interfaces and
// every configuration needs a media address.
func Default() *Config {
	return &Config{
		Log:   Log{Level: "info", Format: "json"},
		Admin: Admin{Listen: "127.0.0.1:9900"},
		Dataplane: Dataplane{
			Mode:        "xdp",
			XDPMode:     "native",
			PinPath:     "/sys/fs/bpf/relayd",
			MaxFlows:    65536,
			Coalesce:    "200us",
			PackFlows:   1024,
			UserspaceIO: "socket",

			WorkerScheduling: "default",
		},
		Media: Media{
			Ports:        "30000-39999",
			Timeout:      "60s",
			LatchWindow:  "3s",
			RebindAfter:  "5s",
			RTCPInterval: "5s",

			RateLimitFactor:     4,
			RateLimitDefaultPPS: 2000,
			RateLimitRTCPPPS:    100,
		},
	}
}

// Error is a configuration error. Key is the dotted TOML key
// ("media.ports"); Line is its 1-based line in the file, 0 when unknown
// (for example a required key that is missing).
type Error struct {
	Key  string
	Line int
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Warnings returns what the config allows but an operator most likely
// does not mean, one message per line like errors ("line 12: route[0]:
// ..."; Load prefixes the file): relayd logs them when it starts and
// reloads, and -check prints them.
func (c *Config) Warnings() []string { return slices.Clone(c.warnings) }

// Load reads and parses the file at path, and reads the files it names
// whose contents relayd needs (see SIP.Credentials).
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, lines, err := parse(data)
	if err == nil {
		err = c.loadFiles(lines)
	}
	if err == nil {
		for i, w := range c.warnings {
			c.warnings[i] = path + ": " + w
		}
	}
	if err != nil {
		// Name the file on every line of a joined error.
		var errs []error
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		} else {
			errs = []error{err}
		}
		for i, e := range errs {
			errs[i] = fmt.Errorf("%s: %w", path, e)
		}
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// Parse decodes a TOML document strictly, applies defaults and validates
// the result. Errors are *Error values, joined with errors.Join when there
// are several; each names its key and, where it can be found, its line.
func Parse(data []byte) (*Config, error) {
	c, _, err := parse(data)
	return c, err
}

func parse(data []byte) (*Config, map[string]int, error) {
	c := Default()
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, nil, decodeError(err)
	}
	lines := keyLines(data)
	if err := c.validate(lines); err != nil {
		return nil, nil, err
	}
	return c, lines, nil
}

// decodeError turns go-toml's errors into *Error values.
func decodeError(err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		errs := make([]error, 0, len(strict.Errors))
		for i := range strict.Errors {
			de := &strict.Errors[i]
			line, _ := de.Position()
			errs = append(errs, &Error{Key: strings.Join(de.Key(), "."), Line: line, Msg: "unknown key"})
		}
		return errors.Join(errs...)
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, _ := de.Position()
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		if m := typeMismatch.FindStringSubmatch(msg); m != nil {
			want := m[2]
			switch {
			case strings.HasPrefix(want, "config."):
				want = "a table"
			case want == "[]string":
				want = "an array of strings"
			case want == "int":
				want = "an integer"
			case want == "bool":
				want = "a boolean (true or false)"
			}
			msg = fmt.Sprintf("got a TOML %s, want %s", m[1], want)
		}
		return &Error{Key: strings.Join(de.Key(), "."), Line: line, Msg: msg}
	}
	return &Error{Msg: err.Error()}
}

// typeMismatch matches go-toml's type errors, which name Go types.
var typeMismatch = regexp.MustCompile(`^cannot decode TOML (\w+) into .* of type (.+)$`)

// validate checks c and fills in the parsed fields. lines maps dotted keys
// to their line in the document, for messages.
func (c *Config) validate(lines map[string]int) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Line: lines[key], Msg: fmt.Sprintf(format, args...)})
	}
	c.warnings = nil
	warn := func(key, format string, args ...any) {
		c.warnings = append(c.warnings, (&Error{Key: key, Line: lines[key], Msg: fmt.Sprintf(format, args...)}).Error())
	}

	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level) {
		bad("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	if !slices.Contains([]string{"json", "console"}, c.Log.Format) {
		bad("log.format", "%q is not one of json, console", c.Log.Format)
	}

	if err := checkListen(c.Admin.Listen); err != nil {
		bad("admin.listen", "%v", err)
	} else if c.Admin.TokenFile == "" && !LoopbackListen(c.Admin.Listen) {
		bad("admin.listen", "%q is reachable from other hosts and the admin API would take requests from anyone: "+
			"set admin.token_file (a bearer token every request must carry), or listen on loopback or a unix socket", c.Admin.Listen)
	}
	if f := c.Admin.TokenFile; f != "" {
		if !filepath.IsAbs(f) {
			bad("admin.token_file", "%q: the path must be absolute", f)
		} else if _, err := secret.ReadToken(f); err != nil {
			bad("admin.token_file", "%v", err)
		}
	}

	d := &c.Dataplane
	switch d.Mode {
	case "xdp":
		if len(d.Interfaces) == 0 {
			bad("dataplane.interfaces", "mode xdp needs at least one interface: name the interfaces media arrives and leaves on")
		}
	case "userspace":
	default:
		bad("dataplane.mode", "%q is not one of xdp, userspace", d.Mode)
	}
	switch d.UserspaceIO {
	case "socket":
	case "afxdp":
		// In mode xdp the relay program redirects into the sockets; it
		// needs the interfaces too (checked above).
		if d.Mode == "userspace" && len(d.Interfaces) == 0 {
			bad("dataplane.interfaces", "userspace_io afxdp needs at least one interface: name the interfaces media arrives on")
		}
	default:
		bad("dataplane.userspace_io", "%q is not one of socket, afxdp", d.UserspaceIO)
	}
	if !slices.Contains([]string{"native", "generic"}, d.XDPMode) {
		bad("dataplane.xdp_mode", "%q is not one of native, generic", d.XDPMode)
	}
	seen := make(map[string]bool)
	for _, name := range d.Interfaces {
		switch {
		case name == "":
			bad("dataplane.interfaces", "empty interface name")
		case len(name) >= ifNameSize:
			bad("dataplane.interfaces", "interface name %q is longer than %d bytes", name, ifNameSize-1)
		case strings.ContainsAny(name, "/ \t\n\x00") || name == "." || name == "..":
			bad("dataplane.interfaces", "%q is not a valid interface name", name)
		case seen[name]:
			bad("dataplane.interfaces", "interface %q listed twice", name)
		}
		seen[name] = true
	}
	if d.Workers < 0 {
		bad("dataplane.workers", "%d is negative (0 means one per online CPU)", d.Workers)
	}
	if d.ControlProcs < 0 {
		bad("dataplane.control_procs", "%d is negative (0 means set by the load, up to one per online CPU)", d.ControlProcs)
	}
	cpuSeen := make(map[int]bool)
	for _, cpu := range d.CPUs {
		switch {
		case cpu < 0 || cpu >= runtime.NumCPU():
			bad("dataplane.cpus", "CPU %d is not online (0-%d)", cpu, runtime.NumCPU()-1)
		case cpuSeen[cpu]:
			bad("dataplane.cpus", "CPU %d listed twice", cpu)
		}
		cpuSeen[cpu] = true
	}
	if d.PinPath == "" || !filepath.IsAbs(d.PinPath) {
		bad("dataplane.pin_path", "%q is not an absolute path", d.PinPath)
	}
	if d.MaxFlows < 1 || d.MaxFlows > MaxMaxFlows {
		bad("dataplane.max_flows", "%d is not within 1-%d", d.MaxFlows, MaxMaxFlows)
	}
	if d.PackFlows < 0 || d.PackFlows > MaxMaxFlows {
		bad("dataplane.pack_flows", "%d is not within 0 (spread every call over the workers)-%d", d.PackFlows, MaxMaxFlows)
	}
	if dur, err := time.ParseDuration(d.Coalesce); err != nil {
		bad("dataplane.coalesce", "%q is not a duration (like 200us; 0s turns it off)", d.Coalesce)
	} else if dur < 0 || dur > MaxCoalesce {
		bad("dataplane.coalesce", "%s is not within 0s-%s", d.Coalesce, MaxCoalesce)
	} else {
		d.CoalesceDuration = dur
	}

	switch d.WorkerScheduling {
	case "default", "other", "batch":
		if d.WorkerPriority < -20 || d.WorkerPriority > 19 {
			bad("dataplane.worker_priority", "%d is not a nice value (-20, the highest, to 19) as worker_scheduling %q takes", d.WorkerPriority, d.WorkerScheduling)
		}
	case "fifo", "rr":
		if d.WorkerPriority < 1 || d.WorkerPriority > 99 {
			bad("dataplane.worker_priority", "%d is not a real-time priority (1 to 99) as worker_scheduling %q takes", d.WorkerPriority, d.WorkerScheduling)
		}
	default:
		bad("dataplane.worker_scheduling", "%q is not default, other, batch, fifo or rr", d.WorkerScheduling)
	}

	m := &c.Media
	if m.Address == "" && m.Address6 == "" && len(m.Interfaces) == 0 {
		bad("media.address", "need a relay media address (address or address6, or a [[media.interface]])")
	}
	parseAddrs("media", &m.Address, &m.Address6, &m.Advertise, &m.Advertise6,
		&m.Addr, &m.Addr6, &m.AdvertiseAddr, &m.AdvertiseAddr6, bad)
	lo, hi, err := ParsePortRange(m.Ports)
	if err != nil {
		bad("media.ports", "%v", err)
	}
	m.PortMin, m.PortMax = lo, hi
	c.validateInterfaces(bad)
	c.validateDeny(bad)
	if m.TimeoutDuration, err = time.ParseDuration(m.Timeout); err != nil {
		bad("media.timeout", "%q is not a duration (like 60s)", m.Timeout)
	} else if m.TimeoutDuration <= 0 {
		bad("media.timeout", "%s is not positive", m.Timeout)
	}
	if m.LatchDuration, err = time.ParseDuration(m.LatchWindow); err != nil {
		bad("media.latch_window", "%q is not a duration (like 3s)", m.LatchWindow)
	} else if m.LatchDuration < 0 {
		bad("media.latch_window", "%s is negative", m.LatchWindow)
	}
	if m.RebindDuration, err = time.ParseDuration(m.RebindAfter); err != nil {
		bad("media.rebind_after", "%q is not a duration (like 5s; 0s: never)", m.RebindAfter)
	} else if m.RebindDuration < 0 {
		bad("media.rebind_after", "%s is negative", m.RebindAfter)
	}
	if m.RTCPDuration, err = time.ParseDuration(m.RTCPInterval); err != nil {
		bad("media.rtcp_interval", "%q is not a duration (like 5s)", m.RTCPInterval)
	} else if m.RTCPDuration < 100*time.Millisecond || m.RTCPDuration > time.Minute {
		bad("media.rtcp_interval", "%s is not from 100ms to 60s", m.RTCPInterval)
	}
	c.validateRates(bad)
	c.validateSIP(bad, warn)
	c.validateState(bad)
	c.validateNG(bad)
	return errors.Join(errs...)
}

// LoopbackListen reports whether an admin listen address is reachable
// from this host only: a unix socket, or TCP on a loopback address
// ("localhost" included). An empty or wildcard host listens everywhere.
func LoopbackListen(s string) bool {
	if strings.HasPrefix(s, "unix:") {
		return true
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

func checkListen(s string) error {
	if path, ok := strings.CutPrefix(s, "unix:"); ok {
		if path == "" || !filepath.IsAbs(path) {
			return fmt.Errorf("%q: unix socket path must be absolute", s)
		}
		return nil
	}
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is neither host:port nor unix:/path: %w", s, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%q: port %q is not within 1-65535", s, port)
	}
	return nil
}

func parseMediaAddr(s string, want4 bool) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	switch {
	case want4 && !a.Is4():
		return netip.Addr{}, fmt.Errorf("%s is not an IPv4 address (use address6 for IPv6)", s)
	case !want4 && (!a.Is6() || a.Is4In6()):
		return netip.Addr{}, fmt.Errorf("%s is not an IPv6 address", s)
	case a.Zone() != "":
		return netip.Addr{}, fmt.Errorf("%s: zoned addresses are not supported", s)
	case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback():
		return netip.Addr{}, fmt.Errorf("%s is not a unicast address", s)
	}
	return a, nil
}

// ParsePortRange parses "A-B": A even, B odd, MinPort <= A < B <= 65535, so
// that the range holds whole RTP (even) / RTCP (odd) pairs.
func ParsePortRange(s string) (lo, hi uint16, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("%q is not a range like 30000-39999", s)
	}
	x, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 16)
	y, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 16)
	switch {
	case err1 != nil || err2 != nil:
		return 0, 0, fmt.Errorf("%q: ports must be numbers within %d-65535", s, MinPort)
	case x < MinPort:
		return 0, 0, fmt.Errorf("%q: first port %d is below %d", s, x, MinPort)
	case x >= y:
		return 0, 0, fmt.Errorf("%q: first port must be below the last", s)
	case x%2 != 0:
		return 0, 0, fmt.Errorf("%q: first port %d must be even (RTP)", s, x)
	case y%2 != 1:
		return 0, 0, fmt.Errorf("%q: last port %d must be odd (RTCP)", s, y)
	}
	return uint16(x), uint16(y), nil
}
