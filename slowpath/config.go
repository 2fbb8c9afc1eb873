package slowpath

import (
	"fmt"
	"net/netip"
	"runtime"
	"time"
)

// Config configures the userspace data plane.
type Config struct {
	// CPUs lists the CPUs to run one worker each on. Empty: Workers
	// workers on CPUs 0..Workers-1, or one per online CPU when Workers is 0.
	CPUs     []int
	Workers  int
	MaxFlows int // default 65536
	// LatchWindow is how long after a latching flow's first packet its
	// source may be learned (media.latch_window); default 3s.
	LatchWindow time.Duration
	// RTCPInterval is the mean interval of the RTCP reports relayd sends
	// on the legs of transcoded streams; default 5s (RFC 3550's minimum).
	RTCPInterval time.Duration
	// Coalesce, if set, lets a busy worker nap this long between reads
	// while its packets gather in the socket, instead of being woken per
	// packet or few: far fewer wake-ups (the dearest part of relaying a
	// packet in userspace at low and medium rates) for at most this much
	// added delay per packet. A worker naps only while packets come faster
	// than one per nap, and waits for the socket again after an empty nap.
	// 0: off.
	Coalesce time.Duration
	// PackFlows, if set, packs flows onto few workers: a new call's flows
	// go to the first worker whose load stays within PackFlows with them
	// (a flow counts 1, a transcoded one TranscodeLoad, an RTCP port's
	// none), and to the least loaded worker once every worker is past it
	// (see flowLoad). Each busy worker pays a wake-up for every burst of
	// packets, the dearest part of relaying in userspace at low and
	// medium rates; a worker carrying a few hundred flows reads many
	// packets per wake-up where two would read half as many each. 0:
	// spread, every call to the least loaded worker.
	PackFlows int
	// IO is how the workers receive: IOSocket (default), their UDP
	// sockets, every packet through the kernel's IP and UDP receive
	// path; or IOAFXDP, an XDP program on Interfaces redirecting the
	// packets of the workers' flows into their AF_XDP sockets (see
	// xsk_linux.go), the UDP sockets taking what it passes.
	IO string
	// Interfaces are where IOAFXDP attaches its XDP program, in
	// generic (skb) mode if XDPGeneric is set, else native.
	Interfaces []string
	XDPGeneric bool
	// ExternalXDP, with IOAFXDP, leaves the interfaces' XDP hook to
	// another program that redirects into the workers' sockets: the XDP
	// data plane's, given the pool's maps (Pool.XSKMaps). The pool
	// opens the sockets on Interfaces and attaches nothing.
	ExternalXDP bool
	// Scheduling is the workers' threads' scheduling policy: "" (as
	// relayd was started), SchedOther, SchedBatch, SchedFIFO or SchedRR.
	// Priority is their nice value (-20 to 19) under "", SchedOther and
	// SchedBatch, and their real-time priority (1 to 99) under SchedFIFO
	// and SchedRR. A worker that cannot take them (no CAP_SYS_NICE nor
	// RLIMIT_NICE or RLIMIT_RTPRIO for them, or systemd's
	// RestrictRealtime=) fails New. See applyScheduling.
	Scheduling string
	Priority   int
	// OnLatched, if set, is called (from one goroutine, in order) when a
	// latching flow learns a source (locked false) and when the window
	// closes and the learned source is locked (locked true).
	OnLatched func(match, source netip.AddrPort, locked bool)
}

// The receive paths of Config.IO.
const (
	IOSocket = "socket"
	IOAFXDP  = "afxdp"
)

// TranscodeLoad is what a transcoded flow counts for in a worker's load
// (Config.PackFlows): decoding and encoding G.729 costs a worker about ten
// times what relaying a plain packet does (some 23 us a packet, on
// average over the two directions, against 2-3 us).
const TranscodeLoad = 10

// MaxCoalesce bounds Config.Coalesce: the delay it adds must stay well
// under what a jitter buffer absorbs.
const MaxCoalesce = 5 * time.Millisecond

func (c *Config) setDefaults() error {
	if c.MaxFlows == 0 {
		c.MaxFlows = 65536
	}
	if c.RTCPInterval == 0 {
		c.RTCPInterval = 5 * time.Second
	}
	if c.LatchWindow == 0 {
		c.LatchWindow = 3 * time.Second
	}
	if len(c.CPUs) == 0 {
		n := c.Workers
		if n == 0 {
			n = runtime.NumCPU()
		}
		for i := range n {
			c.CPUs = append(c.CPUs, i%runtime.NumCPU())
		}
	}
	for _, cpu := range c.CPUs {
		if cpu < 0 || cpu >= runtime.NumCPU() {
			return fmt.Errorf("cpu %d: not online (0-%d)", cpu, runtime.NumCPU()-1)
		}
	}
	if c.Coalesce < 0 || c.Coalesce > MaxCoalesce {
		return fmt.Errorf("coalesce %v: want 0 (off) to %v", c.Coalesce, MaxCoalesce)
	}
	switch c.IO {
	case "":
		c.IO = IOSocket
	case IOSocket:
	case IOAFXDP:
		if len(c.Interfaces) == 0 {
			return fmt.Errorf("io %s: no interfaces to attach to", c.IO)
		}
	default:
		return fmt.Errorf("io %q: want %s or %s", c.IO, IOSocket, IOAFXDP)
	}
	if c.PackFlows < 0 {
		return fmt.Errorf("pack flows %d: want 0 (spread) or more", c.PackFlows)
	}
	if err := checkScheduling(c.Scheduling, c.Priority); err != nil {
		return err
	}
	if len(c.CPUs) > 256 {
		return fmt.Errorf("%d workers: at most 256", len(c.CPUs))
	}
	return nil
}
