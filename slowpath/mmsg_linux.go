package slowpath

import (
	"encoding/binary"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/internal/pktio"
)

const (
	batchSize = 64
	oobSize   = 128 // SO_TIMESTAMPNS + IP(V6)_ORIGDSTADDR
)

// rxBatch is a worker's receive batch: buffers, addresses and control
// messages allocated once and reused for every recvmmsg.
type rxBatch struct {
	hdrs  [batchSize]pktio.Mmsghdr
	iovs  [batchSize]unix.Iovec
	bufs  [batchSize][maxPacket]byte
	names [batchSize]unix.RawSockaddrInet6
	oobs  [batchSize][oobSize]byte
}

func newRxBatch() *rxBatch {
	b := &rxBatch{}
	for i := range b.hdrs {
		b.iovs[i].Base = &b.bufs[i][0]
		b.iovs[i].SetLen(maxPacket)
		h := &b.hdrs[i].Hdr
		h.Iov = &b.iovs[i]
		h.SetIovlen(1)
	}
	return b
}

// recv reads what fd holds, up to a batch, without waiting: the number of
// messages, or 0 and the errno (EAGAIN: nothing to read). A raw system
// call, like flush's: the worker owns its P (see ppoll).
func (b *rxBatch) recv(fd int) (int, syscall.Errno) {
	for i := range b.hdrs {
		h := &b.hdrs[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		h.Namelen = unix.SizeofSockaddrInet6
		h.Control = &b.oobs[i][0]
		h.SetControllen(oobSize)
		h.Flags = 0
	}
	r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])), batchSize, unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// packet returns message i: payload, source, original destination and the
// kernel's receive timestamp (CLOCK_REALTIME ns; 0 if missing).
func (b *rxBatch) packet(i int) (payload []byte, src, dst netip.AddrPort, ts int64) {
	payload = b.bufs[i][:b.hdrs[i].Len]
	src = sockaddrAddrPort(&b.names[i])
	oob := b.oobs[i][:b.hdrs[i].Hdr.Controllen]
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		if h.Len < unix.SizeofCmsghdr || int(h.Len) > len(oob) {
			break
		}
		data := oob[unix.SizeofCmsghdr:h.Len]
		switch {
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_TIMESTAMPNS && len(data) >= 16:
			ts = int64(binary.NativeEndian.Uint64(data))*1e9 + int64(binary.NativeEndian.Uint64(data[8:]))
		case h.Level == unix.SOL_IP && h.Type == unix.IP_ORIGDSTADDR && len(data) >= 8:
			dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(data[4:8])), binary.BigEndian.Uint16(data[2:]))
		case h.Level == unix.SOL_IPV6 && h.Type == unix.IPV6_ORIGDSTADDR && len(data) >= 24:
			a := netip.AddrFrom16([16]byte(data[8:24])).Unmap()
			dst = netip.AddrPortFrom(a, binary.BigEndian.Uint16(data[2:]))
		}
		oob = oob[cmsgAlign(int(h.Len)):]
		if len(oob) == 0 {
			break
		}
	}
	return payload, src, dst, ts
}

func cmsgAlign(n int) int { return (n + 7) &^ 7 }

func sockaddrAddrPort(sa *unix.RawSockaddrInet6) netip.AddrPort {
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	switch sa.Family {
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), port)
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	}
	return netip.AddrPort{}
}

// txBatch is a worker's send batch for one raw socket (one family).
type txBatch struct {
	fd    int
	v6    bool
	hdrs  [batchSize]pktio.Mmsghdr
	iovs  [batchSize]unix.Iovec
	bufs  [batchSize][maxPacket]byte
	names [batchSize]unix.RawSockaddrInet6
	n     int
	id    uint16 // the last IPv4 ID given
}

func newTxBatch(fd int, v6 bool) *txBatch {
	t := &txBatch{fd: fd, v6: v6}
	for i := range t.hdrs {
		t.iovs[i].Base = &t.bufs[i][0]
		h := &t.hdrs[i].Hdr
		h.Iov = &t.iovs[i]
		h.SetIovlen(1)
		h.Name = (*byte)(unsafe.Pointer(&t.names[i]))
	}
	return t
}

// next returns the buffer for the next packet, or nil if the batch is full.
func (t *txBatch) next() []byte {
	if t.n == batchSize {
		return nil
	}
	return t.bufs[t.n][:]
}

// commit queues the packet of length n written into next() for dst.
func (t *txBatch) commit(n int, dst netip.Addr) {
	i := t.n
	t.iovs[i].SetLen(n)
	h := &t.hdrs[i].Hdr
	if t.v6 {
		sa := &t.names[i]
		*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: dst.As16()}
		h.Namelen = unix.SizeofSockaddrInet6
	} else {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&t.names[i]))
		*sa = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: dst.As4()}
		h.Namelen = unix.SizeofSockaddrInet4
		// The IP ID, which the kernel chooses when it is 0 (a hash and an
		// atomic per packet, __ip_select_ident, 3% of a worker's time):
		// a counter of the batch's, never 0.
		t.id++
		if t.id == 0 {
			t.id = 1
		}
		binary.BigEndian.PutUint16(t.bufs[i][4:6], t.id)
	}
	t.n++
}

// flush sends the queued packets and returns how many the kernel took and
// how many it refused. A refused packet is skipped, not retried.
func (t *txBatch) flush() (sent, failed int) {
	off := 0
	for off < t.n {
		r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(t.fd), uintptr(unsafe.Pointer(&t.hdrs[off])), uintptr(t.n-off), 0, 0, 0)
		switch {
		case e == unix.EINTR:
			continue
		case e != 0 || r == 0:
			// The message at off failed (no route, ...): skip it.
			failed++
			off++
		default:
			sent += int(r)
			off += int(r)
		}
	}
	t.n = 0
	return sent, failed
}
