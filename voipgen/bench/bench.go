package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

const benchHelp = `usage: voipgen bench [flags]   (as root)

The comparison: relayd's XDP data plane against its userspace workers (and
SRTP terminated on one leg), optionally against Debian's rtpengine, on the
same calls in one run. It builds a lab of network namespaces (caller, relay,
callee), and for each relay in turn:

 1. SIP calls with media (--sip-calls, one phase per count; 0 skips): voipgen call in the caller
    namespace -> relayd's B2BUA (dataplane xdp or userspace) -> voipgen
    answer in the callee namespace, one G.711 20 ms stream both ways per
    call, sent and analysed by voipgen's per-call media: call setup, loss,
    jitter and the largest gap of real calls. (srtp and rtpengine: none.)
 2. The CPU sweep over concurrent calls (--calls). For relayd the calls are
    SIP calls through its B2BUA, placed by voipgen call and answered by
    voipgen answer, signalling only: at each step the calls missing are
    added (INVITE, 200 with SDP, ACK) and all are held to the end (BYE).
    Each call is a G.711 20 ms stream each way (50 pps each, 100 pps per
    call, 172-byte RTP) between the addresses its SDP named, sent by one
    paced sender (sendmmsg from the caller's socket and, for the callee's
    streams, from the callee's socket) and counted by one sink draining
    both sockets. In srtp mode the caller offers SDES
    (AES_CM_128_HMAC_SHA1_80, a key per call) and sends SRTP: relayd
    decrypts toward the callee and encrypts toward the caller.
    --static-flows installs the relayd sweep's media as static flows
    through the admin API instead (one way, as fwdbench does). rtpengine:
    one ng call (offer, answer) per call, the same streams each way. A relay stops at its
    first step with loss, or when the sender cannot offer more.

The sender and the sink are not the Go runtime's: each has a thread of
its own on plain sockets, the sender paced by clock_nanosleep and the sink
waking every millisecond to drain its sockets, so their wakeups are the
same whatever the relay (a receiver woken per packet costs more the more
the relay spreads the packets, and that was billed to the relay).

--sender xdp sends the same packets as whole Ethernet frames through
AF_XDP TX rings on the caller's and callee's veths (one thread, the same
1 ms slots), past the 200-270k pps one sendmmsg core offers; --sink xdp
counts them with an XDP program on the end hosts' veths that drops them
(lab/xdpsink), its work in those veths' NAPI threads (pinned one per CPU,
SCHED_FIFO), measured as the sink's CPU. Each row gives the relay's, the
sender's and the sink's share of one CPU.

Why a baseline, and not SIP calls' own media: the CPU figures need a run
of the same packets without the relay (direct over an extra veth pair),
and voipgen call's media (a socket and goroutine per call, full
analysis) would swamp the relay's cost at thousands of calls on 2 CPUs.

CPU methods (each figure says which one it is): "tasks" is the run time of
every thread involved (voipgen's sender, sink and runtime, relayd or
rtpengine, ksoftirqd/N) from /proc/PID/task/TID/schedstat; on veth, XDP and
socket delivery run in the sending thread's softirq, so they are in it.
"idle" is whole-machine busy time from per-CPU idle in /proc/stat. Both are
taken minus the mean of two direct runs of the same load around the relay's
two runs (direct, relay, relay, direct), per packet sent. CPU % is that cost
times the packet rate over all CPUs of the machine. Calls per GHz: a call is
100 pps, a GHz is the CPU clock from /proc/cpuinfo. Cost per port: the
server price over the calls the whole machine would carry at 100% CPU
(projected from the ns per packet), and over the highest zero-loss call
count measured here.

Modes (--modes): xdp, userspace (workers = one per CPU), srtp (userspace,
SRTP with AES_CM_128_HMAC_SHA1_80 on the caller leg, plain RTP on the
callee leg), transcode (below); --with-rtpengine adds rtpengine (userspace,
--table=-1, one thread per CPU) for the plain modes, and
rtpengine-transcode for transcode. userspace-xsk and srtp-xsk are
userspace and srtp with the workers receiving through AF_XDP
(dataplane.userspace_io = afxdp) whatever --userspace-io says, so that one
run compares both ways in: their ratios to userspace and to rtpengine,
and srtp-xsk's to userspace-xsk, are printed beside the others.
xdp-srtp and xdp-srtp-xsk are srtp in relayd's XDP data plane
(dataplane.mode = xdp), as SRTP calls are relayed in production: the XDP
program hands their packets to the workers through the kernel's receive
path (userspace_io socket) or into the workers' AF_XDP sockets (afxdp).

transcode: G.711 <-> G.729 calls, over ng for both relays (relayd with
userspace workers and its ng listener, and rtpengine), its own sweep
(--transcode-calls). Each call's offer comes from the caller with PCMU and
telephone-event, asking the relay to offer G.729 to the callee and to hide
PCMU from it (codec: mask PCMU, transcode G729); the callee answers G.729
only (annexb=no). The caller sends PCMU 20 ms (a speech-like signal), the
callee real G.729 20 ms (the same signal encoded by bcg729 once at start,
looped). Every packet through the relay must arrive transcoded (PT 18 of
20 bytes to the callee, PT 0 of 160 bytes to the caller): a run with one
that is not fails the bench. bcg729's own cost is timed in-process in the
same run (a call: 100 G.729 frames encoded and 100 decoded per second);
each relay's overhead is its CPU per call (tasks) minus that cost.

Writes bench.json, cpu.png/.svg (CPU % vs concurrent calls per relay) and
nsperpkt.png/.svg (CPU ns per relayed packet) to --out.

flags:
`

// The modes of relayd's userspace workers receiving through AF_XDP
// (dataplane.userspace_io = afxdp), beside userspace and srtp in one run.
const (
	userspaceXSK = "userspace-xsk"
	srtpXSK      = "srtp-xsk"
)

// The modes of SRTP calls through relayd's XDP data plane, which hands
// their packets to the workers: through the kernel's receive path
// (userspace_io socket), or into their AF_XDP sockets (afxdp).
const (
	xdpSRTP    = "xdp-srtp"
	xdpSRTPXSK = "xdp-srtp-xsk"
)

// Config configures voipgen bench.
type Config struct {
	calls []int
	modes []string // xdp | userspace | srtp | userspace-xsk | srtp-xsk | xdp-srtp | xdp-srtp-xsk | transcode
	// transcodeCalls are the transcode sweep's steps.
	transcodeCalls []int
	rtpengine      bool
	static         bool  // relayd sweep media as static flows, not SIP calls
	sipCalls       []int // SIP phase call counts; empty: none
	sipDuration    time.Duration
	step           time.Duration
	repeat         int // steps (direct, relay, relay, direct) per call count
	quietWait      time.Duration
	price          float64
	Out            string
	relayd         string
	// userspaceIO is relayd's dataplane.userspace_io in its userspace,
	// srtp and transcode modes ("" relayd's default, socket).
	userspaceIO string
	// workerSched and workerPrio are relayd's
	// dataplane.worker_scheduling and worker_priority, and rtpengine's
	// --scheduling and --priority ("": each one's default).
	workerSched string
	workerPrio  int
	// voipgen is the binary of the SIP phase's user agents.
	voipgen  string
	JSON     bool
	Progress io.Writer
	// sender and sink are the sweep's traffic ends: benchEndMmsg (a
	// socket, sendmmsg / recvmmsg) or benchEndXDP (an AF_XDP TX socket
	// per veth / the XDP sink on the end hosts' veths).
	sender, sink string
}

// The sweep's sender and sink kinds (--sender, --sink).
const (
	benchEndMmsg = "mmsg"
	benchEndXDP  = "xdp"
)

// How the sweep's media is set up, per row.
const (
	benchMediaStatic = "static flows (admin API)"
	benchMediaSIP    = "SIP calls via relayd's B2BUA, both ways"
	benchMediaNG     = "ng calls (offer/answer), a stream each way"
	// benchMediaNGTranscode: the transcode mode's calls, for both relays.
	benchMediaNGTranscode = "ng calls (offer/answer), PCMU caller leg, G.729 callee leg, transcoded"
)

const (
	benchPPSPerCall = 100 // two flows of 50 pps
	// benchMaxCalls is what relayd's media ports in the SIP sweep hold
	// (benchSIPRelayPorts, four ports a call: RTP and RTCP on each leg)
	// and what the far prefix's addresses number (farPrefix, one a call).
	benchMaxCalls = 13000
	// benchMaxStaticCalls: static flows take one port each of relayd's
	// default range 30000-39999, two a call.
	benchMaxStaticCalls = fwdMaxFlows / 2
	defaultBenchCall    = "250,500,1000,2000,4000,5000"
)

func Parse(args []string, out io.Writer) (Config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, benchHelp); fs.PrintDefaults() }
	calls := fs.String("calls", defaultBenchCall, "concurrent calls per step, comma-separated (k suffix; at most 13000: relayd's lab port range, 5000 with --static-flows)")
	modes := fs.String("modes", "xdp,userspace,srtp", "relayd modes: xdp, userspace, srtp, userspace-xsk, srtp-xsk, xdp-srtp, xdp-srtp-xsk, transcode")
	tcalls := fs.String("transcode-calls", defaultTranscodeCalls, "concurrent calls per step of the transcode sweep, comma-separated")
	rtpe := fs.Bool("with-rtpengine", false, "also measure Debian's rtpengine (userspace) in the same run")
	static := fs.Bool("static-flows", false, "set the sweep's media up as static flows through relayd's admin API, not as SIP calls")
	sipCalls := fs.String("sip-calls", "200", "SIP calls with media per relayd mode, comma-separated counts, each a phase (0: none)")
	sipDur := fs.Duration("sip-duration", 4*time.Second, "duration of each SIP call")
	step := fs.Duration("step", time.Second, "duration of each measured run (4 runs per step)")
	repeat := fs.Int("repeat", 1, "steps per call count; the row takes the median relay cost of their runs (a shared machine's noise)")
	quiet := fs.Duration("quiet-wait", 30*time.Second, "the most time to wait in all for other processes to leave the CPUs (0: never)")
	price := fs.Float64("server-price", 2000, "server price in USD, for the cost per port")
	outDir := fs.String("out", "bench-out", "directory for bench.json and the plots")
	relayd := fs.String("relayd", "", "relayd binary (default: relayd next to voipgen, else go build)")
	voipgen := fs.String("voipgen", "", "voipgen binary for the SIP phase's voipgen call and answer (default: this program, else go build)")
	js := fs.Bool("json", false, "print the report as JSON")
	sender := fs.String("sender", benchEndMmsg, "the sweep's sender: mmsg (sendmmsg on a socket in each end namespace) or xdp (AF_XDP TX sockets on the end hosts' veths)")
	sink := fs.String("sink", benchEndMmsg, "the sweep's sink: mmsg (recvmmsg on the end sockets) or xdp (an XDP program counting and dropping on the end hosts' veths)")
	uio := fs.String("userspace-io", "socket", "how relayd's userspace workers receive in modes userspace, srtp and transcode: socket or afxdp (dataplane.userspace_io)")
	sched := fs.String("worker-scheduling", "", "the scheduling policy of relayd's userspace workers (dataplane.worker_scheduling) and of rtpengine's (--scheduling): other, batch, fifo or rr; default: as started")
	prio := fs.Int("worker-priority", 0, "with --worker-scheduling: their nice value (other, batch) or real-time priority (fifo, rr; 1-99)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	switch *sched {
	case "", "other", "batch":
		if *prio < -20 || *prio > 19 {
			return Config{}, fmt.Errorf("--worker-priority %d: a nice value (-20 to 19) with --worker-scheduling %q", *prio, *sched)
		}
	case "fifo", "rr":
		if *prio < 1 || *prio > 99 {
			return Config{}, fmt.Errorf("--worker-priority %d: a real-time priority (1 to 99) with --worker-scheduling %s", *prio, *sched)
		}
	default:
		return Config{}, fmt.Errorf("--worker-scheduling %q: want other, batch, fifo or rr", *sched)
	}
	if *sched == "" && *prio != 0 {
		return Config{}, fmt.Errorf("--worker-priority without --worker-scheduling")
	}
	if *uio != "socket" && *uio != "afxdp" {
		return Config{}, fmt.Errorf("--userspace-io %q: want socket or afxdp", *uio)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	c := Config{rtpengine: *rtpe, static: *static, sipDuration: *sipDur, step: *step, repeat: *repeat, quietWait: max(0, *quiet),
		price: *price, Out: *outDir, relayd: *relayd, voipgen: *voipgen, JSON: *js, sender: *sender, sink: *sink, userspaceIO: *uio,
		workerSched: *sched, workerPrio: *prio}
	var err error
	maxCalls := benchMaxCalls
	if c.static {
		maxCalls = benchMaxStaticCalls
	}
	if c.calls, err = parseCounts("--calls", *calls, 1, maxCalls); err != nil {
		return c, err
	}
	slices.Sort(c.calls)
	c.calls = slices.Compact(c.calls)
	if c.transcodeCalls, err = parseCounts("--transcode-calls", *tcalls, 1, benchMaxStaticCalls); err != nil {
		return c, err
	}
	slices.Sort(c.transcodeCalls)
	c.transcodeCalls = slices.Compact(c.transcodeCalls)
	if strings.TrimSpace(*sipCalls) != "0" {
		if c.sipCalls, err = parseCounts("--sip-calls", *sipCalls, 1, 5000); err != nil {
			return c, err
		}
	}
	for _, m := range strings.Split(*modes, ",") {
		m = strings.TrimSpace(strings.ToLower(m))
		switch m {
		case "xdp", "userspace", "srtp", userspaceXSK, srtpXSK, xdpSRTP, xdpSRTPXSK, transcodeRelayd:
			if !slices.Contains(c.modes, m) {
				c.modes = append(c.modes, m)
			}
		default:
			return c, fmt.Errorf("--modes: unknown mode %q (want xdp, userspace, srtp, userspace-xsk, srtp-xsk, xdp-srtp, xdp-srtp-xsk, transcode)", m)
		}
	}
	for _, e := range []struct{ flag, v string }{{"--sender", c.sender}, {"--sink", c.sink}} {
		if e.v != benchEndMmsg && e.v != benchEndXDP {
			return c, fmt.Errorf("%s %q: want mmsg or xdp", e.flag, e.v)
		}
	}
	if (c.sender == benchEndXDP || c.sink == benchEndXDP) && slices.Contains(c.modes, transcodeRelayd) {
		// The transcode runs count by the relay's source port and check
		// every packet's format: the socket sink's work.
		return c, errors.New("--sender xdp and --sink xdp do not run the transcode mode")
	}
	switch {
	case c.step < 200*time.Millisecond:
		return c, fmt.Errorf("--step %v: need at least 200ms", c.step)
	case c.repeat < 1 || c.repeat > 20:
		return c, fmt.Errorf("--repeat %d: want 1-20", c.repeat)
	case c.sipDuration < time.Second:
		return c, fmt.Errorf("--sip-duration %v: need at least 1s", c.sipDuration)
	case c.price <= 0:
		return c, errors.New("--server-price must be positive")
	case c.Out == "":
		return c, errors.New("--out must name a directory")
	}
	return c, nil
}

// benchRow is one call count of the sweep for one relay: the relay runs of
// its steps (each direct, relay, relay, direct; --repeat steps) together.
type benchRow struct {
	Relay string `json:"relay"` // xdp | userspace | srtp | rtpengine
	Calls int    `json:"calls"`
	// Media is "static flows (admin API)" or "ng calls (offer/answer)":
	// how the sweep's media was set up (see the help).
	Media      string  `json:"media"`
	Flows      int     `json:"flows"`
	OfferedPPS int     `json:"offered_pps"`
	SentPPS    float64 `json:"sent_pps"`
	Sent       uint64  `json:"sent"`
	Received   uint64  `json:"received"`
	// Relayed is relayd's counter of packets forwarded in the two runs;
	// -1 for rtpengine (no such counter read).
	Relayed int64 `json:"relayed"`
	// RelayedUserspace is the part of Relayed forwarded by relayd's
	// userspace workers: in xdp mode, packets XDP did not forward; -1
	// for rtpengine.
	RelayedUserspace int64   `json:"relayed_userspace"`
	Lost             int64   `json:"lost"`
	LossPct          float64 `json:"loss_pct"`
	// SenderLimited: the sender fell short of the offered rate.
	SenderLimited bool `json:"sender_limited"`
	// Comparable: the relay runs and their direct runs carried the same
	// load, so the CPU figures below mean something.
	Comparable bool `json:"comparable"`
	// Relay CPU per packet sent, minus the direct baseline, median over
	// the relay runs: tasks (schedstat) and idle (/proc/stat).
	TaskNsPerPkt float64 `json:"task_ns_per_pkt"`
	IdleNsPerPkt float64 `json:"idle_ns_per_pkt"`
	// RelaydNsPerPkt is the part of TaskNsPerPkt in relayd's own threads
	// (its process's schedstat, the same difference of runs): what is
	// relayd's alone, without the kernel's work in the sender's and the
	// sink's threads or voipgen's other threads. Zero for other relays.
	RelaydNsPerPkt float64 `json:"relayd_ns_per_pkt,omitempty"`
	// CPU %: of all the machine's CPUs, at the step's sent rate.
	TaskCPUPct float64 `json:"task_cpu_pct"`
	IdleCPUPct float64 `json:"idle_cpu_pct"`
	// ProgNsPerRun: XDP program run time per packet (BPF stats), xdp only.
	ProgNsPerRun float64 `json:"prog_ns_per_run,omitempty"`
	// Shares of one CPU (1 = a whole CPU) at the step's rate: the relay's
	// (tasks ns/pkt x sent pps), and the sender's and the sink's threads'
	// (CPU time / elapsed) in the step's direct runs, where neither runs
	// relay work in its softirq, and in the relay runs (where the
	// sender's includes the XDP relay's work on veth). The sink's is its
	// recvmmsg threads, or with the XDP sink the end veths' NAPI threads
	// that run it.
	RelayCPU          float64 `json:"relay_cpu_share"`
	SenderCPU         float64 `json:"sender_cpu_share"`
	SinkCPU           float64 `json:"sink_cpu_share"`
	SenderCPURelayRun float64 `json:"sender_cpu_share_relay_runs"`
	SinkCPURelayRun   float64 `json:"sink_cpu_share_relay_runs"`
	// Rerun: the step's runs disagreed and it was run again (this row is
	// the second attempt).
	Rerun bool `json:"rerun,omitempty"`
	// Transcode rows: the relay runs' packets that arrived transcoded,
	// G.729 (PT 18, 20 bytes) at the callee and PCMU (PT 0, 160 bytes) at
	// the caller. Every packet received was (or the bench failed).
	TranscodedToCallee uint64 `json:"transcoded_to_callee,omitempty"`
	TranscodedToCaller uint64 `json:"transcoded_to_caller,omitempty"`
	// WorkerDelayP50US is the largest of the relay runs' median delay
	// added by relayd's userspace workers (0: no worker saw the packets).
	// WorkerBehind: in a relay run the median packet waited longer than a
	// packet time (20 ms) or past the histogram's last bound: the workers
	// were not keeping up, lost packets or not (a queue that grows for 2 s
	// loses nothing yet).
	WorkerDelayP50US float64 `json:"worker_delay_p50_us,omitempty"`
	WorkerBehind     bool    `json:"worker_behind,omitempty"`
}

// behindDelayUS is the median worker delay past which the workers are
// behind: one packet time.
const behindDelayUS = 20000

func (r benchRow) lossless() bool { return r.Sent > 0 && r.Lost <= 0 }

// benchSIP is the SIP phase of one relayd mode.
type benchSIP struct {
	Relay     string  `json:"relay"`
	Media     string  `json:"media"` // "SIP calls via relayd's B2BUA"
	Calls     int     `json:"calls"`
	Succeeded int     `json:"succeeded"`
	Failed    int     `json:"failed"`
	DurationS float64 `json:"call_duration_s"`
	T200P50Ms float64 `json:"t200_p50_ms"`
	T200MaxMs float64 `json:"t200_max_ms"`
	// Media both ways, over the two ends' reports.
	WithMedia   int     `json:"calls_with_media_both_ways"`
	SentPackets uint64  `json:"sent_packets"`
	RecvPackets uint64  `json:"received_packets"`
	Lost        int64   `json:"lost"`
	JitterP50Ms float64 `json:"jitter_p50_ms"`
	JitterP99Ms float64 `json:"jitter_p99_ms"`
	JitterMaxMs float64 `json:"jitter_max_ms"`
	MaxGapMs    float64 `json:"max_gap_ms"`
	// Relayed is relayd's packets forwarded over the phase.
	Relayed int64  `json:"relayed"`
	Error   string `json:"error,omitempty"`
	// Direct is the same calls placed caller -> answerer over a veth
	// pair, no relay: what the user agents and the lab make of the
	// media by themselves. Nil when it did not run.
	Direct *benchSIPMedia `json:"direct,omitempty"`
}

// benchSIPMedia is one run of a SIP phase's calls, over both ends'
// reports.
type benchSIPMedia struct {
	Succeeded   int     `json:"succeeded"`
	WithMedia   int     `json:"calls_with_media_both_ways"`
	SentPackets uint64  `json:"sent_packets"`
	RecvPackets uint64  `json:"received_packets"`
	Lost        int64   `json:"lost"`
	JitterP50Ms float64 `json:"jitter_p50_ms"`
	JitterP99Ms float64 `json:"jitter_p99_ms"`
	JitterMaxMs float64 `json:"jitter_max_ms"`
	MaxGapMs    float64 `json:"max_gap_ms"`
	Error       string  `json:"error,omitempty"`
}

// goalJitterP99OverDirectMs is how much receiver jitter (p99 over the
// calls' streams) the relay may add to a direct run of the same calls.
const goalJitterP99OverDirectMs = 0.5

// mediaShown reports whether the phase's jitter and largest gap describe
// the relay: a direct run of the same calls came up whole beside it, so a
// reader can tell what the relay adds to what the lab makes by itself.
func (s benchSIP) mediaShown() bool {
	d := s.Direct
	return d != nil && d.Error == "" && d.Succeeded == s.Calls && d.WithMedia == s.Calls
}

// benchSummary is one relay's figures over the sweep.
type benchSummary struct {
	Relay string `json:"relay"`
	// MaxZeroLossCalls is the highest step without loss whose load the
	// sender offered in full and whose workers kept up (0: none).
	MaxZeroLossCalls int `json:"max_zero_loss_calls"`
	// FirstLossCalls is the first step with loss (0: none).
	FirstLossCalls int `json:"first_loss_calls,omitempty"`
	// Median over the comparable lossless steps, per method.
	TaskNsPerPkt float64 `json:"task_ns_per_pkt"`
	IdleNsPerPkt float64 `json:"idle_ns_per_pkt"`
	Steps        int     `json:"comparable_steps"`
	// CallsPerGHz from the tasks figure (100 pps per call).
	CallsPerGHz float64 `json:"calls_per_ghz_tasks"`
	// ProjectedCalls: the whole machine at 100% (tasks figure).
	ProjectedCalls float64 `json:"projected_calls_tasks"`
	// Cost per port: price / projected calls, price / measured max.
	CostPerPortProjected float64 `json:"cost_per_port_projected_usd"`
	CostPerPortMeasured  float64 `json:"cost_per_port_measured_usd,omitempty"`
	ProgNsPerRun         float64 `json:"prog_ns_per_run,omitempty"`
	// ProgCallsPerGHz is a projection for a physical NIC, where veth's
	// copy into an XDP buffer is not paid: calls per GHz from the XDP
	// program's own run time per packet (BPF stats), xdp only.
	ProgCallsPerGHz float64 `json:"projected_nic_calls_per_ghz_prog,omitempty"`
}

// benchRatio compares two relays' CPU per packet, same run.
type benchRatio struct {
	What string  `json:"what"`
	Task float64 `json:"tasks"`
	Idle float64 `json:"idle"`
	// Steps are the call counts both relays completed (lossless,
	// comparable), over which Task and Idle are taken, each with its own
	// tasks ratio.
	Steps []benchStepRatio `json:"steps,omitempty"`
}

// benchStepRatio is one call count's tasks ratio.
type benchStepRatio struct {
	Calls int     `json:"calls"`
	Task  float64 `json:"tasks"`
}

type Report struct {
	Config    map[string]any `json:"config"`
	SIP       []benchSIP     `json:"sip"`
	Rows      []benchRow     `json:"rows"`
	Summaries []benchSummary `json:"summaries"`
	Ratios    []benchRatio   `json:"ratios"`
	// Transcode is the transcode mode's comparison (nil without it).
	Transcode *benchTranscodeReport `json:"transcode,omitempty"`
	Notes     []string              `json:"notes,omitempty"`
	Plots     []string              `json:"plots,omitempty"`
	// Runs are every measured run of the sweep (fwdbench's records).
	Runs []fwdStep `json:"runs,omitempty"`
}

// thpMode returns the selected mode of a transparent huge page setting
// as /sys/kernel/mm/transparent_hugepage/enabled shows it ("always
// [madvise] never" is "madvise"), or "" when none is selected.
func thpMode(b []byte) string {
	for _, f := range strings.Fields(string(b)) {
		if len(f) > 2 && f[0] == '[' && f[len(f)-1] == ']' {
			return f[1 : len(f)-1]
		}
	}
	return ""
}

// cpuGHz reads the mean CPU clock from /proc/cpuinfo ("cpu MHz").
func cpuGHz(r io.Reader) float64 {
	sc := bufio.NewScanner(r)
	var sum float64
	n := 0
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && f > 0 {
			sum += f
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n) / 1000
}

// summarizeBench fills the per-relay summaries and the ratios.
func summarizeBench(rep *Report, relays []string, ghz float64, cpus int, price float64) {
	rep.Summaries, rep.Ratios = nil, nil
	byRelay := map[string]benchSummary{}
	for _, name := range relays {
		s := benchSummary{Relay: name}
		var task, idle, prog []float64
		for _, r := range rep.Rows {
			if r.Relay != name {
				continue
			}
			// A step whose sender fell short did not offer its calls,
			// and one whose workers were behind was not carried.
			if r.lossless() && !r.SenderLimited && !r.WorkerBehind && s.FirstLossCalls == 0 {
				s.MaxZeroLossCalls = max(s.MaxZeroLossCalls, r.Calls)
			}
			if !r.lossless() && s.FirstLossCalls == 0 {
				s.FirstLossCalls = r.Calls
			}
			if r.lossless() && r.Comparable {
				task, idle = append(task, r.TaskNsPerPkt), append(idle, r.IdleNsPerPkt)
				if r.ProgNsPerRun > 0 {
					prog = append(prog, r.ProgNsPerRun)
				}
			}
		}
		s.Steps = len(task)
		s.TaskNsPerPkt, s.IdleNsPerPkt, s.ProgNsPerRun = finite(median(task)), finite(median(idle)), finite(median(prog))
		if s.TaskNsPerPkt > 0 && ghz > 0 {
			s.CallsPerGHz = 1e9 / (s.TaskNsPerPkt * benchPPSPerCall) / ghz
			s.ProjectedCalls = s.CallsPerGHz * ghz * float64(cpus)
			s.CostPerPortProjected = price / s.ProjectedCalls
		}
		if s.ProgNsPerRun > 0 && ghz > 0 {
			s.ProgCallsPerGHz = 1e9 / (s.ProgNsPerRun * benchPPSPerCall) / ghz
		}
		if s.MaxZeroLossCalls > 0 {
			s.CostPerPortMeasured = price / float64(s.MaxZeroLossCalls)
		}
		rep.Summaries = append(rep.Summaries, s)
		byRelay[name] = s
	}
	for _, p := range [][2]string{{"xdp", "userspace"}, {"srtp", "userspace"}, {"userspace", "rtpengine"}, {"xdp", "rtpengine"},
		{userspaceXSK, "userspace"}, {userspaceXSK, "rtpengine"}, {srtpXSK, userspaceXSK}, {srtpXSK, "srtp"},
		{xdpSRTPXSK, xdpSRTP}, {xdpSRTP, "srtp"}, {xdpSRTPXSK, srtpXSK},
		{transcodeRelayd, transcodeRtpengine}} {
		if _, ok := byRelay[p[0]]; !ok {
			continue
		}
		if _, ok := byRelay[p[1]]; !ok {
			continue
		}
		// Over the steps both completed: medians over different steps
		// would compare different loads.
		pairs := commonSteps(rep.Rows, p[0], p[1])
		if len(pairs) == 0 {
			continue
		}
		ta, tb, steps := medianPair(pairs, func(r benchRow) float64 { return r.TaskNsPerPkt })
		r := benchRatio{What: p[0] + " / " + p[1] + " (CPU per packet)", Task: ta / tb, Steps: steps}
		if ia, ib, _ := medianPair(pairs, func(r benchRow) float64 { return r.IdleNsPerPkt }); ia > 0 && ib > 0 {
			r.Idle = ia / ib
		}
		rep.Ratios = append(rep.Ratios, r)
		// Both relayd's workers: the ratio over relayd's own threads beside
		// it. The tasks figures also hold the kernel's work in the sender's
		// and the sink's threads and voipgen's other threads, the same in
		// both modes but for their noise, which at a light step can be as
		// large as SRTP's cost. (In xdp mode relayd's threads relay nothing.)
		own := func(r benchRow) float64 { return r.RelaydNsPerPkt }
		if (p == [2]string{"srtp", "userspace"} || p == [2]string{srtpXSK, userspaceXSK}) && !slices.ContainsFunc(pairs, func(pr [2]benchRow) bool { return own(pr[0]) <= 0 || own(pr[1]) <= 0 }) {
			oa, ob, steps := medianPair(pairs, own)
			rep.Ratios = append(rep.Ratios, benchRatio{What: p[0] + " / " + p[1] + " (relayd's threads)", Task: oa / ob, Steps: steps})
		}
	}
}

// medianPair returns the medians of val over the pairs' first and second
// rows, and each pair's ratio of the two.
func medianPair(pairs [][2]benchRow, val func(benchRow) float64) (a, b float64, steps []benchStepRatio) {
	va, vb := make([]float64, len(pairs)), make([]float64, len(pairs))
	steps = make([]benchStepRatio, len(pairs))
	for i, pr := range pairs {
		va[i], vb[i] = val(pr[0]), val(pr[1])
		steps[i] = benchStepRatio{Calls: pr[0].Calls, Task: va[i] / vb[i]}
	}
	return median(va), median(vb), steps
}

// commonSteps pairs relay a's rows with relay b's of the same call count,
// for the counts both carried without loss and measured (comparable, with
// a CPU figure), in a's order.
func commonSteps(rows []benchRow, a, b string) [][2]benchRow {
	carried := func(r benchRow) bool { return r.lossless() && r.Comparable && r.TaskNsPerPkt > 0 }
	rowsB := map[int]benchRow{}
	for _, r := range rows {
		if r.Relay == b && carried(r) {
			rowsB[r.Calls] = r
		}
	}
	var pairs [][2]benchRow
	for _, ra := range rows {
		if rb, ok := rowsB[ra.Calls]; ok && ra.Relay == a && carried(ra) {
			pairs = append(pairs, [2]benchRow{ra, rb})
		}
	}
	return pairs
}

// benchRowFromRuns folds a call count's runs (one or more steps of direct,
// relay, relay, direct) into a row: packets summed, relay costs the median
// over the relay runs.
func benchRowFromRuns(relay, media string, calls int, runs []fwdStep, cpus int) benchRow {
	row := benchRow{Relay: relay, Calls: calls, Media: media, Flows: 2 * calls, OfferedPPS: benchPPSPerCall * calls, Comparable: true}
	var task, idle, pps, prog, own []float64
	var sndD, sinkD, sndR, sinkR []float64
	relayed, userspace := int64(0), int64(0)
	for i := range runs {
		r := &runs[i]
		snd, sink := r.share("sender"), r.share("sink")+r.share("napi")
		if r.Mode == "direct" {
			sndD, sinkD = append(sndD, snd), append(sinkD, sink)
			continue
		}
		sndR, sinkR = append(sndR, snd), append(sinkR, sink)
		row.Sent += r.Sent
		row.Received += r.Received
		row.Lost += r.Lost
		pps = append(pps, r.SentPPS)
		row.SenderLimited = row.SenderLimited || r.SenderLimited
		row.Comparable = row.Comparable && r.Comparable
		if r.Relayed < 0 {
			relayed = -1
		} else if relayed >= 0 {
			relayed += r.Relayed
		}
		if r.RelayedUserspace < 0 {
			userspace = -1
		} else if userspace >= 0 {
			userspace += r.RelayedUserspace
		}
		if r.RelayTaskNsPerPkt != nil {
			task = append(task, *r.RelayTaskNsPerPkt)
		}
		if r.RelayBusyNsPerPkt != nil {
			idle = append(idle, *r.RelayBusyNsPerPkt)
		}
		if r.ProgNsPerRun != nil {
			prog = append(prog, *r.ProgNsPerRun)
		}
		if v, ok := r.RelayLabelNsPkt["relayd"]; ok {
			own = append(own, v)
		}
		row.TranscodedToCallee += r.TranscodedToCallee
		row.TranscodedToCaller += r.TranscodedToCaller
		if d := r.WorkerDelay; d != nil {
			row.WorkerDelayP50US = max(row.WorkerDelayP50US, d.P50US)
			row.WorkerBehind = row.WorkerBehind || d.P50Over || d.P50US > behindDelayUS
		}
	}
	row.Relayed, row.RelayedUserspace = relayed, userspace
	row.SentPPS = mean(pps)
	if row.Sent > 0 {
		row.LossPct = 100 * float64(row.Lost) / float64(row.Sent)
	}
	row.TaskNsPerPkt, row.IdleNsPerPkt, row.ProgNsPerRun = finite(median(task)), finite(median(idle)), finite(median(prog))
	row.RelaydNsPerPkt = finite(median(own))
	if len(task) == 0 {
		row.Comparable = false
	}
	row.RelayCPU = row.TaskNsPerPkt * row.SentPPS / 1e9
	row.SenderCPU, row.SinkCPU, row.SenderCPURelayRun, row.SinkCPURelayRun = mean(sndD), mean(sinkD), mean(sndR), mean(sinkR)
	if cpus > 0 {
		row.TaskCPUPct = 100 * row.TaskNsPerPkt * row.SentPPS / 1e9 / float64(cpus)
		row.IdleCPUPct = 100 * row.IdleNsPerPkt * row.SentPPS / 1e9 / float64(cpus)
	}
	return row
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// writeSIP writes the SIP phases: each beside the direct run of the same
// calls, its jitter and largest gap only when that run came up whole.
func (rep *Report) writeSIP(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "SIP calls with media through relayd's B2BUA (caller -> relayd -> answerer), G.711 20 ms both ways,")
	fmt.Fprintln(w, "and the same calls direct (caller -> answerer over a veth pair, no relay); voipgen call and voipgen answer run as processes of their own:")
	fmt.Fprintln(tw, "relay\tcalls\tok\tfailed\tsetup p50 ms\tsent\treceived\tlost\tjitter p50/p99/max ms\tmax gap ms\trelayd relayed\t"+
		"direct ok\tdirect lost\tdirect jitter p50/p99/max ms\tdirect max gap ms\t")
	for _, s := range rep.SIP {
		jitter, gap := "-", "-"
		if s.mediaShown() {
			jitter, gap = fmt.Sprintf("%.2f/%.2f/%.2f", s.JitterP50Ms, s.JitterP99Ms, s.JitterMaxMs), fmt.Sprintf("%.1f", s.MaxGapMs)
		}
		dok, dlost, djitter, dgap := "-", "-", "-", "-"
		if d := s.Direct; d != nil {
			dok, dlost = strconv.Itoa(d.Succeeded), strconv.FormatInt(d.Lost, 10)
			djitter, dgap = fmt.Sprintf("%.2f/%.2f/%.2f", d.JitterP50Ms, d.JitterP99Ms, d.JitterMaxMs), fmt.Sprintf("%.1f", d.MaxGapMs)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.1f\t%d\t%d\t%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t\n", s.Relay, s.Calls, s.Succeeded, s.Failed,
			s.T200P50Ms, s.SentPackets, s.RecvPackets, s.Lost, jitter, gap, s.Relayed, dok, dlost, djitter, dgap)
	}
	tw.Flush()
	for _, s := range rep.SIP {
		if s.Error != "" {
			fmt.Fprintf(w, "  %s: %s\n", s.Relay, s.Error)
		}
		switch d := s.Direct; {
		case s.mediaShown():
			fmt.Fprintf(w, "  %s %d calls: receiver jitter p99 %.2f ms, %+.2f ms against the direct run (goal: within %.1f ms)\n",
				s.Relay, s.Calls, s.JitterP99Ms, s.JitterP99Ms-d.JitterP99Ms, goalJitterP99OverDirectMs)
		case d == nil:
			fmt.Fprintf(w, "  %s %d calls: no direct run of the same calls: jitter and gap not shown\n", s.Relay, s.Calls)
		case !s.mediaShown():
			fmt.Fprintf(w, "  %s %d calls: the direct run did not bring all calls up with media (%d of %d) %s: jitter and gap not shown\n",
				s.Relay, s.Calls, d.WithMedia, s.Calls, d.Error)
		}
	}
	fmt.Fprintln(w)
}

func (rep *Report) WriteText(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if len(rep.SIP) > 0 {
		rep.writeSIP(w)
	}
	fmt.Fprintln(w, "CPU sweep (relay cost = runs through the relay minus direct runs of the same packets; tasks = schedstat, idle = /proc/stat,")
	fmt.Fprintln(w, "<0 where the machine's other work varied more than the relay cost):")
	fmt.Fprintln(w, "media: sip = SIP calls through relayd's B2BUA, a stream each way per call; ng = rtpengine ng calls (offer/answer), a stream each way per call; static = static flows (admin API), one way;")
	fmt.Fprintln(w, "       ng-xc = ng calls (both relays) with a PCMU caller leg and a G.729 callee leg, every packet checked transcoded")
	fmt.Fprintln(w, "       relay/sender/sink CPU: share of one CPU (1.00 = a whole CPU) at the step's rate: the relay's cost (tasks); the sender's and the sink's threads in the direct runs,"+
		" and the sink's in the relay runs")
	fmt.Fprintln(tw, "relay\tcalls\tmedia\tpps\tsent\treceived\trelayed\tloss %\tCPU % tasks\tCPU % idle\tns/pkt tasks\tns/pkt idle\trelay CPU\tsender CPU\tsink CPU\tsink CPU relay runs\tnote\t")
	for _, r := range rep.Rows {
		rel := "-"
		if r.Relayed >= 0 {
			rel = strconv.FormatInt(r.Relayed, 10)
		}
		var notes []string
		if r.SenderLimited {
			notes = append(notes, "sender short")
		} else if !r.Comparable {
			notes = append(notes, "not comparable")
		}
		if r.Rerun {
			notes = append(notes, "rerun")
		}
		if r.Relay == "xdp" && r.RelayedUserspace > 0 {
			notes = append(notes, fmt.Sprintf("%d by userspace", r.RelayedUserspace))
		}
		media := map[string]string{benchMediaNG: "ng", benchMediaSIP: "sip", benchMediaNGTranscode: "ng-xc"}[r.Media]
		if media == "" {
			media = "static"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f\t%d\t%d\t%s\t%.3f\t%.1f\t%s\t%.0f\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t\n", r.Relay, r.Calls, media, r.SentPPS, r.Sent, r.Received, rel,
			r.LossPct, r.TaskCPUPct, fmtIdle(r.IdleCPUPct, "%.1f"), r.TaskNsPerPkt, fmtIdle(r.IdleNsPerPkt, "%.0f"), r.RelayCPU, r.SenderCPU, r.SinkCPU, r.SinkCPURelayRun, strings.Join(notes, ", "))
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Per relay (medians over comparable zero-loss steps; %v GHz, %v CPUs; server price %v USD):\n",
		rep.Config["cpu_ghz"], rep.Config["cpus"], rep.Config["server_price_usd"])
	fmt.Fprintln(tw, "relay\tns/pkt tasks\tns/pkt idle\tcalls/GHz (tasks)\tprojected calls at 100%\tmax zero-loss calls\tUSD/port projected\tUSD/port measured\tXDP program ns\t")
	for _, s := range rep.Summaries {
		prog := "-"
		if s.ProgNsPerRun > 0 {
			prog = fmt.Sprintf("%.0f", s.ProgNsPerRun)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.0f\t%.0f\t%d\t%.3f\t%.3f\t%s\t\n", s.Relay, s.TaskNsPerPkt, fmtIdle(s.IdleNsPerPkt, "%.0f"), s.CallsPerGHz, s.ProjectedCalls,
			s.MaxZeroLossCalls, s.CostPerPortProjected, s.CostPerPortMeasured, prog)
	}
	tw.Flush()
	for _, s := range rep.Summaries {
		if s.ProgCallsPerGHz > 0 {
			fmt.Fprintf(w, "projection, not a measurement: %s on a physical NIC (no veth copy), from the XDP program's own %.0f ns per packet (BPF stats): %.0f calls per GHz\n",
				s.Relay, s.ProgNsPerRun, s.ProgCallsPerGHz)
		}
	}
	if len(rep.Ratios) > 0 {
		fmt.Fprintln(w, "\nRatios, same run:")
		for _, r := range rep.Ratios {
			fmt.Fprintf(w, "  %-44s %.2f (tasks)  %s (idle)\n", r.What, r.Task, fmtIdleRatio(r.Idle))
		}
		fmt.Fprintln(w, "  (medians over the call counts both relays completed; per call count, tasks:")
		for _, r := range rep.Ratios {
			steps := make([]string, len(r.Steps))
			for i, st := range r.Steps {
				steps[i] = fmt.Sprintf("%d calls %.2f", st.Calls, st.Task)
			}
			fmt.Fprintf(w, "   %s: %s)\n", r.What, strings.Join(steps, ", "))
		}
	}
	writeTranscodeText(w, rep.Transcode)
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if len(rep.Plots) > 0 {
		fmt.Fprintf(w, "\nplots: %s\n", strings.Join(rep.Plots, ", "))
	}
}

// WriteOutputs writes bench.json and the plots to cfg.out.
func (rep *Report) WriteOutputs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	plots, err := benchPlots(rep, dir)
	rep.Plots = plots
	b, jerr := json.MarshalIndent(rep, "", "  ")
	if jerr != nil {
		return errors.Join(err, jerr)
	}
	return errors.Join(err, os.WriteFile(filepath.Join(dir, "bench.json"), append(b, '\n'), 0o644))
}

var benchRun func(ctx context.Context, cfg Config) (*Report, error)

// Run runs the comparison in the lab (Linux only).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if benchRun == nil {
		return nil, errors.New("bench needs Linux (network namespaces, XDP)")
	}
	return benchRun(ctx, cfg)
}

// finite returns v, or 0 when it is NaN or infinite (JSON has neither).
func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}
