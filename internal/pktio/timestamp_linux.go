package pktio

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TimestampOOBSize fits one SCM_TIMESTAMPNS control message.
var TimestampOOBSize = unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{})))

// EnableTimestamps asks the kernel for a receive timestamp
// (SO_TIMESTAMPNS, CLOCK_REALTIME) on every datagram of the socket.
func EnableTimestamps(rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return err
	}
	return serr
}

// RxTimestamp returns the SCM_TIMESTAMPNS time in the control messages
// oob as Unix nanoseconds, or 0 when there is none.
func RxTimestamp(oob []byte) int64 {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return 0
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_TIMESTAMPNS &&
			l >= unix.CmsgLen(int(unsafe.Sizeof(unix.Timespec{}))) {
			ts := (*unix.Timespec)(unsafe.Pointer(&oob[unix.CmsgLen(0)]))
			return ts.Nano()
		}
		oob = oob[unix.CmsgSpace(l-unix.CmsgLen(0)):]
	}
	return 0
}
