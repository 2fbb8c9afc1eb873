package fwtest

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Usage is voipgen fwtest's help text.
const Usage = `usage: voipgen fwtest [flags]   (as root; needs keepalived and conntrackd)

Stands a redundant firewall pair up in network namespaces (two Linux
firewalls with a stateful nftables ruleset, keepalived VRRP for the gateway
addresses on both sides, conntrackd replicating the connection state over
a sync link) and measures what VoIP traffic sees through it:

 1. throughput: an RFC 2544 style binary search for the highest offered
    rate the pair forwards with zero loss (every trial of a step lossless),
    for G.711 and G.729 packets at 20 ms and a mix, with the kernel's
    forwarding and with a minimal XDP forwarder on the firewalls; loss is
    counted at the receiving host's UDP layer, so the receiving program's
    own CPU does not count against the pair;
 2. failover: --calls concurrent calls (RTP both ways, or one way WAN to
    LAN on connection state opened from the LAN), then the master fails
    (keepalived stopped, its priority lowered, its links cut, its daemons
    killed) and later recovers (preemption moves the addresses back): the
    glitch of every stream, its distribution, the outage all streams
    together bound (to ptime / streams), packets lost and duplicated,
    calls that never recovered, and the times keepalived and conntrackd
    logged, beside the thesis's figures for OpenBSD 3.8 CARP+pfsync;
 3. a report: a table, --json, and with --out the plots (received packets
    per ms around the failure, per-stream glitch distributions, the
    search's steps) and report.json.

Ctrl-C tears down everything it started.

flags:
`

// VRRPSetting is a VRRP version and advertisement interval.
type VRRPSetting struct {
	Version int           `json:"version"`
	Advert  time.Duration `json:"advert_ns"`
}

func (v VRRPSetting) String() string { return fmt.Sprintf("%d/%v", v.Version, v.Advert) }

// Config is one experiment. Parse fills it from flags.
type Config struct {
	Calls      int           `json:"calls"` // concurrent calls per failover run
	Codec      string        `json:"codec"`
	Ptime      time.Duration `json:"ptime_ns"`
	Failures   []FailureKind `json:"failures"`
	VRRP       []VRRPSetting `json:"vrrp"`
	Conntrackd []bool        `json:"conntrackd"`
	Streams    []string      `json:"streams"` // Bidirectional, OneWayWANLAN
	Reps       int           `json:"reps"`
	Stateless  bool          `json:"stateless"` // failover runs on the stateless ruleset
	SIP        bool          `json:"sip"`       // the calls' SIP signalling through the pair too

	Forwarders []string      `json:"forwarders"` // throughput: "kernel", "xdp"; none: no search
	Sizes      []string      `json:"sizes"`      // "g711", "g729", "mix"
	Search     SearchConfig  `json:"search"`
	Trial      time.Duration `json:"trial_ns"`  // one trial's sending time
	Transport  string        `json:"transport"` // the throughput sender's: raw or xdp
	Threads    int           `json:"threads"`   // the throughput sender's threads

	Quick   bool   `json:"quick"`
	JSON    bool   `json:"-"`
	Out     string `json:"-"` // directory for report.json, report.txt and plots
	Capture string `json:"-"` // directory for a capture at each receiving host per failover run

	Progress io.Writer `json:"-"` // progress lines; nil: none
	Log      io.Writer `json:"-"` // the daemons' output; nil: none
}

// Parse reads voipgen fwtest's flags.
func Parse(args []string, out io.Writer) (Config, error) {
	fs := flag.NewFlagSet("fwtest", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, Usage); fs.PrintDefaults() }
	quick := fs.Bool("quick", false, "a short version: fewer cases, one repetition, a coarse search (about a minute)")
	calls := fs.Int("calls", 0, "concurrent calls in each failover run (default 100; 40 with --quick)")
	codec := fs.String("codec", "pcmu", "codec of the failover calls: pcmu, pcma or g729")
	ptime := fs.Duration("ptime", 20*time.Millisecond, "packet interval of the failover calls")
	failures := fs.String("failures", "", "failures to cause: admin-stop, admin-priority, crash-links, crash-kill; none: no failover runs (default all; admin-stop,crash-links with --quick)")
	vrrp := fs.String("vrrp", "", "VRRP settings VERSION/ADVERT (default 3/1s,3/100ms; 3/100ms with --quick)")
	ct := fs.String("conntrackd", "on,off", "conntrackd state replication: on, off or both")
	streams := fs.String("streams", "bidirectional,one-way", "stream kinds: bidirectional (RTP both ways) and one-way (WAN to LAN on state the LAN opened)")
	reps := fs.Int("reps", 0, "repetitions of each failover case (default 3; 1 with --quick)")
	stateless := fs.Bool("stateless", false, "failover runs with the stateless ruleset")
	sipFlag := fs.Bool("sip", false, "set the failover calls up with SIP through the pair (voipgen's user agent, LAN to WAN), hold them across the failure and the recovery and hang them up after")
	fwd := fs.String("throughput", "kernel,xdp", "forwarders to search the zero-loss rate of: kernel, xdp; none: no search")
	sizes := fs.String("sizes", "", "packet sizes of the search: g711, g729, mix (default all; g711 with --quick)")
	lo := fs.Int("search-lo", 5000, "lowest rate of the search, pps")
	hi := fs.Int("search-hi", 0, "highest rate of the search, pps (default 400000; 200000 with --quick)")
	res := fs.Int("resolution", 0, "the search ends when its bracket is this narrow, pps (default 5000; 10000 with --quick)")
	trials := fs.Int("trials", 0, "trials per search step, all lossless to pass (default 3; 1 with --quick)")
	trial := fs.Duration("trial", 0, "sending time of one trial (default 2s; 1s with --quick)")
	transport := fs.String("transport", "raw", "the search's sender: raw (sendmmsg on raw sockets) or xdp (AF_XDP, where one core cannot offer enough)")
	threads := fs.Int("threads", min(2, runtime.NumCPU()), "the search's sender threads (each pinned to a CPU)")
	js := fs.Bool("json", false, "print the report as JSON")
	outDir := fs.String("out", "", "write report.json, report.txt and the plots here")
	capture := fs.String("capture", "", "capture each failover run at the receiving hosts (tcpdump) into this directory")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	pick := func(v, def, quickDef int) int {
		switch {
		case v != 0:
			return v
		case *quick:
			return quickDef
		}
		return def
	}
	pickS := func(v, def, quickDef string) string {
		switch {
		case v != "":
			return v
		case *quick:
			return quickDef
		}
		return def
	}
	cfg := Config{
		Calls: pick(*calls, 100, 40), Codec: *codec, Ptime: *ptime, Reps: pick(*reps, 3, 1), Stateless: *stateless, SIP: *sipFlag,
		Search: SearchConfig{Lo: *lo, Hi: pick(*hi, 400000, 200000), Resolution: pick(*res, 5000, 10000), Trials: pick(*trials, 3, 1)},
		Trial:  *trial, Transport: *transport, Threads: *threads,
		Quick: *quick, JSON: *js, Out: *outDir, Capture: *capture,
	}
	if cfg.Trial == 0 {
		cfg.Trial = map[bool]time.Duration{false: 2 * time.Second, true: time.Second}[*quick]
	}
	fails := pickS(*failures, "admin-stop,admin-priority,crash-links,crash-kill", "admin-stop,crash-links")
	if fails == "none" {
		fails = ""
	}
	for _, f := range list(fails) {
		k := FailureKind(f)
		if k.Category() == "" || k == RecoveryPreempt {
			return cfg, fmt.Errorf("--failures: unknown failure %q", f)
		}
		cfg.Failures = append(cfg.Failures, k)
	}
	for _, v := range list(pickS(*vrrp, "3/1s,3/100ms", "3/100ms")) {
		ver, adv, ok := strings.Cut(v, "/")
		n, err := strconv.Atoi(ver)
		d, derr := time.ParseDuration(adv)
		if !ok || err != nil || derr != nil {
			return cfg, fmt.Errorf("--vrrp %q: want VERSION/ADVERT such as 3/100ms", v)
		}
		cfg.VRRP = append(cfg.VRRP, VRRPSetting{Version: n, Advert: d})
	}
	for _, v := range list(*ct) {
		switch v {
		case "on":
			cfg.Conntrackd = append(cfg.Conntrackd, true)
		case "off":
			cfg.Conntrackd = append(cfg.Conntrackd, false)
		default:
			return cfg, fmt.Errorf("--conntrackd %q: want on, off or on,off", *ct)
		}
	}
	for _, v := range list(*streams) {
		switch v {
		case "bidirectional":
			cfg.Streams = append(cfg.Streams, Bidirectional)
		case "one-way":
			cfg.Streams = append(cfg.Streams, OneWayWANLAN)
		default:
			return cfg, fmt.Errorf("--streams %q: want bidirectional and/or one-way", v)
		}
	}
	if *fwd != "none" {
		cfg.Forwarders = list(*fwd)
	}
	cfg.Sizes = list(pickS(*sizes, "g711,g729,mix", "g711"))
	return cfg, cfg.validate()
}

func list(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func (c *Config) validate() error {
	switch {
	case c.Calls < 1 || c.Calls > 2000:
		return fmt.Errorf("--calls %d: want 1 to 2000", c.Calls)
	case c.Reps < 1:
		return fmt.Errorf("--reps %d: want at least 1", c.Reps)
	case c.Ptime < 10*time.Millisecond || c.Ptime > 100*time.Millisecond:
		return fmt.Errorf("--ptime %v: want 10ms to 100ms", c.Ptime)
	case c.Trial < 200*time.Millisecond:
		return fmt.Errorf("--trial %v: want at least 200ms", c.Trial)
	case c.Transport != "raw" && c.Transport != "xdp":
		return fmt.Errorf("--transport %q: want raw or xdp", c.Transport)
	case c.Threads < 1:
		return fmt.Errorf("--threads %d: want at least 1", c.Threads)
	case len(c.Failures) > 0 && (len(c.VRRP) == 0 || len(c.Conntrackd) == 0 || len(c.Streams) == 0):
		return errors.New("failover runs need --vrrp, --conntrackd and --streams")
	}
	for _, v := range c.VRRP {
		switch {
		case v.Version != 2 && v.Version != 3:
			return fmt.Errorf("--vrrp %v: version 2 or 3", v)
		case v.Version == 2 && v.Advert%time.Second != 0:
			return fmt.Errorf("--vrrp %v: VRRPv2 adverts are whole seconds", v)
		case v.Advert < 10*time.Millisecond:
			return fmt.Errorf("--vrrp %v: advert too short", v)
		}
	}
	for _, f := range c.Forwarders {
		if f != "kernel" && f != "xdp" {
			return fmt.Errorf("--throughput %q: want kernel, xdp or none", f)
		}
	}
	for _, s := range c.Sizes {
		if !slices.Contains([]string{"g711", "g729", "mix"}, s) {
			return fmt.Errorf("--sizes %q: want g711, g729 or mix", s)
		}
	}
	if len(c.Forwarders) > 0 {
		if _, err := c.Search.validate(); err != nil {
			return err
		}
	}
	return nil
}
