package slowpath

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// The control plane's Ps, set by its load (dataplane.control_procs = 0).
//
// Every Go P beyond what the control plane keeps busy costs CPU: sipgo
// starts a goroutine per SIP message, and each one made ready wakes an
// idle P's thread, which finds little to do and sleeps again (a futex
// wake, two context switches). On 2 CPUs one P instead of two took
// 12-16 % off a SIP call's CPU at 500 calls a second (docs/bench-history.md,
// "The control plane's Ps"). One P also caps the control plane at one
// CPU, which a burst of calls can need more than. AutoControlProcs
// starts with one P and adds one when the control plane's CPU comes near
// what its Ps can give, and takes one back when the load has fitted in
// one fewer for a while.
//
// The control plane's CPU is the process's less the userspace workers'
// threads' (a worker busy with packets holds a P of its own on top, see
// procGauge): what the SIP, ng and admin goroutines, the runtime and the
// system calls they make take.

// Thresholds of procScaler, in CPUs per P, and its windows.
const (
	scaleInterval = 250 * time.Millisecond
	// One more P when the last second's control CPU reached upAt of the
	// Ps': one P gives at most one CPU (a little more while a thread is
	// in a system call and another runs the P).
	upAt      = 0.9
	upSamples = 4
	// One fewer when each second of the last five fitted downAt of one P
	// fewer. With fewer Ps the same load costs less (the wake-ups above), so
	// the CPU after a step down is under both thresholds: no flapping.
	downAt      = 0.75
	downSamples = 20
)

// procScaler decides the control plane's Ps from its CPU per interval.
type procScaler struct {
	max, n int
	rates  []float64 // CPUs used per interval since the last change, newest last, at most downSamples
}

func newProcScaler(max int) *procScaler {
	return &procScaler{max: max, n: 1, rates: make([]float64, 0, downSamples)}
}

// observe takes one interval's control plane CPU, in CPUs, and reports
// whether n changed.
func (s *procScaler) observe(rate float64) bool {
	if len(s.rates) == downSamples {
		copy(s.rates, s.rates[1:])
		s.rates = s.rates[:downSamples-1]
	}
	s.rates = append(s.rates, rate)
	switch {
	case s.n < s.max && len(s.rates) >= upSamples && mean(s.rates[len(s.rates)-upSamples:]) >= upAt*float64(s.n):
		s.n++
	case s.n > 1 && len(s.rates) == downSamples && peak(s.rates) <= downAt*float64(s.n-1):
		s.n--
	default:
		return false
	}
	// The next decision is on the new count's own load.
	s.rates = s.rates[:0]
	return true
}

// peak is the highest mean of v's seconds (upSamples at a time).
func peak(v []float64) float64 {
	var p float64
	for i := 0; i+upSamples <= len(v); i += upSamples {
		p = max(p, mean(v[i:i+upSamples]))
	}
	return p
}

func mean(v []float64) float64 {
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

// ControlProcs returns the control plane's Ps: GOMAXPROCS less the
// workers holding one (0 before a pool opened or SetControlProcs).
func ControlProcs() int {
	procs.Lock()
	defer procs.Unlock()
	return procs.base
}

// AutoControlProcs sets the control plane's Ps by its load, between one
// and max, until ctx ends. It starts with one.
func AutoControlProcs(ctx context.Context, max int, log *zap.Logger) {
	if max < 1 {
		max = 1
	}
	s := newProcScaler(max)
	SetControlProcs(s.n)
	if max == 1 {
		// One CPU: nothing to decide, so nothing to sample. Each sample
		// is a timer's wake-up and a read of every thread's CPU clock,
		// which an idle relayd on one CPU paid for nothing.
		<-ctx.Done()
		return
	}
	t := time.NewTicker(scaleInterval)
	defer t.Stop()
	last, at := sampleCPU(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cpu := sampleCPU()
			rate := float64(cpu-last) / float64(now.Sub(at))
			last, at = cpu, now
			if s.observe(rate) {
				SetControlProcs(s.n)
				log.Debug("control plane's Ps", zap.Int("procs", s.n), zap.Float64("cpus_used", rate))
			}
		}
	}
}

// workerThreads are the threads of the workers that run (kernel thread
// ID: the thread's CPU time when its worker started on it) and what the
// workers that ended took: controlCPU leaves both out. A thread's CPU
// clock counts from the thread's start, and the runtime may have run other
// goroutines on it before the worker locked it.
var workerThreads struct {
	sync.Mutex
	tids  map[int]time.Duration
	ended time.Duration
}

// workerThreadStart registers the calling thread, a worker's, which
// stays locked to its goroutine until workerThreadEnd.
func workerThreadStart() int {
	tid, cpu := unix.Gettid(), clockCPU(unix.CLOCK_THREAD_CPUTIME_ID)
	workerThreads.Lock()
	defer workerThreads.Unlock()
	if workerThreads.tids == nil {
		workerThreads.tids = make(map[int]time.Duration)
	}
	workerThreads.tids[tid] = cpu
	return tid
}

// workerThreadEnd is called on the worker's thread as the worker ends.
func workerThreadEnd(tid int) {
	cpu := clockCPU(unix.CLOCK_THREAD_CPUTIME_ID)
	workerThreads.Lock()
	defer workerThreads.Unlock()
	workerThreads.ended += cpu - workerThreads.tids[tid]
	delete(workerThreads.tids, tid)
}

// sampleCPU is what AutoControlProcs reads each interval: controlCPU
// (a test counts the reads).
var sampleCPU = controlCPU

// controlCPU is the process's CPU time less what its workers took.
func controlCPU() time.Duration {
	workerThreads.Lock()
	defer workerThreads.Unlock()
	cpu := clockCPU(unix.CLOCK_PROCESS_CPUTIME_ID) - workerThreads.ended
	for tid, start := range workerThreads.tids {
		if now := clockCPU(threadCPUClock(tid)); now > start {
			cpu -= now - start
		}
	}
	return cpu
}

// threadCPUClock is the CPU-time clock of thread tid of this process
// (what pthread_getcpuclockid gives: the kernel's MAKE_THREAD_CPUCLOCK of
// CPUCLOCK_SCHED, a per-thread clock).
func threadCPUClock(tid int) int32 {
	const perThread, sched = 4, 2
	return int32(^tid<<3 | perThread | sched)
}

// clockCPU reads a CPU-time clock; 0 when it cannot (a thread that has
// just ended).
func clockCPU(clock int32) time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(clock, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
