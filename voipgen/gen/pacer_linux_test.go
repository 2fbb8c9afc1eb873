package gen

import (
	"testing"
	"time"
)

func TestPacerReachesDeadline(t *testing.T) {
	p, err := newPacer()
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	for _, wait := range []time.Duration{0, time.Millisecond, longWait + 3*time.Millisecond} {
		deadline := MonoNow() + int64(wait)
		p.until(deadline)
		if late := MonoNow() - deadline; late < 0 {
			t.Errorf("wait of %v returned %v early", wait, time.Duration(-late))
		}
	}
	allocs := testing.AllocsPerRun(5, func() { p.until(MonoNow() + int64(longWait+time.Millisecond)) })
	if allocs != 0 {
		t.Errorf("a long wait allocates %.1f times, want 0", allocs)
	}
}
