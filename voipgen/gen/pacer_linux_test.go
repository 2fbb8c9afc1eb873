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
	// The timerfd itself, which until falls back from silently.
	deadline := MonoNow() + int64(longWait+time.Millisecond)
	if err := p.wait(deadline); err != nil {
		t.Fatalf("timerfd wait: %v", err)
	}
	if late := MonoNow() - deadline; late < 0 {
		t.Errorf("timerfd wait returned %v early", time.Duration(-late))
	}
	var werr error
	allocs := testing.AllocsPerRun(5, func() { werr = p.wait(MonoNow() + int64(longWait+time.Millisecond)) })
	if werr != nil || allocs != 0 {
		t.Errorf("a timerfd wait allocates %.1f times (%v), want 0", allocs, werr)
	}
}
