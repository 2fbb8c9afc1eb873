package slowpath

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/slowpath/srtpflow"
	"github.com/relayd/relayd/slowpath/transcode"
)

// Pool is the userspace data plane: one worker per CPU, each on its own
// OS thread pinned to its CPU, each owning its flows. Safe for concurrent
// use.
type Pool struct {
	log     *zap.Logger
	cfg     Config
	steer   *Steering
	xsk     *xskPlane  // Config.IO "afxdp"
	links   *linkWatch // the AF_XDP interfaces, followed
	workers []*worker
	wg      sync.WaitGroup
	// procs keeps GOMAXPROCS at the program's own count plus one per
	// worker holding its P (procs_linux.go).
	procs  *procGauge
	events sync.WaitGroup

	latched chan latchEvent

	mu        sync.Mutex // guards the following
	owner     map[netip.AddrPort]placed
	count     []int              // flows per worker
	load      []int              // their load (flowLoad) per worker
	relayRefs map[netip.Addr]int // flows (shadows too) by the address they match on
	relays    relaySet           // relayRefs' addresses, for the workers
}

// placed is where the pool put a flow: its worker, and what it counts
// for in the worker's load.
type placed struct{ worker, load int }

// flowLoad is what a flow counts for in its worker's load
// (Config.PackFlows): an RTCP port's flow (no clock rate) nothing, its
// reports come every few seconds; a transcoded flow TranscodeLoad; any
// other 1.
func flowLoad(fl *dataplane.Flow) int {
	switch {
	case fl.Transcode != nil:
		return TranscodeLoad
	case fl.ClockRate == 0:
		return 0
	}
	return 1
}

// place picks the worker for a new call's flow of load l: with
// Config.PackFlows, the first whose load stays within it; else, or when
// every worker is past it, the least loaded. p.mu held.
func (p *Pool) place(l int) int {
	if pack := p.cfg.PackFlows; pack > 0 {
		for i, have := range p.load {
			if have+l <= pack {
				return i
			}
		}
	}
	wi := 0
	for i, have := range p.load {
		if have < p.load[wi] {
			wi = i
		}
	}
	return wi
}

// relaySet is the set of relay addresses, read by every worker for every
// packet it sends and replaced (rarely: an address's first flow or its
// last) by the control path. The slice a load returns never changes.
type relaySet struct{ p atomic.Pointer[[]netip.Addr] }

// has reports whether a is a relay address. It allocates nothing: a
// relay has a handful of media addresses.
func (r *relaySet) has(a netip.Addr) bool {
	if r == nil {
		return false
	}
	p := r.p.Load()
	if p == nil {
		return false
	}
	for _, x := range *p {
		if x == a {
			return true
		}
	}
	return false
}

// holdRelay and dropRelay count a flow on its match's address; p.mu held.
func (p *Pool) holdRelay(a netip.Addr) {
	a = a.Unmap().WithZone("")
	p.relayRefs[a]++
	if p.relayRefs[a] == 1 {
		p.publishRelays()
	}
}

func (p *Pool) dropRelay(a netip.Addr) {
	a = a.Unmap().WithZone("")
	if p.relayRefs[a]--; p.relayRefs[a] <= 0 {
		delete(p.relayRefs, a)
		p.publishRelays()
	}
}

func (p *Pool) publishRelays() {
	addrs := make([]netip.Addr, 0, len(p.relayRefs))
	for a := range p.relayRefs {
		addrs = append(addrs, a)
	}
	p.relays.p.Store(&addrs)
}

// New creates the sockets and workers and attaches the steering program to
// the network namespace of the calling thread.
func New(cfg Config, log *zap.Logger) (*Pool, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	p := &Pool{log: log, cfg: cfg, owner: make(map[netip.AddrPort]placed), count: make([]int, len(cfg.CPUs)), load: make([]int, len(cfg.CPUs)),
		latched: make(chan latchEvent, 4096), relayRefs: make(map[netip.Addr]int)}
	// Nothing is steered until flows are installed: attaching before the
	// workers' sockets are in the sockmap changes no packet's way.
	steer, err := NewSteering("/proc/thread-self/ns/net", cfg.MaxFlows)
	if err != nil {
		return nil, err
	}
	p.steer = steer
	for i, cpu := range cfg.CPUs {
		w, err := newWorker(i, cpu, log.With(zap.Int("worker", i), zap.Int("cpu", cpu)))
		if err != nil {
			p.Close()
			return nil, err
		}
		w.latchWindow = int64(cfg.LatchWindow)
		w.coalesce = int64(cfg.Coalesce)
		w.rtcpInterval = int64(cfg.RTCPInterval)
		w.latched = p.latched
		w.relays = &p.relays
		p.workers = append(p.workers, w)
		if err := p.steer.SetSocket(i, w.rxFD); err != nil {
			p.Close()
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
	}
	if cfg.IO == IOAFXDP {
		if p.xsk, err = newXSKPlane(p.steer, p.workers, cfg.Interfaces, cfg.XDPGeneric, cfg.ExternalXDP, log); err != nil {
			p.Close()
			return nil, err
		}
	}

	// A worker with packets keeps its P while it waits (see ppoll): the
	// rest of the program needs as many as it had besides.
	p.procs = newProcGauge()
	for _, w := range p.workers {
		w.procs = p.procs
		w.sched, w.prio, w.ready = cfg.Scheduling, cfg.Priority, make(chan error, 1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			w.run()
		}()
	}
	var errs []error
	for _, w := range p.workers {
		errs = append(errs, <-w.ready)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	p.events.Add(1)
	go func() {
		defer p.events.Done()
		for ev := range p.latched {
			if p.cfg.OnLatched != nil {
				p.cfg.OnLatched(ev.match, ev.source, ev.locked)
			}
		}
	}()
	if p.xsk != nil {
		// After the workers started: the watch's first check may move a
		// device re-created since its sockets were opened at once, by a
		// request each worker answers in its loop.
		ns, err := netns.Get()
		if err == nil {
			p.links, err = p.watchLinks(ns)
			ns.Close()
		}
		if err != nil {
			log.Warn("interfaces are not followed: one deleted and created again keeps its AF_XDP receive on the old device until relayd restarts",
				zap.Error(err))
		}
	}
	log.Info("userspace data plane started", zap.Int("workers", len(p.workers)), zap.Ints("cpus", cfg.CPUs), zap.String("io", cfg.IO), zap.Strings("interfaces", cfg.Interfaces),
		zap.String("scheduling", policyName(cfg.Scheduling)), zap.Int("priority", cfg.Priority))
	return p, nil
}

// Close stops the workers and detaches the steering program.
func (p *Pool) Close() error {
	p.links.close()
	var errs []error
	for _, w := range p.workers {
		errs = append(errs, w.close())
	}
	p.wg.Wait()
	if p.procs != nil {
		p.procs.close()
	}
	if p.latched != nil {
		close(p.latched)
		p.events.Wait()
	}
	errs = append(errs, p.xsk.close(), p.steer.Close())
	return errors.Join(errs...)
}

// Path implements dataplane.DataPlane.
func (p *Pool) Path() dataplane.Path { return dataplane.PathUserspace }

// Install implements dataplane.DataPlane. The flow goes to the worker with
// the fewest flows.
func (p *Pool) Install(fl dataplane.Flow) error { return p.install(&fl, false) }

// InstallShadow implements dataplane.PuntRelay. The shadow starts
// dormant (worker.dormant): its worker is neither woken nor waited for,
// and holds only the flow until XDP first punts to it. Most XDP flows
// never are; each install would otherwise wake a worker on its locked
// thread, and each shadow would be a flowState for the call's lifetime.
// A dormant shadow keeps fl itself (the caller's, never changed after).
func (p *Pool) InstallShadow(fl *dataplane.Flow) error { return p.install(fl, true) }

// UpdateShadow implements dataplane.PuntRelay; like InstallShadow, it
// does not wait for the worker (a dormant shadow's flow is replaced).
func (p *Pool) UpdateShadow(fl *dataplane.Flow) error { return p.update(fl, true) }

// RemoveShadow implements dataplane.PuntRelay.
func (p *Pool) RemoveShadow(match netip.AddrPort) (dataplane.Stats, error) {
	return p.remove(match, true)
}

// ShadowStat implements dataplane.PuntRelay: one worker is asked.
func (p *Pool) ShadowStat(match netip.AddrPort) (dataplane.Stats, error) {
	return p.stats(match, true)
}

// ShadowStats implements dataplane.PuntRelay: only the shadows that
// carried or dropped a packet, which XDP seldom punts to, are copied out
// of the workers; the others' statistics are zero.
func (p *Pool) ShadowStats() (map[netip.AddrPort]dataplane.Stats, error) {
	out := make(map[netip.AddrPort]dataplane.Stats)
	err := p.eachStats(true, func(match netip.AddrPort, st dataplane.Stats) { out[match] = st })
	return out, err
}

var _ dataplane.StatsReader = (*Pool)(nil)

// EachStats implements dataplane.StatsReader.
func (p *Pool) EachStats(fn func(match netip.AddrPort, st dataplane.Stats)) error {
	return p.eachStats(false, fn)
}

// eachStats calls fn with the statistics opStats gets from each worker.
func (p *Pool) eachStats(shadow bool, fn func(netip.AddrPort, dataplane.Stats)) error {
	for _, w := range p.workers {
		r, err := w.callStats(ctrl{op: opStats, shadow: shadow})
		if err != nil {
			return err
		}
		for match, st := range r {
			fn(match, st)
		}
	}
	return nil
}

func (p *Pool) install(fl *dataplane.Flow, shadow bool) error {
	if err := fl.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.owner[fl.Match]; ok {
		return dataplane.ErrExists
	}
	if len(p.owner) >= p.cfg.MaxFlows {
		return dataplane.ErrFull
	}
	// A flow and its reverse live on one worker: latching updates the
	// reverse flow's destination in place.
	load := flowLoad(fl)
	rev, ok := p.owner[fl.Reverse]
	wi := rev.worker
	if !ok {
		wi = p.place(load)
	}
	dec, enc, err := newTransforms(fl)
	if err != nil {
		return err
	}
	add := ctrl{op: opAdd, flow: *fl, shadow: shadow, dec: dec, enc: enc}
	w := p.workers[wi]
	dormant := shadow && canSleep(&add)
	if dormant {
		// Before the steering: the worker finds it at the first packet.
		w.sleep(fl)
	} else if _, err := w.call(add); err != nil {
		return err
	}
	if err := p.steer.Steer(fl.Match, wi); err != nil {
		if !dormant || !w.unsleep(fl.Match) {
			w.call(ctrl{op: opRemove, flow: *fl, shadow: shadow})
		}
		return err
	}
	p.owner[fl.Match] = placed{worker: wi, load: load}
	p.count[wi]++
	p.load[wi] += load
	p.holdRelay(fl.Match.Addr())
	return nil
}

// Update implements dataplane.DataPlane; the flow keeps its statistics.
func (p *Pool) Update(fl dataplane.Flow) error { return p.update(&fl, false) }

func (p *Pool) update(fl *dataplane.Flow, shadow bool) error {
	if err := fl.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	at, ok := p.owner[fl.Match]
	p.mu.Unlock()
	if !ok {
		return dataplane.ErrNotFound
	}
	wi := at.worker
	dec, enc, err := newTransforms(fl)
	if err != nil {
		return err
	}
	c := ctrl{op: opUpdate, flow: *fl, shadow: shadow, dec: dec, enc: enc}
	w := p.workers[wi]
	if shadow {
		switch {
		case canSleep(&c) && w.resleep(fl):
			p.reweigh(fl)
			return nil // still dormant, now with fl
		case w.unsleep(fl.Match):
			// Dormant but no longer fit to be (never for what XDP
			// carries): the worker makes it.
			c.op = opAdd
		}
		if fl.Transcode == nil {
			w.post(c)
			p.reweigh(fl)
			return nil
		}
	}
	if _, err = w.call(c); err != nil {
		return err
	}
	p.reweigh(fl)
	return nil
}

// reweigh counts an updated flow for what it weighs now (it may have
// started or stopped transcoding) on its worker, where it stays: its
// state is there.
func (p *Pool) reweigh(fl *dataplane.Flow) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at, ok := p.owner[fl.Match]; ok {
		l := flowLoad(fl)
		p.load[at.worker] += l - at.load
		at.load = l
		p.owner[fl.Match] = at
	}
}

// Remove implements dataplane.DataPlane.
func (p *Pool) Remove(match netip.AddrPort) (dataplane.Stats, error) { return p.remove(match, false) }

func (p *Pool) remove(match netip.AddrPort, shadow bool) (dataplane.Stats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.owner[match]
	if !ok {
		return dataplane.Stats{}, dataplane.ErrNotFound
	}
	wi := at.worker
	rm := ctrl{op: opRemove, flow: dataplane.Flow{Match: match}, shadow: shadow}
	var r []dataplane.FlowStats
	if !shadow || !p.workers[wi].unsleep(match) {
		// Ask the worker first: the flow must be of the kind asked for.
		// A dormant shadow counted nothing and the worker need not be
		// asked (a packet it takes from now on finds no flow, as one
		// arriving just after the removal would).
		var err error
		if r, err = p.workers[wi].call(rm); err != nil {
			return dataplane.Stats{}, err
		}
	}
	if err := p.steer.Unsteer(match); err != nil {
		return dataplane.Stats{}, err
	}
	delete(p.owner, match)
	p.count[wi]--
	p.load[wi] -= at.load
	p.dropRelay(match.Addr())
	if len(r) == 0 {
		return dataplane.Stats{}, nil
	}
	return r[0].Stats, nil
}

// Stats implements dataplane.DataPlane.
func (p *Pool) Stats(match netip.AddrPort) (dataplane.Stats, error) { return p.stats(match, false) }

func (p *Pool) stats(match netip.AddrPort, shadow bool) (dataplane.Stats, error) {
	p.mu.Lock()
	at, ok := p.owner[match]
	p.mu.Unlock()
	if !ok {
		return dataplane.Stats{}, dataplane.ErrNotFound
	}
	wi := at.worker
	if shadow && p.workers[wi].dormantHas(match) {
		return dataplane.Stats{}, nil
	}
	r, err := p.workers[wi].call(ctrl{op: opGet, flow: dataplane.Flow{Match: match}, shadow: shadow})
	if err != nil {
		return dataplane.Stats{}, err
	}
	if len(r) == 0 {
		return dataplane.Stats{}, dataplane.ErrNotFound
	}
	return r[0].Stats, nil
}

// List implements dataplane.DataPlane. Shadows are not listed.
func (p *Pool) List() ([]dataplane.FlowStats, error) { return p.list(false) }

func (p *Pool) list(shadow bool) ([]dataplane.FlowStats, error) {
	var out []dataplane.FlowStats
	for _, w := range p.workers {
		r, err := w.call(ctrl{op: opList, shadow: shadow})
		if err != nil {
			return nil, err
		}
		out = append(out, r...)
	}
	return out, nil
}

// Counters implements dataplane.Observer: packets by verdict, summed over
// workers.
func (p *Pool) Counters() ([]dataplane.Counter, error) {
	out := make([]dataplane.Counter, 0, vMax+3)
	var c [vMax + 3]dataplane.Counter
	for _, w := range p.workers {
		for v := range vMax {
			c[v].Packets += w.counters[v].Load()
		}
		c[vMax].Packets += w.noFlow.Load()
		c[vMax+1].Packets += w.sendFailed.Load()
		c[vMax+2].Packets += w.malformed.Load()
	}
	for v := range vMax {
		verdict := "drop"
		switch v {
		case vSend:
			verdict = "forward"
		case vConsumed:
			verdict = "consume"
		}
		out = append(out, dataplane.Counter{Verdict: verdict, Reason: "userspace_" + verdictNames[v], Packets: c[v].Packets})
	}
	out = append(out,
		dataplane.Counter{Verdict: "drop", Reason: "userspace_no_flow", Packets: c[vMax].Packets},
		dataplane.Counter{Verdict: "drop", Reason: "userspace_send_failed", Packets: c[vMax+1].Packets},
		// AF_XDP frames whose lengths or checksums do not hold (the
		// kernel drops those before a socket sees them).
		dataplane.Counter{Verdict: "drop", Reason: "userspace_malformed", Packets: c[vMax+2].Packets})
	return out, nil
}

// Ping asks every worker for an answer through its control queue, as a
// flow change would, and returns an error naming each worker that did not
// answer before ctx is done (a worker stuck in a batch or on its CPU). The
// workers are asked at once, so a ping takes as long as the slowest one.
func (p *Pool) Ping(ctx context.Context) error {
	errs := make([]error, len(p.workers))
	var wg sync.WaitGroup
	for i, w := range p.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = w.callCtx(ctx, ctrl{op: opPing})
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Interfaces implements dataplane.Observer: the interfaces its AF_XDP
// receive program is attached to (Config.IO "afxdp"), none otherwise.
func (p *Pool) Interfaces() []dataplane.Interface {
	if p.xsk == nil {
		return nil
	}
	p.xsk.mu.Lock()
	defer p.xsk.mu.Unlock()
	return append([]dataplane.Interface(nil), p.xsk.ifaces...)
}

// InterfaceRecreated moves AF_XDP receive (Config.IO "afxdp") on
// interface name from ifindex old to now: the interface was deleted and
// created again under its name (ifupdown does that to VLAN and bond
// devices when networking restarts). The workers get sockets on the new
// device's queues, each between two batches, and the old sockets are
// closed; without Config.ExternalXDP the pool's program is attached to
// the new device too. Calls in progress keep their flows. The pool's own
// watch of the interfaces calls it; it must run on a thread in the
// namespace the pool was started in (a socket binds to an ifindex of its
// own namespace). Without AF_XDP receive it does nothing.
func (p *Pool) InterfaceRecreated(name string, old, now int) error {
	if p.xsk == nil {
		return nil
	}
	if err := p.xsk.recreated(p.workers, name, old, now, p.cfg.XDPGeneric, p.log); err != nil {
		return err
	}
	p.log.Info("interface re-created: AF_XDP receive moved to it", zap.String("interface", name),
		zap.Int("old_ifindex", old), zap.Int("ifindex", now))
	return nil
}

type ctrlOp uint8

const (
	opAdd ctrlOp = iota
	opUpdate
	opRemove
	opGet
	opList
	// opStats: the statistics of the flows (shadow false) or of the
	// shadows that carried or dropped a packet (shadow true), by match.
	opStats
	opPing // answers nothing: the worker's loop is alive
	// opSwapXSK: the worker's AF_XDP sockets on ifindex xskOld are
	// replaced by xsks (the device was created again), between batches;
	// the answer comes once the old ones are no longer read.
	opSwapXSK
)

type ctrl struct {
	op     ctrlOp
	flow   dataplane.Flow
	shadow bool // the flow is a shadow of an XDP flow
	dec    *srtpflow.Decrypter
	enc    *srtpflow.Encrypter
	reply  chan ctrlReply
	// opSwapXSK
	xskOld int
	xsks   []*xskSock
}

type ctrlReply struct {
	flows []dataplane.FlowStats
	stats map[netip.AddrPort]dataplane.Stats // opStats
	err   error
}

// worker owns a receiving socket (dual-stack where the host has IPv6), two
// raw sending sockets and its flows. Only its goroutine, locked to its
// pinned thread, touches the flows; the control plane talks to it through
// a queue and wakes it through an eventfd.
//
// The worker waits on its own thread, in ppoll on the socket and the
// eventfd, not in the Go runtime's netpoller: there a packet would wake
// the netpoller's thread, which would then have to wake the worker's
// locked thread, two wake-ups per batch where one does.
type worker struct {
	id  int
	cpu int
	log *zap.Logger

	rxFD   int // nonblocking UDP socket
	rx6    bool
	wakeFD int // eventfd: a control request, or stop
	raw4   int
	raw6   int
	flows  map[netip.AddrPort]*flowState

	// dormant are the shadows XDP has not punted to yet: their flow
	// alone, a fraction of a flowState, installed and removed without
	// waking the worker (dormant_linux.go). The worker wakes one into flows
	// at its first packet. Written by the pool, read by the worker when
	// a packet's match is not in flows.
	dormantMu sync.Mutex // guards dormant
	dormant   map[netip.AddrPort]*dataplane.Flow
	dormantN  atomic.Int32 // len(dormant): a miss in flows takes no lock while 0

	// xsks are the worker's AF_XDP sockets (Config.IO "afxdp"), one per
	// (device, queue), read before the UDP socket; xb is their batch.
	xsks      []*xskSock
	xb        *xskBatch
	xskRounds uint
	// xskSwap is an opSwapXSK request waiting for the loop's next round,
	// where no socket is being read. Worker goroutine only.
	xskSwap *ctrl

	// ppoll's arguments, allocated once: the UDP socket, the eventfd,
	// then xsks. Worker goroutine only.
	pollFDs []unix.PollFd
	pollTS  unix.Timespec
	// holding is whether the worker keeps its P while it waits (it had
	// packets within idleWait), counted in procs (nil: a test's worker,
	// the test sets GOMAXPROCS). Worker goroutine only.
	holding bool
	procs   *procGauge
	wakeBuf [8]byte
	// Coalescing (Config.Coalesce): coalesce is the nap in ns (0: off);
	// polling is set while packets come faster than one per nap, and the
	// worker naps between reads instead of waiting for the socket;
	// lastWake is when the socket last woke it. Worker goroutine only.
	coalesce int64
	polling  bool
	lastWake int64
	// exited is closed when run returns; started is set when it begins.
	exited  chan struct{}
	started atomic.Bool
	// sched and prio are Config.Scheduling and Config.Priority; ready,
	// if set (by New), gets the outcome of setting up the worker's
	// thread, nil or why it ended at once.
	sched string
	prio  int
	ready chan error

	ctrlMu  sync.Mutex // guards ctrlQ
	ctrlQ   []ctrl
	pending atomic.Bool
	// ctrlSpare is the queue drained last, emptied, for the next: the
	// worker's goroutine alone touches it.
	ctrlSpare []ctrl

	latchWindow int64             // ns
	latched     chan<- latchEvent // to the pool; never blocks
	// relays are the relay addresses of the pool's flows: a packet to
	// one of them would come back to relayd (see loops).
	relays *relaySet
	// latchBacklog holds, in order, the events the pool's queue had no
	// room for (thousands of calls latching at once): they are handed on
	// after later batches, never dropped. A lost "locked" event would
	// leave an XDP flow in userspace for good. Worker goroutine only.
	latchBacklog []latchEvent
	// heldLocks are the matches of the flows whose lock waits for the
	// worker to catch up (holdLock).
	heldLocks []netip.AddrPort

	// Transcoding: the worker's transcoding flows, its send batches
	// (pullOut sends from the control path too) and its timers: timer is
	// when the next engine deadline or RTCP report is due, latchWake when
	// the latch backlog is retried, armed the deadline of its wait (Unix ns;
	// 0 none). Worker goroutine only.
	tcFlows      map[*flowState]struct{}
	tx4, tx6     *txBatch
	scratch      [maxPacket]byte
	batch        [batchSize]rxPacket // the packets of the batch being relayed
	timer, armed int64
	rtcpInterval int64 // ns
	latchWake    int64

	counters [vMax]atomic.Uint64
	// wakes counts the waits the socket ended, naps the naps taken,
	// batches the reads that returned packets; delay and delaySum are
	// the packets' receive-queue delays (dataplane.WorkerStats).
	wakes, naps, batches atomic.Uint64
	// interrupts counts the waits a signal ended (EINTR); lastData is
	// when the worker last had packets (a wait ended with some, or it
	// read some since its last wait), UnixNano, for idleWait.
	interrupts atomic.Uint64
	lastData   int64
	delay      [len(delayBoundsNS) + 1]atomic.Uint64
	delaySum   atomic.Int64
	noFlow     atomic.Uint64
	lockWaits  atomic.Uint64 // latching flows whose lock waited for the worker (lockLag)
	sendFailed atomic.Uint64
	// xskPackets counts the packets read from xsks, malformed the frames
	// dropped there (bad lengths or checksums).
	xskPackets, malformed atomic.Uint64
	closed                atomic.Bool
}

func newWorker(id, cpu int, log *zap.Logger) (*worker, error) {
	w := &worker{id: id, cpu: cpu, log: log, flows: make(map[netip.AddrPort]*flowState), rxFD: -1, wakeFD: -1, raw4: -1, raw6: -1,
		tcFlows: make(map[*flowState]struct{}), exited: make(chan struct{})}
	var err error
	if w.rxFD, w.rx6, err = listenUDP(); err != nil {
		return nil, fmt.Errorf("worker %d socket: %w", id, err)
	}
	var serr error
	set := func(level, opt, v int) {
		if err := unix.SetsockoptInt(w.rxFD, level, opt, v); err != nil && serr == nil {
			serr = fmt.Errorf("setsockopt %d/%d: %w", level, opt, err)
		}
	}
	set(unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	set(unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	set(unix.SOL_IP, unix.IP_RECVORIGDSTADDR, 1)
	if w.rx6 {
		set(unix.SOL_IPV6, unix.IPV6_RECVORIGDSTADDR, 1)
	}
	if serr != nil {
		w.release()
		return nil, serr
	}
	if w.wakeFD, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		w.release()
		return nil, fmt.Errorf("worker %d eventfd: %w", id, err)
	}
	if w.raw4, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW); err != nil {
		w.release()
		return nil, fmt.Errorf("worker %d raw IPv4 socket: %w", id, err)
	}
	unix.SetsockoptInt(w.raw4, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20)
	if w.raw6, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW); err == nil {
		if err := unix.SetsockoptInt(w.raw6, unix.SOL_IPV6, unix.IPV6_HDRINCL, 1); err != nil {
			w.release()
			return nil, fmt.Errorf("worker %d IPV6_HDRINCL: %w", id, err)
		}
		unix.SetsockoptInt(w.raw6, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20)
	} else {
		w.raw6 = -1
		log.Warn("no raw IPv6 socket: IPv6 flows cannot be sent", zap.Error(err))
	}
	return w, nil
}

// listenUDP opens the worker's receiving socket, nonblocking: dual-stack
// on [::] where the host has IPv6, else on 0.0.0.0, with a port of the
// kernel's choosing (sk_lookup steers the relay ports' packets to it).
func listenUDP() (fd int, v6 bool, err error) {
	fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		if err = unix.SetsockoptInt(fd, unix.SOL_IPV6, unix.IPV6_V6ONLY, 0); err == nil {
			if err = unix.Bind(fd, &unix.SockaddrInet6{}); err == nil {
				return fd, true, nil
			}
		}
		unix.Close(fd)
	}
	fd, err4 := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err4 != nil {
		return -1, false, errors.Join(err, err4)
	}
	if err4 = unix.Bind(fd, &unix.SockaddrInet4{}); err4 != nil {
		unix.Close(fd)
		return -1, false, errors.Join(err, err4)
	}
	return fd, false, nil
}

// close stops the worker: its loop returns (after the batch it is in and
// the control requests queued), then its sockets are closed.
func (w *worker) close() error {
	w.closed.Store(true)
	w.wake()
	if w.started.Load() {
		<-w.exited
	}
	return w.release()
}

// release closes the worker's file descriptors; its loop must not be
// running.
func (w *worker) release() error {
	var errs []error
	for _, fd := range []*int{&w.rxFD, &w.wakeFD, &w.raw4, &w.raw6} {
		if *fd >= 0 {
			errs = append(errs, unix.Close(*fd))
			*fd = -1
		}
	}
	return errors.Join(errs...)
}

// wake makes the worker's wait return: a control request is queued, or
// the worker is to stop.
func (w *worker) wake() {
	if w.wakeFD < 0 {
		return
	}
	one := [8]byte{1} // little-endian 1 (amd64, arm64)
	for {
		if _, err := unix.Write(w.wakeFD, one[:]); err != unix.EINTR {
			return // EAGAIN: the counter is full, so the worker is woken anyway
		}
	}
}

var errWorkerClosed = errors.New("worker closed")

// latchEvent reports that a flow learned a source, or locked it.
type latchEvent struct {
	match, source netip.AddrPort
	locked        bool
}

func (w *worker) notifyLatched(match, source netip.AddrPort, locked bool) {
	ev := latchEvent{match, source, locked}
	if len(w.latchBacklog) == 0 {
		select {
		case w.latched <- ev:
			return
		default:
		}
	}
	w.latchBacklog = append(w.latchBacklog, ev)
}

// Locks are reported once the worker has caught up. The report moves an
// XDP flow back into XDP, which forwards the flow's next packets at once:
// were the worker behind its receive queue then, the packets of the flow
// still queued would reach the peer after them, late and out of order (a
// starved worker in the appliance's VM had receivers see sequence jumps
// of 70-190 packets). So a locked flow refuses other sources at once,
// but its lock is held (heldLocks) until a read finds the worker's queue
// drained, and reported after the packets read before it were sent. A
// worker that does not catch up reports it one window after the window
// ended: those packets are late in userspace already, and XDP takes
// their load off the worker.
//
// lockLag is the wait past which a held lock counts in
// relayd_userspace_lock_waits_total.
const lockLag = int64(20 * time.Millisecond)

// holdLock holds the lock of f, decided by a packet that arrived at ts.
func (w *worker) holdLock(f *flowState, ts int64) {
	f.lockHeld, f.lockedAt = true, ts
	w.heldLocks = append(w.heldLocks, f.flow.Match)
}

// reportLock reports f's held lock at now.
func (w *worker) reportLock(f *flowState, now int64) {
	f.lockHeld = false
	if now-f.lockedAt > lockLag {
		w.lockWaits.Add(1)
	}
	w.notifyLatched(f.flow.Match, f.learned, true)
}

// releaseLocks reports the held locks: the worker's queue is drained.
func (w *worker) releaseLocks() {
	if len(w.heldLocks) == 0 {
		return
	}
	now := time.Now().UnixNano()
	for _, m := range w.heldLocks {
		if f := w.flows[m]; f != nil && f.lockHeld {
			w.reportLock(f, now)
		}
	}
	w.heldLocks = w.heldLocks[:0]
}

// flushLatched hands on what the queue has room for of the backlog, in
// order, without blocking; it reports whether events remain.
func (w *worker) flushLatched() bool {
	sent := 0
	for _, ev := range w.latchBacklog {
		select {
		case w.latched <- ev:
			sent++
			continue
		default:
		}
		break
	}
	n := copy(w.latchBacklog, w.latchBacklog[sent:])
	w.latchBacklog = w.latchBacklog[:n]
	return n > 0
}

// latchRetry is how soon an idle worker retries a latch backlog.
const latchRetry = 10 * time.Millisecond

// ctrlTimeout bounds the wait for a worker's answer to call and
// callStats.
const ctrlTimeout = 5 * time.Second

// Every flow install, update and removal is a round trip to a worker:
// its reply channels and timers are reused rather than made each time.
var (
	replies = sync.Pool{New: func() any { return make(chan ctrlReply, 1) }}
	timers  = sync.Pool{New: func() any {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return t
	}}
)

// call hands a control request to the worker and waits up to ctrlTimeout
// for its answer.
func (w *worker) call(c ctrl) ([]dataplane.FlowStats, error) {
	r, err := w.roundTrip(c, nil, nil)
	return r.flows, err
}

// callStats is call for opStats, whose answer is a map.
func (w *worker) callStats(c ctrl) (map[netip.AddrPort]dataplane.Stats, error) {
	r, err := w.roundTrip(c, nil, nil)
	return r.stats, err
}

// callCtx hands a control request to the worker and waits for its answer
// until ctx is done.
func (w *worker) callCtx(ctx context.Context, c ctrl) ([]dataplane.FlowStats, error) {
	r, err := w.roundTrip(c, ctx.Done(), ctx.Err)
	return r.flows, err
}

// post queues c for the worker and wakes it, without waiting for its
// answer: the worker logs a failure (c.reply is nil). Requests are served
// in order, posted or not.
func (w *worker) post(c ctrl) {
	if w.closed.Load() {
		return
	}
	c.reply = nil
	w.ctrlMu.Lock()
	w.ctrlQ = append(w.ctrlQ, c)
	w.ctrlMu.Unlock()
	if !w.pending.Swap(true) {
		w.wake()
	}
}

// roundTrip queues c for the worker, wakes it and waits for its reply
// until done is closed (why says why), or for ctrlTimeout when done is
// nil.
func (w *worker) roundTrip(c ctrl, done <-chan struct{}, why func() error) (ctrlReply, error) {
	if w.closed.Load() {
		return ctrlReply{}, errWorkerClosed
	}
	reply := replies.Get().(chan ctrlReply)
	c.reply = reply
	w.ctrlMu.Lock()
	w.ctrlQ = append(w.ctrlQ, c)
	w.ctrlMu.Unlock()
	// The first request since the worker last drained its queue wakes it;
	// the others find it awake (drainCtrl clears pending before it takes
	// the queue, so none is left behind).
	if !w.pending.Swap(true) {
		w.wake()
	}
	var timeout <-chan time.Time
	var t *time.Timer
	if done == nil {
		t = timers.Get().(*time.Timer)
		t.Reset(ctrlTimeout)
		timeout = t.C
	}
	var r ctrlReply
	var err error
	select {
	case r = <-reply:
		// The worker sends one reply per request: the channel is free.
		replies.Put(reply)
		err = r.err
	case <-timeout:
		err = fmt.Errorf("worker %d did not answer: %w", w.id, context.DeadlineExceeded)
	case <-done:
		err = fmt.Errorf("worker %d did not answer: %w", w.id, why())
	}
	if t != nil {
		t.Stop() // no stale tick after Stop (Go 1.23 timers)
		timers.Put(t)
	}
	return r, err
}

func (w *worker) drainCtrl() {
	w.pending.Store(false)
	w.ctrlMu.Lock()
	q := w.ctrlQ
	w.ctrlQ = w.ctrlSpare
	w.ctrlMu.Unlock()
	for i := range q {
		if q[i].op == opSwapXSK {
			// Answered by swapXSK, at the top of the loop.
			w.xskSwap = &ctrl{op: opSwapXSK, xskOld: q[i].xskOld, xsks: q[i].xsks, reply: q[i].reply}
			continue
		}
		r := w.handleCtrl(q[i])
		switch {
		case q[i].reply != nil:
			q[i].reply <- r
		case r.err != nil && q[i].op == opRemove:
			w.log.Warn("remove shadow", zap.Stringer("match", q[i].flow.Match), zap.Error(r.err))
		case r.err != nil:
			w.log.Warn("punted packets of this flow will not be relayed", zap.Stringer("match", q[i].flow.Match), zap.Error(r.err))
		}
	}
	clear(q) // the spare keeps no flow, key or channel alive
	w.ctrlSpare = q[:0]
}

func (w *worker) handleCtrl(c ctrl) ctrlReply {
	switch c.op {
	case opAdd:
		if _, ok := w.flows[c.flow.Match]; ok {
			return ctrlReply{err: dataplane.ErrExists}
		}
		f := &flowState{flow: c.flow, shadow: c.shadow, dec: c.dec, enc: c.enc}
		if err := w.setTranscode(f, c.flow.Transcode); err != nil {
			return ctrlReply{err: err}
		}
		w.flows[c.flow.Match] = f
	case opUpdate:
		f, ok := w.flows[c.flow.Match]
		if !ok || f.shadow != c.shadow {
			return ctrlReply{err: dataplane.ErrNotFound}
		}
		// The same conversion keeps its engine, with its sequence
		// numbers, timestamps and codec state.
		if !f.flow.Transcode.Equal(c.flow.Transcode) {
			if err := w.setTranscode(f, c.flow.Transcode); err != nil {
				return ctrlReply{err: err}
			}
		}
		// Same keys: keep the contexts, with their rollover counters and
		// replay windows. New keys: new contexts.
		if !f.flow.Decrypt.Equal(c.flow.Decrypt) {
			f.dec = c.dec
		}
		if !f.flow.Encrypt.Equal(c.flow.Encrypt) {
			f.enc = c.enc
		}
		// Latching again (a rebinding after the locked source fell
		// silent) or against another expected source: a new window.
		if c.flow.Latch && (!f.flow.Latch || f.flow.ExpectSource != c.flow.ExpectSource || f.flow.LatchAddress != c.flow.LatchAddress) {
			f.resetLatch()
		}
		f.flow = c.flow
	case opRemove, opGet:
		f, ok := w.flows[c.flow.Match]
		if !ok || f.shadow != c.shadow {
			return ctrlReply{err: dataplane.ErrNotFound}
		}
		if c.op == opRemove {
			delete(w.flows, c.flow.Match)
			st := f.stats()
			w.setTranscode(f, nil)
			return ctrlReply{flows: []dataplane.FlowStats{{Flow: f.flow, Stats: st}}}
		}
		return ctrlReply{flows: []dataplane.FlowStats{{Flow: f.flow, Stats: f.stats()}}}
	case opList:
		n := 0
		for _, f := range w.flows {
			if f.shadow == c.shadow {
				n++
			}
		}
		out := make([]dataplane.FlowStats, 0, n)
		for _, f := range w.flows {
			if f.shadow == c.shadow {
				out = append(out, dataplane.FlowStats{Flow: f.flow, Stats: f.stats()})
			}
		}
		return ctrlReply{flows: out}
	case opStats:
		out := make(map[netip.AddrPort]dataplane.Stats)
		for match, f := range w.flows {
			if f.shadow != c.shadow || f.shadow && f.packets == 0 && f.dropped == 0 && f.lastSeen == 0 {
				continue
			}
			out[match] = f.stats()
		}
		return ctrlReply{stats: out}
	}
	return ctrlReply{}
}

// setTranscode gives f the engine t asks for (nil: none), freeing the one
// it had. The engine is created here, on the worker's thread, and only
// this worker touches it.
func (w *worker) setTranscode(f *flowState, t *dataplane.Transcode) error {
	var tc *transcode.Stream
	if t != nil {
		ssrc := t.SSRC
		if ssrc == 0 {
			ssrc = rand.Uint32() | 1
		}
		var err error
		if tc, err = transcode.New(*t, ssrc); err != nil {
			return fmt.Errorf("transcode %s to %s: %w", t.In.Name, t.Out.Name, err)
		}
	}
	if f.tc != nil {
		f.tc.Close()
		delete(w.tcFlows, f)
	}
	f.tc, f.rtcpDue = tc, 0
	if tc != nil {
		w.tcFlows[f] = struct{}{}
	}
	return nil
}

// pin locks the goroutine to its thread for good, names the thread
// relayd-wN (top -H, ps -L), pins it to the worker's CPU and sets its
// scheduling (Config.Scheduling). The thread ends with the worker: it is never given back to
// the runtime with its CPU, policy and timer slack.
func (w *worker) pin() error {
	runtime.LockOSThread()
	name, _ := unix.BytePtrFromString(fmt.Sprintf("relayd-w%d", w.id))
	if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0); err != nil {
		w.log.Debug("cannot name the worker's thread", zap.Error(err))
	}
	runtime.KeepAlive(name)
	var set unix.CPUSet
	set.Set(w.cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		w.log.Warn("cannot pin worker to its CPU", zap.Error(err))
	}
	if err := applyScheduling(w.sched, w.prio); err != nil {
		return fmt.Errorf("worker %d: %w", w.id, err)
	}
	// Naps end when they should: the default slack (50 us) would add to
	// every coalesced packet's delay.
	if w.coalesce > 0 {
		if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0); err != nil {
			w.log.Warn("cannot set the worker's timer slack", zap.Error(err))
		}
	}
	return nil
}

// run is the worker's packet loop: recvmmsg a batch, relay each packet,
// sendmmsg per family; when the socket is empty, serve what is due and
// wait. It ends when the worker is closed. It runs on a thread of its
// own (see pin), never on the process's main thread.
func (w *worker) run() {
	w.started.Store(true)
	defer close(w.exited)
	runtime.LockOSThread()
	if !onMainThread() {
		w.serve()
		return
	}
	// The process's main thread: its name is the process's (pin would
	// rename relayd), and when a goroutine locked to it ends the runtime
	// parks it for good instead of ending it. Hold it until another
	// goroutine has locked a thread of its own, which cannot be this
	// one, and give it back to the runtime untouched.
	locked, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		runtime.LockOSThread()
		close(locked)
		w.serve()
	}()
	<-locked
	runtime.UnlockOSThread()
	<-ended
}

// onMainThread reports whether the calling goroutine runs on the
// process's main thread; a variable for tests.
var onMainThread = func() bool { return unix.Gettid() == unix.Getpid() }

// serve is run's loop, on the worker's locked thread.
func (w *worker) serve() {
	// No UnlockOSThread: the thread ends with the goroutine (see pin).
	err := w.pin()
	if w.ready != nil {
		w.ready <- err
	}
	if err != nil {
		return
	}
	tid := workerThreadStart()
	defer workerThreadEnd(tid)
	rx := newRxBatch()
	w.tx4 = newTxBatch(w.raw4, false)
	if w.raw6 >= 0 {
		w.tx6 = newTxBatch(w.raw6, true)
	}
	tx4, tx6 := w.tx4, w.tx6
	defer func() {
		for f := range w.tcFlows {
			f.tc.Close()
		}
	}()
	w.pollFDs = make([]unix.PollFd, 2, 2+len(w.xsks))
	w.pollFDs[0] = unix.PollFd{Fd: int32(w.rxFD), Events: unix.POLLIN}
	w.pollFDs[1] = unix.PollFd{Fd: int32(w.wakeFD), Events: unix.POLLIN}
	for _, s := range w.xsks {
		w.pollFDs = append(w.pollFDs, unix.PollFd{Fd: int32(s.fd), Events: unix.POLLIN})
	}
	if len(w.xsks) > 0 {
		w.xb = newXSKBatch()
	}
	got := false   // a packet was read since the last wait or nap
	fresh := false // a packet was read since the last wait (naps between)
	for {
		if w.closed.Load() {
			w.drainCtrl()
			return
		}
		if w.xskSwap != nil {
			w.swapXSK()
		}
		if read, drained := w.relayXSK(tx4, tx6); read {
			got, fresh = true, true
			w.afterBatch()
			if drained {
				w.releaseLocks()
			}
			// The UDP socket (what the XDP program passes) is read
			// every 16th round while the XDP sockets keep the worker
			// busy, and whenever they are empty.
			if w.xskRounds++; w.xskRounds%16 != 0 {
				continue
			}
			if n, _ := rx.recv(w.rxFD); n > 0 {
				if w.pending.Load() {
					w.drainCtrl()
				}
				w.relayBatch(rx, n, tx4, tx6)
				w.afterBatch()
			}
			continue
		}
		n, errno := rx.recv(w.rxFD)
		if n > 0 {
			got, fresh = true, true
			// Requests queued before these packets came (a posted shadow
			// install) are served first.
			if w.pending.Load() {
				w.drainCtrl()
			}
			w.relayBatch(rx, n, tx4, tx6)
			w.afterBatch()
			if n < batchSize && len(w.xsks) == 0 {
				w.releaseLocks() // the read drained the socket
			}
			continue
		}
		switch errno {
		case 0, unix.EAGAIN, unix.EINTR:
		default:
			w.log.Error("receive", zap.Error(errno))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		// The socket is empty: what is due, then a wait for a packet, a
		// control request or the next deadline.
		w.releaseLocks()
		if w.armed != 0 && time.Now().UnixNano() >= w.armed {
			w.armed = 0
			w.drainCtrl()
			w.retryLatched()
			w.timers()
			w.armTimer()
			continue
		}
		if w.polling && !got {
			w.polling = false // a whole nap brought nothing: wait for the socket again
		}
		got = false
		if w.polling {
			w.nap()
		} else {
			w.wait(fresh)
			fresh = false
		}
		if w.pending.Load() {
			w.drainCtrl()
		}
	}
}

// swapXSK replaces the AF_XDP sockets of a re-created device (xskSwap)
// and answers the request: from then on the old sockets are not read, and
// the pool closes them.
func (w *worker) swapXSK() {
	c := w.xskSwap
	w.xskSwap = nil
	w.xsks = append(slices.DeleteFunc(w.xsks, func(s *xskSock) bool { return s.u.ifindex == c.xskOld }), c.xsks...)
	w.pollFDs = w.pollFDs[:2]
	for _, s := range w.xsks {
		w.pollFDs = append(w.pollFDs, unix.PollFd{Fd: int32(s.fd), Events: unix.POLLIN})
	}
	if w.xb == nil && len(w.xsks) > 0 {
		w.xb = newXSKBatch()
	}
	if c.reply != nil {
		c.reply <- ctrlReply{}
	}
}

// relayXSK relays a batch from each XDP socket that holds frames and
// gives the frames back; it reports whether it read any, and whether
// every socket's ring was drained by the read (none filled a batch).
func (w *worker) relayXSK(tx4, tx6 *txBatch) (read, drained bool) {
	drained = true
	for _, s := range w.xsks {
		n, frames, bad := w.xb.recv(s)
		if frames == 0 {
			continue
		}
		read = true
		if frames == batchSize {
			drained = false // more may be queued
		}
		// As for the socket: requests queued before these packets came
		// are served first.
		if w.pending.Load() {
			w.drainCtrl()
		}
		if n > 0 {
			// Counted as read, before they leave: whoever has received
			// one sees it counted.
			w.xskPackets.Add(uint64(n))
			w.relayBatch(w.xb, n, tx4, tx6)
		}
		w.xb.release(s)
		if bad > 0 {
			w.malformed.Add(uint64(bad))
		}
	}
	return read, drained
}

// afterBatch serves, between batches, what the batch or the control plane
// left to do.
func (w *worker) afterBatch() {
	if w.pending.Load() {
		w.drainCtrl()
	}
	if len(w.latchBacklog) > 0 {
		w.retryLatched()
	}
	if w.timer != 0 || w.armed != 0 {
		w.timers()
		w.armTimer()
	}
}

// wait blocks in ppoll until the socket has a packet, the eventfd was
// written (a control request, or close) or the deadline w.armed passes.
// The thread sleeps in the kernel; the Go scheduler hands its P on.
// fresh says packets were read since the last wait: a worker busy for
// longer than idleWait without waiting (reading, napping) is not idle.
func (w *worker) wait(fresh bool) {
	now := time.Now().UnixNano()
	if fresh {
		w.lastData = now
	}
	deadline := w.armed
	if deadline != 0 && deadline <= now {
		return
	}
	// Packets within idleWait: the worker keeps its P while it waits, and
	// the wait ends when idleWait has passed, to give the P back then.
	busy := now-w.lastData <= idleWait
	if busy != w.holding {
		w.holding = busy
		if w.procs != nil {
			d := int32(-1)
			if busy {
				d = 1
			}
			w.procs.add(d)
		}
	}
	wait := ppollIdle
	if busy {
		wait = ppoll
		if idle := w.lastData + idleWait + 1; deadline == 0 || idle < deadline {
			deadline = idle
		}
	}
	var ts *unix.Timespec
	if deadline != 0 {
		w.pollTS = unix.NsecToTimespec(deadline - now)
		ts = &w.pollTS
	}
	if wait(w.pollFDs, ts) != 0 {
		w.interrupts.Add(1)
		return // EINTR: the loop looks again
	}
	if w.pollFDs[1].Revents != 0 {
		unix.Read(w.wakeFD, w.wakeBuf[:]) // resets the counter
	}
	data := w.pollFDs[0].Revents != 0
	for i := 2; i < len(w.pollFDs); i++ {
		data = data || w.pollFDs[i].Revents != 0
	}
	if !data {
		return
	}
	w.wakes.Add(1)
	now = time.Now().UnixNano()
	w.lastData = now
	if w.coalesce > 0 {
		// Two socket wake-ups within a nap: packets come fast enough
		// for naps to gather several per read.
		if now-w.lastWake < w.coalesce {
			w.polling = true
		}
		w.lastWake = now
	}
}

// idleWait is how long a worker waits with ppoll, keeping its P, after
// the last wait that ended with a packet; past it the worker is idle and
// waits with ppollIdle. A worker of an XDP data plane, whose flows are
// all in the kernel, is idle nearly always.
const idleWait = int64(100 * time.Millisecond)

// ppollIdle is ppoll for an idle worker: a blocking system call the Go
// scheduler knows, so that sysmon retakes the P and stops preempting the
// worker (with ppoll, a signal ends the wait every 10-20 ms: 50-100
// wake-ups a second per idle worker, a percent of a CPU for nothing). The
// first packet after an idle spell pays the slow return from the call
// (the P taken back) once.
func ppollIdle(fds []unix.PollFd, ts *unix.Timespec) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)), uintptr(unsafe.Pointer(ts)), 0, 0, 0)
	return e
}

// ppoll waits in the kernel without leaving the Go scheduler: the worker
// keeps its P (the pool raised GOMAXPROCS for that, see procGauge), so neither
// sysmon's retaking of a P in a long system call nor the slow return from
// one runs per wake-up (with unix.Ppoll they cost the process about a
// tenth of its time at 50k packets per second). A signal (the runtime's
// preemption, every 10 ms of a wait) ends the wait with EINTR.
func ppoll(fds []unix.PollFd, ts *unix.Timespec) unix.Errno {
	_, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)), uintptr(unsafe.Pointer(ts)), 0, 0, 0)
	return e
}

// nap sleeps for the coalescing interval (less if a deadline comes
// first) while packets gather in the socket; a control request ends it
// at once. A packet waits at most the nap (plus the time the batch before
// it took), the price of one wake-up per nap instead of one per packet or
// few.
func (w *worker) nap() {
	d := w.coalesce
	if w.armed != 0 {
		d = min(d, w.armed-time.Now().UnixNano())
		if d <= 0 {
			return
		}
	}
	w.naps.Add(1)
	w.pollTS = unix.NsecToTimespec(d)
	w.pollFDs[1] = unix.PollFd{Fd: int32(w.wakeFD), Events: unix.POLLIN}
	if ppoll(w.pollFDs[1:2], &w.pollTS) != 0 {
		return
	}
	if w.pollFDs[1].Revents != 0 {
		unix.Read(w.wakeFD, w.wakeBuf[:])
	}
}

// timers runs the transcoding timers due now and sends what they made.
func (w *worker) timers() {
	if w.timer == 0 {
		return
	}
	var counts [vMax]uint64
	w.runTimers(time.Now().UnixNano(), &counts)
	w.flush(w.tx4, w.tx6)
	for v, c := range counts {
		if c != 0 {
			w.counters[v].Add(c)
		}
	}
}

// retryLatched flushes the latch backlog and, if some remains, has the
// receive time out soon so that an idle worker tries again.
func (w *worker) retryLatched() {
	w.latchWake = 0
	if w.flushLatched() {
		w.latchWake = time.Now().Add(latchRetry).UnixNano()
	}
	w.armTimer()
}

// rxSource is a batch of received packets: the UDP socket's (rxBatch) or
// the XDP sockets' (xskBatch).
type rxSource interface {
	// packet returns packet i: UDP payload, source, the relay address
	// and port it came to, and its receive time (Unix ns; 0 if missing).
	packet(i int) (payload []byte, src, dst netip.AddrPort, ts int64)
}

// rxPacket is a received packet, as relayBatch holds it between its passes.
type rxPacket struct {
	payload  []byte
	src, dst netip.AddrPort
	ts       int64
	f        *flowState // dst's flow, nil: none found yet
}

// relayBatch relays the n packets of rx. It allocates nothing, and
// publishes its counters once per batch.
func (w *worker) relayBatch(rx rxSource, n int, tx4, tx6 *txBatch) {
	var counts [vMax]uint64
	var noFlow uint64
	var delays [len(delayBoundsNS) + 1]uint64
	var delaySum int64
	now := time.Now().UnixNano()
	defer func() {
		for v, c := range counts {
			if c != 0 {
				w.counters[v].Add(c)
			}
		}
		if noFlow != 0 {
			w.noFlow.Add(noFlow)
		}
		for b, c := range delays {
			if c != 0 {
				w.delay[b].Add(c)
			}
		}
		w.delaySum.Add(delaySum)
		w.batches.Add(1)
	}()
	// First the batch's flows, and the loads of their SRTP contexts, all
	// together: a context is rarely in the caches when its flow's next
	// packet comes, and the cipher and the MAC would meet its lines one
	// miss after another (see srtpflow's Prefetch). n is at most
	// batchSize, the receive batches' size.
	n = min(n, len(w.batch))
	for i := range n {
		p := &w.batch[i]
		p.payload, p.src, p.dst, p.ts = rx.packet(i)
		p.f = w.flows[p.dst]
		if f := p.f; f != nil {
			if f.dec != nil {
				f.dec.Prefetch()
			}
			if f.enc != nil {
				f.enc.Prefetch()
			}
		}
	}
	for i := 0; i < n; i++ {
		p := &w.batch[i]
		payload, src, dst, ts := p.payload, p.src, p.dst, p.ts
		if ts != 0 {
			d := max(now-ts, 0)
			delays[delayBucket(d)]++
			delaySum += d
		}
		f := p.f
		p.f = nil // hold no flow past its batch
		if f == nil {
			f = w.flows[dst] // made by an earlier packet's awaken
		}
		if f == nil {
			if f = w.awaken(dst); f == nil {
				noFlow++
				continue
			}
		}
		tx := tx4
		if !f.outIs4() {
			tx = tx6
		}
		if tx == nil {
			counts[vDropNoRoute]++
			continue
		}
		out := tx.next()
		if out == nil {
			w.flush(tx4, tx6)
			out = tx.next()
		}
		if ts == 0 {
			ts = now // no kernel timestamp: the batch's clock read
		}
		if f.flow.Latch {
			ok, res := f.latch(src, ts, w.latchWindow)
			if !ok {
				f.dropped++
				counts[vDropSource]++
				continue
			}
			if res&latchLearned != 0 {
				// Media goes back where it comes from: at once here, and
				// through the control plane in the data plane that carries
				// the reverse flow.
				if f.flow.Reverse.IsValid() {
					if r := w.flows[f.flow.Reverse]; r != nil {
						r.flow.SendTo = f.learned
					} else {
						w.dormantSendTo(f.flow.Reverse, f.learned)
					}
					w.notifyLatched(f.flow.Match, f.learned, false)
				}
			}
			if res&latchLocked != 0 {
				w.holdLock(f, ts)
			} else if f.lockHeld && ts > f.latchUntil+w.latchWindow {
				w.reportLock(f, now)
			}
		}
		// Policed before the work a packet costs (decryption above all),
		// and only what passes the source check: a flood from elsewhere
		// takes none of the flow's rate. Latching flows checked theirs
		// above.
		if f.flow.RateCap.PPS != 0 && f.sourceOK(src) && !f.admit(ts) {
			f.dropped++
			counts[vDropRate]++
			continue
		}
		if w.loops(f.dest(src)) {
			f.dropped++
			counts[vDropLoop]++
			continue
		}
		if f.tc != nil || f.flow.SinkRTCP {
			w.transcodeOne(f, payload, src, ts, &counts)
			continue
		}
		m, to, v := f.process(out, payload, src, ts)
		counts[v]++
		if v == vSend {
			tx.commit(m, to.Addr())
		}
	}
	w.flush(tx4, tx6)
}

// delayBoundsNS are dataplane.DelayBounds in nanoseconds.
var delayBoundsNS = [...]int64{5e3, 10e3, 25e3, 50e3, 100e3, 200e3, 300e3, 500e3, 750e3, 1e6, 2e6, 5e6, 10e6, 50e6}

// delayBucket is the bucket of delayBoundsNS that holds d ns.
func delayBucket(d int64) int {
	for i, b := range delayBoundsNS {
		if d <= b {
			return i
		}
	}
	return len(delayBoundsNS)
}

// WorkerStats implements dataplane.WorkerObserver.
func (p *Pool) WorkerStats() dataplane.WorkerStats {
	var st dataplane.WorkerStats
	for _, w := range p.workers {
		st.Wakeups += w.wakes.Load()
		st.Interrupts += w.interrupts.Load()
		st.Naps += w.naps.Load()
		st.Batches += w.batches.Load()
		st.AFXDP += w.xskPackets.Load()
		st.LockWaits += w.lockWaits.Load()
		for b := range w.delay {
			st.Delay[b] += w.delay[b].Load()
		}
		st.DelaySum += time.Duration(w.delaySum.Load())
	}
	if p.xsk != nil {
		st.AFXDPNoFrame, st.AFXDPRingFull, st.AFXDPFillFrames = p.xsk.dropped.Load(), p.xsk.ringFull.Load(), p.xsk.fillFrames()
	}
	p.mu.Lock()
	st.Flows = slices.Clone(p.count)
	p.mu.Unlock()
	return st
}

// loops reports whether a packet sent to dst would come back into
// relayd: dst is a relay address (the match address of a flow the pool
// carries) or loopback. The control plane never installs such a flow
// (control/destpolicy); this holds if it did, or if the learned source of
// a latching flow is relayd's own: a raw socket's packet to a local
// address is delivered locally, to the same worker, at once, for ever.
func (w *worker) loops(dst netip.AddrPort) bool {
	a := dst.Addr().Unmap()
	return a.IsLoopback() || w.relays.has(a)
}

func (w *worker) flush(txs ...*txBatch) {
	for _, tx := range txs {
		if tx == nil || tx.n == 0 {
			continue
		}
		if _, failed := tx.flush(); failed > 0 {
			w.sendFailed.Add(uint64(failed))
		}
	}
}
