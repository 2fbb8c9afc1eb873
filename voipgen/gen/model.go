package gen

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/relayd/relayd/voipgen/analyze"
	"github.com/relayd/relayd/voipgen/payload"

	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

// Endpoints is a range of addresses and ports: stream i uses address
// addrs[i mod n] and port port+2*(i/n), so with one address stream i uses
// PORT+2i (RTP even, RTCP the odd port after it) and every stream has its own 5-tuple.
type Endpoints struct {
	Lo   netip.Addr // first address; invalid: any (the kernel chooses)
	N    int        // number of consecutive addresses from lo, >= 1
	Port int        // of stream 0; 0: ephemeral (only for sources)
}

// ParseEndpoints parses ADDR[:PORT], ADDR-ADDR[:PORT] or [V6ADDR-V6ADDR]:PORT.
// needPort requires the port.
func ParseEndpoints(s string, needPort bool) (Endpoints, error) {
	var e Endpoints
	host, port := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		i := strings.Index(s, "]")
		if i < 0 {
			return e, fmt.Errorf("%q: missing ]", s)
		}
		host, port = s[1:i], strings.TrimPrefix(s[i+1:], ":")
		if port == "" && len(s) > i+1 {
			return e, fmt.Errorf("%q: want [ADDR]:PORT", s)
		}
	case strings.Count(s, ":") == 1:
		host, port, _ = strings.Cut(s, ":")
	}
	if port == "" && needPort {
		return e, fmt.Errorf("%q: want ADDR:PORT", s)
	}
	if port != "" {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return e, fmt.Errorf("%q: bad port %q", s, port)
		}
		e.Port = p
	}
	a, b, isRange := strings.Cut(host, "-")
	lo, err := netip.ParseAddr(a)
	if err != nil {
		return e, fmt.Errorf("%q: %w", s, err)
	}
	e.Lo, e.N = lo.Unmap(), 1
	if isRange {
		hi, err := netip.ParseAddr(b)
		if err != nil {
			return e, fmt.Errorf("%q: %w", s, err)
		}
		hi = hi.Unmap()
		if hi.Is4() != e.Lo.Is4() || hi.Less(e.Lo) {
			return e, fmt.Errorf("%q: bad address range", s)
		}
		n := 1
		for x := e.Lo; x != hi; x = x.Next() {
			if n++; n > 1<<16 {
				return e, fmt.Errorf("%q: more than 65536 addresses", s)
			}
		}
		e.N = n
	}
	return e, nil
}

// At returns the endpoint of stream i (port 0 when ephemeral).
func (e Endpoints) At(i int) netip.AddrPort {
	a := e.Lo
	for k := i % e.N; k > 0; k-- {
		a = a.Next()
	}
	port := 0
	if e.Port != 0 {
		port = e.Port + 2*(i/e.N)
	}
	return netip.AddrPortFrom(a, uint16(port))
}

// LastPort is the port stream streams-1 uses (+1 for its RTCP).
func (e Endpoints) LastPort(streams int) int { return e.Port + 2*((streams-1)/e.N) }

func (e Endpoints) String() string {
	if !e.Lo.IsValid() {
		return "*"
	}
	h := e.Lo.String()
	if e.N > 1 {
		h += "-" + e.At(e.N-1).Addr().String()
	}
	if e.Lo.Is6() {
		h = "[" + h + "]"
	}
	if e.Port == 0 {
		return h
	}
	return fmt.Sprintf("%s:%d", h, e.Port)
}

// Config is the sending model of voipgen send and of each side of
// voipgen call/answer: streams concurrent calls (one stream each way, this
// process sends one direction), each of callDur (fixed or exponential with
// that mean, 0 = the whole run) starting at rate calls per second, a
// channel whose call ends starting the next call at once on the same
// 5-tuple with a new SSRC.
type Config struct {
	Dst, Src   Endpoints
	Streams    int
	Codec      payload.Codec
	Ptime      time.Duration
	Duration   time.Duration
	CallDur    time.Duration
	CallDurExp bool
	Rate       float64 // calls per second during the ramp; 0: all at once
	Bidir      bool    // receive and analyse the peer's stream on each source socket
	RTCP       bool    // RTCP SR + SDES every 5 s to port+1
	SRTP       *srtpflow.Config
	Threads    int
	Transport  string        // "udp", "shared" or "raw"
	Slot       time.Duration // width of a sending time slot
	DSCP       int
	Pin        bool // pin sender threads to CPUs
	RTPriority int  // SCHED_FIFO priority of the sender threads; 0: normal
	JSON       bool
	Progress   bool // live one-line progress on stderr
	Grace      time.Duration
	Emodel     analyze.EmodelOpts
}

const Usage = `usage: voipgen send --dst ADDR[-ADDR]:PORT [flags]

Sends the RTP of --streams concurrent calls, one stream per call from this
side. Stream i goes to address i mod n of --dst and port PORT+2*(i/n), from
the same position in --src: every call has its own 5-tuple. Calls start at
--rate per second (a ramp; 0: all at once) and last --call-duration (fixed,
or exponential with that mean with --call-duration-dist exp; 0: the whole
run); a call that ends is followed at once by a new call on its channel
(new SSRC, sequence number and timestamp, marker bit).

Pacing: the streams are staggered evenly across the ptime; streams whose
offsets fall into the same --slot leave in one sendmmsg at an absolute
deadline, so lateness never accumulates: clock_nanosleep TIMER_ABSTIME, or
for a wait of 5 ms and more (a few streams) a timerfd read through Go's
poller, which spares the runtime's monitor thousands of wake-ups a second.
--threads sender threads, each pinned to its own CPU, take every T-th
stream. Transports: raw (default as root: one raw socket per thread builds
IP and UDP headers, so one sendmmsg carries every 5-tuple of a slot), udp
(one UDP socket per stream: one sendmmsg per packet), shared (one UDP socket
per thread, every stream from the same source port), xdp (AF_XDP: the raw
transport's packets as Ethernet frames to the next hop, through an XDP
socket's TX ring on device queue T for thread T; root, no XDP program).

--bidir makes each source socket also receive the peer's stream (symmetric
RTP, as phones do; run a second voipgen send --bidir on the other side with
--src and --dst swapped) and report it like voipgen recv.

--json prints {"config", "load", "result", "recv"}; without it the derived
load is printed before sending, then a summary.

flags:
`

func Parse(args []string, out io.Writer) (Config, error) {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, Usage); fs.PrintDefaults() }
	cfg := Config{}
	dst := fs.String("dst", "", "destination ADDR[-ADDR]:PORT of the streams (required)")
	src := fs.String("src", "", "source ADDR[-ADDR][:PORT] (default: the route's source, ephemeral ports; raw: port 16384)")
	srcPort := fs.Int("src-port", 0, "source port of stream 0, stream i uses +2i (same as --src ADDR:PORT)")
	fs.IntVar(&cfg.Streams, "streams", 1, "concurrent calls (streams sent by this side)")
	calls := fs.Int("calls", 0, "same as --streams")
	codecName := fs.String("codec", "pcmu", "pcmu | pcma | g729 | opus")
	kbps := fs.Int("opus-kbps", 32, "opus bit rate, sets the packet size")
	fs.DurationVar(&cfg.Ptime, "ptime", 20*time.Millisecond, "packetization time")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to send")
	fs.DurationVar(&cfg.CallDur, "call-duration", 0, "duration of each call (0: the whole run)")
	dist := fs.String("call-duration-dist", "fixed", "fixed | exp (exponential with --call-duration as mean)")
	fs.Float64Var(&cfg.Rate, "rate", 0, "call arrival rate during the ramp, calls per second (0: all at once)")
	fs.BoolVar(&cfg.Bidir, "bidir", false, "also receive and analyse the peer's streams on the source sockets")
	fs.BoolVar(&cfg.RTCP, "rtcp", false, "send RTCP sender reports (SR + SDES) every 5 s to port+1")
	srtpSuite := fs.String("srtp-suite", "", "SRTP suite, e.g. AES_CM_128_HMAC_SHA1_80 or AEAD_AES_128_GCM (default: plain RTP)")
	srtpKey := fs.String("srtp-key", "", "SRTP master key||salt, base64 (with --srtp-suite)")
	fs.IntVar(&cfg.Threads, "threads", 1, "sender threads")
	fs.StringVar(&cfg.Transport, "transport", "", "raw | udp | shared | xdp (default: raw as root, else udp)")
	shared := fs.Bool("shared-socket", false, "same as --transport shared")
	fs.DurationVar(&cfg.Slot, "slot", time.Millisecond, "sending time slot: streams whose offsets fall into one slot leave in one batch")
	fs.IntVar(&cfg.DSCP, "dscp", 46, "DSCP of the packets (46: EF, as phones mark RTP; raw transport and IPv4 udp)")
	fs.BoolVar(&cfg.Pin, "pin", false, "pin each sender thread to a CPU (default: when --threads > 1)")
	fs.IntVar(&cfg.RTPriority, "rt-priority", 0, "run sender threads SCHED_FIFO at this priority (1-99; root): pacing on a busy machine")
	fs.BoolVar(&cfg.JSON, "json", false, "print machine-readable JSON")
	fs.DurationVar(&cfg.Grace, "grace", 500*time.Millisecond, "with --bidir: keep receiving this long after sending ends")
	fs.Float64Var(&cfg.Emodel.DelayMs, "emodel-delay", 0, "one-way mouth-to-ear delay Ta in ms for the E-model (0: G.107 default)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	// One thread is better left to the scheduler: pinned to a CPU that
	// something else keeps busy, it waits instead of moving.
	pinSet := false
	fs.Visit(func(f *flag.Flag) { pinSet = pinSet || f.Name == "pin" })
	if !pinSet {
		cfg.Pin = cfg.Threads > 1
	}
	var err error
	if cfg.Dst, err = ParseEndpoints(*dst, true); err != nil {
		return cfg, fmt.Errorf("--dst: %w", err)
	}
	if *src != "" {
		if cfg.Src, err = ParseEndpoints(*src, false); err != nil {
			return cfg, fmt.Errorf("--src: %w", err)
		}
	} else {
		cfg.Src.N = 1
	}
	if *srcPort != 0 {
		if cfg.Src.Port != 0 {
			return cfg, errors.New("--src-port and a port in --src")
		}
		cfg.Src.Port = *srcPort
	}
	if *calls != 0 {
		cfg.Streams = *calls
	}
	if cfg.Codec, err = payload.LookupAny(*codecName, cfg.Ptime); err != nil {
		return cfg, err
	}
	if cfg.Codec.Kbps != 0 {
		if cfg.Codec, err = cfg.Codec.WithKbps(*kbps); err != nil {
			return cfg, err
		}
	}
	switch *dist {
	case "fixed":
	case "exp":
		cfg.CallDurExp = true
	default:
		return cfg, fmt.Errorf("--call-duration-dist %q: want fixed or exp", *dist)
	}
	if *shared {
		if cfg.Transport != "" && cfg.Transport != "shared" {
			return cfg, errors.New("--shared-socket with another --transport")
		}
		cfg.Transport = "shared"
	}
	if *srtpSuite != "" || *srtpKey != "" {
		suite, err := sdes.ParseSuite(*srtpSuite)
		if err != nil {
			return cfg, fmt.Errorf("--srtp-suite: %w", err)
		}
		key, salt, err := sdes.DecodeKey(suite, *srtpKey)
		if err != nil {
			return cfg, fmt.Errorf("--srtp-key: %w", err)
		}
		cfg.SRTP = &srtpflow.Config{Suite: suite, Key: key, Salt: salt}
	}
	return cfg, cfg.Validate()
}

func (c *Config) Validate() error {
	fam4 := c.Dst.Lo.Is4()
	switch {
	case c.Streams < 1:
		return fmt.Errorf("--streams %d: need at least 1", c.Streams)
	case c.Src.Lo.IsValid() && c.Src.Lo.Is4() != fam4:
		return fmt.Errorf("--src %s and --dst %s are of different IP families", c.Src, c.Dst)
	case c.Dst.LastPort(c.Streams)+1 > 65535:
		return fmt.Errorf("--dst %s: %d streams need ports beyond 65535", c.Dst, c.Streams)
	case c.Src.Port != 0 && c.Src.LastPort(c.Streams)+1 > 65535:
		return fmt.Errorf("--src %s: %d streams need ports beyond 65535", c.Src, c.Streams)
	case c.Transport == "shared" && c.Src.Port != 0 && c.Streams > 1:
		return errors.New("--transport shared sends all streams from one port per thread: drop the source port")
	case c.Transport == "shared" && c.Bidir:
		return errors.New("--bidir needs a socket per stream: not with --transport shared")
	case c.Transport != "" && c.Transport != "raw" && c.Transport != "udp" && c.Transport != "shared" && c.Transport != "xdp":
		return fmt.Errorf("--transport %q: want raw, udp, shared or xdp", c.Transport)
	case c.Duration < c.Ptime:
		return fmt.Errorf("--duration %v shorter than --ptime %v", c.Duration, c.Ptime)
	case c.CallDur < 0 || c.CallDur > 0 && c.CallDur < c.Ptime:
		return fmt.Errorf("--call-duration %v: want 0 or at least one ptime", c.CallDur)
	case c.Rate < 0 || math.IsInf(c.Rate, 0) || math.IsNaN(c.Rate):
		return fmt.Errorf("--rate %v: want a rate >= 0", c.Rate)
	case c.Threads < 1 || c.Threads > 256:
		return fmt.Errorf("--threads %d: want 1 to 256", c.Threads)
	case c.Slot < time.Microsecond || c.Slot > c.Ptime:
		return fmt.Errorf("--slot %v: want 1us up to the ptime", c.Slot)
	case c.RTPriority < 0 || c.RTPriority > 99:
		return fmt.Errorf("--rt-priority %d: want 0 to 99", c.RTPriority)
	case c.DSCP < 0 || c.DSCP > 63:
		return fmt.Errorf("--dscp %d: want 0 to 63", c.DSCP)
	}
	return nil
}

// Load is the traffic a sending model offers, per direction and in total.
type Load struct {
	Streams       int     `json:"streams"`
	Directions    int     `json:"directions"` // 2 with --bidir: the peer is expected to send as much back
	PPS           float64 `json:"pps"`        // this side's RTP packets per second
	RTPBytes      int     `json:"rtp_bytes"`  // RTP header + payload (+ SRTP tag)
	PayloadBytes  int     `json:"payload_bytes"`
	IPBytes       int     `json:"ip_bytes"`
	FrameBytes    int     `json:"frame_bytes"` // Ethernet header + FCS, padded to 64
	WireBytes     int     `json:"wire_bytes"`  // + preamble/SFD 8 + inter-frame gap 12
	WireBitsPS    float64 `json:"wire_bits_per_s"`
	IPBitsPS      float64 `json:"ip_bits_per_s"`
	PerStreamBPS  float64 `json:"wire_bits_per_s_per_stream"`
	RTCPPPS       float64 `json:"rtcp_pps,omitempty"`
	BothWaysPPS   float64 `json:"both_ways_pps"`
	BothWaysBitPS float64 `json:"both_ways_wire_bits_per_s"`
	RampS         float64 `json:"ramp_s"` // time until every channel has a call
}

func (c *Config) Load() Load {
	l := Load{Streams: c.Streams, Directions: 1}
	if c.Bidir {
		l.Directions = 2
	}
	l.PayloadBytes = c.Codec.PayloadSize(c.Ptime)
	l.RTPBytes = 12 + l.PayloadBytes
	if c.SRTP != nil {
		l.RTPBytes += c.SRTP.Suite.RTPTagLen()
	}
	l.IPBytes, l.FrameBytes, l.WireBytes = packetSizes(l.RTPBytes, !c.Dst.Lo.Is4())
	perStream := float64(time.Second) / float64(c.Ptime)
	l.PPS = perStream * float64(c.Streams)
	l.WireBitsPS = l.PPS * float64(l.WireBytes) * 8
	l.IPBitsPS = l.PPS * float64(l.IPBytes) * 8
	l.PerStreamBPS = perStream * float64(l.WireBytes) * 8
	if c.RTCP {
		l.RTCPPPS = float64(c.Streams) / rtcpInterval.Seconds()
	}
	l.BothWaysPPS = l.PPS * float64(l.Directions)
	l.BothWaysBitPS = l.WireBitsPS * float64(l.Directions)
	if c.Rate > 0 {
		l.RampS = float64(c.Streams-1) / c.Rate
	}
	return l
}

func (l Load) WriteText(w io.Writer, c *Config) {
	dist := "fixed"
	if c.CallDurExp {
		dist = "exponential, mean"
	}
	dur := "the whole run"
	if c.CallDur > 0 {
		dur = fmt.Sprintf("%v (%s)", c.CallDur, dist)
	}
	srtp := "plain RTP"
	if c.SRTP != nil {
		srtp = "SRTP " + c.SRTP.Suite.String()
	}
	fmt.Fprintf(w, "model: %d concurrent calls, %s/%v (%s), calls of %s, ramp %.1f s, %s, from %s to %s for %v\n",
		c.Streams, c.Codec.Name, c.Ptime, srtp, dur, l.RampS, map[bool]string{false: "one-way", true: "bidirectional (peer sends back)"}[c.Bidir],
		c.Src, c.Dst, c.Duration)
	fmt.Fprintf(w, "load: %.0f pps; packet payload %d B, RTP %d B, IP %d B, frame %d B, wire %d B; %.3f Mbit/s on the wire (%.1f kbit/s per stream), %.3f Mbit/s IP",
		l.PPS, l.PayloadBytes, l.RTPBytes, l.IPBytes, l.FrameBytes, l.WireBytes, l.WireBitsPS/1e6, l.PerStreamBPS/1e3, l.IPBitsPS/1e6)
	if l.RTCPPPS > 0 {
		fmt.Fprintf(w, "; RTCP %.1f pps", l.RTCPPPS)
	}
	fmt.Fprintln(w)
	if l.Directions == 2 {
		fmt.Fprintf(w, "both ways: %.0f pps, %.3f Mbit/s on the wire\n", l.BothWaysPPS, l.BothWaysBitPS/1e6)
	}
}

// rtcpInterval is how often each stream sends an RTCP sender report.
const rtcpInterval = 5 * time.Second
