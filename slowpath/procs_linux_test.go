package slowpath

import (
	"runtime"
	"testing"
	"time"
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

// TestBusyWorkerLeavesControlP: with the control plane on one P, a worker
// that starts holding its P has GOMAXPROCS raised before add returns, on
// its own thread, so the control plane's goroutines keep their P while it
// waits with its own. Left to the gauge's goroutine, the raise was made
// ready on the worker's P and waited there for the runtime to preempt
// the worker (10-20 ms), every goroutine with it (a latched source reached
// its reverse flow late in TestRelayLatching). Going idle still leaves
// the change to that goroutine.
func TestBusyWorkerLeavesControlP(t *testing.T) {
	defer SetControlProcs(runtime.GOMAXPROCS(0))
	SetControlProcs(1)
	g := newProcGauge()
	defer g.close()
	// No yield between add and the reads: the gauge's goroutine cannot
	// have run on this, the only P.
	g.add(1)
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Fatalf("GOMAXPROCS %d as add(1) returned, want 2", n)
	}
	g.add(1)
	if n := runtime.GOMAXPROCS(0); n != 3 {
		t.Fatalf("GOMAXPROCS %d as the second add(1) returned, want 3", n)
	}
	g.add(-1)
	g.add(-1)
	for deadline := time.Now().Add(5 * time.Second); runtime.GOMAXPROCS(0) != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("GOMAXPROCS %d with no worker holding a P, want 1", runtime.GOMAXPROCS(0))
		}
	}
}
