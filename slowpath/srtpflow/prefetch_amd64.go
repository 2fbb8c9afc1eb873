package srtpflow

// prefetchLines issues a PREFETCHT0 for each of the n addresses at lines.
// A prefetch, unlike a load, retires at once: the loads of a whole batch's
// contexts are under way together, where loads would hold the CPU's
// reorder buffer until their data came.
//
//go:noescape
func prefetchLines(lines *uintptr, n int)
