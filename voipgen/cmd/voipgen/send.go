package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"github.com/relayd/relayd/voipgen/payload"
	"io"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

const sendHelp = `usage: voipgen send --dst ADDR:PORT [flags]

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

type sendConfig struct {
	dst          netip.AddrPort
	src          netip.Addr
	srcPort      int
	streams      int
	codec        payload.Codec
	ptime        time.Duration
	duration     time.Duration
	sharedSocket bool
	json         bool
}

func parseSend(args []string, out io.Writer) (sendConfig, error) {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, sendHelp); fs.PrintDefaults() }
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
		return sendConfig{}, err
	}
	var cfg sendConfig
	var err error
	if cfg.dst, err = netip.ParseAddrPort(*dst); err != nil {
		return cfg, fmt.Errorf("--dst %q: %w", *dst, err)
	}
	if *src != "" {
		if cfg.src, err = netip.ParseAddr(*src); err != nil {
			return cfg, fmt.Errorf("--src %q: %w", *src, err)
		}
		if cfg.src.Is4() != cfg.dst.Addr().Unmap().Is4() {
			return cfg, fmt.Errorf("--src %s and --dst %s are of different IP families", cfg.src, cfg.dst)
		}
	}
	if cfg.codec, err = payload.Lookup(*codecName, *ptime); err != nil {
		return cfg, err
	}
	cfg.srcPort, cfg.streams, cfg.ptime, cfg.duration = *srcPort, *streams, *ptime, *duration
	cfg.sharedSocket, cfg.json = *shared, *js
	return cfg, cfg.validate()
}

func (c *sendConfig) validate() error {
	switch {
	case c.streams < 1:
		return fmt.Errorf("--streams %d: need at least 1", c.streams)
	case int(c.dst.Port())+2*(c.streams-1) > 65535:
		return fmt.Errorf("--dst port %d + 2*%d streams exceeds 65535", c.dst.Port(), c.streams)
	case c.srcPort < 0 || c.srcPort+2*(c.streams-1) > 65535:
		return fmt.Errorf("--src-port %d + 2*%d streams exceeds 65535", c.srcPort, c.streams)
	case c.sharedSocket && c.srcPort != 0 && c.streams > 1:
		return errors.New("--shared-socket sends all streams from one port: --src-port applies to it alone, use one stream or drop --src-port")
	case c.duration < c.ptime:
		return fmt.Errorf("--duration %v shorter than --ptime %v", c.duration, c.ptime)
	}
	return nil
}

// load is the traffic a configuration puts on the wire: per packet at the
// RTP, IP, Ethernet frame and wire level, and in bits per second.
type load struct {
	PPS         float64 `json:"pps"`
	RTPBytes    int     `json:"rtp_bytes"`
	IPBytes     int     `json:"ip_bytes"`
	FrameBytes  int     `json:"frame_bytes"` // Ethernet header + FCS, padded to 64
	WireBytes   int     `json:"wire_bytes"`  // + preamble/SFD 8 + inter-frame gap 12
	WireBitsPS  float64 `json:"wire_bits_per_s"`
	IPBitsPS    float64 `json:"ip_bits_per_s"`
	PerStreamBP float64 `json:"wire_bits_per_s_per_stream"`
}

func (c *sendConfig) load() load {
	var l load
	l.RTPBytes = 12 + c.codec.PayloadSize(c.ptime)
	l.IPBytes = l.RTPBytes + 8 + 20
	if c.dst.Addr().Is6() && !c.dst.Addr().Is4In6() {
		l.IPBytes = l.RTPBytes + 8 + 40
	}
	l.FrameBytes = max(l.IPBytes+14+4, 64)
	l.WireBytes = l.FrameBytes + 8 + 12
	perStream := float64(time.Second) / float64(c.ptime)
	l.PPS = perStream * float64(c.streams)
	l.WireBitsPS = l.PPS * float64(l.WireBytes) * 8
	l.IPBitsPS = l.PPS * float64(l.IPBytes) * 8
	l.PerStreamBP = perStream * float64(l.WireBytes) * 8
	return l
}

// batchWriter is what ipv4.PacketConn and ipv6.PacketConn have in common
// (their Message types are the same type).
type batchWriter interface {
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

type v6writer struct{ *ipv6.PacketConn }

func (w v6writer) WriteBatch(ms []ipv4.Message, flags int) (int, error) {
	return w.PacketConn.WriteBatch(ms, flags)
}

type sender struct {
	cfg     sendConfig
	streams []*payload.Stream
	msgs    []ipv4.Message // msgs[i] carries streams[i]'s buffer and address
	conns   []*net.UDPConn
	writers []batchWriter // one per stream, or one shared
	slots   int           // time slots per ptime
}

type sendResult struct {
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

func newSender(cfg sendConfig) (*sender, error) {
	s := &sender{cfg: cfg, slots: max(1, min(cfg.streams, int(cfg.ptime/slotWidth)))}
	network := "udp4"
	dstAddr := cfg.dst.Addr().Unmap()
	if dstAddr.Is6() {
		network = "udp6"
	}
	nsock := cfg.streams
	if cfg.sharedSocket {
		nsock = 1
	}
	for i := 0; i < nsock; i++ {
		la := &net.UDPAddr{}
		if cfg.src.IsValid() {
			la.IP = cfg.src.AsSlice()
		}
		if cfg.srcPort != 0 {
			la.Port = cfg.srcPort + 2*i
		}
		c, err := net.ListenUDP(network, la)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("open socket %d: %w", i, err)
		}
		s.conns = append(s.conns, c)
		if cfg.sharedSocket {
			_ = c.SetWriteBuffer(4 << 20)
		}
		if network == "udp4" {
			s.writers = append(s.writers, ipv4.NewPacketConn(c))
		} else {
			s.writers = append(s.writers, v6writer{ipv6.NewPacketConn(c)})
		}
	}
	var rnd [8]byte
	s.msgs = make([]ipv4.Message, cfg.streams)
	bufs := make([][]byte, cfg.streams)
	for i := range cfg.streams {
		if _, err := rand.Read(rnd[:]); err != nil {
			s.close()
			return nil, fmt.Errorf("random SSRC: %w", err)
		}
		st := payload.NewStream(cfg.codec, cfg.ptime, i, binary.BigEndian.Uint32(rnd[:]),
			binary.BigEndian.Uint16(rnd[4:]), binary.BigEndian.Uint32(rnd[:])^0x5a5a5a5a)
		s.streams = append(s.streams, st)
		bufs[i] = st.Buf
		s.msgs[i].Buffers = bufs[i : i+1]
		s.msgs[i].Addr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(dstAddr, cfg.dst.Port()+uint16(2*i)))
	}
	return s, nil
}

func (s *sender) close() error {
	var errs []error
	for _, c := range s.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// slotRange returns the streams sent in slot k.
func (s *sender) slotRange(k int) (lo, hi int) {
	return k * s.cfg.streams / s.slots, (k + 1) * s.cfg.streams / s.slots
}

// run sends until the duration has passed or ctx is done. Every deadline
// is computed from the start time, so lateness never accumulates.
func (s *sender) run(ctx context.Context) sendResult {
	var res sendResult
	var late latencyHist
	cycles := int(s.cfg.duration / s.cfg.ptime)
	start := time.Now().Add(10 * time.Millisecond)
	for cycle := 0; cycle < cycles; cycle++ {
		if ctx.Err() != nil {
			break
		}
		base := time.Duration(cycle) * s.cfg.ptime
		for k := 0; k < s.slots; k++ {
			deadline := start.Add(base + time.Duration(k)*s.cfg.ptime/time.Duration(s.slots))
			if d := time.Until(deadline); d > 0 {
				time.Sleep(d)
			}
			lo, hi := s.slotRange(k)
			for i := lo; i < hi; i++ {
				s.streams[i].Next()
			}
			if s.cfg.sharedSocket {
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

func (s *sender) write(res *sendResult, w batchWriter, ms []ipv4.Message) {
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

// latencyHist records lateness with 1 us resolution below 1 ms and 100 us
// resolution up to 100 ms; beyond that only the maximum is exact.
type latencyHist struct {
	buckets [2000]uint64
	total   uint64
	max     time.Duration
}

func (h *latencyHist) add(d time.Duration, n int) {
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
func (h *latencyHist) quantile(q float64) float64 {
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
