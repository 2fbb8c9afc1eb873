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
