package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relayd/relayd/sdes"
)

const fwdbenchHelp = `usage: voipgen fwdbench [flags]   (as root)

Measures plain and SRTP RTP forwarding in a lab of network namespaces
(caller, relay, callee; lab package), side by side in one run: the kernel's
own IPv4 forwarding, relayd's XDP program, relayd's userspace workers with
1 and 2 workers, and the userspace workers decrypting SRTP from the caller
(AES_CM_128_HMAC_SHA1_80, AEAD_AES_128_GCM). For each, at 1,000 and 10,000
flows: the highest offered rate without loss, the CPU each relayed packet
costs, packets per second per worker, and the loss curve under overload.

Traffic: RTP with 160-byte G.711 payloads (172 B RTP, 200 B IP), one
5-tuple per flow, from a paced sendmmsg sender on one socket in the caller
namespace to a one-socket recvmmsg sink in the callee namespace. A step
offers a total rate (--rates) spread evenly over the phase's flows
(--flows): at 10,000 flows and 100k pps each flow sends 10 pps. A mode
stops after its first lossless step where the sender falls short of the
offered rate (it cannot offer more). After its first step with loss it
runs --overload more steps, the overload curve (loss and achieved rate;
no CPU figures).

Modes (--modes, comma-separated; default kernel,xdp,user-w1,user-w2,
aescm-w1,gcm-w1):
  kernel    caller -> relay -> callee, kernel forwarding, no relayd
  xdp       relayd (dataplane xdp), one "mode":"xdp" flow per stream
  xdpmin    no relayd: a minimal XDP forwarder (lab/minfwd: FIB lookup,
            rewrite, DEVMAP redirect) on r0 and r1, the yardstick of xdp
  user-wN   relayd (dataplane userspace, workers = N), "mode":"userspace"
            flows: sk_lookup steering, recvmmsg, raw-socket sendmmsg
  user-xsk-wN  user-wN with dataplane.userspace_io = "afxdp": relayd's
            XDP program on r0 and r1 redirects the flows' packets into
            the workers' AF_XDP sockets (copy mode), raw-socket sendmmsg
            as user-wN; compared with user-wN and cmmsg in the same run
  cmmsg     no relayd: a minimal C relay (lab/cmmsg), the yardstick of
            user-w1. The same flows (relay ports, source check, rewrite
            with the UDP checksum) and the same kernel path: relayd's
            sk_lookup program steers them to its one UDP socket, it reads
            up to 64 with a blocking recvmmsg (IP_ORIGDSTADDR), sends
            with one sendmmsg on a raw socket, pinned to CPU 0 as
            user-w1's worker is. No RTP statistics, latching, rate caps
            or SRTP. Built with cc on first use (gcc)
  aescm-wN  user-wN, flows "decrypt" AES_CM_128_HMAC_SHA1_80: the sender
            encrypts each packet (srtpflow), the relay decrypts it
  gcm-wN    the same with AEAD_AES_128_GCM
  aescm-xsk-wN, gcm-xsk-wN  the SRTP modes receiving through AF_XDP
  userspace = user-w1,user-w2; srtp = aescm-w1,gcm-w1
  A user or SRTP mode may end in @DURATION, relayd's dataplane.coalesce
  for it (user-w1@0s: workers woken per packet; default 200us), so that
  coalescing is compared with its absence in one run.
relayd is restarted for each mode; it holds exactly the phase's flows
(1,000, then 9,000 more installed with parallel POSTs for 10,000). The C
relay is started for each phase with exactly its flows.

Each lossless-search step runs direct, mode, mode, direct with the same load:
direct is caller -> callee over an extra veth pair, no relay, the same
packets (SRTP modes: the same encrypted packets, so the sender's encryption
cancels out): the baseline.

CPU accounting (lab/measure): the CPU time of every thread involved (this
process's sender, sink and runtime threads, relayd or the C relay,
ksoftirqd/N) from
/proc/PID/task/TID/schedstat, which includes the softirq work that XDP,
forwarding and socket delivery do in the sending thread's context on veth.
The relay's cost per packet is a mode's ns/packet minus the mean of its two
direct runs ("tasks"). Cross-check: whole-machine busy time from per-CPU
idle in /proc/stat ("idle"; 10 ms resolution, includes other processes).
The XDP program's own run time comes from the kernel's BPF run-time
statistics (xdp and xdpmin). With --relay-napi the relay's veths receive
in NAPI threads, and the end hosts' in threads of their own, so that the
relay's receive, its XDP program or the kernel's forwarding, and its
redirect or transmit run in threads that do nothing else: the relay hop
(HOP_NS) is those threads' CPU plus the relay process's per sent packet,
a measurement of the relay alone rather than a difference of runs, and
each ratio gets a "relay hop" figure beside the tasks one. The threads'
wake-ups are part of the hop. The summary's CPU figures use the lossless
runs where the sender kept up (in the run and its direct runs: the same
load); ratios between modes are taken over the offered rates where both
modes qualify, in this run, with the range their runs allow (a relay
cost is a difference of totals that vary from run to run): xdp against
kernel, xdpmin (with the ratio of the programs' own run times too) and
each user mode; user-w1 against cmmsg; SRTP modes against user-wN;
user-w2 against user-w1.

On a shared machine other processes take CPU from the measured threads
(each run reports its threads' run-queue wait and the machine's busy time
outside them): before each step fwdbench waits, up to 3 s (--quiet-wait
in all), until the machine is nearly idle, and it runs a step again once when its
runs disagree (one of two lost packets or fell short of the rate, or a
direct run was disturbed).

--json prints {"config":{...},"installs":[...],"steps":[...],"summary":{...}}.

flags:
`

// fwdMode is one way of relaying that fwdbench measures.
type fwdMode struct {
	Name    string     `json:"name"`              // kernel, xdp, user-w1, aescm-w1, gcm-w2, ...
	Kind    string     `json:"kind"`              // kernel | xdp | user | srtp
	Workers int        `json:"workers,omitempty"` // relayd dataplane.workers (user, srtp)
	Suite   sdes.Suite `json:"-"`                 // srtp
	// Coalesce is relayd's dataplane.coalesce (user, srtp): a mode name's
	// "@DURATION" suffix; "" relayd's default.
	Coalesce string `json:"coalesce,omitempty"`
	// IO is relayd's dataplane.userspace_io (user, srtp): "afxdp" for a
	// mode name's "-xsk" before -wN (user-xsk-w1); "" relayd's default.
	IO string `json:"io,omitempty"`
	// Plane is relayd's dataplane.mode for the srtp kind: "xdp" for the
	// XDP data plane, whose program hands the SRTP flows' packets to the
	// workers; "" mode userspace.
	Plane string `json:"plane,omitempty"`
}

func (m fwdMode) relayd() bool { return m.Kind != "kernel" && m.Kind != "xdpmin" && m.Kind != "cmmsg" }

// srtpKinds maps the mode name prefix of an SRTP mode to its suite.
var srtpKinds = map[string]sdes.Suite{
	"aescm": sdes.AES_CM_128_HMAC_SHA1_80,
	"gcm":   sdes.AEAD_AES_128_GCM,
}

const fwdMaxWorkers = 64

// fwdModeNames lists the modes --modes takes.
const fwdModeNames = "kernel, xdp, xdpmin, user-wN, user-xsk-wN, cmmsg, aescm-wN, gcm-wN, aescm-xsk-wN, gcm-xsk-wN, userspace, srtp"

// parseModes parses --modes.
func parseModes(s string) ([]fwdMode, error) {
	var out []fwdMode
	add := func(m fwdMode) {
		if !slices.ContainsFunc(out, func(o fwdMode) bool { return o.Name == m.Name }) {
			out = append(out, m)
		}
	}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(strings.ToLower(name))
		switch name {
		case "kernel", "xdp", "xdpmin":
			add(fwdMode{Name: name, Kind: name})
			continue
		case "cmmsg":
			// One relay thread, as user-w1 has one worker.
			add(fwdMode{Name: name, Kind: name, Workers: 1})
			continue
		case "userspace":
			add(fwdMode{Name: "user-w1", Kind: "user", Workers: 1})
			add(fwdMode{Name: "user-w2", Kind: "user", Workers: 2})
			continue
		case "srtp":
			add(fwdMode{Name: "aescm-w1", Kind: "srtp", Workers: 1, Suite: srtpKinds["aescm"]})
			add(fwdMode{Name: "gcm-w1", Kind: "srtp", Workers: 1, Suite: srtpKinds["gcm"]})
			continue
		}
		full := name
		name, coalesce, hasCoalesce := strings.Cut(name, "@")
		if hasCoalesce {
			d, err := time.ParseDuration(coalesce)
			if err != nil || d < 0 || d > 5*time.Millisecond {
				return nil, fmt.Errorf("--modes: %q: the coalescing interval after @ must be a duration of 0s-5ms", full)
			}
		}
		prefix, n, ok := strings.Cut(name, "-w")
		w, err := strconv.Atoi(n)
		if !ok || err != nil || w < 1 || w > fwdMaxWorkers {
			return nil, fmt.Errorf("--modes: unknown mode %q (want %s; N workers 1-%d)", name, fwdModeNames, fwdMaxWorkers)
		}
		io := ""
		if p, isXSK := strings.CutSuffix(prefix, "-xsk"); isXSK {
			prefix, io = p, "afxdp"
		}
		switch suite, isSRTP := srtpKinds[prefix]; {
		case prefix == "user":
			add(fwdMode{Name: full, Kind: "user", Workers: w, Coalesce: coalesce, IO: io})
		case isSRTP:
			add(fwdMode{Name: full, Kind: "srtp", Workers: w, Suite: suite, Coalesce: coalesce, IO: io})
		default:
			return nil, fmt.Errorf("--modes: unknown mode %q (want %s)", name, fwdModeNames)
		}
	}
	return out, nil
}

type FwdConfig struct {
	rates    []int // offered packets per second, over all flows
	flows    []int // flow counts, ascending
	step     time.Duration
	overload int // steps past the first lossy one
	modes    []fwdMode
	relayd   string
	JSON     bool
	Save     string // also write the JSON report here
	// quietWait bounds the time spent waiting for a quiet machine.
	quietWait time.Duration
	allSteps  bool // run every rate (tests)
	// sender and sink: benchEndMmsg (default when empty) or benchEndXDP;
	// see Config.
	sender, sink string
	// relayNAPI: the relay's veths receive in NAPI threads, and the end
	// hosts' in their own (see --relay-napi).
	relayNAPI bool
	// workerSched and workerPrio: see Config.
	workerSched string
	workerPrio  int
}

const (
	defaultModes = "kernel,xdp,user-w1,user-w2,aescm-w1,gcm-w1"
	defaultFlows = "1000,10000"
)

// defaultRates and quickRates are offered rates in pps.
var (
	defaultRates = []int{50000, 100000, 150000, 200000, 250000, 300000}
	quickRates   = []int{100000, 200000}
)

const (
	fwdPtime      = 20 * time.Millisecond // RTP timestamp step per packet: 160 samples
	fwdMaxFlows   = 10000                 // relayd's lab port range 30000-39999, one port per flow
	fwdMaxRate    = 1000000
	fwdSlot       = time.Millisecond // the sender's pacing granularity
	fwdInstallers = 8                // parallel POSTs installing flows
	defaultStep   = time.Second
	quickStep     = 400 * time.Millisecond
	defaultOver   = 2
	quickOver     = 1
	defaultQuiet  = 60 * time.Second
	quickQuiet    = 10 * time.Second
)

// parseCounts parses a comma-separated list of positive counts with an
// optional k suffix (20k = 20000) within [lo, hi].
func parseCounts(flagName, s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ToLower(f))
		mult := 1
		if v, ok := strings.CutSuffix(f, "k"); ok {
			f, mult = v, 1000
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s: bad value %q", flagName, f)
		}
		n *= mult
		if n < lo || n > hi {
			return nil, fmt.Errorf("%s: %d out of range %d-%d", flagName, n, lo, hi)
		}
		out = append(out, n)
	}
	return out, nil
}

func ParseFwd(args []string, out io.Writer) (FwdConfig, error) {
	fs := flag.NewFlagSet("fwdbench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, fwdbenchHelp); fs.PrintDefaults() }
	quick := fs.Bool("quick", false, "short run (~1 min): rates 100k,200k, 0.4 s runs, one overload step")
	rates := fs.String("rates", "", "offered rates in pps over all flows, comma-separated, e.g. 50k,100k (default 50k..300k by 50k)")
	flows := fs.String("flows", defaultFlows, "flow counts, comma-separated (at most 10000)")
	step := fs.Duration("step", 0, "duration of each measured run (default 1s, 0.4s with --quick)")
	overload := fs.Int("overload", defaultOver, "steps to run past a mode's first step with loss, for the overload curve (1 with --quick)")
	modes := fs.String("modes", defaultModes, "modes to measure besides the direct baseline: "+fwdModeNames)
	relayd := fs.String("relayd", "", "relayd binary (default: relayd next to voipgen, else go build)")
	js := fs.Bool("json", false, "print machine-readable JSON")
	save := fs.String("save", "", "also write the JSON report to this file")
	relayNAPI := fs.Bool("relay-napi", false, "the relay's veths receive in NAPI threads (the end hosts' in threads of their own): measures the relay hop's own CPU per packet (HOP_NS, \"relay hop\" ratios), not a difference of runs")
	quietWait := fs.Duration("quiet-wait", defaultQuiet, "the most time to wait in all, before steps, for other processes to leave the CPUs (10s with --quick; 0: never wait)")
	if err := fs.Parse(args); err != nil {
		return FwdConfig{}, err
	}
	if fs.NArg() > 0 {
		return FwdConfig{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg := FwdConfig{rates: defaultRates, step: defaultStep, overload: defaultOver, relayd: *relayd, JSON: *js, Save: *save,
		quietWait: defaultQuiet, relayNAPI: *relayNAPI}
	if *quick {
		cfg.rates, cfg.step, cfg.overload, cfg.quietWait = quickRates, quickStep, quickOver, quickQuiet
	}
	var err error
	if *rates != "" {
		if cfg.rates, err = parseCounts("--rates", *rates, 1000, fwdMaxRate); err != nil {
			return cfg, err
		}
	}
	if cfg.flows, err = parseCounts("--flows", *flows, 1, fwdMaxFlows); err != nil {
		return cfg, err
	}
	slices.Sort(cfg.flows)
	cfg.flows = slices.Compact(cfg.flows)
	if *step != 0 {
		cfg.step = *step
	}
	if cfg.step < 200*time.Millisecond {
		return cfg, fmt.Errorf("--step %v: need at least 200ms", cfg.step)
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "overload":
			cfg.overload = *overload
		case "quiet-wait":
			cfg.quietWait = max(0, *quietWait)
		}
	})
	if cfg.overload < 0 {
		return cfg, fmt.Errorf("--overload %d: negative", cfg.overload)
	}
	if cfg.modes, err = parseModes(*modes); err != nil {
		return cfg, err
	}
	// Every flow must send at least two packets per run.
	for _, f := range cfg.flows {
		for _, r := range cfg.rates {
			if period(f, r) > cfg.step/2 {
				return cfg, fmt.Errorf("--rates %d with %d flows: each flow would send %.2f pps, under 2 packets per %v run: raise the rate or --step",
					r, f, float64(r)/float64(f), cfg.step)
			}
		}
	}
	return cfg, nil
}

// period is the time between two packets of one flow when flows flows
// share rate pps.
func period(flows, rate int) time.Duration {
	return time.Duration(int64(flows) * int64(time.Second) / int64(rate))
}

func (c FwdConfig) maxFlows() int { return slices.Max(c.flows) }

// share returns label's threads' CPU time over the run's elapsed time (1
// = a whole CPU), from its ns per packet sent.
func (st *fwdStep) share(label string) float64 {
	return finite(st.LabelNsPkt[label] * st.SentPPS / 1e9)
}

// fwdStep is one measured run.
type fwdStep struct {
	Mode    string `json:"mode"`  // direct | a mode name
	Phase   string `json:"phase"` // the mode whose step this run belongs to
	Flows   int    `json:"flows"`
	Workers int    `json:"workers,omitempty"`
	// Overload: a step past the mode's first lossy step (no direct runs,
	// no relay cost).
	Overload bool `json:"overload,omitempty"`
	// Superseded: the step's runs disagreed (see disturbed) and the step
	// was run again; this run is left out of the summary.
	Superseded bool `json:"superseded,omitempty"`
	// QuietWaitS is how long the step waited, before this run, for other
	// processes to leave the CPUs.
	QuietWaitS float64 `json:"quiet_wait_s,omitempty"`
	OfferedPPS int     `json:"offered_pps"`
	PerFlowPPS float64 `json:"per_flow_pps"`
	SentPPS    float64 `json:"sent_pps"` // what the sender managed
	// SenderLimited: the sender managed less than 97% of the offered rate.
	SenderLimited bool    `json:"sender_limited"`
	AchievedPPS   float64 `json:"achieved_pps"` // received / send time
	Sent          uint64  `json:"sent"`
	SendErrors    uint64  `json:"send_errors"`
	EncryptErrors uint64  `json:"encrypt_errors,omitempty"`
	Received      uint64  `json:"received"`
	Lost          int64   `json:"lost"`
	LossPct       float64 `json:"loss_pct"`
	// StreamsShort counts flows that received fewer packets than sent.
	StreamsShort int `json:"streams_short"`
	// LabDrops are the lab's drop counters that grew over a run with
	// loss (see labPathDrops): where outside relayd the packets went.
	LabDrops map[string]uint64 `json:"lab_drops,omitempty"`
	// Relayed and RelayDropped are relayd's counters of packets forwarded
	// and dropped (relayd_packets_total), -1 without relayd.
	Relayed      int64 `json:"relayed"`
	RelayDropped int64 `json:"relay_dropped"`
	// RelayedUserspace is the part of Relayed that relayd's userspace
	// workers forwarded: in xdp mode, what XDP punted or has not taken
	// back yet (latching flows), -1 without relayd.
	RelayedUserspace int64 `json:"relayed_userspace"`
	// TranscodedToCallee and TranscodedToCaller count, in a transcode
	// run through a relay, the packets that arrived in the format the
	// other leg asked for: G.729 to the callee, G.711 µ-law to the caller.
	TranscodedToCallee uint64 `json:"transcoded_to_callee,omitempty"`
	TranscodedToCaller uint64 `json:"transcoded_to_caller,omitempty"`
	// RelayDrops are relayd's drops by reason, if any.
	RelayDrops map[string]uint64 `json:"relay_drops,omitempty"`
	// WorkerDelay is what relayd's userspace workers added (user and
	// SRTP modes), nil otherwise.
	WorkerDelay *WorkerDelay `json:"worker_delay,omitempty"`
	ElapsedS    float64      `json:"elapsed_s"`

	// CPU nanoseconds per sent packet: all threads (tasks), each label,
	// whole machine from idle time (busy).
	TaskNsPerPkt float64            `json:"task_ns_per_pkt"`
	BusyNsPerPkt float64            `json:"busy_ns_per_pkt"`
	LabelNsPkt   map[string]float64 `json:"label_ns_per_pkt"`
	// LabelWaitMs is how long each label's threads were runnable but
	// waited for a CPU (schedstat), in ms.
	LabelWaitMs map[string]float64 `json:"label_wait_ms"`
	StealMs     float64            `json:"steal_ms"`

	// OutsideNsPerPkt is the machine's busy time outside the measured
	// tasks (other processes, softirqs in no task) per sent packet: when it
	// is large, the idle cross-check means little.
	OutsideNsPerPkt float64 `json:"outside_ns_per_pkt"`

	// Relay cost: this run's figure minus the mean of its direct runs.
	// Comparable: this run and both direct runs kept up with the offered
	// rate, so they carried the same load; only comparable runs enter the
	// summary's CPU figures and ratios.
	Comparable        bool     `json:"comparable,omitempty"`
	RelayTaskNsPerPkt *float64 `json:"relay_task_ns_per_pkt,omitempty"`
	RelayBusyNsPerPkt *float64 `json:"relay_busy_ns_per_pkt,omitempty"`
	// The same split by label (sender, sink, ksoftirqd, relayd, voipgen).
	RelayLabelNsPkt map[string]float64 `json:"relay_label_ns_per_pkt,omitempty"`

	// The XDP program's own run time per run (BPF stats), xdp only.
	ProgRuns     uint64   `json:"prog_runs,omitempty"`
	ProgNsPerRun *float64 `json:"prog_ns_per_run,omitempty"`
	// HopNsPerPkt is, with --relay-napi, the relay hop's own CPU per sent
	// packet in a mode run: the relay's NAPI threads (its veths' receive,
	// where XDP and kernel forwarding run) plus the relay process (relayd
	// or the C relay). Not a difference of runs: nil in direct runs.
	HopNsPerPkt *float64 `json:"hop_ns_per_pkt,omitempty"`
}

func (s *fwdStep) lossless() bool {
	return s.Sent > 0 && s.Lost <= 0 && s.SendErrors == 0 && s.EncryptErrors == 0
}

// disturbed reports whether the runs of a step disagree: one mode run lost
// packets and the other did not, or the sender fell short in one mode run
// and not the other, or a direct run lost packets, or a direct run fell
// short of a rate well below what the sender managed in direct runs
// before (senderMax pps): something else took the CPU.
func disturbed(runs []fwdStep, senderMax float64) bool {
	lossy, limited, mode := 0, 0, 0
	for i := range runs {
		r := &runs[i]
		if r.Mode == "direct" {
			if !r.lossless() || r.SenderLimited && float64(r.OfferedPPS) < 0.9*senderMax {
				return true
			}
			continue
		}
		mode++
		if !r.lossless() {
			lossy++
		}
		if r.SenderLimited {
			limited++
		}
	}
	return mode == 2 && (lossy == 1 || limited == 1)
}

// fwdInstall is the installation of a phase's flows into relayd.
type fwdInstall struct {
	Mode    string  `json:"mode"`
	Flows   int     `json:"flows"` // installed in total afterwards
	Added   int     `json:"added"`
	Seconds float64 `json:"seconds"`
	PerSec  float64 `json:"flows_per_s"`
}

// fwdPoint is one step of a mode: the mean of its runs.
type fwdPoint struct {
	OfferedPPS    int     `json:"offered_pps"`
	SentPPS       float64 `json:"sent_pps"`
	AchievedPPS   float64 `json:"achieved_pps"`
	LossPct       float64 `json:"loss_pct"`
	SenderLimited bool    `json:"sender_limited"`
	Overload      bool    `json:"overload,omitempty"`
}

type fwdModeSummary struct {
	Mode    string `json:"mode"`
	Flows   int    `json:"flows"`
	Workers int    `json:"workers,omitempty"`
	// InstallS: the time to install this phase's flows (the 10,000-flow
	// phase adds 9,000 to the 1,000 of the phase before).
	InstallS     float64 `json:"install_s,omitempty"`
	InstallAdded int     `json:"install_added,omitempty"`
	// Highest step without loss: offered and achieved pps.
	MaxLosslessOfferedPPS  int     `json:"max_lossless_offered_pps"`
	MaxLosslessAchievedPPS float64 `json:"max_lossless_achieved_pps"`
	// MaxLosslessSenderLimited: the sender, not the relay, set the limit.
	MaxLosslessSenderLimited bool `json:"max_lossless_sender_limited"`
	// PPSPerWorker is MaxLosslessAchievedPPS over the workers.
	PPSPerWorker float64 `json:"lossless_pps_per_worker,omitempty"`
	// Median over the lossless comparable runs of the relay cost per
	// packet, and the range of the tasks figure.
	RelayTaskNsPerPkt float64 `json:"relay_task_ns_per_pkt"`
	RelayBusyNsPerPkt float64 `json:"relay_busy_ns_per_pkt"`
	RelayTaskMinNs    float64 `json:"relay_task_min_ns,omitempty"`
	RelayTaskMaxNs    float64 `json:"relay_task_max_ns,omitempty"`
	ProgNsPerRun      float64 `json:"prog_ns_per_run,omitempty"`
	// ProgramShare is ProgNsPerRun over RelayTaskNsPerPkt (xdp).
	ProgramShare float64 `json:"program_share,omitempty"`
	Steps        int     `json:"lossless_steps"`
	// The same at the 100k pps step (the reference figures of docs/architecture.md are at 100k pps),
	// mean of its two runs; 0 without a lossless 100k step.
	At100kTaskNsPerPkt float64 `json:"at_100k_relay_task_ns_per_pkt"`
	At100kBusyNsPerPkt float64 `json:"at_100k_relay_busy_ns_per_pkt"`
	At100kProgNsPerRun float64 `json:"at_100k_prog_ns_per_run,omitempty"`
	// The loss curve: every step, ascending offered rate.
	Curve []fwdPoint `json:"curve"`
	// PeakAchievedPPS is the most any step delivered, PeakPPSPerWorker
	// that over the workers.
	PeakAchievedPPS  float64 `json:"peak_achieved_pps"`
	PeakPPSPerWorker float64 `json:"peak_pps_per_worker,omitempty"`
	// Collapse: the last step delivered under half the peak.
	Collapse bool `json:"collapse"`
	// Overloaded: some step lost packets.
	Overloaded bool `json:"overloaded"`
}

// fwdRatio compares the relay cost of two modes at one flow count over the
// rates where both were lossless.
type fwdRatio struct {
	Name  string  `json:"name"` // num/den
	Flows int     `json:"flows"`
	Rates []int   `json:"rates"`
	NumNs float64 `json:"num_ns_per_pkt"` // mean relay cost over Rates (tasks)
	DenNs float64 `json:"den_ns_per_pkt"`
	Tasks float64 `json:"tasks"` // NumNs / DenNs
	// TasksLo and TasksHi bound Tasks by the runs: the numerator's lowest
	// runs over the denominator's highest, and the other way round. A
	// relay cost is a difference of two runs' totals, each some thousands
	// of ns a packet; when the runs' spread is as large as the modes'
	// difference, so is this range. TasksHi is 0 when a run of the
	// denominator cost nothing or less (no upper bound).
	TasksLo float64 `json:"tasks_lo"`
	TasksHi float64 `json:"tasks_hi"`
	Busy    float64 `json:"busy"`           // the same from idle time
	SRTP    bool    `json:"srtp,omitempty"` // an SRTP mode against plain userspace with as many workers
	// ProgNumNs and ProgDenNs are the XDP programs' own run times (BPF
	// statistics), mean over Rates, when both modes have one (xdp,
	// xdpmin): Prog, their ratio, is timed by the kernel per run and does
	// not suffer the relay cost's spread.
	ProgNumNs float64 `json:"prog_num_ns_per_run,omitempty"`
	ProgDenNs float64 `json:"prog_den_ns_per_run,omitempty"`
	Prog      float64 `json:"prog,omitempty"`
	// Hop is, with --relay-napi, the ratio of the two modes' relay hops
	// (HopNsPerPkt, mean over Rates: HopNumNs, HopDenNs), each the CPU of
	// the relay's own threads in the mode's runs, not a difference of
	// runs; HopLo and HopHi bound it by the runs as TasksLo and TasksHi
	// do Tasks.
	HopNumNs float64 `json:"hop_num_ns_per_pkt,omitempty"`
	HopDenNs float64 `json:"hop_den_ns_per_pkt,omitempty"`
	Hop      float64 `json:"hop,omitempty"`
	HopLo    float64 `json:"hop_lo,omitempty"`
	HopHi    float64 `json:"hop_hi,omitempty"`
}

type fwdSummary struct {
	Modes  []fwdModeSummary `json:"modes"`
	Ratios []fwdRatio       `json:"ratios"`
	Notes  []string         `json:"notes"`
}

type FwdReport struct {
	Config   map[string]any `json:"config"`
	Installs []fwdInstall   `json:"installs"`
	Steps    []fwdStep      `json:"steps"`
	Summary  fwdSummary     `json:"summary"`
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// fwdStepKey names one step: a mode at a flow count and a rate.
type fwdStepKey struct {
	mode  string
	flows int
	rate  int
}

// fwdAgg is the mean over the mode runs of one step.
type fwdAgg struct {
	key              fwdStepKey
	runs             int
	lossless         bool // every run
	limited          bool // some run
	comparable       bool // every run
	overload         bool
	sent, ach, loss  float64
	task, busy, prog float64 // means; task and busy NaN without relay cost
	taskRuns         spread  // the lowest and highest run of task
	hasProg          bool
	// hop: the mean relay hop (HopNsPerPkt) of the runs that had one,
	// hopRuns their lowest, highest and count.
	hop     float64
	hopRuns spread
	labels  map[string]float64 // relay cost by label
}

// aggregate groups the mode runs of steps by step, in order.
func aggregate(steps []fwdStep) []fwdAgg {
	var out []fwdAgg
	idx := map[fwdStepKey]int{}
	for _, s := range steps {
		if s.Mode == "direct" || s.Superseded {
			continue
		}
		k := fwdStepKey{s.Mode, s.Flows, s.OfferedPPS}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, fwdAgg{key: k, lossless: true, comparable: true, labels: map[string]float64{}})
		}
		a := &out[i]
		a.runs++
		a.lossless = a.lossless && s.lossless()
		a.limited = a.limited || s.SenderLimited
		a.comparable = a.comparable && s.Comparable
		a.overload = a.overload || s.Overload
		a.sent += s.SentPPS
		a.ach += s.AchievedPPS
		a.loss += s.LossPct
		if s.RelayTaskNsPerPkt != nil {
			v := *s.RelayTaskNsPerPkt
			a.task += v
			a.taskRuns.add(v)
			a.busy += *s.RelayBusyNsPerPkt
		} else {
			a.task, a.busy = math.NaN(), math.NaN()
		}
		if s.ProgNsPerRun != nil {
			a.prog += *s.ProgNsPerRun
			a.hasProg = true
		}
		if s.HopNsPerPkt != nil {
			a.hop += *s.HopNsPerPkt
			a.hopRuns.add(*s.HopNsPerPkt)
		}
		for l, v := range s.RelayLabelNsPkt {
			a.labels[l] += v
		}
	}
	for i := range out {
		a := &out[i]
		n := float64(a.runs)
		a.sent, a.ach, a.loss, a.task, a.busy, a.prog = a.sent/n, a.ach/n, a.loss/n, a.task/n, a.busy/n, a.prog/n
		if a.hopRuns.n > 0 {
			a.hop /= float64(a.hopRuns.n)
		}
		for l := range a.labels {
			a.labels[l] /= n
		}
	}
	return out
}

// summarize derives the summary from the steps and installs.
func summarize(steps []fwdStep, installs []fwdInstall, modes []fwdMode, flows []int) fwdSummary {
	var sum fwdSummary
	aggs := aggregate(steps)
	byMode := map[fwdStepKey][]fwdAgg{} // rate 0
	for _, a := range aggs {
		k := fwdStepKey{a.key.mode, a.key.flows, 0}
		byMode[k] = append(byMode[k], a)
	}
	for _, m := range modes {
		for _, f := range flows {
			as := byMode[fwdStepKey{m.Name, f, 0}]
			if len(as) == 0 {
				continue
			}
			ms := fwdModeSummary{Mode: m.Name, Flows: f, Workers: m.Workers}
			for _, in := range installs {
				if in.Mode == m.Name && in.Flows == f {
					ms.InstallS, ms.InstallAdded = in.Seconds, in.Added
				}
			}
			var task, busy, prog []float64
			for _, s := range steps {
				if s.Mode != m.Name || s.Flows != f || !s.lossless() || s.Overload || !s.Comparable || s.Superseded {
					continue
				}
				if s.RelayTaskNsPerPkt != nil {
					task = append(task, *s.RelayTaskNsPerPkt)
					busy = append(busy, *s.RelayBusyNsPerPkt)
				}
				if s.ProgNsPerRun != nil {
					prog = append(prog, *s.ProgNsPerRun)
				}
			}
			slices.SortFunc(as, func(a, b fwdAgg) int { return a.key.rate - b.key.rate })
			for _, a := range as {
				ms.Curve = append(ms.Curve, fwdPoint{OfferedPPS: a.key.rate, SentPPS: a.sent, AchievedPPS: a.ach,
					LossPct: a.loss, SenderLimited: a.limited, Overload: a.overload})
				ms.PeakAchievedPPS = max(ms.PeakAchievedPPS, a.ach)
				if !a.lossless {
					ms.Overloaded = true
				}
				if !a.lossless || a.overload {
					continue
				}
				ms.Steps++
				if a.ach > ms.MaxLosslessAchievedPPS {
					ms.MaxLosslessOfferedPPS, ms.MaxLosslessAchievedPPS = a.key.rate, a.ach
					ms.MaxLosslessSenderLimited = a.limited
				}
				if a.key.rate == 100000 && a.comparable && !math.IsNaN(a.task) {
					ms.At100kTaskNsPerPkt, ms.At100kBusyNsPerPkt = a.task, a.busy
					if a.hasProg {
						ms.At100kProgNsPerRun = a.prog
					}
				}
			}
			if last := ms.Curve[len(ms.Curve)-1]; ms.PeakAchievedPPS > 0 && last.AchievedPPS < ms.PeakAchievedPPS/2 {
				ms.Collapse = true
			}
			ms.RelayTaskNsPerPkt, ms.RelayBusyNsPerPkt = median(task), median(busy)
			if len(task) > 0 {
				ms.RelayTaskMinNs, ms.RelayTaskMaxNs = slices.Min(task), slices.Max(task)
			}
			if len(prog) > 0 {
				ms.ProgNsPerRun = median(prog)
				ms.ProgramShare = ms.ProgNsPerRun / ms.RelayTaskNsPerPkt
			}
			if m.Workers > 0 {
				ms.PPSPerWorker = ms.MaxLosslessAchievedPPS / float64(m.Workers)
				ms.PeakPPSPerWorker = ms.PeakAchievedPPS / float64(m.Workers)
			}
			if math.IsNaN(ms.RelayTaskNsPerPkt) {
				sum.Notes = append(sum.Notes, fmt.Sprintf("%s at %d flows: no lossless step where the sender kept up, no CPU figure", m.Name, f))
			}
			if ms.Collapse {
				sum.Notes = append(sum.Notes, fmt.Sprintf("%s at %d flows: collapse under overload: the last step delivered %.0f pps, under half the peak %.0f",
					m.Name, f, ms.Curve[len(ms.Curve)-1].AchievedPPS, ms.PeakAchievedPPS))
			}
			sum.Modes = append(sum.Modes, ms)
		}
	}
	sum.Ratios = ratios(aggs, modes, flows)
	for _, q := range sum.Ratios {
		if len(q.Rates) == 0 || (q.TasksHi != 0 && q.TasksHi <= 1.5*q.TasksLo) {
			continue
		}
		prog := ""
		if q.Prog > 0 {
			prog = fmt.Sprintf("; the programs' own run times, which the kernel times per run, compare %.2f", q.Prog)
		}
		if q.Hop > 0 {
			prog += fmt.Sprintf("; the relay hops, each the relay's own CPU and no difference of runs, compare %.2f (runs %.2f..%.2f)", q.Hop, q.HopLo, q.HopHi)
		}
		sum.Notes = append(sum.Notes, fmt.Sprintf("%s at %d flows: the runs put the ratio anywhere in %s, the relay costs being "+
			"differences of totals that vary more from run to run than the modes differ: the ratio tells little; steps repeated "+
			"at one rate (--rates 100k,100k,100k) narrow it%s", q.Name, q.Flows, ratioRange(q), prog))
	}
	var outside []float64
	for _, s := range steps {
		if s.BusyNsPerPkt > 0 {
			outside = append(outside, s.OutsideNsPerPkt/s.BusyNsPerPkt)
		}
	}
	superseded := 0
	for _, s := range steps {
		if s.Superseded && s.Mode != "direct" {
			superseded++
		}
	}
	var waited float64
	for _, s := range steps {
		waited += s.QuietWaitS
	}
	if waited >= 1 {
		sum.Notes = append(sum.Notes, fmt.Sprintf("waited %.0f s in all before steps for other processes to leave the CPUs", waited))
	}
	if superseded > 0 {
		sum.Notes = append(sum.Notes, fmt.Sprintf("%d step(s) were run again because their runs disagreed (loss or a sender short of the rate in one of two runs, or a direct run disturbed); the first attempts are in the JSON report (superseded)", superseded/2))
	}
	if o := median(outside); o > 0.2 {
		sum.Notes = append(sum.Notes, fmt.Sprintf("the machine was busy outside the measured tasks for %.0f%% of its busy time (median over runs): other processes ran; the idle cross-check is polluted by them, the tasks figures much less", 100*o))
	}
	// NaN does not encode as JSON.
	for i := range sum.Modes {
		m := &sum.Modes[i]
		m.RelayTaskNsPerPkt, m.RelayBusyNsPerPkt = zeroNaN(m.RelayTaskNsPerPkt), zeroNaN(m.RelayBusyNsPerPkt)
		m.ProgramShare = zeroNaN(m.ProgramShare)
	}
	return sum
}

// ratios compares modes measured in the same run, and only those: xdp
// against kernel forwarding, against the minimal XDP forwarder and
// against each userspace mode, one userspace worker against the minimal
// C relay, each SRTP mode against the plain userspace mode with as many
// workers, and 2 workers against 1.
func ratios(aggs []fwdAgg, modes []fwdMode, flows []int) []fwdRatio {
	has := func(name string) bool {
		return slices.ContainsFunc(modes, func(m fwdMode) bool { return m.Name == name })
	}
	type pair struct {
		num, den string
		srtp     bool
	}
	var pairs []pair
	if has("xdp") && has("kernel") {
		pairs = append(pairs, pair{"xdp", "kernel", false})
	}
	if has("xdp") && has("xdpmin") {
		// relayd's XDP end to end against a minimal XDP forwarder (fib
		// lookup, rewrite, DEVMAP redirect).
		pairs = append(pairs, pair{"xdp", "xdpmin", false})
	}
	for _, m := range modes {
		if m.Kind == "user" && has("xdp") {
			pairs = append(pairs, pair{"xdp", m.Name, false})
		}
	}
	if has("user-w1") && has("cmmsg") {
		// relayd's userspace worker end to end against a minimal C relay
		// on the same kernel path (sk_lookup, recvmmsg, raw sendmmsg).
		pairs = append(pairs, pair{"user-w1", "cmmsg", false})
	}
	for _, m := range modes {
		// AF_XDP receive against the socket path of the same workers,
		// and against the C relay.
		if m.Kind == "user" && m.IO == "afxdp" {
			if sock := fmt.Sprintf("user-w%d", m.Workers); has(sock) {
				pairs = append(pairs, pair{m.Name, sock, false})
			}
			if m.Workers == 1 && has("cmmsg") {
				pairs = append(pairs, pair{m.Name, "cmmsg", false})
			}
		}
	}
	for _, m := range modes {
		if m.Kind == "srtp" && has(fmt.Sprintf("user-w%d", m.Workers)) {
			pairs = append(pairs, pair{m.Name, fmt.Sprintf("user-w%d", m.Workers), true})
		}
	}
	if has("user-w1") && has("user-w2") {
		pairs = append(pairs, pair{"user-w2", "user-w1", false})
	}
	lossless := map[fwdStepKey]fwdAgg{}
	for _, a := range aggs {
		if a.lossless && a.comparable && !a.overload && !math.IsNaN(a.task) {
			lossless[a.key] = a
		}
	}
	var out []fwdRatio
	for _, f := range flows {
		for _, p := range pairs {
			r := fwdRatio{Name: p.num + "/" + p.den, Flows: f, SRTP: p.srtp}
			var nb, db float64
			var tasks, hop ratioBounds
			progs, hops := 0, 0
			for _, a := range aggs {
				if a.key.mode != p.num || a.key.flows != f {
					continue
				}
				na, ok1 := lossless[a.key]
				da, ok2 := lossless[fwdStepKey{p.den, f, a.key.rate}]
				if !ok1 || !ok2 {
					continue
				}
				r.Rates = append(r.Rates, a.key.rate)
				r.NumNs += na.task
				r.DenNs += da.task
				nb += na.busy
				db += da.busy
				tasks.add(na.taskRuns, da.taskRuns)
				if na.hasProg && da.hasProg {
					r.ProgNumNs += na.prog
					r.ProgDenNs += da.prog
					progs++
				}
				if na.hopRuns.n > 0 && da.hopRuns.n > 0 {
					r.HopNumNs += na.hop
					r.HopDenNs += da.hop
					hop.add(na.hopRuns, da.hopRuns)
					hops++
				}
			}
			if len(r.Rates) == 0 {
				continue
			}
			n := float64(len(r.Rates))
			r.NumNs, r.DenNs = r.NumNs/n, r.DenNs/n
			r.Tasks, r.Busy = zeroNaN(r.NumNs/r.DenNs), zeroNaN(nb/db)
			r.TasksLo, r.TasksHi = tasks.lo(), tasks.hi()
			if progs == len(r.Rates) && r.ProgDenNs > 0 {
				r.ProgNumNs, r.ProgDenNs = r.ProgNumNs/n, r.ProgDenNs/n
				r.Prog = r.ProgNumNs / r.ProgDenNs
			} else {
				r.ProgNumNs, r.ProgDenNs = 0, 0
			}
			if hops == len(r.Rates) && hop.hi() > 0 {
				r.HopNumNs, r.HopDenNs = r.HopNumNs/n, r.HopDenNs/n
				r.Hop, r.HopLo, r.HopHi = r.HopNumNs/r.HopDenNs, hop.lo(), hop.hi()
			} else {
				r.HopNumNs, r.HopDenNs = 0, 0
			}
			out = append(out, r)
		}
	}
	return out
}

// spread is the lowest and highest of a step's runs of one figure, and
// how many there were.
type spread struct {
	lo, hi float64
	n      int
}

func (s *spread) add(v float64) {
	if s.n == 0 {
		s.lo, s.hi = v, v
	}
	s.lo, s.hi = min(s.lo, v), max(s.hi, v)
	s.n++
}

// ratioBounds bounds a ratio of two modes' figures, summed over rates, by
// their runs: the numerator's lowest runs over the denominator's highest,
// and the other way round.
type ratioBounds struct{ num, den spread }

func (b *ratioBounds) add(num, den spread) {
	b.num.lo, b.num.hi = b.num.lo+num.lo, b.num.hi+num.hi
	b.den.lo, b.den.hi = b.den.lo+den.lo, b.den.hi+den.hi
}

// lo is the lowest the runs allow, 0 without a positive denominator.
func (b ratioBounds) lo() float64 {
	if b.den.hi <= 0 {
		return 0
	}
	return max(0, b.num.lo/b.den.hi)
}

// hi is the highest the runs allow, 0 (unbounded) when a denominator's
// run cost nothing or less.
func (b ratioBounds) hi() float64 {
	if b.den.lo <= 0 {
		return 0
	}
	return max(0, b.num.hi/b.den.lo)
}

// ratioRange is q's range by its runs.
func ratioRange(q fwdRatio) string {
	if q.TasksHi == 0 {
		return fmt.Sprintf("%.2f..unbounded", q.TasksLo)
	}
	return fmt.Sprintf("%.2f..%.2f", q.TasksLo, q.TasksHi)
}

func zeroNaN(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

func fmtNs(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

// fmtIdle formats an idle cross-check figure (format for its value). It is
// a difference of whole-machine busy times, relay run minus direct runs,
// and falls below zero when the machine's other work varied more than the
// relay cost: "<0" then, never a negative CPU figure.
func fmtIdle(v float64, format string) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v < 0:
		return "<0"
	}
	return fmt.Sprintf(format, v)
}

// fmtIdleRatio formats a ratio of two idle cross-check figures: "-" when
// it is not positive (one of them was below zero or missing).
func fmtIdleRatio(v float64) string {
	if !(v > 0) {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

func kpps(v float64) string { return fmt.Sprintf("%.1fk", v/1000) }

func (r *FwdReport) WriteText(w io.Writer) {
	fmt.Fprintln(w, "steps (mean of a step's two mode runs; relay ns/pkt = mode minus the mean of its two direct runs;")
	fmt.Fprintln(w, "where the relay cost lands: sender, sink, other voipgen threads, ksoftirqd, the relay process (relayd or cmmsg);")
	fmt.Fprintln(w, "* = sender fell short):")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "MODE\tFLOWS\tOFFERED\tSENT\tACHIEVED\tLOSS%\tRELAY_NS/PKT\tIDLE_NS/PKT\t(sender\tsink\tother\tksoftirqd\trelay)\tPROG_NS\tHOP_NS\t")
	for _, a := range aggregate(r.Steps) {
		lim := ""
		if a.limited {
			lim = "*"
		}
		prog := "-"
		if a.hasProg {
			prog = fmtNs(a.prog)
		}
		a.labels["other"] = a.labels["voipgen"] - a.labels["sender"] - a.labels["sink"]
		a.labels["relay"] = a.labels["relayd"] + a.labels["cmmsg"] // one of them ran
		lab := func(l string) string {
			if math.IsNaN(a.task) {
				return "-"
			}
			return fmtNs(a.labels[l])
		}
		hop := "-"
		if a.hopRuns.n > 0 {
			hop = fmtNs(a.hop)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			a.key.mode, a.key.flows, kpps(float64(a.key.rate)), lim, kpps(a.sent), kpps(a.ach), a.loss,
			fmtNs(a.task), fmtIdle(a.busy, "%.0f"), lab("sender"), lab("sink"), lab("other"), lab("ksoftirqd"), lab("relay"), prog, hop)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "per mode (relay CPU per packet: median over lossless runs where the sender kept up, tasks method, with its range;")
	fmt.Fprintln(w, "idle = whole-machine cross-check; PEAK = most delivered by any step, overload steps included):")
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "MODE\tFLOWS\tINSTALL\tMAX_LOSSLESS\tPER_WORKER\tRELAY_NS/PKT\tRANGE\tIDLE_NS/PKT\tAT_100K\tPROG_NS\tPEAK\tPEAK/WORKER\tOVERLOAD\t")
	for _, m := range r.Summary.Modes {
		inst := "-"
		if m.InstallAdded > 0 {
			inst = fmt.Sprintf("+%d %.2fs", m.InstallAdded, m.InstallS)
		}
		ml := kpps(m.MaxLosslessAchievedPPS)
		if m.MaxLosslessSenderLimited {
			ml += "*"
		}
		if m.Steps == 0 {
			ml = "none"
		}
		pw, ppw := "-", "-"
		if m.Workers > 0 {
			pw, ppw = kpps(m.PPSPerWorker), kpps(m.PeakPPSPerWorker)
		}
		at := "-"
		if m.At100kTaskNsPerPkt != 0 {
			at = fmtNs(m.At100kTaskNsPerPkt)
		}
		prog := "-"
		if m.ProgNsPerRun > 0 {
			prog = fmt.Sprintf("%.0f (%.0f%%)", m.ProgNsPerRun, 100*m.ProgramShare)
		}
		rng := "-"
		if m.RelayTaskMaxNs != 0 {
			rng = fmt.Sprintf("%.0f..%.0f", m.RelayTaskMinNs, m.RelayTaskMaxNs)
		}
		over := "none"
		switch {
		case m.Collapse:
			over = "COLLAPSE"
		case m.Overloaded:
			over = "graceful"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Mode, m.Flows, inst, ml, pw,
			fmtNs(m.RelayTaskNsPerPkt), rng, fmtIdle(m.RelayBusyNsPerPkt, "%.0f"), at, prog, kpps(m.PeakAchievedPPS), ppw, over)
	}
	tw.Flush()
	fmt.Fprintln(w, "  (* = the sender, not the relay, set the limit; OVERLOAD: none = no step lost packets, graceful = loss without")
	fmt.Fprintln(w, "  collapse, COLLAPSE = the last step delivered under half the peak)")
	// Install time of the most flows, over the phases that added them.
	total := map[string]float64{}
	most := 0
	for _, in := range r.Installs {
		total[in.Mode] += in.Seconds
		most = max(most, in.Flows)
	}
	for _, in := range r.Installs {
		if in.Flows == most && total[in.Mode] > 0 {
			fmt.Fprintf(w, "  %s: %d flows installed in %.2fs (%.0f flows/s, %d parallel POSTs)\n",
				in.Mode, in.Flows, total[in.Mode], float64(in.Flows)/total[in.Mode], fwdInstallers)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "loss curves (offered -> loss%, achieved):")
	for _, m := range r.Summary.Modes {
		var parts []string
		for _, p := range m.Curve {
			lim := ""
			if p.SenderLimited {
				lim = "*"
			}
			parts = append(parts, fmt.Sprintf("%s%s %.2f%% %s", kpps(float64(p.OfferedPPS)), lim, p.LossPct, kpps(p.AchievedPPS)))
		}
		fmt.Fprintf(w, "  %-9s %5d flows: %s\n", m.Mode, m.Flows, strings.Join(parts, " | "))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "ratios of relay CPU per packet, same run (tasks method; idle cross-check; over the rates where both were lossless")
	fmt.Fprintln(w, "and the sender kept up in their runs and direct runs):")
	for _, q := range r.Summary.Ratios {
		goal := ""
		if q.SRTP {
			goal = fmt.Sprintf("  SRTP overhead %+.0f%%", 100*(q.Tasks-1))
		}
		if len(q.Rates) == 0 {
			fmt.Fprintf(w, "  %-26s %5d flows: %.2f (%.0f / %.0f ns, median over lossless steps)%s\n",
				q.Name, q.Flows, q.Tasks, q.NumNs, q.DenNs, goal)
			continue
		}
		rates := make([]string, len(q.Rates))
		for i, x := range q.Rates {
			rates[i] = kpps(float64(x))
		}
		prog := ""
		if q.Prog > 0 {
			prog = fmt.Sprintf("; programs %.2f (%.0f / %.0f ns a run)", q.Prog, q.ProgNumNs, q.ProgDenNs)
		}
		if q.Hop > 0 {
			prog += fmt.Sprintf("; relay hop %.2f (%.0f / %.0f ns; runs %.2f..%.2f)", q.Hop, q.HopNumNs, q.HopDenNs, q.HopLo, q.HopHi)
		}
		fmt.Fprintf(w, "  %-26s %5d flows: %.2f (%.0f / %.0f ns; runs %s), idle %s, at %s%s%s\n",
			q.Name, q.Flows, q.Tasks, q.NumNs, q.DenNs, ratioRange(q), fmtIdleRatio(q.Busy), strings.Join(rates, ","), prog, goal)
	}
	for _, n := range r.Summary.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}

// relayCounters are relayd's global packet counters (relayd_packets_total).
type relayCounters struct {
	forwarded uint64
	userspace uint64            // of forwarded: by the userspace workers (reason userspace_*)
	drops     map[string]uint64 // by reason
	// The userspace workers' receive-queue delay histogram
	// (relayd_userspace_delay_seconds: cumulative counts by upper bound
	// in seconds, +Inf included) and their wake-ups and reads.
	delay         map[float64]uint64
	wakeups, naps uint64
	batches       uint64
	afxdp         uint64 // packets the workers read from AF_XDP sockets
}

// WorkerDelay is what relayd's userspace workers added to a run's packets
// (relayd_userspace_delay_seconds and the wake-up counters, the run's
// increase): the time from the kernel's receive timestamp to the worker's
// read. Quantiles are the upper bound of the histogram bucket that holds
// them (so "at most"); one past the last finite bucket is that bucket's
// bound with its Over flag set (so "more than": JSON has no infinity).
type WorkerDelay struct {
	Packets  uint64  `json:"packets"`
	P50US    float64 `json:"p50_us"`
	P50Over  bool    `json:"p50_over,omitempty"`
	P99US    float64 `json:"p99_us"`
	P99Over  bool    `json:"p99_over,omitempty"`
	Wakeups  uint64  `json:"wakeups"`
	Naps     uint64  `json:"naps"`
	Batches  uint64  `json:"batches"`
	PerBatch float64 `json:"packets_per_batch"`
	// AFXDP is how many of the packets the workers read from their AF_XDP
	// sockets (dataplane.userspace_io afxdp): all but a few in an -xsk
	// mode, or the XDP program did not redirect them.
	AFXDP uint64 `json:"afxdp_packets"`
}

// workerDelay returns the workers' delay between before and c, nil if
// they saw no packet.
func (c relayCounters) workerDelay(before relayCounters) *WorkerDelay {
	bounds := make([]float64, 0, len(c.delay))
	for b := range c.delay {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	if len(bounds) == 0 {
		return nil
	}
	total := c.delay[bounds[len(bounds)-1]] - before.delay[bounds[len(bounds)-1]]
	if total == 0 {
		return nil
	}
	d := &WorkerDelay{Packets: total, Wakeups: c.wakeups - before.wakeups, Naps: c.naps - before.naps, Batches: c.batches - before.batches,
		AFXDP: c.afxdp - before.afxdp}
	if d.Batches > 0 {
		d.PerBatch = float64(total) / float64(d.Batches)
	}
	q := func(f float64) (us float64, over bool) {
		last := 0.0 // the last finite bound
		for _, b := range bounds {
			if math.IsInf(b, 1) {
				break
			}
			if float64(c.delay[b]-before.delay[b]) >= f*float64(total) {
				return b * 1e6, false
			}
			last = b
		}
		return last * 1e6, true
	}
	d.P50US, d.P50Over = q(0.5)
	d.P99US, d.P99Over = q(0.99)
	return d
}

// parseRelayCounters sums relayd_packets_total of verdict forward, and
// those of verdict drop by reason, with the kernel's AF_XDP drops
// (reasons afxdp_no_frame, afxdp_rx_ring_full).
func parseRelayCounters(text string) (relayCounters, error) {
	c := relayCounters{drops: map[string]uint64{}}
	found := false
	for _, line := range strings.Split(text, "\n") {
		if parseWorkerLine(&c, line) {
			continue
		}
		rest, ok := strings.CutPrefix(line, "relayd_packets_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return c, fmt.Errorf("metric line %q", line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return c, fmt.Errorf("metric line %q: %w", line, err)
		}
		found = true
		switch {
		case strings.Contains(labels, `verdict="forward"`):
			c.forwarded += uint64(v)
			if strings.Contains(labels, `reason="userspace_`) {
				c.userspace += uint64(v)
			}
		case strings.Contains(labels, `verdict="drop"`):
			reason := "?"
			if _, r, ok := strings.Cut(labels, `reason="`); ok {
				reason, _, _ = strings.Cut(r, `"`)
			}
			c.drops[reason] += uint64(v)
		}
	}
	if !found {
		return c, errors.New("no relayd_packets_total in relayd's metrics")
	}
	return c, nil
}

// parseWorkerLine reads line into c if it is one of the workers' metrics.
func parseWorkerLine(c *relayCounters, line string) bool {
	name, rest, ok := strings.Cut(line, " ")
	if !ok || !strings.HasPrefix(name, "relayd_userspace_") {
		return false
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
	if err != nil {
		return false
	}
	switch {
	case strings.HasPrefix(name, `relayd_userspace_delay_seconds_bucket{le="`):
		le := strings.TrimSuffix(strings.TrimPrefix(name, `relayd_userspace_delay_seconds_bucket{le="`), `"}`)
		b, err := strconv.ParseFloat(le, 64) // "+Inf" parses
		if err != nil {
			return false
		}
		if c.delay == nil {
			c.delay = map[float64]uint64{}
		}
		c.delay[b] = uint64(v)
	case name == `relayd_userspace_wakeups_total{kind="socket"}`:
		c.wakeups = uint64(v)
	case name == `relayd_userspace_wakeups_total{kind="nap"}`:
		c.naps = uint64(v)
	case name == "relayd_userspace_batches_total":
		c.batches = uint64(v)
	case name == "relayd_userspace_afxdp_packets_total":
		c.afxdp = uint64(v)
	case strings.HasPrefix(name, `relayd_userspace_afxdp_dropped_total{reason="`):
		// The kernel's drops on the way into the workers' AF_XDP
		// sockets: relayd's too, though no verdict of its counts them.
		r := strings.TrimSuffix(strings.TrimPrefix(name, `relayd_userspace_afxdp_dropped_total{reason="`), `"}`)
		c.drops["afxdp_"+r] = uint64(v)
	default:
		return false
	}
	return true
}

// since returns the counts from before to c: forwarded, dropped, and the
// drops by reason (none if nothing was dropped).
func (c relayCounters) since(before relayCounters) (fwd, dropped uint64, reasons map[string]uint64) {
	for r, v := range c.drops {
		if d := v - before.drops[r]; d != 0 {
			if reasons == nil {
				reasons = map[string]uint64{}
			}
			reasons[r] = d
			dropped += d
		}
	}
	return c.forwarded - before.forwarded, dropped, reasons
}
