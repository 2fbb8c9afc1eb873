package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

const kmodHelp = `usage: voipgen kmodbench [flags]   (as root)

relayd's XDP data plane against the relay it replaces in the kernel:
rtpengine's kernel module (xt_RTPENGINE, Debian's rtpengine-kernel-dkms),
the same calls in one run. The module builds only for Debian 12's 6.1
kernel here, so --vm builds it for that kernel (lab/rtpengine,
BuildKernelModule) and runs this command again inside lab/vm's 6.1 guest
(qemu, TCG unless RELAYD_VM_ACCEL=kvm); without --vm it runs in the kernel
it is on, which must load --module.

In a namespace lab (caller, relay, callee), for each repetition, each relay
in turn with a fresh start:

  forward    no relay: the caller and the callee send to each other and the
             relay namespace routes them (ip_forward), the floor any
             in-kernel relay sits on
  rtpengine  Debian's rtpengine-daemon with --table=0 --no-fallback, the
             module loaded and the iptables rules of Debian's
             rtpengine-iptables-setup in the relay namespace (INPUT -p udp ->
             chain rtpengine -> RTPENGINE --id 0)
  xdp        relayd, dataplane.mode = xdp, its ng listener

The relays get the same ng calls (offer with the caller's SDP, answer with
the callee's): --calls calls, a G.711 20 ms stream each way (172-byte RTP,
100 pps a call), sent from each party's own socket (symmetric RTP) to the
port the rewritten SDP named. Each run sends --warmup first (rtpengine
kernelizes the streams, relayd locks the latched sources and moves them to
XDP) with other SSRCs, then --duration measured. Received streams are
analysed per stream (RFC 3550 loss and jitter, largest gap) from kernel
receive timestamps; relayed is the relay's own count (the module's table
counters from /proc/rtpengine/0/list, relayd's relayd_packets_total).

CPU per packet: /proc/stat of all the machine's CPUs over the measured
send, per packet received: softirq (where XDP and the module forward on
veth), system, and busy (all but idle), the same method for every relay;
and the relay process's own time (utime+stime of rtpengine or relayd).
Tick-sampled (CONFIG_IRQ_TIME_ACCOUNTING is off in Debian's kernel), 10 ms
units. The sender and the receivers are the same in every run, so the
differences between the relays are the relays'. Under TCG instruction
costs are distorted: the ratio is indicative only.

flags:
`

// KmodConfig configures voipgen kmodbench.
type KmodConfig struct {
	Calls    int
	Duration time.Duration
	Warmup   time.Duration
	Repeat   int
	Module   string // xt_RTPENGINE.ko to insmod (unless loaded)
	Relayd   string
	Relays   []string
	// Label says where it ran ("TCG emulation", "KVM", "native"), for
	// the report's heading.
	Label string
	VM    bool // build the module and run in lab/vm's Debian guest
	CPUs  int  // guest vCPUs with VM
	Out   string
	JSON  bool
	// Progress gets the run's progress lines.
	Progress io.Writer
	// args are the flags as given, for the guest's command line.
	args []string
}

const (
	kmodForward   = "forward"
	kmodRtpengine = "rtpengine"
	kmodXDP       = "xdp"
)

// ParseKmod parses voipgen kmodbench's flags.
func ParseKmod(args []string, out io.Writer) (KmodConfig, error) {
	fs := flag.NewFlagSet("kmodbench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, kmodHelp); fs.PrintDefaults() }
	c := KmodConfig{}
	fs.IntVar(&c.Calls, "calls", 5, "concurrent calls (a stream each way, 100 pps a call)")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "measured send per run")
	fs.DurationVar(&c.Warmup, "warmup", 2*time.Second, "send before the measured part of each run")
	fs.IntVar(&c.Repeat, "repeat", 3, "repetitions (each runs every relay once)")
	fs.StringVar(&c.Module, "module", "", "xt_RTPENGINE.ko to load (without --vm; not needed when loaded)")
	fs.StringVar(&c.Relayd, "relayd", "", "relayd binary (default: relayd next to voipgen, else go build)")
	fs.StringVar(&c.Label, "label", "", "where it runs, for the report (default: native, or the VM's accelerator)")
	fs.BoolVar(&c.VM, "vm", false, "build the module for Debian's kernel and run in lab/vm's guest (qemu)")
	fs.IntVar(&c.CPUs, "vm-cpus", 1, "guest vCPUs with --vm")
	fs.StringVar(&c.Out, "out", "", "write the report as JSON to this file")
	fs.BoolVar(&c.JSON, "json", false, "print the report as JSON")
	relays := fs.String("relays", "forward,rtpengine,xdp", "relays to run: forward, rtpengine, xdp")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, r := range splitList(*relays) {
		switch r {
		case kmodForward, kmodRtpengine, kmodXDP:
			if !slices.Contains(c.Relays, r) {
				c.Relays = append(c.Relays, r)
			}
		default:
			return c, fmt.Errorf("--relays: unknown relay %q (want forward, rtpengine, xdp)", r)
		}
	}
	switch {
	case len(c.Relays) == 0:
		return c, errors.New("--relays: none")
	case c.Calls < 1 || c.Calls > 2000:
		return c, fmt.Errorf("--calls %d: want 1-2000", c.Calls)
	case c.Duration < time.Second:
		return c, fmt.Errorf("--duration %v: need at least 1s", c.Duration)
	case c.Warmup < 500*time.Millisecond:
		return c, fmt.Errorf("--warmup %v: need at least 500ms", c.Warmup)
	case c.Repeat < 1 || c.Repeat > 20:
		return c, fmt.Errorf("--repeat %d: want 1-20", c.Repeat)
	case c.CPUs < 1 || c.CPUs > 8:
		return c, fmt.Errorf("--vm-cpus %d: want 1-8", c.CPUs)
	}
	c.args = args
	return c, nil
}

// KmodRun is one relay's run.
type KmodRun struct {
	Relay      string `json:"relay"`
	Repetition int    `json:"repetition"`
	Calls      int    `json:"calls"`
	Sent       uint64 `json:"sent"`     // RTP packets sent in the measured part
	Received   uint64 `json:"received"` // of the whole streams (warm-up included)
	Lost       int64  `json:"lost"`     // RFC 3550, summed over the streams
	// Relayed is the relay's own count over the measured part: the
	// module's table counters, relayd's forwarded packets; -1 for
	// forward.
	Relayed int64 `json:"relayed"`
	// RelayErrors: the module's error counter, relayd's drops.
	RelayErrors int64 `json:"relay_errors"`
	// VethDrops and SocketDrops are the lab's drops outside the relays
	// over the run: the veths' rx and tx dropped (a full queue or XDP
	// ring), the parties' UDP receive buffer errors.
	VethDrops   int64 `json:"veth_drops"`
	SocketDrops int64 `json:"socket_drops"`
	// RelayedUserspace is the part of Relayed that relayd's userspace
	// forwarded (latching, punts), -1 for the others.
	RelayedUserspace int64 `json:"relayed_userspace"`
	// SentAll and Expected count the whole streams, warm-up included,
	// as Received and Lost do.
	SentAll uint64 `json:"sent_all"`
	// IdlePct is the CPUs' idle share over the measured send: near 0
	// the machine was saturated and busy ns/pkt is the elapsed time.
	IdlePct float64 `json:"idle_pct"`
	// ProcessIdlePct is the relay process's CPU share over 2 s with its
	// calls set up and no media, before the run's send.
	ProcessIdlePct float64 `json:"process_idle_pct"`
	// Jitter over the streams (RFC 3550, ms): median and largest; the
	// largest gap between two packets of a stream.
	JitterP50Ms float64 `json:"jitter_p50_ms"`
	JitterMaxMs float64 `json:"jitter_max_ms"`
	MaxGapMs    float64 `json:"max_gap_ms"`
	// CPU per packet received, ns: /proc/stat softirq, system, and
	// everything but idle, over all CPUs; the relay process's own.
	SoftirqNs  float64 `json:"softirq_ns_per_pkt"`
	SystemNs   float64 `json:"system_ns_per_pkt"`
	BusyNs     float64 `json:"busy_ns_per_pkt"`
	ProcessNs  float64 `json:"process_ns_per_pkt"`
	ElapsedS   float64 `json:"elapsed_s"`
	SendErrors uint64  `json:"send_errors"`
	// Kernelized counts rtpengine's "Kernelizing media stream" log
	// lines in the run.
	Kernelized int    `json:"kernelized,omitempty"`
	Error      string `json:"error,omitempty"`
}

// KmodRow is a relay's summary over the repetitions: medians, and the
// spread (min-max) of the CPU figures.
type KmodRow struct {
	Relay                    string
	Runs                     int
	SentAll, Received        uint64
	Lost                     int64 // summed over the runs
	RelayedP50               float64
	JitterP50Ms, JitterMaxMs float64 // medians of the runs' figures
	MaxGapMs                 float64 // the largest of the runs
	SoftirqNs, SystemNs      Spread
	BusyNs, ProcessNs        Spread
}

// Spread is a median and the range of a figure over the repetitions.
type Spread struct {
	P50, Min, Max float64
}

func spreadOf(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return Spread{P50: median(s), Min: s[0], Max: s[len(s)-1]}
}

func (s Spread) String() string {
	return fmt.Sprintf("%.0f (%.0f-%.0f)", s.P50, s.Min, s.Max)
}

// KmodReport is voipgen kmodbench's report.
type KmodReport struct {
	Label    string    `json:"label"`
	Kernel   string    `json:"kernel"`
	CPUs     int       `json:"cpus"`
	Module   string    `json:"module,omitempty"` // the module's version
	Daemon   string    `json:"rtpengine,omitempty"`
	Calls    int       `json:"calls"`
	Duration float64   `json:"duration_s"`
	Runs     []KmodRun `json:"runs"`
	Notes    []string  `json:"notes,omitempty"`
}

// Rows summarises the runs per relay, in the order they ran.
func (r *KmodReport) Rows() []KmodRow {
	var order []string
	by := map[string][]KmodRun{}
	for _, run := range r.Runs {
		if run.Error != "" {
			continue
		}
		if _, ok := by[run.Relay]; !ok {
			order = append(order, run.Relay)
		}
		by[run.Relay] = append(by[run.Relay], run)
	}
	var rows []KmodRow
	for _, name := range order {
		runs := by[name]
		row := KmodRow{Relay: name, Runs: len(runs)}
		var soft, sys, busy, proc, relayed, jit, jmax []float64
		for _, x := range runs {
			row.SentAll += x.SentAll
			row.Received += x.Received
			row.Lost += x.Lost
			row.MaxGapMs = max(row.MaxGapMs, x.MaxGapMs)
			soft, sys, busy, proc = append(soft, x.SoftirqNs), append(sys, x.SystemNs), append(busy, x.BusyNs), append(proc, x.ProcessNs)
			relayed = append(relayed, float64(x.Relayed))
			jit, jmax = append(jit, x.JitterP50Ms), append(jmax, x.JitterMaxMs)
		}
		row.SoftirqNs, row.SystemNs, row.BusyNs, row.ProcessNs = spreadOf(soft), spreadOf(sys), spreadOf(busy), spreadOf(proc)
		row.RelayedP50 = spreadOf(relayed).P50
		row.JitterP50Ms, row.JitterMaxMs = spreadOf(jit).P50, spreadOf(jmax).P50
		rows = append(rows, row)
	}
	return rows
}

// Ratio returns a's median over b's of the figure f, 0 when either is
// missing.
func kmodRatio(rows []KmodRow, a, b string, f func(KmodRow) float64) float64 {
	var x, y float64
	for _, r := range rows {
		switch r.Relay {
		case a:
			x = f(r)
		case b:
			y = f(r)
		}
	}
	if x == 0 || y == 0 {
		return 0
	}
	return x / y
}

// WriteText prints the report: the functional side by side and the CPU
// figures, labelled with where they were measured.
func (r *KmodReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "kmodbench: %d calls (%d streams, %d pps), %v measured per run, kernel %s, %d CPU(s), measured under %s\n",
		r.Calls, 2*r.Calls, 100*r.Calls, time.Duration(r.Duration*float64(time.Second)), r.Kernel, r.CPUs, r.Label)
	if r.Module != "" || r.Daemon != "" {
		fmt.Fprintf(w, "rtpengine %s, module %s\n", r.Daemon, r.Module)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\nRuns:")
	fmt.Fprintln(tw, "rep\trelay\tsent (all)\treceived (all)\tlost\tsent (measured)\trelayed\tof it userspace\trelay errors\tveth drops\tsocket drops\tjitter p50/max ms\tmax gap ms\t"+
		"softirq ns/pkt\tsystem ns/pkt\tbusy ns/pkt\tidle %\tprocess ns/pkt\tprocess idle %\tkernelized\terror\t")
	for _, x := range r.Runs {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.2f/%.2f\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%d\t%s\t\n", x.Repetition, x.Relay, x.SentAll, x.Received, x.Lost,
			x.Sent, x.Relayed, x.RelayedUserspace, x.RelayErrors, x.VethDrops, x.SocketDrops, x.JitterP50Ms, x.JitterMaxMs, x.MaxGapMs, x.SoftirqNs, x.SystemNs, x.BusyNs, x.IdlePct, x.ProcessNs, x.ProcessIdlePct, x.Kernelized, x.Error)
	}
	tw.Flush()
	rows := r.Rows()
	fmt.Fprintf(w, "\nPer relay (median of %d repetitions, (min-max)), measured under %s:\n", r.repetitions(), r.Label)
	fmt.Fprintln(tw, "relay\truns\tsent (all)\treceived\tlost\trelayed p50\tjitter p50/max ms\tmax gap ms\tsoftirq ns/pkt\tsystem ns/pkt\tbusy ns/pkt\tprocess ns/pkt\t")
	for _, x := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.0f\t%.2f/%.2f\t%.1f\t%s\t%s\t%s\t%s\t\n", x.Relay, x.Runs, x.SentAll, x.Received, x.Lost, x.RelayedP50,
			x.JitterP50Ms, x.JitterMaxMs, x.MaxGapMs, x.SoftirqNs, x.SystemNs, x.BusyNs, x.ProcessNs)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nRatios, same run (medians), measured under %s:\n", r.Label)
	for _, q := range []struct {
		name string
		f    func(KmodRow) float64
	}{
		{"softirq", func(x KmodRow) float64 { return x.SoftirqNs.P50 }},
		{"busy", func(x KmodRow) float64 { return x.BusyNs.P50 }},
	} {
		if v := kmodRatio(rows, kmodXDP, kmodRtpengine, q.f); v != 0 {
			fmt.Fprintf(w, "  xdp / rtpengine module (%s): %.2f\n", q.name, v)
		}
		if v := kmodRatio(rows, kmodXDP, kmodForward, q.f); v != 0 {
			fmt.Fprintf(w, "  xdp / forward (%s): %.2f\n", q.name, v)
		}
		if v := kmodRatio(rows, kmodRtpengine, kmodForward, q.f); v != 0 {
			fmt.Fprintf(w, "  rtpengine module / forward (%s): %.2f\n", q.name, v)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func (r *KmodReport) repetitions() int {
	n := 0
	for _, x := range r.Runs {
		n = max(n, x.Repetition)
	}
	return n
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(strings.ToLower(f)); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// udpRcvbufErrors returns the Udp: RcvbufErrors of /proc/net/snmp.
func udpRcvbufErrors(snmp string) (uint64, error) {
	var names []string
	for _, line := range strings.Split(snmp, "\n") {
		rest, ok := strings.CutPrefix(line, "Udp: ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == "RcvbufErrors" && i < len(f) {
				return strconv.ParseUint(f[i], 10, 64)
			}
		}
	}
	return 0, errors.New("no Udp: RcvbufErrors")
}
