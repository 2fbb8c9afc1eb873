package analyze

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayd/relayd/internal/pktio"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/relayd/relayd/rtp"
)

const Help = `usage: voipgen recv --listen ADDR:PORT-PORT [flags]

Listens on every port of the range (one socket and goroutine per port, reads
batched with recvmmsg, kernel receive timestamps per packet) and reports per
stream, keyed by port and SSRC. Exits after --duration, or after --idle without
packets once traffic has started, or on SIGINT.

--json prints one object:
  {
    "listen": "127.0.0.1:40000-40038",
    "elapsed_s": 12.0,              // wall time spent receiving
    "streams": [{                   // sorted by port, then SSRC
      "port": 40000, "ssrc": 305419896, "payload_type": 0,
      "packets": 500,               // RTP packets seen, all of them
      "bytes": 86000,               // UDP payload bytes
      "expected": 500,              // RFC 3550 A.3: extended max - base + 1
      "lost": 0,                    // expected - unique packets counted, >= 0
      "duplicates": 0, "reordered": 0,
      "jitter_ms": 0.02,            // RFC 3550 A.8 interarrival jitter
      "max_gap_ms": 20.3,           // longest time between consecutive packets
      "first_arrival": "2026-...Z", "last_arrival": "2026-...Z" (RFC 3339, ns)
    }],
    "totals": {"streams", "packets", "bytes", "expected", "lost", "duplicates",
               "reordered", "max_jitter_ms", "mean_jitter_ms", "max_gap_ms",
               "rtcp_packets", "other_packets"}
  }

flags:
`

type Config struct {
	Emodel           EmodelOpts
	Direction        string // label of the direction received, for reports
	Progress         bool   // one-line live progress on stderr
	AllStreams       bool   // list every stream in the text report
	Addr             netip.Addr
	PortLo, PortHi   int
	Duration, Idle   time.Duration
	JSON             bool
	ClockRate        uint32
	Batch            int
	MaxSSRCsPerPort  int
	TimestampsKernel bool
}

func ParseListen(s string) (netip.Addr, int, int, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return netip.Addr{}, 0, 0, fmt.Errorf("--listen %q: want ADDR:PORT-PORT", s)
	}
	addr, err := netip.ParseAddr(strings.Trim(s[:i], "[]"))
	if err != nil {
		return addr, 0, 0, fmt.Errorf("--listen %q: %w", s, err)
	}
	lo, hi, ok := strings.Cut(s[i+1:], "-")
	if !ok {
		hi = lo
	}
	plo, err1 := strconv.Atoi(lo)
	phi, err2 := strconv.Atoi(hi)
	if err := errors.Join(err1, err2); err != nil {
		return addr, 0, 0, fmt.Errorf("--listen %q: %w", s, err)
	}
	if plo < 1 || phi > 65535 || plo > phi {
		return addr, 0, 0, fmt.Errorf("--listen %q: bad port range", s)
	}
	return addr, plo, phi, nil
}

func Parse(args []string, out io.Writer) (Config, error) {
	fs := flag.NewFlagSet("recv", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, Help); fs.PrintDefaults() }
	listen := fs.String("listen", "", "ADDR:PORT-PORT to listen on (required)")
	duration := fs.Duration("duration", 12*time.Second, "how long to receive")
	idle := fs.Duration("idle", 0, "stop this long after the last packet once traffic started (0: never)")
	js := fs.Bool("json", false, "print machine-readable JSON (schema above)")
	rate := fs.Uint("clock-rate", 8000, "RTP clock rate of the streams, for jitter in ms (48000 for opus)")
	dir := fs.String("direction", "", "name of the direction received, for the report (e.g. caller->callee)")
	all := fs.Bool("all-streams", false, "list every stream in the text report (default: all up to 40, else the 10 worst)")
	delay := fs.Float64("emodel-delay", 0, "one-way mouth-to-ear delay Ta in ms for the E-model (0: G.107 default)")
	noPLC := fs.Bool("no-plc", false, "E-model: the receiving phone has no packet loss concealment (G.711 Bpl 4.3, not 25.1)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	cfg := Config{Duration: *duration, Idle: *idle, JSON: *js, ClockRate: uint32(*rate), Batch: 64, MaxSSRCsPerPort: 16,
		Direction: *dir, AllStreams: *all, Emodel: EmodelOpts{DelayMs: *delay, NoPLC: *noPLC}}
	var err error
	if cfg.Addr, cfg.PortLo, cfg.PortHi, err = ParseListen(*listen); err != nil {
		return cfg, err
	}
	if cfg.ClockRate == 0 {
		return cfg, errors.New("--clock-rate must be positive")
	}
	return cfg, nil
}

type batchReader interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
}

type v6reader struct{ *ipv6.PacketConn }

func (r v6reader) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	return r.PacketConn.ReadBatch(ms, flags)
}

// portReader owns one socket and the analyzers of the streams arriving on
// it; only its goroutine touches them until run returns.
type portReader struct {
	port    int
	local   netip.AddrPort // for reports when the receiver spans addresses
	conn    *net.UDPConn
	r       batchReader
	msgs    []ipv4.Message
	streams []*rtp.StreamAnalyzer
	rtcp    uint64
	other   uint64
	last    *atomic.Int64
	bySSRC  map[uint32]*rtp.StreamAnalyzer // once a port has many streams
	// received and lossRuns, when set, count RTP packets and loss periods
	// as they happen, for the live progress line.
	received, lossRuns *atomic.Uint64
}

const drainTime = 20 * time.Millisecond

type Receiver struct {
	cfg     Config
	readers []*portReader
	last    atomic.Int64 // Unix ns of the newest batch, 0 before traffic

	received, lossRuns atomic.Uint64 // for the progress line
	start              time.Time
}

func New(cfg Config) (*Receiver, error) {
	rc := &Receiver{cfg: cfg}
	network := "udp4"
	if cfg.Addr.Is6() && !cfg.Addr.Is4In6() {
		network = "udp6"
	}
	for p := cfg.PortLo; p <= cfg.PortHi; p++ {
		c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(cfg.Addr, uint16(p))))
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("listen on port %d: %w", p, err)
		}
		_ = c.SetReadBuffer(1 << 20)
		pr, ts := newPortReader(c, p, cfg.Batch, 2048, &rc.last)
		rc.cfg.TimestampsKernel = rc.cfg.TimestampsKernel || ts
		rc.readers = append(rc.readers, pr)
	}
	return rc, nil
}

// newPortReader returns the reader of socket c, bound to port, reading
// batches of batch datagrams of up to bufSize bytes with kernel receive
// timestamps when the system has them (ts reports whether it does).
func newPortReader(c *net.UDPConn, port, batch, bufSize int, last *atomic.Int64) (pr *portReader, ts bool) {
	pr = &portReader{port: port, conn: c, last: last}
	if raw, err := c.SyscallConn(); err == nil && pktio.EnableTimestamps(raw) == nil {
		ts = true
	}
	if la, ok := c.LocalAddr().(*net.UDPAddr); ok && la.IP.To4() == nil {
		pr.r = v6reader{ipv6.NewPacketConn(c)}
	} else {
		pr.r = ipv4.NewPacketConn(c)
	}
	pr.msgs = make([]ipv4.Message, batch)
	bufs := make([]byte, batch*bufSize)
	for i := range pr.msgs {
		pr.msgs[i].Buffers = [][]byte{bufs[i*bufSize : (i+1)*bufSize : (i+1)*bufSize]}
		if pktio.TimestampOOBSize > 0 {
			pr.msgs[i].OOB = make([]byte, pktio.TimestampOOBSize)
		}
	}
	return pr, ts
}

func (rc *Receiver) Close() {
	for _, pr := range rc.readers {
		pr.conn.Close()
	}
}

// loop reads until the socket is closed.
func (pr *portReader) loop(clockRate uint32, maxSSRCs int) {
	var h rtp.Header
	for {
		n, err := pr.r.ReadBatch(pr.msgs, 0)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
			continue // e.g. ECONNREFUSED from an ICMP error: keep reading
		}
		now := time.Now().UnixNano()
		pr.last.Store(now)
		var rtpN, runs uint64
		for i := 0; i < n; i++ {
			m := &pr.msgs[i]
			b := m.Buffers[0][:m.N]
			switch rtp.Demux(b) {
			case rtp.ClassRTP:
			case rtp.ClassRTCP:
				pr.rtcp++
				continue
			default:
				pr.other++
				continue
			}
			if _, err := h.Unmarshal(b); err != nil {
				pr.other++
				continue
			}
			at := pktio.RxTimestamp(m.OOB[:m.NN])
			if at == 0 {
				at = now
			}
			a := pr.lookup(h.SSRC, clockRate, maxSSRCs)
			if a == nil {
				pr.other++
				continue
			}
			r0 := a.LossRuns
			a.Update(&h, m.N, at)
			rtpN++
			runs += a.LossRuns - r0
		}
		if pr.received != nil {
			pr.received.Add(rtpN)
			if runs != 0 {
				pr.lossRuns.Add(runs)
			}
		}
	}
}

func (pr *portReader) lookup(ssrc uint32, clockRate uint32, maxSSRCs int) *rtp.StreamAnalyzer {
	if pr.bySSRC != nil {
		if a := pr.bySSRC[ssrc]; a != nil {
			return a
		}
	} else {
		for _, a := range pr.streams {
			if a.Stats.SSRC == ssrc {
				return a
			}
		}
	}
	if len(pr.streams) >= maxSSRCs {
		return nil
	}
	a := &rtp.StreamAnalyzer{ClockRate: clockRate}
	pr.streams = append(pr.streams, a)
	// Many streams on one port (SIPp's rtp_stream to one media port):
	// index them by SSRC.
	if len(pr.streams) > 8 {
		if pr.bySSRC == nil {
			pr.bySSRC = make(map[uint32]*rtp.StreamAnalyzer, 64)
			for _, b := range pr.streams[:len(pr.streams)-1] {
				pr.bySSRC[b.Stats.SSRC] = b
			}
		}
		pr.bySSRC[ssrc] = a
	}
	return a
}

// Run receives until ctx is done, the duration passed or traffic went idle,
// then closes the sockets and returns the report.
func (rc *Receiver) Run(ctx context.Context) Report {
	var wg sync.WaitGroup
	start := time.Now()
	rc.start = start
	for _, pr := range rc.readers {
		pr.received, pr.lossRuns = &rc.received, &rc.lossRuns
		wg.Go(func() { pr.loop(rc.cfg.ClockRate, rc.cfg.MaxSSRCsPerPort) })
	}
	if rc.cfg.Progress {
		pctx, stop := context.WithCancel(ctx)
		defer stop()
		var pwg sync.WaitGroup
		defer pwg.Wait()
		defer stop()
		pwg.Go(func() { rc.ShowProgress(pctx, os.Stderr) })
	}
	timer := time.NewTimer(rc.cfg.Duration)
	defer timer.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-timer.C:
			break wait
		case <-tick.C:
			if last := rc.last.Load(); rc.cfg.Idle > 0 && last != 0 && time.Since(time.Unix(0, last)) > rc.cfg.Idle {
				break wait
			}
		}
	}
	// Drain: readers consume what is queued and exit once their socket has
	// been quiet for drainTime, so a receiver short of CPU loses nothing
	// that had already arrived.
	drain := time.Now().Add(drainTime)
	for _, pr := range rc.readers {
		_ = pr.conn.SetReadDeadline(drain)
	}
	wg.Wait()
	rc.Close()
	return rc.Report(time.Since(start))
}

// NewOn is newReceiver on a list of endpoints instead of a port
// range (cfg.addr and the port range only label the report). Sockets are
// opened in the caller's network namespace.
func NewOn(cfg Config, eps []netip.AddrPort) (*Receiver, error) {
	rc := &Receiver{cfg: cfg}
	for _, ep := range eps {
		network := "udp4"
		if !ep.Addr().Unmap().Is4() {
			network = "udp6"
		}
		c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(ep))
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("listen on %s: %w", ep, err)
		}
		_ = c.SetReadBuffer(256 << 10)
		pr, ts := newPortReader(c, int(ep.Port()), cfg.Batch, 1500, &rc.last)
		pr.local = ep
		rc.cfg.TimestampsKernel = rc.cfg.TimestampsKernel || ts
		rc.readers = append(rc.readers, pr)
	}
	return rc, nil
}

// NewOnConns is a receiver reading sockets opened elsewhere, such as a
// sender's own (voipgen send --bidir, the demo): each conn is a stream's
// socket, and the port range in the report is that of conns. The
// receiver's Run ends by closing them, like its own.
func NewOnConns(cfg Config, conns []*net.UDPConn) *Receiver {
	rc := &Receiver{cfg: cfg}
	for _, c := range conns {
		la := c.LocalAddr().(*net.UDPAddr).AddrPort()
		pr, ts := newPortReader(c, int(la.Port()), cfg.Batch, 1500, &rc.last)
		pr.local = la
		rc.cfg.TimestampsKernel = rc.cfg.TimestampsKernel || ts
		rc.readers = append(rc.readers, pr)
	}
	if len(rc.readers) > 0 {
		rc.cfg.PortLo, rc.cfg.PortHi = rc.readers[0].port, rc.readers[len(rc.readers)-1].port
	}
	return rc
}

// Conns returns the receiver's sockets in the order of its streams' ports,
// for a sender that sends from them.
func (rc *Receiver) Conns() []*net.UDPConn {
	cs := make([]*net.UDPConn, len(rc.readers))
	for i, pr := range rc.readers {
		cs[i] = pr.conn
	}
	return cs
}

// Received is the number of RTP packets received so far; safe to call
// while Run runs.
func (rc *Receiver) Received() uint64 { return rc.received.Load() }

// Config returns the receiver's configuration, with TimestampsKernel set
// when every socket has kernel receive timestamps.
func (rc *Receiver) Config() Config { return rc.cfg }

// SetEmodel sets the E-model inputs of the report; call it before Run.
func (rc *Receiver) SetEmodel(o EmodelOpts) { rc.cfg.Emodel = o }
