package slowpath

import (
	"runtime"
	"testing"
)

// SetControlProcs sets the control plane's Ps; the workers holding one
// keep theirs on top, and closing the last pool leaves the control
// plane's.
func TestSetControlProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	SetControlProcs(1)
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("GOMAXPROCS %d with no pool, want 1", n)
	}
	procsOpen()
	procsAdjust(2) // two workers hold a P
	if n := runtime.GOMAXPROCS(0); n != 3 {
		t.Fatalf("GOMAXPROCS %d with two workers holding a P, want 3", n)
	}
	SetControlProcs(2)
	if n := runtime.GOMAXPROCS(0); n != 4 {
		t.Fatalf("GOMAXPROCS %d after SetControlProcs(2), want 4", n)
	}
	procsAdjust(-2)
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Fatalf("GOMAXPROCS %d once the workers went idle, want 2", n)
	}
	procsClose()
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Fatalf("GOMAXPROCS %d after the pool closed, want 2", n)
	}
}
