package pktio

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// XSK is an AF_XDP socket for transmitting whole Ethernet frames, with its
// UMEM: the traffic generators' way past the kernel's IP and UDP output
// path (voipgen's --transport xdp, voipgen bench's --sender xdp). It is
// written on x/sys/unix (about 200 lines) rather than taking
// github.com/asavie/xdp, which is unmaintained since 2021 and would bring
// its own copy of cilium/ebpf for an RX path nothing here needs.
//
// Transmit only: no XDP program is attached, the fill ring is registered
// (the kernel requires it) but never filled. Copy mode works on any
// driver, veth included; the kernel may pick zero-copy where supported.
//
// An XSK belongs to one thread at a time: Frame, Queue and Flush are not
// safe for concurrent use. None of them allocates.
type XSK struct {
	fd     int
	umem   []byte
	tx, cq xskRing
	fq     xskRing
	txDesc []unix.XDPDesc
	cqAddr []uint64
	free   []uint64 // frame addresses not in flight
	prod   uint32   // TX producer, published by Flush
	cur    uint64   // the frame Frame handed out, for Queue
	kicks  uint64
}

const (
	// XSKFrameSize is the size of a UMEM frame: the most one frame holds.
	XSKFrameSize = 2048
	// XSKFrames is the number of UMEM frames, and the TX and completion
	// ring sizes.
	XSKFrames = 4096
)

type xskRing struct {
	producer, consumer *uint32
	flags              *uint32
	mask               uint32
	mem                []byte
}

func setsockoptPtr(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, errno := syscall.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), size, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func mmapRing(fd int, off uint64, ro unix.XDPRingOffset, n, elem int) (xskRing, error) {
	size := int(ro.Desc) + n*elem
	mem, err := unix.Mmap(fd, int64(off), size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return xskRing{}, err
	}
	return xskRing{
		producer: (*uint32)(unsafe.Pointer(&mem[ro.Producer])),
		consumer: (*uint32)(unsafe.Pointer(&mem[ro.Consumer])),
		flags:    (*uint32)(unsafe.Pointer(&mem[ro.Flags])),
		mask:     uint32(n - 1), mem: mem,
	}, nil
}

// OpenXSK opens an AF_XDP socket on queue of the device with ifindex, in
// the calling thread's network namespace.
func OpenXSK(ifindex, queue int) (_ *XSK, err error) {
	x := &XSK{fd: -1}
	defer func() {
		if err != nil {
			x.Close()
		}
	}()
	if x.fd, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("AF_XDP socket: %w", err)
	}
	if x.umem, err = unix.Mmap(-1, 0, XSKFrames*XSKFrameSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("UMEM: %w", err)
	}
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&x.umem[0]))), Len: uint64(len(x.umem)), Size: XSKFrameSize}
	if err := setsockoptPtr(x.fd, unix.SOL_XDP, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return nil, fmt.Errorf("XDP_UMEM_REG: %w", err)
	}
	for _, o := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_TX_RING} {
		if err := unix.SetsockoptInt(x.fd, unix.SOL_XDP, o, XSKFrames); err != nil {
			return nil, fmt.Errorf("XDP ring %d: %w", o, err)
		}
	}
	var off unix.XDPMmapOffsets
	size := uint32(unsafe.Sizeof(off))
	if _, _, errno := syscall.Syscall6(unix.SYS_GETSOCKOPT, uintptr(x.fd), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
		uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&size)), 0); errno != 0 {
		return nil, fmt.Errorf("XDP_MMAP_OFFSETS: %w", errno)
	}
	if x.tx, err = mmapRing(x.fd, unix.XDP_PGOFF_TX_RING, off.Tx, XSKFrames, int(unsafe.Sizeof(unix.XDPDesc{}))); err != nil {
		return nil, fmt.Errorf("TX ring: %w", err)
	}
	if x.cq, err = mmapRing(x.fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, XSKFrames, 8); err != nil {
		return nil, fmt.Errorf("completion ring: %w", err)
	}
	if x.fq, err = mmapRing(x.fd, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, XSKFrames, 8); err != nil {
		return nil, fmt.Errorf("fill ring: %w", err)
	}
	x.txDesc = unsafe.Slice((*unix.XDPDesc)(unsafe.Pointer(&x.tx.mem[off.Tx.Desc])), XSKFrames)
	x.cqAddr = unsafe.Slice((*uint64)(unsafe.Pointer(&x.cq.mem[off.Cr.Desc])), XSKFrames)
	x.free = make([]uint64, 0, XSKFrames)
	for i := XSKFrames - 1; i >= 0; i-- {
		x.free = append(x.free, uint64(i*XSKFrameSize))
	}
	x.prod = *x.tx.producer
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

// Close unmaps the rings and the UMEM and closes the socket.
func (x *XSK) Close() error {
	var errs []error
	for _, r := range []xskRing{x.tx, x.cq, x.fq} {
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
	x.tx, x.cq, x.fq, x.umem, x.fd = xskRing{}, xskRing{}, xskRing{}, nil, -1
	return errors.Join(errs...)
}

// reap returns completed frames to the free list.
func (x *XSK) reap() {
	prod := atomic.LoadUint32(x.cq.producer)
	cons := *x.cq.consumer
	for ; cons != prod; cons++ {
		x.free = append(x.free, x.cqAddr[cons&x.cq.mask])
	}
	atomic.StoreUint32(x.cq.consumer, cons)
}

// Frame returns a free UMEM frame (XSKFrameSize bytes) to write the next
// Ethernet frame into, then Queue it; nil when every frame is in flight
// even after publishing what is queued and kicking the kernel once.
func (x *XSK) Frame() []byte {
	if len(x.free) == 0 {
		x.reap()
	}
	if len(x.free) == 0 {
		atomic.StoreUint32(x.tx.producer, x.prod)
		x.kick()
		x.reap()
		if len(x.free) == 0 {
			return nil
		}
	}
	x.cur = x.free[len(x.free)-1]
	x.free = x.free[:len(x.free)-1]
	return x.umem[x.cur : x.cur+XSKFrameSize : x.cur+XSKFrameSize]
}

// Queue puts the frame Frame returned on the TX ring, n bytes long. The
// kernel sees it at the next Flush.
func (x *XSK) Queue(n int) {
	d := &x.txDesc[x.prod&x.tx.mask]
	d.Addr, d.Len, d.Options = x.cur, uint32(n), 0
	x.prod++
}

// xskKicksPerFlush bounds Flush's syscalls: in copy mode each one sends at
// most 32 frames (the kernel's TX_BATCH_SIZE) and says EAGAIN for more.
const xskKicksPerFlush = XSKFrames / 32

// Flush publishes the queued frames and kicks the kernel until it has
// taken them all off the TX ring, or refuses to (a full device queue):
// what is left goes with the next Flush. It returns the frames still on
// the ring.
func (x *XSK) Flush() int {
	atomic.StoreUint32(x.tx.producer, x.prod)
	for range xskKicksPerFlush {
		if atomic.LoadUint32(x.tx.consumer) == x.prod {
			break
		}
		if errno := x.kick(); errno != 0 && errno != unix.EAGAIN && errno != unix.EBUSY && errno != unix.EINTR {
			break
		}
	}
	return int(x.prod - atomic.LoadUint32(x.tx.consumer))
}

// kick has the kernel send what the TX ring holds. It is a raw system call
// the Go scheduler does not see: it never blocks (MSG_DONTWAIT), but on a
// veth the receiving side's softirq runs in it, often longer than the
// runtime monitor's 20 µs tick, past which a system call the runtime knows
// of loses its P to sysmon and must get one back.
func (x *XSK) kick() syscall.Errno {
	x.kicks++
	_, _, errno := syscall.RawSyscall6(unix.SYS_SENDTO, uintptr(x.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return errno
}

// Kicks returns the sendto calls made so far.
func (x *XSK) Kicks() uint64 { return x.kicks }
