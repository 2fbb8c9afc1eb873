package pktio

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mmsghdr is struct mmsghdr, an element of the vectors of sendmmsg(2)
// and recvmmsg(2).
type Mmsghdr struct {
	Hdr unix.Msghdr
	Len uint32 // bytes sent or received for this message
	_   [4]byte
}

// Sendmmsg sends ms on fd with one sendmmsg(2) and returns how many
// messages the kernel took. It does not retry: EINTR and EAGAIN come back
// as errors, and a short count means the message at that index failed.
func Sendmmsg(fd int, ms []Mmsghdr, flags int) (int, syscall.Errno) {
	if len(ms) == 0 {
		return 0, 0
	}
	r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&ms[0])), uintptr(len(ms)), uintptr(flags), 0, 0)
	return int(r), e
}

// Recvmmsg receives into ms from fd with one recvmmsg(2) and returns how
// many messages it filled.
func Recvmmsg(fd int, ms []Mmsghdr, flags int) (int, syscall.Errno) {
	if len(ms) == 0 {
		return 0, 0
	}
	r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&ms[0])), uintptr(len(ms)), uintptr(flags), 0, 0)
	return int(r), e
}
