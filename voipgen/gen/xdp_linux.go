package gen

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/relayd/relayd/internal/pktio"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The AF_XDP transport (--transport xdp) hands whole Ethernet frames to
// the driver through an XDP socket's TX ring, skipping the kernel's IP and
// UDP output path: the way to the goal of a million packets per second per
// core. It is written on x/sys/unix (about 250 lines) rather than taking
// github.com/asavie/xdp, which is unmaintained since 2021 and would bring
// its own copy of cilium/ebpf for an RX path voipgen does not need.
//
// Transmit only: no XDP program is attached, the fill ring is registered
// (the kernel requires it) but never filled. Copy mode works on any
// driver, veth included; the kernel may pick zero-copy where supported.
// Frames are the raw transport's IP packets behind an Ethernet header to
// the next hop's MAC address, resolved from the neighbour table when the
// generator starts (a route's gateway, or the destination on a link).

const (
	xdpFrameSize = 2048
	xdpFrames    = 4096 // UMEM frames; also the TX and completion ring sizes
)

type xdpRing struct {
	producer, consumer *uint32
	flags              *uint32
	mask               uint32
	mem                []byte
}

// xdpSock is one AF_XDP socket bound to a device queue, with its UMEM.
// It belongs to one sender thread.
type xdpSock struct {
	fd     int
	umem   []byte
	tx, cq xdpRing
	fq     xdpRing
	txDesc []unix.XDPDesc
	cqAddr []uint64
	free   []uint64 // frame addresses not in flight
	eth    [14]byte
	kicks  uint64
}

func setsockoptPtr(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, errno := syscall.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), size, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func mmapRing(fd int, off uint64, ro unix.XDPRingOffset, n, elem int) (xdpRing, error) {
	size := int(ro.Desc) + n*elem
	mem, err := unix.Mmap(fd, int64(off), size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return xdpRing{}, err
	}
	return xdpRing{
		producer: (*uint32)(unsafe.Pointer(&mem[ro.Producer])),
		consumer: (*uint32)(unsafe.Pointer(&mem[ro.Consumer])),
		flags:    (*uint32)(unsafe.Pointer(&mem[ro.Flags])),
		mask:     uint32(n - 1), mem: mem,
	}, nil
}

// openXDP opens an AF_XDP socket on queue of the device with ifindex.
func openXDP(ifindex, queue int, eth [14]byte) (_ *xdpSock, err error) {
	x := &xdpSock{fd: -1, eth: eth}
	defer func() {
		if err != nil {
			x.close()
		}
	}()
	if x.fd, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("AF_XDP socket: %w", err)
	}
	if x.umem, err = unix.Mmap(-1, 0, xdpFrames*xdpFrameSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("UMEM: %w", err)
	}
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&x.umem[0]))), Len: uint64(len(x.umem)), Size: xdpFrameSize}
	if err := setsockoptPtr(x.fd, unix.SOL_XDP, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return nil, fmt.Errorf("XDP_UMEM_REG: %w", err)
	}
	for _, o := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_TX_RING} {
		if err := unix.SetsockoptInt(x.fd, unix.SOL_XDP, o, xdpFrames); err != nil {
			return nil, fmt.Errorf("XDP ring %d: %w", o, err)
		}
	}
	var off unix.XDPMmapOffsets
	size := uint32(unsafe.Sizeof(off))
	if _, _, errno := syscall.Syscall6(unix.SYS_GETSOCKOPT, uintptr(x.fd), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
		uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&size)), 0); errno != 0 {
		return nil, fmt.Errorf("XDP_MMAP_OFFSETS: %w", errno)
	}
	if x.tx, err = mmapRing(x.fd, unix.XDP_PGOFF_TX_RING, off.Tx, xdpFrames, int(unsafe.Sizeof(unix.XDPDesc{}))); err != nil {
		return nil, fmt.Errorf("TX ring: %w", err)
	}
	if x.cq, err = mmapRing(x.fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, xdpFrames, 8); err != nil {
		return nil, fmt.Errorf("completion ring: %w", err)
	}
	if x.fq, err = mmapRing(x.fd, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, xdpFrames, 8); err != nil {
		return nil, fmt.Errorf("fill ring: %w", err)
	}
	x.txDesc = unsafe.Slice((*unix.XDPDesc)(unsafe.Pointer(&x.tx.mem[off.Tx.Desc])), xdpFrames)
	x.cqAddr = unsafe.Slice((*uint64)(unsafe.Pointer(&x.cq.mem[off.Cr.Desc])), xdpFrames)
	x.free = make([]uint64, 0, xdpFrames)
	for i := xdpFrames - 1; i >= 0; i-- {
		x.free = append(x.free, uint64(i*xdpFrameSize))
	}
	// A socket closed just before on the same queue is released by the
	// kernel a little later: EBUSY for a while.
	for try := 0; ; try++ {
		sa := &unix.SockaddrXDP{Flags: unix.XDP_USE_NEED_WAKEUP, Ifindex: uint32(ifindex), QueueID: uint32(queue)}
		err := unix.Bind(x.fd, sa)
		if err != nil && !errors.Is(err, unix.EBUSY) {
			sa.Flags |= unix.XDP_COPY
			err = unix.Bind(x.fd, sa)
		}
		if err == nil {
			return x, nil
		}
		if !errors.Is(err, unix.EBUSY) || try == 50 {
			return nil, fmt.Errorf("bind AF_XDP to ifindex %d queue %d: %w", ifindex, queue, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (x *xdpSock) close() error {
	var errs []error
	for _, r := range []xdpRing{x.tx, x.cq, x.fq} {
		if r.mem != nil {
			errs = append(errs, unix.Munmap(r.mem))
		}
	}
	if x.umem != nil {
		errs = append(errs, unix.Munmap(x.umem))
	}
	if x.fd >= 0 {
		errs = append(errs, unix.Close(x.fd))
	}
	return errors.Join(errs...)
}

// reap returns completed frames to the free list.
func (x *xdpSock) reap() {
	prod := atomic.LoadUint32(x.cq.producer)
	cons := *x.cq.consumer
	for ; cons != prod; cons++ {
		x.free = append(x.free, x.cqAddr[cons&x.cq.mask])
	}
	atomic.StoreUint32(x.cq.consumer, cons)
}

// send queues the IP packets of ms behind the Ethernet header and kicks
// the kernel. It returns how many were queued (the rest had no free
// frame) and the bytes queued. It does not allocate.
func (x *xdpSock) send(ms []pktio.Mmsghdr) (n int, bytes uint64) {
	x.reap()
	prod := *x.tx.producer
	for i := range ms {
		if len(x.free) == 0 {
			x.kick()
			time.Sleep(0)
			x.reap()
			if len(x.free) == 0 {
				break
			}
		}
		m := &ms[i]
		iov := m.Hdr.Iov
		pkt := unsafe.Slice(iov.Base, iov.Len)
		addr := x.free[len(x.free)-1]
		x.free = x.free[:len(x.free)-1]
		f := x.umem[addr : addr+xdpFrameSize]
		copy(f, x.eth[:])
		l := 14 + copy(f[14:], pkt)
		d := &x.txDesc[prod&x.tx.mask]
		d.Addr, d.Len, d.Options = addr, uint32(l), 0
		prod++
		n++
		bytes += uint64(len(pkt))
	}
	atomic.StoreUint32(x.tx.producer, prod)
	// Copy mode transmits only when kicked; kick every batch (one
	// syscall per slot) rather than trust XDP_RING_NEED_WAKEUP.
	x.kick()
	return n, bytes
}

func (x *xdpSock) kick() {
	x.kicks++
	_, _, _ = syscall.Syscall6(unix.SYS_SENDTO, uintptr(x.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
}

// nextHop returns the output interface and the Ethernet header towards dst
// from src's interface, resolving the neighbour (by sending it a datagram
// to the discard port) when it is not known yet.
func nextHop(dst netip.Addr) (ifindex int, eth [14]byte, err error) {
	routes, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return 0, eth, fmt.Errorf("route to %s: %v", dst, err)
	}
	r := routes[0]
	link, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return 0, eth, fmt.Errorf("route to %s: %w", dst, err)
	}
	hop := dst
	if r.Gw != nil {
		hop, _ = netip.AddrFromSlice(r.Gw)
		hop = hop.Unmap()
	}
	family := netlink.FAMILY_V4
	if !hop.Is4() {
		family = netlink.FAMILY_V6
	}
	for try := 0; try < 50; try++ {
		neighs, err := netlink.NeighList(r.LinkIndex, family)
		if err != nil {
			return 0, eth, fmt.Errorf("neighbours of %s: %w", link.Attrs().Name, err)
		}
		for _, n := range neighs {
			if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == hop && len(n.HardwareAddr) == 6 &&
				n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE|netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0 {
				copy(eth[0:6], n.HardwareAddr)
				copy(eth[6:12], link.Attrs().HardwareAddr)
				if hop.Is4() {
					eth[12], eth[13] = 0x08, 0x00
				} else {
					eth[12], eth[13] = 0x86, 0xdd
				}
				return r.LinkIndex, eth, nil
			}
		}
		if try == 0 || try%10 == 0 {
			network := "udp4"
			if !dst.Is4() {
				network = "udp6"
			}
			if c, err := net.DialUDP(network, nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9))); err == nil {
				_, _ = c.Write([]byte{0})
				c.Close()
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, eth, fmt.Errorf("next hop %s on %s did not resolve", hop, link.Attrs().Name)
}
