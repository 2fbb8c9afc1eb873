//go:build !linux

package pktio

import "syscall"

// TimestampOOBSize is 0: receive timestamps are Linux-only here.
const TimestampOOBSize = 0

// EnableTimestamps does nothing outside Linux.
func EnableTimestamps(syscall.RawConn) error { return nil }

// RxTimestamp returns 0 outside Linux.
func RxTimestamp([]byte) int64 { return 0 }
