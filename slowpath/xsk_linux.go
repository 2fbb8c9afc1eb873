package slowpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/pktio"
)

// AF_XDP receive (Config.IO "afxdp"). The XDP program bpf/xsk.c, attached
// to Config.Interfaces, redirects each packet to a steered relay address
// and port into an XDP socket of the worker that owns the flow, instead of
// passing it up the kernel's IP and UDP receive path to the worker's UDP
// socket. An XDP socket is bound to one device queue, and a queue has one
// buffer pool: so each (device, queue) has one UMEM and one fill ring
// (xskUmem), and each worker one socket on it with its own RX ring
// (xskSock), bound with XDP_SHARED_UMEM to the first. A worker reads its
// RX rings without a system call, relays the batch through the same
// per-packet code as the socket path, and gives the frames back to the
// fill ring (under the queue's mutex: the ring has one producer side and
// the workers share it; one lock per batch, uncontended with one worker).
// Sending stays on the workers' raw sockets. Packets the program passes
// (not steered, IPv4 options, fragments, IPv6 extension headers, VLAN
// tags, no socket for the slot) take the socket path as before.
const (
	xskQueues    = 64   // bpf/xsk.h XSK_QUEUES: queues per device a worker can have a socket on
	xskFrameSize = 2048 // a UMEM frame; XDP_PACKET_HEADROOM (256) of it is in front of the packet
	// xskFrames are a (device, queue)'s frames (16 MiB), also its fill
	// ring's size, and xskRxRing each socket's RX ring: about what the
	// socket path's 8 MiB receive buffer holds of RTP packets (a skb's
	// truesize is about 1 KiB), so that a worker kept off its CPU for a
	// while (160 ms at 50k pps) loses no more than the socket would.
	xskFrames   = 8192
	xskRxRing   = 8192
	xskCompRing = 64 // the completion ring the kernel requires (nothing is sent)
	xskMetaLen  = 8  // the program's receive time in front of the packet

	// The fill ring holds fillCover of the queue's traffic (at the rate
	// of the last fillTick), at least fillMin frames and at most all of
	// them; the floor's raise after the ring ran dry halves back one step
	// per fillDecay without another.
	fillMin   = 512
	fillCover = 20 * time.Millisecond
	fillTick  = 100 * time.Millisecond
	fillDecay = time.Minute
)

type xskRing struct {
	producer, consumer *uint32
	mask               uint32
	mem                []byte
}

func (r *xskRing) unmap() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
	return err
}

// xskUmem is one (device, queue)'s UMEM and fill ring, shared by the
// workers' sockets on that queue. Its first socket registered it.
type xskUmem struct {
	ifindex, queue int
	fd             int // the first socket's, which owns the rings
	mem            []byte
	mu             sync.Mutex // guards the fill ring's producer side and what follows
	fq             xskRing
	fqAddr         []uint64
	// The fill ring is kept at level frames, not at all of them. The
	// kernel fills frames in the order they were given, so a ring holding
	// every frame would cycle the queue's packets through the whole UMEM
	// (16 MiB; the five cache lines a packet and its receive time take,
	// written by the kernel and read by the worker, missed every time,
	// and the caches' other lines, the flows' state and SRTP contexts,
	// pushed out). Kept at what the traffic needs, the ring gets back the
	// frames given back last, still in the caches. free holds the others,
	// the most recently given back last.
	free     []uint64
	level    int    // the fill ring's frames, set by tuneFill
	floor    int    // level's least, raised when the ring ran dry
	released uint64 // frames given back, for tuneFill's rate
	tune     fillTuning
	// meta: the program puts each packet's receive time in front of it
	// (xskPlane.meta).
	meta bool
}

// xskSock is one worker's XDP socket on one (device, queue). Its RX ring
// is the worker's alone.
type xskSock struct {
	fd     int
	u      *xskUmem
	rx     xskRing
	rxDesc []unix.XDPDesc
	own    bool               // fd is u.fd: closed with the UMEM
	seen   unix.XDPStatistics // its statistics at xskPlane.tuneOnce's last read
}

func setsockoptPtr(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, errno := syscall.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), size, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// getsockoptXDP reads SOL_XDP option opt (named name in errors) of fd.
func getsockoptXDP[T any](fd, opt int, name string) (T, error) {
	var v T
	size := uint32(unsafe.Sizeof(v))
	if _, _, errno := syscall.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt),
		uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&size)), 0); errno != 0 {
		return v, fmt.Errorf("%s: %w", name, errno)
	}
	return v, nil
}

func xskOffsets(fd int) (unix.XDPMmapOffsets, error) {
	return getsockoptXDP[unix.XDPMmapOffsets](fd, unix.XDP_MMAP_OFFSETS, "XDP_MMAP_OFFSETS")
}

func mmapXSKRing(fd int, pgoff uint64, ro unix.XDPRingOffset, n, elem int) (xskRing, error) {
	mem, err := unix.Mmap(fd, int64(pgoff), int(ro.Desc)+n*elem, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return xskRing{}, err
	}
	return xskRing{
		producer: (*uint32)(unsafe.Pointer(&mem[ro.Producer])),
		consumer: (*uint32)(unsafe.Pointer(&mem[ro.Consumer])),
		mask:     uint32(n - 1), mem: mem,
	}, nil
}

// bindXSK binds fd to the queue, in copy mode (veth has no zero-copy),
// sharing the UMEM of the socket shared if it is not -1. A socket closed
// just before on the queue is released by the kernel a little later:
// EBUSY is retried for a second.
func bindXSK(fd, ifindex, queue, shared int) error {
	sa := &unix.SockaddrXDP{Flags: unix.XDP_COPY, Ifindex: uint32(ifindex), QueueID: uint32(queue)}
	if shared >= 0 {
		sa.Flags = unix.XDP_SHARED_UMEM
		sa.SharedUmemFD = uint32(shared)
	}
	for try := 0; ; try++ {
		err := unix.Bind(fd, sa)
		if err == nil || !errors.Is(err, unix.EBUSY) || try == 50 {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// openXSK opens a socket on (ifindex, queue): with a new UMEM when u is
// nil (the queue's first socket), else on u's. It returns the socket and
// its UMEM.
func openXSK(ifindex, queue int, u *xskUmem) (_ *xskSock, err error) {
	s := &xskSock{fd: -1, u: u}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.fd, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("AF_XDP socket: %w", err)
	}
	shared := -1
	if u == nil {
		u = &xskUmem{ifindex: ifindex, queue: queue, fd: s.fd}
		s.u, s.own = u, true
		if u.mem, err = unix.Mmap(-1, 0, xskFrames*xskFrameSize, unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
			return nil, fmt.Errorf("UMEM: %w", err)
		}
		reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&u.mem[0]))), Len: uint64(len(u.mem)), Size: xskFrameSize}
		if err := setsockoptPtr(s.fd, unix.SOL_XDP, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
			return nil, fmt.Errorf("XDP_UMEM_REG: %w", err)
		}
		if err := unix.SetsockoptInt(s.fd, unix.SOL_XDP, unix.XDP_UMEM_FILL_RING, xskFrames); err != nil {
			return nil, fmt.Errorf("XDP fill ring: %w", err)
		}
		if err := unix.SetsockoptInt(s.fd, unix.SOL_XDP, unix.XDP_UMEM_COMPLETION_RING, xskCompRing); err != nil {
			return nil, fmt.Errorf("XDP completion ring: %w", err)
		}
	} else {
		shared = u.fd
	}
	if err := unix.SetsockoptInt(s.fd, unix.SOL_XDP, unix.XDP_RX_RING, xskRxRing); err != nil {
		return nil, fmt.Errorf("XDP RX ring: %w", err)
	}
	off, err := xskOffsets(s.fd)
	if err != nil {
		return nil, err
	}
	if s.rx, err = mmapXSKRing(s.fd, unix.XDP_PGOFF_RX_RING, off.Rx, xskRxRing, int(unsafe.Sizeof(unix.XDPDesc{}))); err != nil {
		return nil, fmt.Errorf("RX ring: %w", err)
	}
	s.rxDesc = unsafe.Slice((*unix.XDPDesc)(unsafe.Pointer(&s.rx.mem[off.Rx.Desc])), xskRxRing)
	if s.own {
		if u.fq, err = mmapXSKRing(s.fd, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, xskFrames, 8); err != nil {
			return nil, fmt.Errorf("fill ring: %w", err)
		}
		u.fqAddr = unsafe.Slice((*uint64)(unsafe.Pointer(&u.fq.mem[off.Fr.Desc])), xskFrames)
		u.initFill()
	}
	if err := bindXSK(s.fd, ifindex, queue, shared); err != nil {
		return nil, fmt.Errorf("bind AF_XDP socket to ifindex %d queue %d: %w", ifindex, queue, err)
	}
	return s, nil
}

// close closes the socket; the queue's first socket unmaps the UMEM and
// fill ring too, so it is closed last.
func (s *xskSock) close() error {
	errs := []error{s.rx.unmap()}
	if s.own {
		errs = append(errs, s.u.fq.unmap())
	}
	if s.fd >= 0 {
		errs = append(errs, unix.Close(s.fd))
		s.fd = -1
	}
	if s.own && s.u.mem != nil {
		errs = append(errs, unix.Munmap(s.u.mem))
		s.u.mem = nil
	}
	return errors.Join(errs...)
}

// xskBatch is a worker's AF_XDP receive batch: the packets parsed out of
// the frames read, and the frames to give back. Allocated once.
type xskBatch struct {
	pkts  [batchSize]xskPacket
	addrs [batchSize]uint64 // the frames of the last recv, to give back
	nAddr int
	// monoStart and monoBase are one instant read by time.Now and as
	// CLOCK_MONOTONIC (ns): the program's receive times (monotonic) are
	// converted to Unix ns through them.
	monoStart time.Time
	monoBase  int64
}

type xskPacket struct {
	payload  []byte
	src, dst netip.AddrPort
	ts       int64
}

func newXSKBatch() *xskBatch {
	b := &xskBatch{monoStart: time.Now()}
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) == nil {
		b.monoBase = ts.Nano()
	}
	return b
}

func (b *xskBatch) packet(i int) (payload []byte, src, dst netip.AddrPort, ts int64) {
	p := &b.pkts[i]
	return p.payload, p.src, p.dst, p.ts
}

// recv takes up to a batch of frames off s's RX ring without a system
// call: it returns the packets parsed into b (valid IP and UDP headers and
// checksums), the descriptors taken and the frames dropped as malformed.
// The frames taken are given back with release once the batch is relayed
// (a descriptor outside the UMEM, which the kernel never writes, names no
// frame to give back).
func (b *xskBatch) recv(s *xskSock) (n, frames, bad int) {
	b.nAddr = 0
	prod := atomic.LoadUint32(s.rx.producer)
	cons := *s.rx.consumer
	avail := int(prod - cons)
	if avail == 0 {
		return 0, 0, 0
	}
	frames = min(avail, batchSize)
	now := time.Now()
	offset := now.UnixNano() - (b.monoBase + int64(now.Sub(b.monoStart)))
	mem := s.u.mem
	for i := range frames {
		d := s.rxDesc[(cons+uint32(i))&s.rx.mask]
		if d.Addr >= uint64(len(mem)) {
			bad++
			continue
		}
		b.addrs[b.nAddr] = d.Addr &^ (xskFrameSize - 1)
		b.nAddr++
		if uint64(d.Len) > uint64(len(mem))-d.Addr || d.Addr&(xskFrameSize-1) < xskMetaLen {
			bad++
			continue
		}
		p := &b.pkts[n]
		var ok bool
		if p.payload, p.src, p.dst, ok = parseFrame(mem[d.Addr : d.Addr+uint64(d.Len)]); !ok {
			bad++
			continue
		}
		p.ts = 0
		if !s.u.meta {
			p.ts = now.UnixNano()
		} else if mono := int64(binary.NativeEndian.Uint64(mem[d.Addr-xskMetaLen:])); mono > 0 {
			p.ts = mono + offset
		}
		n++
	}
	atomic.StoreUint32(s.rx.consumer, cons+uint32(frames))
	return n, frames, bad
}

// release gives the frames of the last recv back to the queue: to its
// fill ring first, as far as the ring is below its level.
func (b *xskBatch) release(s *xskSock) {
	u := s.u
	u.mu.Lock()
	u.free = append(u.free, b.addrs[:b.nAddr]...) // never grows: cap is every frame
	u.released += uint64(b.nAddr)
	u.topUp()
	u.mu.Unlock()
}

// initFill gives the kernel the UMEM's first fillMin frames; the others
// wait in free.
func (u *xskUmem) initFill() {
	n := len(u.mem) / xskFrameSize
	u.free = make([]uint64, 0, n)
	for i := n - 1; i >= 0; i-- {
		u.free = append(u.free, uint64(i)*xskFrameSize)
	}
	u.level, u.floor = min(fillMin, n), min(fillMin, n)
	u.topUp()
}

// topUp moves frames from the top of free (the last given back) to the
// fill ring until it holds level of them. u.mu must be held.
func (u *xskUmem) topUp() {
	prod := *u.fq.producer
	n := min(u.level-int(prod-atomic.LoadUint32(u.fq.consumer)), len(u.free))
	if n <= 0 {
		return
	}
	top := len(u.free) - 1
	for i := range n {
		u.fqAddr[(prod+uint32(i))&u.fq.mask] = u.free[top-i]
	}
	u.free = u.free[:len(u.free)-n]
	atomic.StoreUint32(u.fq.producer, prod+uint32(n))
}

// fillTuning is what tuneFill keeps between its ticks.
type fillTuning struct {
	released uint64    // u.released at the last tick
	empty    uint64    // the kernel's count of frames asked of an empty fill ring, at the last tick
	raised   time.Time // when floor was last raised or decayed
}

// tuneFill sets the fill ring's level from the frames given back since
// the last call (dt ago) and empty, the kernel's count of packets that
// found the fill ring empty (XDP_STATISTICS): fillCover of traffic at that
// rate, rounded up to a power of two; after the ring ran dry, at least
// twice what it was, for fillDecay. It tops the ring up to the new level.
func (u *xskUmem) tuneFill(now time.Time, dt time.Duration, empty uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := len(u.mem) / xskFrameSize
	t := &u.tune
	rate := u.released - t.released
	t.released = u.released
	switch {
	case empty > t.empty:
		u.floor = min(2*max(u.floor, u.level), n)
		t.raised = now
	case u.floor > fillMin && now.Sub(t.raised) >= fillDecay:
		u.floor = max(u.floor/2, fillMin)
		t.raised = now
	}
	t.empty = empty
	want := 0
	if dt > 0 {
		want = 1 << bits.Len64(rate*uint64(fillCover)/uint64(dt))
	}
	u.level = min(max(want, u.floor, fillMin), n)
	u.topUp()
}

// parseFrame returns the UDP payload and addresses of an Ethernet frame
// holding an IPv4 (no options, not fragmented) or IPv6 (no extension
// headers) UDP datagram whose lengths and checksums hold: what the
// kernel's receive path checks before a socket sees a datagram. An IPv4
// UDP checksum of 0 means none; IPv6 requires one.
func parseFrame(f []byte) (payload []byte, src, dst netip.AddrPort, ok bool) {
	if len(f) < 14 {
		return nil, src, dst, false
	}
	var udp []byte
	var sum uint64
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0800:
		ip := f[14:]
		if len(ip) < ipv4HeaderLen || ip[0] != 0x45 || ip[9] != unix.IPPROTO_UDP || binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
			return nil, src, dst, false
		}
		tot := int(binary.BigEndian.Uint16(ip[2:]))
		if tot < ipv4HeaderLen+udpHeaderLen || tot > len(ip) || pktio.Fold(pktio.Sum(0, ip[:ipv4HeaderLen])) != 0xffff {
			return nil, src, dst, false
		}
		udp = ip[ipv4HeaderLen:tot]
		src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(udp))
		dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(udp[2:]))
		if binary.BigEndian.Uint16(udp[6:]) != 0 {
			sum = pktio.Sum(0, ip[12:20])
		}
	case 0x86dd:
		ip := f[14:]
		if len(ip) < ipv6HeaderLen || ip[0]>>4 != 6 || ip[6] != unix.IPPROTO_UDP {
			return nil, src, dst, false
		}
		plen := int(binary.BigEndian.Uint16(ip[4:]))
		if plen < udpHeaderLen || ipv6HeaderLen+plen > len(ip) || binary.BigEndian.Uint16(ip[ipv6HeaderLen+6:]) == 0 {
			return nil, src, dst, false
		}
		udp = ip[ipv6HeaderLen : ipv6HeaderLen+plen]
		src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[8:24])).Unmap(), binary.BigEndian.Uint16(udp))
		dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[24:40])).Unmap(), binary.BigEndian.Uint16(udp[2:]))
		sum = pktio.Sum(0, ip[8:40])
	default:
		return nil, src, dst, false
	}
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	if ulen < udpHeaderLen || ulen > len(udp) {
		return nil, src, dst, false
	}
	udp = udp[:ulen]
	if sum != 0 {
		sum += unix.IPPROTO_UDP + uint64(ulen)
		if pktio.Fold(pktio.Sum(sum, udp)) != 0xffff {
			return nil, src, dst, false
		}
	}
	return udp[udpHeaderLen:], src, dst, true
}

// xskPlane is the pool's AF_XDP receive: the program on its interfaces
// (loaded once per interface, with its index: objs[i] is interface i's),
// or none when another program redirects (Config.ExternalXDP); the
// sockets' XSKMAP and the devices' indexes (what such a program needs);
// and every worker's sockets.
type xskPlane struct {
	names   []string // the devices (Config.Interfaces), by their index
	objs    []*xskObjects
	sockMap *ebpf.Map // slot (see bpf/xsk.c) -> socket
	devMap  *ebpf.Map // ifindex -> the device's index in names

	mu      sync.Mutex // guards what follows: a device re-created replaces them (recreated)
	closed  bool
	ifindex []int                 // by device: the one its sockets are bound to
	links   []link.Link           // by device, without ExternalXDP
	ifaces  []dataplane.Interface // where the program is attached, and how (without ExternalXDP)
	socks   []*xskSock            // the queues' first sockets after the others

	// stop ends tuneLoop, which sets the fill rings' levels and counts
	// the kernel's drops into dropped (no frame: the fill ring was empty,
	// or the packet longer than a frame) and ringFull (a worker's RX ring
	// was full).
	stop              chan struct{}
	stopOnce          sync.Once
	tuning            sync.WaitGroup
	dropped, ringFull atomic.Uint64

	// meta: the programs that redirect into the sockets put each packet's
	// receive time in front of it (bpf/xsk.h's xsk_meta), where the kernel
	// lets an XDP program call bpf_xdp_adjust_meta.
	meta bool
}

// newXSKPlane opens a socket per worker on every receive queue of each
// interface (workers[i].xsks), puts them in an XSKMAP, and, unless
// external is set, loads bpf/xsk.c with that map and the steering's and
// attaches it, in generic mode if generic is set (or, as the XDP data
// plane does, where the driver has no native XDP). A device has its
// queues 0..n-1: the first queue that refuses a bind ends its list.
func newXSKPlane(steer *Steering, workers []*worker, ifaces []string, generic, external bool, log *zap.Logger) (_ *xskPlane, err error) {
	x := &xskPlane{names: ifaces, meta: !xskNoMeta && xskMetaSupported(), stop: make(chan struct{})}
	defer func() {
		if err != nil {
			x.close()
		}
	}()
	if !x.meta {
		log.Warn("this kernel refuses bpf_xdp_adjust_meta in XDP programs: AF_XDP packets reach the workers without their receive time, " +
			"so their delay and RFC 3550 arrival times are taken when a worker reads them, later by the time they waited in its ring")
	}
	spec, err := loadXsk()
	if err != nil {
		return nil, fmt.Errorf("load AF_XDP program spec: %w", err)
	}
	if err := spec.Variables["xsk_meta"].Set(boolU32(x.meta)); err != nil {
		return nil, err
	}
	spec.Maps["steer"].MaxEntries = steer.objs.Steer.MaxEntries()
	spec.Maps["xsks"].MaxEntries = uint32(len(workers) * len(ifaces) * xskQueues)
	if err := spec.Variables["devices"].Set(uint32(len(ifaces))); err != nil {
		return nil, err
	}
	if x.sockMap, err = ebpf.NewMap(spec.Maps["xsks"]); err != nil {
		return nil, fmt.Errorf("AF_XDP: XSKMAP: %w", err)
	}
	// Room for every device's ifindex twice: a device created again
	// gets its new one before its old one goes (recreated).
	if x.devMap, err = ebpf.NewMap(&ebpf.MapSpec{Name: "xsk_devs", Type: ebpf.Hash, KeySize: 4, ValueSize: 4,
		MaxEntries: uint32(2 * len(ifaces))}); err != nil {
		return nil, fmt.Errorf("AF_XDP: devices map: %w", err)
	}
	repl := map[string]*ebpf.Map{"steer": steer.objs.Steer, "xsks": x.sockMap}
	for d, name := range ifaces {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return nil, fmt.Errorf("AF_XDP on %s: %w", name, err)
		}
		if err := x.devMap.Update(uint32(ifi.Index), uint32(d), ebpf.UpdateAny); err != nil {
			return nil, fmt.Errorf("AF_XDP on %s: devices map: %w", name, err)
		}
		byWorker, err := x.openDevice(d, ifi.Index, len(workers))
		if err != nil {
			return nil, err
		}
		x.ifindex = append(x.ifindex, ifi.Index)
		for i, w := range workers {
			w.xsks = append(w.xsks, byWorker[i]...)
		}
		if external {
			continue
		}
		if err := spec.Variables["dev_index"].Set(uint32(d)); err != nil {
			return nil, err
		}
		objs := &xskObjects{}
		if err := spec.LoadAndAssign(objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
			return nil, fmt.Errorf("load AF_XDP program for %s: %w", name, err)
		}
		x.objs = append(x.objs, objs)
		flags := link.XDPDriverMode
		if generic {
			flags = link.XDPGenericMode
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: objs.RelayXsk, Interface: ifi.Index, Flags: flags})
		mode := "native"
		if generic {
			mode = "generic"
		}
		if err != nil && flags == link.XDPDriverMode {
			log.Warn("native XDP unavailable for AF_XDP receive, falling back to generic (slower)", zap.String("interface", name), zap.Error(err))
			l, err = link.AttachXDP(link.XDPOptions{Program: objs.RelayXsk, Interface: ifi.Index, Flags: link.XDPGenericMode})
			mode = "generic"
		}
		if err != nil {
			return nil, fmt.Errorf("attach AF_XDP program to %s: %w", name, err)
		}
		x.links = append(x.links, l)
		x.ifaces = append(x.ifaces, dataplane.Interface{Name: name, Index: ifi.Index, Mode: mode})
	}
	x.tuning.Go(x.tuneLoop)
	return x, nil
}

// tuneLoop reads the sockets' statistics every fillTick until the plane
// closes: the drops into x's counters, and each queue's fill ring level
// (xskUmem.tuneFill). It holds x.mu while it reads: a socket that
// recreated takes out of x.socks is closed only after, never under it.
func (x *xskPlane) tuneLoop() {
	t := time.NewTicker(fillTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-x.stop:
			return
		case now := <-t.C:
			x.tuneOnce(now, now.Sub(last))
			last = now
		}
	}
}

// tuneOnce is a tick of tuneLoop. The plane's close stops the loop before
// it closes the sockets, so a tick never finds them closed.
func (x *xskPlane) tuneOnce(now time.Time, dt time.Duration) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, s := range x.socks {
		st, err := xskStatistics(s.fd)
		if err != nil {
			continue
		}
		// A socket's counters start at zero and only grow.
		x.dropped.Add(st.Rx_dropped - s.seen.Rx_dropped)
		x.ringFull.Add(st.Rx_ring_full - s.seen.Rx_ring_full)
		s.seen = st
		if s.own {
			// The fill ring's count is its UMEM's, whichever socket reads it.
			s.u.tuneFill(now, dt, st.Rx_fill_ring_empty_descs)
		}
	}
}

// fillFrames is the sum of the fill rings' levels.
func (x *xskPlane) fillFrames() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := 0
	for _, s := range x.socks {
		if s.own {
			s.u.mu.Lock()
			n += s.u.level
			s.u.mu.Unlock()
		}
	}
	return n
}

func xskStatistics(fd int) (unix.XDPStatistics, error) {
	return getsockoptXDP[unix.XDPStatistics](fd, unix.XDP_STATISTICS, "XDP_STATISTICS")
}

// openDevice opens a socket per worker on every receive queue of device
// d (ifindex) and puts them in the XSKMAP: byWorker[i] are worker i's. A
// device has its queues 0..n-1: the first queue that refuses a bind ends
// its list. The sockets join x.socks.
func (x *xskPlane) openDevice(d, ifindex, workers int) (byWorker [][]*xskSock, err error) {
	name := x.names[d]
	byWorker = make([][]*xskSock, workers)
	var opened []*xskSock // the queues' first sockets after the others
	defer func() {
		if err != nil {
			closeXSKs(opened)
		}
	}()
	for q := 0; q < xskQueues; q++ {
		first, err := openXSK(ifindex, q, nil)
		if err != nil {
			if q > 0 && errors.Is(err, unix.EINVAL) {
				break // no such queue
			}
			return nil, fmt.Errorf("AF_XDP on %s: %w", name, err)
		}
		first.u.meta = x.meta
		opened = append(opened, first) // closed last: see closeXSKs
		for i := range workers {
			s := first
			if i > 0 {
				if s, err = openXSK(ifindex, q, first.u); err != nil {
					return nil, fmt.Errorf("AF_XDP on %s, worker %d: %w", name, i, err)
				}
				opened = append([]*xskSock{s}, opened...)
			}
			slot := uint32((i*len(x.names)+d)*xskQueues + q)
			if err := x.sockMap.Update(slot, uint32(s.fd), ebpf.UpdateAny); err != nil {
				return nil, fmt.Errorf("AF_XDP on %s: XSKMAP: %w", name, err)
			}
			byWorker[i] = append(byWorker[i], s)
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil, errors.New("AF_XDP: closed")
	}
	x.socks = append(opened, x.socks...)
	return byWorker, nil
}

// recreated moves device name's sockets (and, without ExternalXDP, its
// program) from ifindex old to now: the device was deleted and created
// again under its name. New sockets go into the XSKMAP and the device map
// first, then to the workers in place of the old ones (each swaps them
// between batches and answers then), and the old sockets are closed last:
// closing a socket takes it out of the XSKMAP. Once the new sockets are
// in the XSKMAP the workers get them whatever fails after: a slot no
// worker reads would lose its packets.
func (x *xskPlane) recreated(workers []*worker, name string, old, now int, generic bool, log *zap.Logger) error {
	d := slices.Index(x.names, name)
	if d < 0 {
		return fmt.Errorf("AF_XDP: %s is not one of the interfaces", name)
	}
	x.mu.Lock()
	var stale []*xskSock // the old device's, by identity: the new one may have its ifindex
	for _, s := range x.socks {
		if s.u.ifindex == old {
			stale = append(stale, s)
		}
	}
	x.mu.Unlock()
	byWorker, err := x.openDevice(d, now, len(workers))
	if err != nil {
		return err
	}
	var errs []error
	if err := x.devMap.Update(uint32(now), uint32(d), ebpf.UpdateAny); err != nil {
		errs = append(errs, fmt.Errorf("AF_XDP on %s: devices map: %w", name, err))
	}
	// The old ifindex may be another device's by now; it stays only if
	// that device is one of ours and holds it (its own re-creation wrote
	// it).
	var was uint32
	if err := x.devMap.Lookup(uint32(old), &was); err == nil && was == uint32(d) && old != now {
		if err := x.devMap.Delete(uint32(old)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			log.Warn("old ifindex left in the AF_XDP devices map", zap.Int("ifindex", old), zap.Error(err))
		}
	}
	if len(x.objs) > d {
		errs = append(errs, x.reattach(d, now, generic, log))
	}
	x.mu.Lock()
	x.ifindex[d] = now
	x.mu.Unlock()
	swapped := true
	for i, w := range workers {
		if _, err := w.call(ctrl{op: opSwapXSK, xskOld: old, xsks: byWorker[i]}); err != nil {
			errs = append(errs, err)
			swapped = false
		}
	}
	if !swapped {
		// A worker that did not answer (closing, or stuck) may still
		// read the old sockets: they stay open until the pool closes.
		return errors.Join(errs...)
	}
	x.mu.Lock()
	x.socks = slices.DeleteFunc(x.socks, func(s *xskSock) bool { return slices.Contains(stale, s) })
	x.mu.Unlock()
	errs = append(errs, closeXSKs(stale))
	return errors.Join(errs...)
}

// reattach attaches the pool's program for device d (no ExternalXDP) to
// ifindex now, in the mode it had (falling back to generic as at the
// start), in place of its link to the deleted device.
func (x *xskPlane) reattach(d, now int, generic bool, log *zap.Logger) error {
	name := x.names[d]
	mode := "native"
	flags := link.XDPDriverMode
	if generic || x.ifaces[d].Mode == "generic" {
		mode, flags = "generic", link.XDPGenericMode
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: x.objs[d].RelayXsk, Interface: now, Flags: flags})
	if err != nil && flags == link.XDPDriverMode {
		log.Warn("native XDP unavailable for AF_XDP receive, falling back to generic (slower)", zap.String("interface", name), zap.Error(err))
		l, err = link.AttachXDP(link.XDPOptions{Program: x.objs[d].RelayXsk, Interface: now, Flags: link.XDPGenericMode})
		mode = "generic"
	}
	if err != nil {
		return fmt.Errorf("attach AF_XDP program to %s: %w", name, err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.links[d].Close()
	x.links[d] = l
	x.ifaces[d] = dataplane.Interface{Name: name, Index: now, Mode: mode}
	return nil
}

// closeXSKs closes socks. Closing a socket waits for the kernel's RCU
// grace period of its unbind (5-30 ms each on a VM); closed together, the
// waits overlap (8 sockets: 31 ms against 95 one after the other). The
// queues' first sockets, which own the UMEMs, close after the others.
func closeXSKs(socks []*xskSock) error {
	var errs []error
	var mu sync.Mutex
	for _, owners := range []bool{false, true} {
		var wg sync.WaitGroup
		for _, s := range socks {
			if s.own != owners {
				continue
			}
			wg.Go(func() {
				err := s.close()
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	return errors.Join(errs...)
}

// close detaches the program and closes the sockets; the workers must
// have stopped.
func (x *xskPlane) close() error {
	if x == nil {
		return nil
	}
	x.stopOnce.Do(func() { close(x.stop) })
	x.tuning.Wait()
	x.mu.Lock()
	defer x.mu.Unlock()
	x.closed = true
	var errs []error
	for _, l := range x.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, closeXSKs(x.socks))
	for _, o := range x.objs {
		errs = append(errs, o.Close())
	}
	for _, m := range []*ebpf.Map{x.sockMap, x.devMap} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// xskMetaSupported reports whether this kernel lets an XDP program call
// bpf_xdp_adjust_meta. Upstream kernels do; some hardened ones do not,
// and refuse the programs that call it.
func xskMetaSupported() bool {
	return features.HaveProgramHelper(ebpf.XDP, asm.FnXdpAdjustMeta) == nil
}

// xskNoMeta makes the pool's programs leave the receive time out as if
// the kernel refused bpf_xdp_adjust_meta (tests).
var xskNoMeta bool

// XSKReceiveTime reports whether the XDP programs that redirect into the
// workers' AF_XDP sockets are to put each packet's receive time in front
// of it (bpf/xsk.h's xsk_meta): what an external program (Config.
// ExternalXDP, XSKMaps) must be loaded with.
func (p *Pool) XSKReceiveTime() bool { return p.xsk != nil && p.xsk.meta }

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// XSKMaps are what another XDP program needs to redirect packets into the
// workers' AF_XDP sockets (Config.ExternalXDP): the steering's map (flow
// match -> worker), the sockets' XSKMAP, each device's index by ifindex,
// and how many devices there are. All nil without AF_XDP receive. The maps
// stay the pool's: a program loaded with them holds its own references.
func (p *Pool) XSKMaps() (steer, sockets, devices *ebpf.Map, n int) {
	if p.xsk == nil {
		return nil, nil, nil, 0
	}
	return p.steer.objs.Steer, p.xsk.sockMap, p.xsk.devMap, len(p.xsk.names)
}
