package slowpath

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// The scaler adds a P after a second near what its Ps give, takes one
// back after five seconds that fitted one fewer with room, and holds
// between: the load a step changes (fewer Ps cost less) never crosses
// back.
func TestProcScaler(t *testing.T) {
	s := newProcScaler(3)
	steps := func(rate float64, n int) (changedAt int) {
		for i := 1; i <= n; i++ {
			if s.observe(rate) {
				return i
			}
		}
		return 0
	}
	if at := steps(0.85, 40); at != 0 || s.n != 1 {
		t.Fatalf("at 0.85 CPU with 1 P: changed at sample %d to %d Ps, want none", at, s.n)
	}
	s = newProcScaler(3)
	if at := steps(0.95, 10); at != upSamples || s.n != 2 {
		t.Fatalf("at 0.95 CPU with 1 P: changed at sample %d to %d Ps, want %d and 2", at, s.n, upSamples)
	}
	// 2 Ps: the same load reads higher; between the thresholds it holds.
	if at := steps(1.05, 40); at != 0 || s.n != 2 {
		t.Fatalf("at 1.05 CPU with 2 Ps: changed at sample %d to %d Ps, want none", at, s.n)
	}
	if at := steps(1.85, 10); at != upSamples || s.n != 3 {
		t.Fatalf("at 1.85 CPU with 2 Ps: changed at sample %d to %d Ps, want %d and 3", at, s.n, upSamples)
	}
	if at := steps(2.9, 40); at != 0 || s.n != 3 {
		t.Fatalf("at the maximum: changed at sample %d to %d Ps", at, s.n)
	}
	if at := steps(1.6, 40); at != 0 || s.n != 3 {
		t.Fatalf("at 1.6 CPU with 3 Ps: changed at sample %d to %d Ps, want none", at, s.n)
	}
	// Each second of the five fits 0.75 of 2 Ps once (nearly) all are at
	// 1.4.
	if at := steps(1.4, downSamples); at < downSamples-upSamples || s.n != 2 {
		t.Fatalf("at 1.4 CPU with 3 Ps: changed at sample %d to %d Ps, want about %d and 2", at, s.n, downSamples)
	}
	// A second's burst within the five seconds keeps the Ps.
	for range downSamples - upSamples {
		s.observe(0.3)
	}
	if at := steps(1.7, upSamples); at != 0 || s.n != 2 {
		t.Fatalf("after a burst: changed at sample %d to %d Ps, want none", at, s.n)
	}
	if at := steps(0.3, downSamples); at < downSamples-upSamples || s.n != 1 {
		t.Fatalf("at 0.3 CPU with 2 Ps: changed at sample %d to %d Ps, want about %d and 1", at, s.n, downSamples)
	}
	if at := steps(0, 40); at != 0 || s.n != 1 {
		t.Fatalf("idle with 1 P: changed at sample %d to %d Ps", at, s.n)
	}
}

// burn spins the calling goroutine's thread for d of its CPU time.
func burn(d time.Duration) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := clockCPU(unix.CLOCK_THREAD_CPUTIME_ID)
	for clockCPU(unix.CLOCK_THREAD_CPUTIME_ID)-start < d {
	}
}

// controlCPU leaves out what a worker's thread takes, while it runs and
// after it ended, and counts what other threads take, the worker's own
// before it became one's included.
func TestControlCPU(t *testing.T) {
	const work = 300 * time.Millisecond
	// The process's CPU read just before and just after the control
	// plane's: the runtime's threads may run between the reads.
	snap := func() (before, control, after time.Duration) {
		before = clockCPU(unix.CLOCK_PROCESS_CPUTIME_ID)
		control = controlCPU()
		after = clockCPU(unix.CLOCK_PROCESS_CPUTIME_ID)
		return
	}
	a0, c0, b0 := snap()
	started, burnt, end, ended := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	var worked time.Duration // the worker's thread's, as a worker's
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		burn(work / 2)
		tid := workerThreadStart()
		w0 := clockCPU(unix.CLOCK_THREAD_CPUTIME_ID)
		close(started)
		burn(work)
		worked = clockCPU(unix.CLOCK_THREAD_CPUTIME_ID) - w0
		close(burnt)
		<-end
		workerThreadEnd(tid)
		close(ended)
	}()
	<-started
	burn(work) // this thread: control plane
	<-burnt
	for _, when := range []string{"while the worker runs", "after it ended"} {
		a, c, b := snap()
		// What controlCPU left out since the start lies between these
		// (the worker's thread took a little more than worked: the
		// clock reads, the channel operations, its park; under an
		// emulated CPU, as in the VM tests' qemu guest, up to several
		// milliseconds: 7.8 ms once). Leaving out the control plane's
		// work too, the fault this looks for, would be 300 ms more.
		lo, hi := (a-c)-(b0-c0), (b-c)-(a0-c0)
		if c-c0 < work+work/2 || hi < worked || lo > worked+work/12 {
			t.Fatalf("%s: control plane %v, left out %v to %v: want the worker's %v left out and the control plane at least %v",
				when, c-c0, lo, hi, worked, work+work/2)
		}
		if end != nil {
			close(end)
			<-ended
			end = nil
		}
	}
}

// AutoControlProcs starts the control plane on one P, goes to two under a
// load of two busy goroutines (on one CPU too: they keep it busy), and
// back to one once they stop.
func TestAutoControlProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	defer SetControlProcs(runtime.GOMAXPROCS(0))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		AutoControlProcs(ctx, 2, zap.NewNop())
	}()
	defer func() {
		cancel()
		<-done
	}()
	waitProcs := func(n int, within time.Duration) {
		t.Helper()
		for deadline := time.Now().Add(within); ControlProcs() != n || runtime.GOMAXPROCS(0) != n; {
			if time.Now().After(deadline) {
				t.Fatalf("control plane's Ps %d (GOMAXPROCS %d), want %d within %v", ControlProcs(), runtime.GOMAXPROCS(0), n, within)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitProcs(1, time.Second)
	stop := make(chan struct{})
	busy(2, stop)
	waitProcs(2, 10*time.Second)
	close(stop)
	waitProcs(1, 20*time.Second)
}

// With one CPU AutoControlProcs sets one P, keeps it under load without
// sampling the CPU it has nothing to decide with, and returns when its
// context ends.
func TestAutoControlProcsOneCPU(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	defer SetControlProcs(runtime.GOMAXPROCS(0))
	var samples atomic.Int64
	defer func(f func() time.Duration) { sampleCPU = f }(sampleCPU)
	sampleCPU = func() time.Duration { samples.Add(1); return controlCPU() }
	SetControlProcs(3)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		AutoControlProcs(ctx, 1, zap.NewNop())
	}()
	stop := make(chan struct{})
	defer close(stop)
	busy(2, stop)
	one := func() bool { return ControlProcs() == 1 && runtime.GOMAXPROCS(0) == 1 }
	for deadline := time.Now().Add(time.Second); !one(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("control plane's Ps %d (GOMAXPROCS %d), want 1", ControlProcs(), runtime.GOMAXPROCS(0))
		}
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if !one() {
			t.Fatalf("control plane's Ps %d (GOMAXPROCS %d) under load, want 1", ControlProcs(), runtime.GOMAXPROCS(0))
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("AutoControlProcs did not return when its context ended")
	}
	if n := samples.Load(); n != 0 {
		t.Errorf("%d CPU samples over more than %v, want none on one CPU", n, 4*scaleInterval)
	}
}

// busy keeps n goroutines burning CPU until stop is closed.
func busy(n int, stop <-chan struct{}) {
	for range n {
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
					burn(time.Millisecond)
				}
			}
		}()
	}
}
