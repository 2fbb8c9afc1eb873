package gen

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/relayd/relayd/voipgen/payload"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

const SenderHelp = `usage: voipgen send --dst ADDR:PORT [flags]

Sends --streams RTP streams; stream i goes to PORT+2i from source port
--src-port+2i (or an ephemeral port per stream). Streams are staggered evenly
across the ptime in 1 ms slots; each slot's packets leave in one sendmmsg per
socket at an absolute deadline. With --shared-socket all streams share one
unconnected socket (one source port) and a slot is a single sendmmsg: the
fastest mode for thousands of streams when distinct source ports do not matter.

--json prints {"config":{...},"load":{...},"result":{"packets","bytes","errors",
"elapsed_s","pps","late_p50_us","late_p99_us","late_max_us"}} on stdout.

flags:
`

type SenderConfig struct {
	Dst          netip.AddrPort
	Src          netip.Addr
	SrcPort      int
	Streams      int
	Codec        payload.Codec
	Ptime        time.Duration
	Duration     time.Duration
	SharedSocket bool
	JSON         bool
}

func ParseSender(args []string, out io.Writer) (SenderConfig, error) {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, SenderHelp); fs.PrintDefaults() }
	dst := fs.String("dst", "", "destination ADDR:PORT of stream 0 (required)")
	src := fs.String("src", "", "source address (default: chosen by the kernel)")
	srcPort := fs.Int("src-port", 0, "source port of stream 0, stream i uses +2i (0: ephemeral)")
	streams := fs.Int("streams", 1, "number of streams")
	codecName := fs.String("codec", "pcmu", "pcmu | pcma | g729")
	ptime := fs.Duration("ptime", 20*time.Millisecond, "packetization time")
	duration := fs.Duration("duration", 10*time.Second, "how long to send")
	shared := fs.Bool("shared-socket", false, "send all streams from one socket and source port")
	js := fs.Bool("json", false, "print machine-readable JSON")
	if err := fs.Parse(args); err != nil {
		return SenderConfig{}, err
	}
	var cfg SenderConfig
	var err error
	if cfg.Dst, err = netip.ParseAddrPort(*dst); err != nil {
		return cfg, fmt.Errorf("--dst %q: %w", *dst, err)
	}
	if *src != "" {
		if cfg.Src, err = netip.ParseAddr(*src); err != nil {
			return cfg, fmt.Errorf("--src %q: %w", *src, err)
		}
		if cfg.Src.Is4() != cfg.Dst.Addr().Unmap().Is4() {
			return cfg, fmt.Errorf("--src %s and --dst %s are of different IP families", cfg.Src, cfg.Dst)
		}
	}
	if cfg.Codec, err = payload.Lookup(*codecName, *ptime); err != nil {
		return cfg, err
	}
	cfg.SrcPort, cfg.Streams, cfg.Ptime, cfg.Duration = *srcPort, *streams, *ptime, *duration
	cfg.SharedSocket, cfg.JSON = *shared, *js
	return cfg, cfg.validate()
}

func (c *SenderConfig) validate() error {
	switch {
	case c.Streams < 1:
		return fmt.Errorf("--streams %d: need at least 1", c.Streams)
	case int(c.Dst.Port())+2*(c.Streams-1) > 65535:
		return fmt.Errorf("--dst port %d + 2*%d streams exceeds 65535", c.Dst.Port(), c.Streams)
	case c.SrcPort < 0 || c.SrcPort+2*(c.Streams-1) > 65535:
		return fmt.Errorf("--src-port %d + 2*%d streams exceeds 65535", c.SrcPort, c.Streams)
	case c.SharedSocket && c.SrcPort != 0 && c.Streams > 1:
		return errors.New("--shared-socket sends all streams from one port: --src-port applies to it alone, use one stream or drop --src-port")
	case c.Duration < c.Ptime:
		return fmt.Errorf("--duration %v shorter than --ptime %v", c.Duration, c.Ptime)
	}
	return nil
}

// SenderLoad is the traffic a configuration puts on the wire: per packet at the
// RTP, IP, Ethernet frame and wire level, and in bits per second.
type SenderLoad struct {
	PPS         float64 `json:"pps"`
	RTPBytes    int     `json:"rtp_bytes"`
	IPBytes     int     `json:"ip_bytes"`
	FrameBytes  int     `json:"frame_bytes"` // Ethernet header + FCS, padded to 64
	WireBytes   int     `json:"wire_bytes"`  // + preamble/SFD 8 + inter-frame gap 12
	WireBitsPS  float64 `json:"wire_bits_per_s"`
	IPBitsPS    float64 `json:"ip_bits_per_s"`
	PerStreamBP float64 `json:"wire_bits_per_s_per_stream"`
}

// packetSizes is the IP packet, Ethernet frame (header and FCS, padded to
// 64) and wire size (plus preamble, SFD and inter-frame gap) of an RTP
// packet of rtpBytes over UDP.
func packetSizes(rtpBytes int, v6 bool) (ip, frame, wire int) {
	ip = rtpBytes + 8 + 20
	if v6 {
		ip = rtpBytes + 8 + 40
	}
	frame = max(ip+14+4, 64)
	return ip, frame, frame + 8 + 12
}

// Load is the traffic c puts on the wire.
func (c *SenderConfig) Load() SenderLoad {
	var l SenderLoad
	l.RTPBytes = 12 + c.Codec.PayloadSize(c.Ptime)
	l.IPBytes, l.FrameBytes, l.WireBytes = packetSizes(l.RTPBytes, c.Dst.Addr().Is6() && !c.Dst.Addr().Is4In6())
	perStream := float64(time.Second) / float64(c.Ptime)
	l.PPS = perStream * float64(c.Streams)
	l.WireBitsPS = l.PPS * float64(l.WireBytes) * 8
	l.IPBitsPS = l.PPS * float64(l.IPBytes) * 8
	l.PerStreamBP = perStream * float64(l.WireBytes) * 8
	return l
}

// BatchWriter is what ipv4.PacketConn and ipv6.PacketConn have in common
// (their Message types are the same type).
type BatchWriter interface {
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

type V6Writer struct{ *ipv6.PacketConn }

func (w V6Writer) WriteBatch(ms []ipv4.Message, flags int) (int, error) {
	return w.PacketConn.WriteBatch(ms, flags)
}

type Sender struct {
	cfg     SenderConfig
	streams []*payload.Stream
	msgs    []ipv4.Message // msgs[i] carries streams[i]'s buffer and address
	conns   []*net.UDPConn
	writers []BatchWriter // one per stream, or one shared
	slots   int           // time slots per ptime
}

type SenderResult struct {
	Packets   uint64  `json:"packets"`
	Bytes     uint64  `json:"bytes"`
	Errors    uint64  `json:"errors"`
	Elapsed   float64 `json:"elapsed_s"`
	PPS       float64 `json:"pps"`
	LateP50us float64 `json:"late_p50_us"`
	LateP99us float64 `json:"late_p99_us"`
	LateMaxus float64 `json:"late_max_us"`
}

const slotWidth = time.Millisecond

func NewSender(cfg SenderConfig) (*Sender, error) {
	return newSender(cfg, nil, nil)
}

// NewSenderOn is a sender whose stream i leaves from conns[i] (sockets
// the caller owns and closes; a receiver may read them too) towards
// dst(i), one socket per stream. cfg.Dst, Src, SrcPort and SharedSocket
// are not used.
func NewSenderOn(cfg SenderConfig, conns []*net.UDPConn, dst func(i int) netip.AddrPort) (*Sender, error) {
	if len(conns) != cfg.Streams {
		return nil, fmt.Errorf("%d sockets for %d streams", len(conns), cfg.Streams)
	}
	return newSender(cfg, conns, dst)
}

func newSender(cfg SenderConfig, conns []*net.UDPConn, dst func(i int) netip.AddrPort) (*Sender, error) {
	s := &Sender{cfg: cfg, slots: max(1, min(cfg.Streams, int(cfg.Ptime/slotWidth)))}
	if conns != nil {
		cfg.SharedSocket = false
		s.cfg.SharedSocket = false
		for _, c := range conns {
			if la, ok := c.LocalAddr().(*net.UDPAddr); ok && la.IP.To4() == nil {
				s.writers = append(s.writers, V6Writer{ipv6.NewPacketConn(c)})
			} else {
				s.writers = append(s.writers, ipv4.NewPacketConn(c))
			}
			_ = c.SetWriteBuffer(256 << 10)
		}
	}
	network := "udp4"
	dstAddr := cfg.Dst.Addr().Unmap()
	if dstAddr.Is6() {
		network = "udp6"
	}
	nsock := cfg.Streams
	if cfg.SharedSocket {
		nsock = 1
	}
	if conns != nil {
		nsock = 0 // the caller's
	}
	for i := 0; i < nsock; i++ {
		la := &net.UDPAddr{}
		if cfg.Src.IsValid() {
			la.IP = cfg.Src.AsSlice()
		}
		if cfg.SrcPort != 0 {
			la.Port = cfg.SrcPort + 2*i
		}
		c, err := net.ListenUDP(network, la)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("open socket %d: %w", i, err)
		}
		s.conns = append(s.conns, c)
		if cfg.SharedSocket {
			_ = c.SetWriteBuffer(4 << 20)
		}
		if network == "udp4" {
			s.writers = append(s.writers, ipv4.NewPacketConn(c))
		} else {
			s.writers = append(s.writers, V6Writer{ipv6.NewPacketConn(c)})
		}
	}
	var rnd [8]byte
	s.msgs = make([]ipv4.Message, cfg.Streams)
	bufs := make([][]byte, cfg.Streams)
	for i := range cfg.Streams {
		if _, err := rand.Read(rnd[:]); err != nil {
			s.Close()
			return nil, fmt.Errorf("random SSRC: %w", err)
		}
		st := payload.NewStream(cfg.Codec, cfg.Ptime, i, binary.BigEndian.Uint32(rnd[:]),
			binary.BigEndian.Uint16(rnd[4:]), binary.BigEndian.Uint32(rnd[:])^0x5a5a5a5a)
		s.streams = append(s.streams, st)
		bufs[i] = st.Buf
		s.msgs[i].Buffers = bufs[i : i+1]
		if dst != nil {
			s.msgs[i].Addr = net.UDPAddrFromAddrPort(dst(i))
		} else {
			s.msgs[i].Addr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(dstAddr, cfg.Dst.Port()+uint16(2*i)))
		}
	}
	return s, nil
}

// Slots is the number of sending time slots per ptime.
func (s *Sender) Slots() int { return s.slots }

// Streams returns the sender's streams, for their counters (Sent).
func (s *Sender) Streams() []*payload.Stream { return s.streams }

// Close closes the sockets the sender opened (not those of NewSenderOn).
func (s *Sender) Close() error {
	var errs []error
	for _, c := range s.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// slotRange returns the streams sent in slot k.
func (s *Sender) slotRange(k int) (lo, hi int) {
	return k * s.cfg.Streams / s.slots, (k + 1) * s.cfg.Streams / s.slots
}

// Run sends until the duration has passed or ctx is done. Every deadline
// is computed from the start time, so lateness never accumulates.
func (s *Sender) Run(ctx context.Context) SenderResult {
	var res SenderResult
	var late LatencyHist
	cycles := int(s.cfg.Duration / s.cfg.Ptime)
	start := time.Now().Add(10 * time.Millisecond)
	for cycle := 0; cycle < cycles; cycle++ {
		if ctx.Err() != nil {
			break
		}
		base := time.Duration(cycle) * s.cfg.Ptime
		for k := 0; k < s.slots; k++ {
			deadline := start.Add(base + time.Duration(k)*s.cfg.Ptime/time.Duration(s.slots))
			if d := time.Until(deadline); d > 0 {
				time.Sleep(d)
			}
			lo, hi := s.slotRange(k)
			for i := lo; i < hi; i++ {
				s.streams[i].Next()
			}
			if s.cfg.SharedSocket {
				s.write(&res, s.writers[0], s.msgs[lo:hi])
			} else {
				for i := lo; i < hi; i++ {
					s.write(&res, s.writers[i], s.msgs[i:i+1])
				}
			}
			late.add(time.Since(deadline), hi-lo)
		}
	}
	res.Elapsed = time.Since(start).Seconds()
	if res.Elapsed > 0 {
		res.PPS = float64(res.Packets) / res.Elapsed
	}
	res.LateP50us = late.quantile(0.5)
	res.LateP99us = late.quantile(0.99)
	res.LateMaxus = float64(late.max) / 1e3
	return res
}

// write sends ms with as few sendmmsg calls as the kernel allows; a message
// that fails is counted and skipped.
var errNothingSent = errors.New("sendmmsg sent nothing")

func (s *Sender) write(res *SenderResult, w BatchWriter, ms []ipv4.Message) {
	for len(ms) > 0 {
		n, err := w.WriteBatch(ms, 0)
		// x/net returns -1 when the first message fails.
		n = max(n, 0)
		if n == 0 && err == nil {
			err = errNothingSent
		}
		for i := 0; i < n; i++ {
			res.Bytes += uint64(ms[i].N)
		}
		res.Packets += uint64(n)
		ms = ms[n:]
		if err != nil && len(ms) > 0 {
			res.Errors++
			ms = ms[1:]
		}
	}
}

// LatencyHist records lateness with 1 us resolution below 1 ms and 100 us
// resolution up to 100 ms; beyond that only the maximum is exact.
type LatencyHist struct {
	buckets [2000]uint64
	total   uint64
	max     time.Duration
}

func (h *LatencyHist) add(d time.Duration, n int) {
	if n == 0 {
		return
	}
	if d < 0 {
		d = 0
	}
	h.max = max(h.max, d)
	us := int(d / time.Microsecond)
	idx := us
	if us >= 1000 {
		idx = min(1000+(us-1000)/100, len(h.buckets)-1)
	}
	h.buckets[idx] += uint64(n)
	h.total += uint64(n)
}

// quantile returns the q-quantile in microseconds (bucket lower bound).
func (h *LatencyHist) quantile(q float64) float64 {
	if h.total == 0 {
		return 0
	}
	want := uint64(q*float64(h.total-1)) + 1
	var acc uint64
	for i, c := range h.buckets {
		acc += c
		if acc >= want {
			if i < 1000 {
				return float64(i)
			}
			return float64(1000 + (i-1000)*100)
		}
	}
	return float64(h.max) / 1e3
}
