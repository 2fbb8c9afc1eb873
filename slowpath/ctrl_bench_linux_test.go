package slowpath

import (
	"sync"
	"testing"

	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/testenv"
)

// BenchmarkControlRoundTrip: one control request to a worker blocked in
// its receive and its answer: what each flow install, update, removal
// and statistics read costs the control plane.
func BenchmarkControlRoundTrip(b *testing.B) {
	testenv.NeedRoot(b)
	w, err := newWorker(0, 0, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	raiseProcs(b, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); w.run() }()
	b.Cleanup(func() { w.close(); wg.Wait() })
	for range b.N {
		if _, err := w.call(ctrl{op: opPing}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestControlRoundTripAllocs: a control round trip reuses its reply
// channel, its timer and the worker's queue (it made 9 allocations
// before): what remains is the worker's wake-up, its read returning the
// deadline as a *net.OpError.
func TestControlRoundTripAllocs(t *testing.T) {
	testenv.NeedRoot(t)
	if raceEnabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	w, err := newWorker(0, 0, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(w.run)
	t.Cleanup(func() { w.close(); wg.Wait() })
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := w.call(ctrl{op: opPing}); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("%.1f allocations per control round trip, want at most 1", allocs)
	}
}
