//go:build !linux

package main

import "syscall"

const oobSize = 0

func enableTimestamps(syscall.RawConn) error { return nil }

func rxTimestamp([]byte) int64 { return 0 }
