package slowpath

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// A worker with packets keeps its P while it waits (see ppoll), so the
// rest of the program needs a P more for each such worker. procGauge
// raises GOMAXPROCS by one per worker holding its P, and lowers it when
// the worker goes idle (idleWait) and waits with ppollIdle, which gives
// the P back.
//
// An XDP data plane's workers are idle nearly always. With a P each kept
// in GOMAXPROCS regardless, the control plane paid a tenth more CPU per
// SIP call on 2 CPUs: an idle P sends the scheduler spinning threads
// after work, and one spare P was enough for that. The price: an idle
// worker woken by a control request or a packet waits for a P like any
// goroutine (flow installs to idle workers run about a tenth slower).
//
// Changing GOMAXPROCS stops the world for some microseconds; a worker
// changes state at most twice per idleWait. A worker that goes idle
// leaves the change to a goroutine of the pool, so that it does not wait
// for it; one that starts holding its P makes it itself, before it keeps
// the P in its wait: the goroutine, made ready on the worker's P, would
// wait there for it while the control plane had only that one (as
// dataplane.control_procs and AutoControlProcs can have it) until the
// runtime preempted the worker, 10-20 ms later, and every control
// request and latched source with it.
type procGauge struct {
	held    atomic.Int32  // workers holding their P
	changes atomic.Uint64 // times a worker started or stopped holding one
	kick    chan struct{} // held changed; cap 1
	done    chan struct{} // run returned
	mu      sync.Mutex
	applied int // what was last added to GOMAXPROCS; under mu
}

func newProcGauge() *procGauge {
	procsOpen()
	g := &procGauge{kick: make(chan struct{}, 1), done: make(chan struct{})}
	go g.run()
	return g
}

// add counts a worker that starts (+1) or stops (-1) holding its P. A
// stop never blocks; a start raises GOMAXPROCS before it returns.
func (g *procGauge) add(d int32) {
	g.held.Add(d)
	g.changes.Add(1)
	if d > 0 {
		g.apply()
		return
	}
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// apply makes GOMAXPROCS count the workers holding their P.
func (g *procGauge) apply() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := int(g.held.Load()); n != g.applied {
		procsAdjust(n - g.applied)
		g.applied = n
	}
}

func (g *procGauge) run() {
	defer close(g.done)
	for range g.kick {
		g.apply()
	}
	g.mu.Lock()
	procsAdjust(-g.applied)
	g.applied = 0
	g.mu.Unlock()
	procsClose()
}

// close puts GOMAXPROCS back; the workers must have stopped.
func (g *procGauge) close() {
	close(g.kick)
	<-g.done
}

// procs is GOMAXPROCS's accounting across the open pools (tests open
// several): base is what it was before the first, held the workers
// holding a P in all of them.
var procs struct {
	sync.Mutex
	pools, base, held int
}

func procsOpen() {
	procs.Lock()
	defer procs.Unlock()
	if procs.pools == 0 {
		procs.base, procs.held = runtime.GOMAXPROCS(0), 0
	}
	procs.pools++
}

func procsClose() {
	procs.Lock()
	defer procs.Unlock()
	if procs.pools--; procs.pools == 0 {
		runtime.GOMAXPROCS(procs.base)
	}
}

func procsAdjust(d int) {
	procs.Lock()
	defer procs.Unlock()
	procs.held += d
	runtime.GOMAXPROCS(procs.base + procs.held) // no stop when unchanged
}

// SetControlProcs gives the rest of the program (the control plane) n
// Ps; the workers holding a P get theirs on top. With no pool open, held
// is 0 and the first pool to open takes n as its base.
func SetControlProcs(n int) {
	procs.Lock()
	defer procs.Unlock()
	procs.base = n
	runtime.GOMAXPROCS(procs.base + procs.held)
}
