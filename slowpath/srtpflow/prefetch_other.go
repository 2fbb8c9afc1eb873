//go:build !amd64

package srtpflow

// prefetchLines does nothing here: Go has no prefetch but the amd64
// assembly's, and loads instead only move the misses to the prefetching
// pass (they hold the reorder buffer until their data comes).
func prefetchLines(lines *uintptr, n int) {}
