package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

const fwdbenchHelp = `usage: voipgen fwdbench [flags]   (as root)

Measures plain RTP forwarding through relayd's XDP program and through the
kernel's own IPv4 forwarding in a lab of network namespaces (caller, relay,
callee; lab package), and the CPU each costs per relayed packet.

Traffic: G.711/20 ms RTP (172 B RTP, 200 B IP), 50 pps per stream, one
5-tuple per stream, from voipgen's paced sendmmsg sender on one socket in
the caller namespace to a one-socket recvmmsg sink in the callee namespace.
The offered rate is stepped by the number of streams (--rates); each mode
stops after the first step that loses packets or where the sender falls
short of the offered rate (on veth the sender's softirq does the relaying).

Each step runs direct, mode, mode, direct with the same load:
  direct  caller -> callee over an extra veth pair, no relay: the baseline
  kernel  caller -> relay -> callee, kernel forwarding, no relayd running
  xdp     caller -> relay -> callee through relayd's XDP program, one flow
          per stream installed via the admin API (expect_source set)

CPU accounting (lab/measure): the CPU time of every thread involved (this
process's sender, sink and runtime threads, relayd, ksoftirqd/N) from
/proc/PID/task/TID/schedstat, which includes the softirq work that XDP and
forwarding do in the sender's context on veth. The relay's cost per packet
is a mode's ns/packet minus the mean of its two direct runs ("tasks"). Cross-check:
whole-machine busy time from per-CPU idle in /proc/stat ("idle"; 10 ms
resolution, includes other processes). The XDP program's own run time comes
from the kernel's BPF run-time statistics (enabled for the xdp phase only).

--json prints {"config":{...},"steps":[...],"summary":{...}}.

flags:
`

type fwdConfig struct {
	rates    []int // offered packets per second, rounded to whole streams
	step     time.Duration
	modes    []string
	relayd   string
	json     bool
	allSteps bool // keep stepping after loss (tests)
}

// defaultRates and quickRates are offered rates in pps.
var (
	defaultRates = []int{20000, 50000, 100000, 150000, 200000, 250000, 300000}
	quickRates   = []int{50000, 100000, 200000}
)

const (
	fwdPtime       = 20 * time.Millisecond
	fwdStreamPPS   = int(time.Second / fwdPtime)
	fwdMaxStreams  = 10000 // relayd's lab port range 30000-39999, one port per flow
	defaultStep    = 2 * time.Second
	quickStep      = time.Second
	refXDPns       = 1100 // DESIGN.md section 6
	refKernelNs    = 400
	refProgramNs   = 300
	referenceRatio = float64(refXDPns) / refKernelNs
)

func parseRates(s string) ([]int, error) {
	var rates []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ToLower(f))
		mult := 1
		if v, ok := strings.CutSuffix(f, "k"); ok {
			f, mult = v, 1000
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--rates: bad rate %q", f)
		}
		n *= mult
		if n < fwdStreamPPS || n > fwdMaxStreams*fwdStreamPPS {
			return nil, fmt.Errorf("--rates: %d pps out of range %d-%d (50 pps per stream, at most %d streams)",
				n, fwdStreamPPS, fwdMaxStreams*fwdStreamPPS, fwdMaxStreams)
		}
		rates = append(rates, n)
	}
	return rates, nil
}

func parseFwdbench(args []string, out io.Writer) (fwdConfig, error) {
	fs := flag.NewFlagSet("fwdbench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, fwdbenchHelp); fs.PrintDefaults() }
	quick := fs.Bool("quick", false, "short run (~40 s): rates 50k,100k,200k, 1 s runs")
	rates := fs.String("rates", "", "offered rates in pps, comma-separated, e.g. 20k,50k,100k (default 20k..300k)")
	step := fs.Duration("step", 0, "duration of each measured run (default 2s, 1s with --quick)")
	modes := fs.String("modes", "kernel,xdp", "modes to measure besides the direct baseline: kernel, xdp")
	relayd := fs.String("relayd", "", "relayd binary (default: relayd next to voipgen, else go build)")
	js := fs.Bool("json", false, "print machine-readable JSON")
	if err := fs.Parse(args); err != nil {
		return fwdConfig{}, err
	}
	if fs.NArg() > 0 {
		return fwdConfig{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg := fwdConfig{rates: defaultRates, step: defaultStep, relayd: *relayd, json: *js}
	if *quick {
		cfg.rates, cfg.step = quickRates, quickStep
	}
	if *rates != "" {
		r, err := parseRates(*rates)
		if err != nil {
			return cfg, err
		}
		cfg.rates = r
	}
	if *step != 0 {
		cfg.step = *step
	}
	if cfg.step < 200*time.Millisecond {
		return cfg, fmt.Errorf("--step %v: need at least 200ms", cfg.step)
	}
	for _, m := range strings.Split(*modes, ",") {
		switch m = strings.TrimSpace(m); m {
		case "kernel", "xdp":
			cfg.modes = append(cfg.modes, m)
		default:
			return cfg, fmt.Errorf("--modes: unknown mode %q (want kernel, xdp)", m)
		}
	}
	return cfg, nil
}

func (c fwdConfig) has(mode string) bool {
	for _, m := range c.modes {
		if m == mode {
			return true
		}
	}
	return false
}

func (c fwdConfig) maxStreams() int {
	n := 0
	for _, r := range c.rates {
		n = max(n, streamsFor(r))
	}
	return n
}

// streamsFor returns the number of 50 pps streams that offer about pps.
func streamsFor(pps int) int { return max(1, (pps+fwdStreamPPS/2)/fwdStreamPPS) }

// fwdStep is one measured run.
type fwdStep struct {
	Mode       string  `json:"mode"` // direct | kernel | xdp
	Phase      string  `json:"phase"`
	Streams    int     `json:"streams"`
	OfferedPPS int     `json:"offered_pps"`
	SentPPS    float64 `json:"sent_pps"` // what the sender managed
	// SenderLimited: the sender managed less than 97% of the offered rate.
	SenderLimited bool    `json:"sender_limited"`
	AchievedPPS   float64 `json:"achieved_pps"` // received / send time
	Sent          uint64  `json:"sent"`
	SendErrors    uint64  `json:"send_errors"`
	Received      uint64  `json:"received"`
	Lost          int64   `json:"lost"`
	LossPct       float64 `json:"loss_pct"`
	// StreamsShort counts streams that received fewer packets than sent.
	StreamsShort int `json:"streams_short"`
	// Relayed is the packets relayd's flows counted (xdp), -1 otherwise.
	Relayed  int64   `json:"relayed"`
	ElapsedS float64 `json:"elapsed_s"`

	// CPU nanoseconds per sent packet: all threads (tasks), each label,
	// whole machine from idle time (busy).
	TaskNsPerPkt float64            `json:"task_ns_per_pkt"`
	BusyNsPerPkt float64            `json:"busy_ns_per_pkt"`
	LabelNsPkt   map[string]float64 `json:"label_ns_per_pkt"`
	StealMs      float64            `json:"steal_ms"`

	// Relay cost: this run's figure minus that of its direct run.
	RelayTaskNsPerPkt *float64 `json:"relay_task_ns_per_pkt,omitempty"`
	RelayBusyNsPerPkt *float64 `json:"relay_busy_ns_per_pkt,omitempty"`

	// The XDP program's own run time per run (BPF stats), xdp only.
	ProgRuns     uint64   `json:"prog_runs,omitempty"`
	ProgNsPerRun *float64 `json:"prog_ns_per_run,omitempty"`
}

func (s *fwdStep) lossless() bool { return s.Sent > 0 && s.Lost <= 0 && s.SendErrors == 0 }

type fwdModeSummary struct {
	Mode string `json:"mode"`
	// Highest step without loss: offered and achieved pps.
	MaxLosslessOfferedPPS  int     `json:"max_lossless_offered_pps"`
	MaxLosslessAchievedPPS float64 `json:"max_lossless_achieved_pps"`
	// Median over the lossless steps of the relay cost per packet.
	RelayTaskNsPerPkt float64 `json:"relay_task_ns_per_pkt"`
	RelayBusyNsPerPkt float64 `json:"relay_busy_ns_per_pkt"`
	ProgNsPerRun      float64 `json:"prog_ns_per_run,omitempty"`
	Steps             int     `json:"lossless_steps"`
	// The same at the 100k pps step (DESIGN.md section 6 is at 100k pps),
	// mean of its two runs; 0 without a lossless 100k step.
	At100kTaskNsPerPkt float64 `json:"at_100k_relay_task_ns_per_pkt"`
	At100kBusyNsPerPkt float64 `json:"at_100k_relay_busy_ns_per_pkt"`
	At100kProgNsPerRun float64 `json:"at_100k_prog_ns_per_run,omitempty"`
	// MaxLosslessSenderLimited: the sender, not the relay, set the limit.
	MaxLosslessSenderLimited bool `json:"max_lossless_sender_limited"`
}

type fwdSummary struct {
	Modes []fwdModeSummary `json:"modes"`
	// XDP over kernel relay cost, both measured in this run.
	XDPOverKernelTasks float64 `json:"xdp_over_kernel_tasks,omitempty"`
	XDPOverKernelBusy  float64 `json:"xdp_over_kernel_busy,omitempty"`
	// The same at 100k pps.
	XDPOverKernelTasks100k float64 `json:"xdp_over_kernel_tasks_100k,omitempty"`
	XDPOverKernelBusy100k  float64 `json:"xdp_over_kernel_busy_100k,omitempty"`
	// Program share of the XDP relay cost (tasks).
	ProgramShare float64 `json:"program_share_of_xdp,omitempty"`
	// DESIGN.md section 6 on this hardware.
	Reference map[string]float64 `json:"reference"`
	Notes     []string           `json:"notes"`
}

type fwdReport struct {
	Config  map[string]any `json:"config"`
	Steps   []fwdStep      `json:"steps"`
	Summary fwdSummary     `json:"summary"`
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	for i := 1; i < len(s); i++ { // insertion sort: a handful of values
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// summarize derives the summary from the steps.
func summarize(steps []fwdStep, modes []string) fwdSummary {
	sum := fwdSummary{Reference: map[string]float64{
		"xdp_ns_per_pkt": refXDPns, "kernel_ns_per_pkt": refKernelNs, "program_ns_per_pkt": refProgramNs,
		"xdp_over_kernel": referenceRatio,
	}}
	for _, m := range modes {
		ms := fwdModeSummary{Mode: m}
		var task, busy, prog []float64
		n100 := 0
		for _, s := range steps {
			if s.Mode != m || !s.lossless() {
				continue
			}
			ms.Steps++
			if s.AchievedPPS > ms.MaxLosslessAchievedPPS {
				ms.MaxLosslessOfferedPPS, ms.MaxLosslessAchievedPPS = s.OfferedPPS, s.AchievedPPS
				ms.MaxLosslessSenderLimited = s.SenderLimited
			}
			if s.OfferedPPS == 100000 && s.RelayTaskNsPerPkt != nil {
				n100++
				ms.At100kTaskNsPerPkt += *s.RelayTaskNsPerPkt
				ms.At100kBusyNsPerPkt += *s.RelayBusyNsPerPkt
				if s.ProgNsPerRun != nil {
					ms.At100kProgNsPerRun += *s.ProgNsPerRun
				}
			}
			if s.RelayTaskNsPerPkt != nil {
				task = append(task, *s.RelayTaskNsPerPkt)
				busy = append(busy, *s.RelayBusyNsPerPkt)
			}
			if s.ProgNsPerRun != nil {
				prog = append(prog, *s.ProgNsPerRun)
			}
		}
		ms.RelayTaskNsPerPkt, ms.RelayBusyNsPerPkt = median(task), median(busy)
		if n100 > 0 {
			ms.At100kTaskNsPerPkt /= float64(n100)
			ms.At100kBusyNsPerPkt /= float64(n100)
			ms.At100kProgNsPerRun /= float64(n100)
		}
		if len(prog) > 0 {
			ms.ProgNsPerRun = median(prog)
		}
		sum.Modes = append(sum.Modes, ms)
	}
	var x, k *fwdModeSummary
	for i := range sum.Modes {
		switch sum.Modes[i].Mode {
		case "xdp":
			x = &sum.Modes[i]
		case "kernel":
			k = &sum.Modes[i]
		}
	}
	if x != nil && k != nil && x.At100kTaskNsPerPkt != 0 && k.At100kTaskNsPerPkt != 0 {
		sum.XDPOverKernelTasks100k = x.At100kTaskNsPerPkt / k.At100kTaskNsPerPkt
		sum.XDPOverKernelBusy100k = x.At100kBusyNsPerPkt / k.At100kBusyNsPerPkt
	}
	if x != nil && k != nil {
		sum.XDPOverKernelTasks = x.RelayTaskNsPerPkt / k.RelayTaskNsPerPkt
		sum.XDPOverKernelBusy = x.RelayBusyNsPerPkt / k.RelayBusyNsPerPkt
	}
	if x != nil && x.ProgNsPerRun > 0 {
		sum.ProgramShare = x.ProgNsPerRun / x.RelayTaskNsPerPkt
	}
	for _, m := range sum.Modes {
		if math.IsNaN(m.RelayTaskNsPerPkt) {
			sum.Notes = append(sum.Notes, fmt.Sprintf("%s: no lossless step, no CPU figure", m.Mode))
		}
	}
	// NaN does not encode as JSON.
	for i := range sum.Modes {
		m := &sum.Modes[i]
		m.RelayTaskNsPerPkt, m.RelayBusyNsPerPkt = zeroNaN(m.RelayTaskNsPerPkt), zeroNaN(m.RelayBusyNsPerPkt)
	}
	sum.XDPOverKernelTasks, sum.XDPOverKernelBusy = zeroNaN(sum.XDPOverKernelTasks), zeroNaN(sum.XDPOverKernelBusy)
	sum.ProgramShare = zeroNaN(sum.ProgramShare)
	sum.XDPOverKernelTasks100k, sum.XDPOverKernelBusy100k = zeroNaN(sum.XDPOverKernelTasks100k), zeroNaN(sum.XDPOverKernelBusy100k)
	return sum
}

func zeroNaN(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

func optf(p *float64, format string) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf(format, *p)
}

func (r *fwdReport) writeText(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "MODE\tSTREAMS\tOFFERED\tSENT_PPS\tACHIEVED\tLOSS%\tCPU_NS/PKT\t(sender\tsink\tksoftirqd\trelayd)\tBUSY_NS/PKT\tRELAY_NS/PKT_TASKS\tRELAY_NS/PKT_IDLE\tPROG_NS/RUN\t")
	for _, s := range r.Steps {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.3f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t\n",
			s.Mode, s.Streams, s.OfferedPPS, s.SentPPS, s.AchievedPPS, s.LossPct, s.TaskNsPerPkt,
			s.LabelNsPkt["sender"], s.LabelNsPkt["sink"], s.LabelNsPkt["ksoftirqd"], s.LabelNsPkt["relayd"],
			s.BusyNsPerPkt, optf(s.RelayTaskNsPerPkt, "%.0f"), optf(s.RelayBusyNsPerPkt, "%.0f"), optf(s.ProgNsPerRun, "%.0f"))
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "per mode (relay cost = mode minus the mean of its two direct runs; median over lossless steps):")
	for _, m := range r.Summary.Modes {
		lim := ""
		if m.MaxLosslessSenderLimited {
			lim = ", sender-limited"
		}
		fmt.Fprintf(w, "  %-6s max lossless %.0f pps achieved (%d offered%s); relay CPU median %.0f ns/pkt (tasks), %.0f (idle cross-check)",
			m.Mode, m.MaxLosslessAchievedPPS, m.MaxLosslessOfferedPPS, lim, m.RelayTaskNsPerPkt, m.RelayBusyNsPerPkt)
		if m.ProgNsPerRun > 0 {
			fmt.Fprintf(w, ", program %.0f ns/run", m.ProgNsPerRun)
		}
		if m.At100kTaskNsPerPkt != 0 {
			fmt.Fprintf(w, "; at 100k pps %.0f ns/pkt (tasks), %.0f (idle)", m.At100kTaskNsPerPkt, m.At100kBusyNsPerPkt)
			if m.At100kProgNsPerRun > 0 {
				fmt.Fprintf(w, ", program %.0f ns/run", m.At100kProgNsPerRun)
			}
		}
		fmt.Fprintln(w)
	}
	s := r.Summary
	if s.XDPOverKernelTasks != 0 {
		fmt.Fprintf(w, "xdp/kernel: %.2f (tasks), %.2f (idle) median over steps; %.2f (tasks), %.2f (idle) at 100k pps; reference %.2f (%d ns / %d ns)\n",
			s.XDPOverKernelTasks, s.XDPOverKernelBusy, s.XDPOverKernelTasks100k, s.XDPOverKernelBusy100k, referenceRatio, refXDPns, refKernelNs)
	}
	if s.ProgramShare != 0 {
		fmt.Fprintf(w, "program share of the xdp relay cost: %.2f; reference %.2f (%d ns / %d ns)\n",
			s.ProgramShare, float64(refProgramNs)/refXDPns, refProgramNs, refXDPns)
	}
	for _, n := range s.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}

func runFwdbench(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := parseFwdbench(args, out)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	progress := out
	if cfg.json {
		progress = io.Discard
	}
	rep, err := fwdbench(ctx, cfg, progress)
	if rep == nil {
		return err
	}
	if cfg.json {
		if jerr := json.NewEncoder(out).Encode(rep); jerr != nil {
			return errors.Join(err, jerr)
		}
		return err
	}
	rep.writeText(out)
	return err
}
