package main

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// oobSize fits one SCM_TIMESTAMPNS control message.
var oobSize = unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{})))

// enableTimestamps asks the kernel for a receive timestamp per datagram.
func enableTimestamps(rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return err
	}
	return serr
}

// rxTimestamp returns the SCM_TIMESTAMPNS time in oob as Unix nanoseconds,
// or 0 when there is none. It does not allocate.
func rxTimestamp(oob []byte) int64 {
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
