package gen

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/relayd/relayd/internal/pktio"
	"github.com/relayd/relayd/voipgen/payload"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

// pktio.Mmsghdr (struct pktio.Mmsghdr) is declared in fwdbench_linux.go.

// genStream is one channel of the model: the current call's RTP state and
// its prebuilt packet. Only its thread touches it while sending.
type genStream struct {
	idx    int
	offset time.Duration   // within the ptime
	st     *payload.Stream // st.buf aliases frame[rtpOff:]
	frame  []byte          // raw: IP + UDP + RTP (+ SRTP tag); else RTP (+ tag)
	rtpOff int
	rtpLen int // RTP header + payload, before SRTP
	msg    pktio.Mmsghdr
	iov    unix.Iovec
	sa4    unix.RawSockaddrInet4
	sa6    unix.RawSockaddrInet6
	fd     int // udp transport: the stream's socket

	sum0 uint64 // raw: checksum of pseudo-header, ports and length

	// RTCP, when enabled.
	rtcpFrame []byte
	rtcpMsg   pktio.Mmsghdr
	rtcpIov   unix.Iovec
	rsa4      unix.RawSockaddrInet4
	rsa6      unix.RawSockaddrInet6
	rfd       int
	rsum0     uint64
	cname     string

	start, end time.Duration // current call, from the run start; end 0: no end
	active     bool
	calls      int // calls started on this channel
	octets     uint32
	packets    uint32
}

// genThread is one sender thread and the streams it owns.
type genThread struct {
	id      int
	streams []*genStream
	slots   []genSlot
	batch   []pktio.Mmsghdr
	fds     []int  // per batch entry (udp transport)
	isRTCP  []bool // per batch entry
	fd      int    // raw or shared socket
	xsk     *xdpSock
	enc     *srtpflow.Encrypter
	rng     *rand.Rand
	pace    *pacer // set by runThread; nil: clock_nanosleep

	res  genThreadResult
	late LatencyHist
}

type genSlot struct {
	lo, hi int           // streams[lo:hi]
	off    time.Duration // deadline within the ptime: the first stream's offset
}

type genThreadResult struct {
	packets, bytes, errors, rtcp, calls, srtpErrors uint64
	errnos                                          errnoTally // the send errors' kinds
	cpu                                             time.Duration
	rtErr                                           error // --rt-priority refused
	cycles                                          int   // ptimes whose packets were sent
	end                                             int64 // MonoNow when the last was
}

// Generator sends the streams of a genConfig.
type Generator struct {
	cfg     Config
	raw     bool
	shared  bool
	hdrLen  int // IP + UDP header bytes in each raw frame
	streams []*genStream
	threads []*genThread
	conns   []*net.UDPConn // udp/shared sockets and --bidir receive sockets
	rtcpCon []*net.UDPConn
	rawFds  []int

	sent atomic.Uint64 // packets, updated per cycle, for progress
}

var errNoAddr = errors.New("no source address")

// RouteSource returns the source address the kernel would use towards dst.
func RouteSource(dst netip.Addr) (netip.Addr, error) {
	network := "udp4"
	if !dst.Is4() {
		network = "udp6"
	}
	c, err := net.DialUDP(network, nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("route to %s: %w", dst, err)
	}
	defer c.Close()
	a := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	if !a.IsValid() || a.IsUnspecified() {
		return a, errNoAddr
	}
	return a, nil
}

// rawSourcePort is the first source port of the raw transport when none is
// given: it binds no socket, so it needs no free port.
const rawSourcePort = 16384

// New opens the sockets and builds every stream's packet. With
// cfg.transport empty it picks raw as root, udp otherwise.
func New(cfg Config) (_ *Generator, err error) {
	if cfg.Transport == "" {
		cfg.Transport = "udp"
		if os.Geteuid() == 0 {
			cfg.Transport = "raw"
		}
	}
	g := &Generator{cfg: cfg, raw: cfg.Transport == "raw" || cfg.Transport == "xdp", shared: cfg.Transport == "shared"}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	fam4 := cfg.Dst.Lo.Is4()
	if g.raw {
		if !g.cfg.Src.Lo.IsValid() {
			a, err := RouteSource(cfg.Dst.Lo)
			if err != nil {
				return nil, err
			}
			g.cfg.Src.Lo, g.cfg.Src.N = a, 1
		}
		if g.cfg.Src.Port == 0 {
			g.cfg.Src.Port = rawSourcePort
		}
		if err := g.cfg.Validate(); err != nil {
			return nil, err
		}
	}
	cfg = g.cfg

	var enc *srtpflow.Encrypter
	tag := 0
	if cfg.SRTP != nil {
		if enc, err = srtpflow.NewEncrypter(*cfg.SRTP); err != nil {
			return nil, err
		}
		tag = enc.RTPOverhead()
	}
	plen := cfg.Codec.PayloadSize(cfg.Ptime)
	rtpLen := rtp.HeaderSize + plen
	ipHdr := 0
	if g.raw {
		ipHdr = 20 + 8
		if !fam4 {
			ipHdr = 40 + 8
		}
	}
	g.hdrLen = ipHdr
	var seed [16]byte
	if _, err := crand.Read(seed[:]); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(seed[:]), binary.LittleEndian.Uint64(seed[8:])))

	for i := range cfg.Streams {
		gs := &genStream{idx: i, fd: -1, rfd: -1}
		gs.offset = time.Duration(int64(i) * int64(cfg.Ptime) / int64(cfg.Streams))
		gs.frame = make([]byte, ipHdr+rtpLen+tag)
		gs.rtpOff, gs.rtpLen = ipHdr, rtpLen
		gs.st = payload.NewStream(cfg.Codec, cfg.Ptime, i, rng.Uint32(), uint16(rng.Uint32()), rng.Uint32())
		gs.st.Buf = gs.frame[ipHdr : ipHdr+rtpLen : ipHdr+rtpLen+tag]
		src, dst := cfg.Src.At(i), cfg.Dst.At(i)
		gs.cname = fmt.Sprintf("voipgen-%d@%s", i, src.Addr())
		if g.raw {
			gs.sum0 = BuildHeaders(gs.frame[:ipHdr], src, dst, len(gs.frame)-ipHdr, cfg.DSCP)
		}
		setSockaddr(&gs.msg, &gs.sa4, &gs.sa6, dst, g.raw)
		gs.iov.Base = &gs.frame[0]
		gs.iov.SetLen(len(gs.frame))
		gs.msg.Hdr.Iov = &gs.iov
		gs.msg.Hdr.Iovlen = 1
		if cfg.RTCP {
			rsrc, rdst := netip.AddrPortFrom(src.Addr(), src.Port()+1), netip.AddrPortFrom(dst.Addr(), dst.Port()+1)
			if src.Port() == 0 {
				rsrc = src
			}
			n := ipHdr + rtcpLen(gs.cname)
			if enc != nil {
				n += enc.RTCPOverhead()
			}
			gs.rtcpFrame = make([]byte, n)
			if g.raw {
				gs.rsum0 = BuildHeaders(gs.rtcpFrame[:ipHdr], rsrc, rdst, n-ipHdr, cfg.DSCP)
			}
			setSockaddr(&gs.rtcpMsg, &gs.rsa4, &gs.rsa6, rdst, g.raw)
			gs.rtcpIov.Base = &gs.rtcpFrame[0]
			gs.rtcpIov.SetLen(n)
			gs.rtcpMsg.Hdr.Iov = &gs.rtcpIov
			gs.rtcpMsg.Hdr.Iovlen = 1
		}
		g.streams = append(g.streams, gs)
	}

	// Threads: stream i belongs to thread i mod T.
	for t := range min(cfg.Threads, cfg.Streams) {
		th := &genThread{id: t, fd: -1, rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))}
		if t == 0 {
			th.enc = enc
		} else if cfg.SRTP != nil {
			if th.enc, err = srtpflow.NewEncrypter(*cfg.SRTP); err != nil {
				return nil, err
			}
		}
		for i := t; i < cfg.Streams; i += cfg.Threads {
			th.streams = append(th.streams, g.streams[i])
		}
		maxSlot := 0
		for lo := 0; lo < len(th.streams); {
			hi := lo + 1
			for hi < len(th.streams) && th.streams[hi].offset < th.streams[lo].offset+cfg.Slot {
				hi++
			}
			th.slots = append(th.slots, genSlot{lo: lo, hi: hi, off: th.streams[lo].offset})
			maxSlot = max(maxSlot, hi-lo)
			lo = hi
		}
		n := maxSlot
		if cfg.RTCP {
			n *= 2
		}
		th.batch = make([]pktio.Mmsghdr, n)
		th.fds = make([]int, n)
		th.isRTCP = make([]bool, n)
		g.threads = append(g.threads, th)
	}

	if err := g.openSockets(); err != nil {
		return nil, err
	}
	return g, nil
}

// setSockaddr points m at the destination dst. A raw socket takes the
// address with port 0.
func setSockaddr(m *pktio.Mmsghdr, sa4 *unix.RawSockaddrInet4, sa6 *unix.RawSockaddrInet6, dst netip.AddrPort, raw bool) {
	port := dst.Port()
	if raw {
		port = 0
	}
	if dst.Addr().Is4() {
		sa4.Family = unix.AF_INET
		sa4.Addr = dst.Addr().As4()
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:], port)
		m.Hdr.Name = (*byte)(unsafe.Pointer(sa4))
		m.Hdr.Namelen = unix.SizeofSockaddrInet4
		return
	}
	sa6.Family = unix.AF_INET6
	sa6.Addr = dst.Addr().As16()
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa6.Port))[:], port)
	m.Hdr.Name = (*byte)(unsafe.Pointer(sa6))
	m.Hdr.Namelen = unix.SizeofSockaddrInet6
}

// BuildHeaders writes the IPv4 or IPv6 header and the UDP header for a UDP
// payload of n bytes into h and returns the one's complement sum of the
// pseudo-header and UDP header (checksum field 0), to which the payload is
// added per packet.
func BuildHeaders(h []byte, src, dst netip.AddrPort, n, dscp int) uint64 {
	udpLen := 8 + n
	var sum uint64
	var u []byte
	if src.Addr().Is4() {
		h[0] = 0x45
		h[1] = byte(dscp << 2)
		binary.BigEndian.PutUint16(h[2:], uint16(20+udpLen))
		binary.BigEndian.PutUint16(h[4:], 0)      // ID: the kernel fills it in
		binary.BigEndian.PutUint16(h[6:], 0x4000) // DF
		h[8] = 64
		h[9] = unix.IPPROTO_UDP
		s, d := src.Addr().As4(), dst.Addr().As4()
		copy(h[12:], s[:])
		copy(h[16:], d[:])
		// Raw sockets fill in the header checksum; AF_XDP frames need it.
		binary.BigEndian.PutUint16(h[10:], 0)
		binary.BigEndian.PutUint16(h[10:], pktio.Checksum(pktio.Sum(0, h[:20])))
		sum = pktio.Sum(sum, h[12:20])
		u = h[20:28]
	} else {
		binary.BigEndian.PutUint32(h[0:], 6<<28|uint32(dscp)<<22)
		binary.BigEndian.PutUint16(h[4:], uint16(udpLen))
		h[6] = unix.IPPROTO_UDP
		h[7] = 64
		s, d := src.Addr().As16(), dst.Addr().As16()
		copy(h[8:], s[:])
		copy(h[24:], d[:])
		sum = pktio.Sum(sum, h[8:40])
		u = h[40:48]
	}
	sum += unix.IPPROTO_UDP + uint64(udpLen)
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(udpLen))
	binary.BigEndian.PutUint16(u[6:], 0)
	return pktio.Sum(sum, u)
}

func (g *Generator) openSockets() error {
	cfg := &g.cfg
	fam4 := cfg.Dst.Lo.Is4()
	network := "udp4"
	if !fam4 {
		network = "udp6"
	}
	if cfg.Transport == "xdp" {
		ifindex, eth, err := NextHop(cfg.Dst.Lo)
		if err != nil {
			return err
		}
		for _, th := range g.threads {
			if th.xsk, err = openXDP(ifindex, th.id, eth); err != nil {
				return fmt.Errorf("thread %d (one device queue per thread): %w", th.id, err)
			}
		}
	} else if g.raw {
		for _, th := range g.threads {
			fd, err := openRaw(fam4)
			if err != nil {
				return err
			}
			g.rawFds = append(g.rawFds, fd)
			th.fd = fd
		}
	}
	listen := func(ap netip.AddrPort) (*net.UDPConn, int, error) {
		la := &net.UDPAddr{Port: int(ap.Port())}
		if ap.Addr().IsValid() {
			la.IP = ap.Addr().AsSlice()
		}
		c, err := net.ListenUDP(network, la)
		if err != nil {
			return nil, -1, err
		}
		fd := -1
		if rc, err := c.SyscallConn(); err == nil {
			rc.Control(func(f uintptr) {
				fd = int(f)
				if fam4 {
					_ = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS, cfg.DSCP<<2)
				} else {
					_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_TCLASS, cfg.DSCP<<2)
				}
				_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 1<<20)
				// Room for seconds of a stream when the receiving
				// goroutine runs late (a loaded host): the default
				// (rmem_default, 208 KiB, which SO_RCVBUF cannot pass
				// without privilege) held about 50 packets that XDP had
				// redirected through a veth, one second of G.711: an
				// appliance test lost 54 packets that way, counted in the
				// callee's UdpRcvbufErrors, while its voipgen answer
				// stalled for 1.1 s. Arrival times are the kernel's, so
				// packets read late keep the times they came at.
				if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 1<<20) != nil {
					_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
				}
			})
		}
		return c, fd, nil
	}
	if g.shared {
		for _, th := range g.threads {
			c, fd, err := listen(netip.AddrPortFrom(cfg.Src.Lo, 0))
			if err != nil {
				return fmt.Errorf("open socket: %w", err)
			}
			g.conns = append(g.conns, c)
			th.fd = fd
		}
		return nil
	}
	if g.raw && !cfg.Bidir {
		return nil
	}
	// A socket per stream: udp transport sends through it; with --bidir it
	// receives the peer's stream (and RTCP on port+1).
	for _, gs := range g.streams {
		src := cfg.Src.At(gs.idx)
		c, fd, err := listen(src)
		if err != nil {
			return fmt.Errorf("open socket for stream %d on %s: %w", gs.idx, src, err)
		}
		g.conns = append(g.conns, c)
		if !g.raw {
			gs.fd = fd
		}
		if cfg.RTCP && (src.Port() != 0 || !g.raw) {
			rsrc := src
			if src.Port() != 0 {
				rsrc = netip.AddrPortFrom(src.Addr(), src.Port()+1)
			}
			rc, rfd, err := listen(rsrc)
			if err != nil {
				return fmt.Errorf("open RTCP socket for stream %d on %s: %w", gs.idx, rsrc, err)
			}
			g.rtcpCon = append(g.rtcpCon, rc)
			if !g.raw {
				gs.rfd = rfd
			}
		}
	}
	return nil
}

func openRaw(fam4 bool) (int, error) {
	af := unix.AF_INET
	if !fam4 {
		af = unix.AF_INET6
	}
	// IPPROTO_RAW implies IP_HDRINCL (and IPV6_HDRINCL since Linux 4.5).
	fd, err := unix.Socket(af, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return -1, fmt.Errorf("raw socket (needs CAP_NET_RAW; try --transport udp): %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4<<20); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
	}
	return fd, nil
}

func (g *Generator) Close() error {
	var errs []error
	for _, c := range g.conns {
		errs = append(errs, c.Close())
	}
	for _, c := range g.rtcpCon {
		errs = append(errs, c.Close())
	}
	for _, fd := range g.rawFds {
		errs = append(errs, unix.Close(fd))
	}
	for _, th := range g.threads {
		if th.xsk != nil {
			errs = append(errs, th.xsk.close())
			th.xsk = nil
		}
	}
	g.conns, g.rtcpCon, g.rawFds = nil, nil, nil
	return errors.Join(errs...)
}

// MonoNow returns CLOCK_MONOTONIC in nanoseconds.
func MonoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// SleepUntil sleeps until CLOCK_MONOTONIC reaches t (ns): an absolute
// deadline, so oversleeping once does not shift later deadlines.
func SleepUntil(t int64) {
	ts := unix.NsecToTimespec(t)
	for {
		err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// SleepUntilHeld is SleepUntil for a thread that keeps its P while it
// sleeps: a goroutine locked to its thread for good (runtime.LockOSThread),
// with GOMAXPROCS raised by one for it, so that the other goroutines keep
// the CPUs' worth of Ps. The sleep is a raw system call the Go scheduler
// does not see. Through SleepUntil, every sleep longer than the runtime
// monitor's 20 µs tick costs the process a P retaken by sysmon and handed
// to another thread, sysmon kept at its shortest period, and a P to get
// back when the sleep ends: for a thread that sleeps a millisecond at a
// time, more CPU than its own work. The runtime's preemption signal, every
// 10 ms of a sleep, ends it early with EINTR; it goes on to t.
func SleepUntilHeld(t int64) {
	ts := unix.NsecToTimespec(t)
	for {
		_, _, errno := unix.RawSyscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME,
			uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		if errno != unix.EINTR {
			return
		}
	}
}

// errnoTally counts send errors by errno, without allocating: the first
// few kinds seen get a slot each, the rest are counted together.
type errnoTally struct {
	errno [4]unix.Errno
	n     [4]uint64
	other uint64
}

func (t *errnoTally) add(err error, n uint64) {
	var e unix.Errno
	if !errors.As(err, &e) {
		t.other += n
		return
	}
	for i := range t.errno {
		if t.errno[i] == e || t.n[i] == 0 {
			t.errno[i] = e
			t.n[i] += n
			return
		}
	}
	t.other += n
}

// into adds the tally to m, by error name (unix.ErrnoName, or the
// number).
func (t *errnoTally) into(m map[string]uint64) {
	for i := range t.errno {
		if t.n[i] == 0 {
			continue
		}
		name := unix.ErrnoName(t.errno[i])
		if name == "" {
			name = fmt.Sprintf("errno %d", int(t.errno[i]))
		}
		m[name] += t.n[i]
	}
	if t.other > 0 {
		m["other"] += t.other
	}
}

// Result is what voipgen send reports about sending.
type Result struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"` // UDP payload bytes
	Errors  uint64 `json:"errors"`
	// ErrorKinds counts the send errors by errno (EAGAIN, ENOBUFS, ...):
	// each is a packet never sent, whose sequence number a receiver sees
	// missing.
	ErrorKinds map[string]uint64 `json:"error_kinds,omitempty"`
	RTCP       uint64            `json:"rtcp_packets"`
	Calls      uint64            `json:"calls"` // calls started
	Elapsed    float64           `json:"elapsed_s"`
	PPS        float64           `json:"pps"`
	LateP50us  float64           `json:"late_p50_us"`
	LateP99us  float64           `json:"late_p99_us"`
	LateMaxus  float64           `json:"late_max_us"`
	CPUs       float64           `json:"sender_cpu_s"` // CPU time of the sender threads
	CPUPerPkUs float64           `json:"sender_cpu_per_packet_us"`
	RTError    string            `json:"rt_priority_error,omitempty"`
	Transport  string            `json:"transport"`
	Threads    int               `json:"threads"`
}

// Run sends until the duration has passed or ctx is done.
func (g *Generator) Run(ctx context.Context) Result {
	start := MonoNow() + int64(20*time.Millisecond)
	wall := time.Now()
	var wg sync.WaitGroup
	for _, th := range g.threads {
		wg.Go(func() { g.runThread(ctx, th, start) })
	}
	wg.Wait()
	// The sending took the span of the ptimes sent, or longer if the
	// last packets left late: not the time until Run's caller woke up.
	span := time.Since(wall) - 20*time.Millisecond
	sched, last := 0, int64(0)
	for _, th := range g.threads {
		sched = max(sched, th.res.cycles)
		last = max(last, th.res.end)
	}
	if last != 0 {
		span = max(time.Duration(sched)*g.cfg.Ptime, time.Duration(last-start))
	}
	res := Result{Elapsed: span.Seconds(), Transport: g.cfg.Transport, Threads: len(g.threads)}
	var late LatencyHist
	var cpu time.Duration
	for _, th := range g.threads {
		r := th.res
		res.Packets += r.packets
		res.Bytes += r.bytes
		res.Errors += r.errors + r.srtpErrors
		if r.errors > 0 {
			if res.ErrorKinds == nil {
				res.ErrorKinds = map[string]uint64{}
			}
			r.errnos.into(res.ErrorKinds)
		}
		if r.srtpErrors > 0 {
			if res.ErrorKinds == nil {
				res.ErrorKinds = map[string]uint64{}
			}
			res.ErrorKinds["srtp"] += r.srtpErrors
		}
		res.RTCP += r.rtcp
		res.Calls += r.calls
		cpu += r.cpu
		late.merge(&th.late)
		if r.rtErr != nil {
			res.RTError = r.rtErr.Error()
		}
	}
	if res.Elapsed > 0 {
		res.PPS = float64(res.Packets) / res.Elapsed
	}
	res.LateP50us = late.quantile(0.5)
	res.LateP99us = late.quantile(0.99)
	res.LateMaxus = float64(late.max) / 1e3
	res.CPUs = cpu.Seconds()
	if res.Packets > 0 {
		res.CPUPerPkUs = cpu.Seconds() * 1e6 / float64(res.Packets+res.RTCP)
	}
	return res
}

func (h *LatencyHist) merge(o *LatencyHist) {
	for i, c := range o.buckets {
		h.buckets[i] += c
	}
	h.total += o.total
	h.max = max(h.max, o.max)
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

func (g *Generator) runThread(ctx context.Context, th *genThread, start int64) {
	runtime.LockOSThread()
	if p := g.cfg.RTPriority; p > 0 {
		// A real-time thread keeps its schedule on a busy machine. It is
		// never unlocked: the runtime ends it with this goroutine rather
		// than hand its priority to other goroutines.
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: uint32(p)}, 0); err != nil {
			th.res.rtErr = err
		}
	} else {
		defer runtime.UnlockOSThread()
	}
	if g.cfg.Pin && runtime.NumCPU() > 1 {
		var set unix.CPUSet
		set.Set(th.id % runtime.NumCPU())
		_ = unix.SchedSetaffinity(0, &set)
	}
	// The default timer slack of 50 us would add to every wake-up.
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	// A real-time thread is woken by the timer itself: it keeps
	// clock_nanosleep (a nil pacer), as it does if no timerfd can be had.
	if g.cfg.RTPriority == 0 {
		if p, err := newPacer(); err == nil {
			th.pace = p
			defer func() {
				p.close()
				th.pace = nil
			}()
		}
	}
	cpu0 := threadCPU()
	cycles := int(g.cfg.Duration / g.cfg.Ptime)
	for cycle := range cycles {
		if ctx.Err() != nil {
			break
		}
		base := time.Duration(cycle) * g.cfg.Ptime
		var sent uint64
		for k := range th.slots {
			sent += g.sendSlot(th, start, base, &th.slots[k])
		}
		g.sent.Add(sent)
		th.res.cycles = cycle + 1
	}
	th.res.end = MonoNow()
	th.res.cpu = threadCPU() - cpu0
}

// sendSlot sleeps until the slot's deadline in the cycle starting at base,
// builds the packets of its active streams and sends them. It returns the
// number of RTP packets sent. It does not allocate (once each stream's
// SSRC is known to the SRTP context).
func (g *Generator) sendSlot(th *genThread, start int64, base time.Duration, sl *genSlot) uint64 {
	deadline := start + int64(base+sl.off)
	th.pace.until(deadline)
	n := 0
	for _, gs := range th.streams[sl.lo:sl.hi] {
		t := base + gs.offset
		if !g.advanceCall(th, gs, t) {
			continue
		}
		if !g.buildRTP(th, gs) {
			continue
		}
		th.batch[n], th.fds[n], th.isRTCP[n] = gs.msg, gs.fd, false
		n++
		if gs.rtcpFrame != nil && g.rtcpDue(gs) && g.buildRTCP(th, gs) {
			th.batch[n], th.fds[n], th.isRTCP[n] = gs.rtcpMsg, gs.rfd, true
			n++
		}
	}
	th.late.add(time.Duration(MonoNow()-deadline), n)
	if n == 0 {
		return 0
	}
	return g.flush(th, th.batch[:n], th.fds[:n], th.isRTCP[:n])
}

// advanceCall starts and ends the calls of gs's channel at time t and
// reports whether a call is active.
func (g *Generator) advanceCall(th *genThread, gs *genStream, t time.Duration) bool {
	if !gs.active {
		if gs.start == 0 && g.cfg.Rate > 0 {
			gs.start = time.Duration(float64(gs.idx) / g.cfg.Rate * float64(time.Second))
			if gs.start == 0 {
				gs.start = -1 // stream 0: at once
			}
		}
		if t < gs.start {
			return false
		}
		g.newCall(th, gs, t)
		return true
	}
	if gs.end > 0 && t >= gs.end {
		g.newCall(th, gs, t)
	}
	return true
}

func (g *Generator) newCall(th *genThread, gs *genStream, t time.Duration) {
	if gs.calls > 0 {
		// A fresh call: new SSRC, sequence number and timestamp. The
		// first call of each channel keeps those chosen at setup.
		r := th.rng.Uint64()
		gs.st.Restart(uint32(r), uint16(r>>32), th.rng.Uint32())
	}
	gs.active = true
	gs.calls++
	gs.packets, gs.octets = 0, 0
	th.res.calls++
	gs.end = 0
	if d := g.cfg.CallDur; d > 0 {
		if g.cfg.CallDurExp {
			d = time.Duration(th.rng.ExpFloat64() * float64(d))
		}
		gs.end = t + max(d, g.cfg.Ptime)
	}
}

// buildRTP writes the stream's next packet into its frame.
func (g *Generator) buildRTP(th *genThread, gs *genStream) bool {
	gs.st.Next()
	n := gs.rtpLen
	if th.enc != nil {
		out, err := th.enc.EncryptRTP(gs.st.Buf[:0], gs.st.Buf)
		if err != nil {
			th.res.srtpErrors++
			return false
		}
		n = len(out)
	}
	gs.packets++
	gs.octets += uint32(gs.rtpLen - rtp.HeaderSize)
	if g.raw {
		SetUDPChecksum(gs.frame, gs.rtpOff, n, gs.sum0)
	}
	return true
}

// SetUDPChecksum writes the UDP checksum of the payload frame[off:off+n].
func SetUDPChecksum(frame []byte, off, n int, sum0 uint64) {
	binary.BigEndian.PutUint16(frame[off-2:], pktio.Checksum(pktio.Sum(sum0, frame[off:off+n])))
}

func (g *Generator) rtcpDue(gs *genStream) bool {
	every := uint32(rtcpInterval / g.cfg.Ptime)
	return every > 0 && (gs.packets+every/2)%every == 0
}

// rtcpLen is the length of voipgen's compound RTCP packet: an SR without
// report blocks and an SDES chunk with the CNAME.
func rtcpLen(cname string) int {
	return 28 + (8+2+len(cname)+1+3)/4*4
}

// buildRTCP writes an SR and an SDES CNAME for gs's current call.
func (g *Generator) buildRTCP(th *genThread, gs *genStream) bool {
	off := len(gs.rtcpFrame) - rtcpLen(gs.cname)
	if th.enc != nil {
		off -= th.enc.RTCPOverhead()
	}
	b := gs.rtcpFrame[off : off+rtcpLen(gs.cname)]
	ssrc := gs.st.Header.SSRC
	h := rtp.RTCPHeader{Type: rtp.TypeSenderReport, Length: 6, SSRC: ssrc}
	h.MarshalTo(b)
	now := time.Now()
	si := rtp.SenderInfo{NTPTime: ntpTime(now), RTPTime: gs.st.Header.Timestamp - gs.st.TSStep,
		PacketCount: gs.packets, OctetCount: gs.octets}
	si.MarshalTo(b[8:])
	s := b[28:]
	sh := rtp.RTCPHeader{Count: 1, Type: rtp.TypeSDES, Length: uint16(len(s)/4 - 1), SSRC: ssrc}
	sh.MarshalTo(s)
	s[8], s[9] = 1, byte(len(gs.cname)) // CNAME
	copy(s[10:], gs.cname)
	clear(s[10+len(gs.cname):])
	n := len(b)
	if th.enc != nil {
		out, err := th.enc.EncryptRTCP(b[:0], b)
		if err != nil {
			th.res.srtpErrors++
			return false
		}
		n = len(out)
	}
	if g.raw {
		SetUDPChecksum(gs.rtcpFrame, off, n, gs.rsum0)
	}
	return true
}

// ntpTime converts t to a 64-bit NTP timestamp.
func ntpTime(t time.Time) uint64 {
	const ntpEpochOffset = 2208988800
	s := uint64(t.Unix() + ntpEpochOffset)
	f := uint64(t.Nanosecond()) << 32 / 1e9
	return s<<32 | f
}

// flush sends a slot's batch: one sendmmsg on the raw or shared socket (or
// the AF_XDP ring), else one per message on each stream's socket. A
// message that fails is counted and skipped. It returns the RTP packets
// sent.
func (g *Generator) flush(th *genThread, ms []pktio.Mmsghdr, fds []int, rtcp []bool) uint64 {
	var rtpSent uint64
	count := func(i int, n uint32) {
		if rtcp[i] {
			th.res.rtcp++
			return
		}
		th.res.packets++
		th.res.bytes += uint64(int(n) - g.hdrLen)
		rtpSent++
	}
	switch {
	case th.xsk != nil:
		n, _ := th.xsk.send(ms)
		for i := range n {
			count(i, uint32(ms[i].Hdr.Iov.Len))
		}
		if n < len(ms) {
			// No free frame in the ring: as the socket's EAGAIN.
			th.res.errors += uint64(len(ms) - n)
			th.res.errnos.add(unix.EAGAIN, uint64(len(ms)-n))
		}
	case th.fd >= 0:
		for off := 0; off < len(ms); {
			n, err := sendmmsg(th.fd, ms[off:])
			for i := off; i < off+n; i++ {
				count(i, ms[i].Len)
			}
			off += n
			if err != nil && off < len(ms) {
				// No route (a link is down): the rest of the slot would
				// fail the same way, one syscall each, and make the
				// sender late for the next slots. Count them all.
				if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.ENETDOWN) {
					th.res.errors += uint64(len(ms) - off)
					th.res.errnos.add(err, uint64(len(ms)-off))
					break
				}
				th.res.errors++
				th.res.errnos.add(err, 1)
				off++
			}
		}
	default:
		for i := range ms {
			n, err := sendmmsg(fds[i], ms[i:i+1])
			if n == 1 {
				count(i, ms[i].Len)
			} else {
				th.res.errors++
				th.res.errnos.add(err, 1)
			}
		}
	}
	return rtpSent
}

// sendmmsg sends ms on fd and returns how many were sent; err is set when
// fewer than all were.
func sendmmsg(fd int, ms []pktio.Mmsghdr) (int, error) {
	n, errno := pktio.Sendmmsg(fd, ms, 0)
	if errno != 0 {
		return 0, errno
	}
	if n < len(ms) {
		return n, errNothingSent
	}
	return n, nil
}

// Config returns the generator's configuration (sources resolved).
func (g *Generator) Config() Config { return g.cfg }

// Threads is the number of sender threads.
func (g *Generator) Threads() int { return len(g.threads) }

// Conns returns the generator's UDP sockets (transports udp and shared;
// none for raw): the streams' RTP sockets, then the RTCP ones. A receiver
// of what the peers send back (--bidir) reads them.
func (g *Generator) Conns() []*net.UDPConn { return append(slices.Clone(g.conns), g.rtcpCon...) }

// Sent is the number of packets sent so far; safe to call while Run runs.
func (g *Generator) Sent() uint64 { return g.sent.Load() }

// WriteText writes the one-line summary of r.
func (r Result) WriteText(w io.Writer) {
	fmt.Fprintf(w, "sent %d RTP packets (%d bytes, %d RTCP, %d errors) of %d calls in %.3f s: %.0f pps; lateness against schedule p50 %.0f us, p99 %.0f us, max %.0f us; sender CPU %.2f s, %.2f us per packet\n",
		r.Packets, r.Bytes, r.RTCP, r.Errors, r.Calls, r.Elapsed, r.PPS, r.LateP50us, r.LateP99us, r.LateMaxus, r.CPUs, r.CPUPerPkUs)
}

// SetDst points stream i at dst before run starts, for endpoints that learn
// their peer from signalling (voipgen call and answer).
func (g *Generator) SetDst(i int, dst netip.AddrPort) {
	gs := g.streams[i]
	setSockaddr(&gs.msg, &gs.sa4, &gs.sa6, dst, g.raw)
	if g.raw {
		gs.sum0 = BuildHeaders(gs.frame[:gs.rtpOff], g.cfg.Src.At(i), dst, len(gs.frame)-gs.rtpOff, g.cfg.DSCP)
	}
}
