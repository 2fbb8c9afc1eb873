//go:build !amd64

package srtpflow

import "unsafe"

// prefetchLines loads a byte of each of the n lines at lines (no
// prefetch instruction here: loads, which wait for their data).
func prefetchLines(lines *unsafe.Pointer, n int) {
	var x byte
	for _, p := range unsafe.Slice(lines, n) {
		x ^= *(*byte)(p)
	}
	prefetchSink ^= x
}

// prefetchSink keeps prefetchLines' loads.
var prefetchSink byte
