package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

const soakHelp = `usage: voipgen soak [flags]   (as root)

The soak: relayd with its XDP data plane in a lab of network namespaces
(caller, relay, callee, attacker) carries --calls SIP calls with media for
--duration under a background of attacks, and must come out of it as it
went in.

 - The calls: voipgen call in the caller namespace places them through
   relayd's B2BUA (one route, allow = the caller's address only) to voipgen
   answer in the callee namespace, signalling only (INVITE, 200 with SDP,
   ACK; BYE at the end). Each call is a G.711 20 ms stream each way (50 pps,
   172-byte RTP) between the addresses its SDP named, sent by the bench's
   paced sender (one thread, sendmmsg) and counted by its sink (one thread
   per socket): no goroutine per call. The sender runs in chunks (--chunk),
   each with an SSRC tag of its own, and the sink's count of each chunk is
   compared with what was sent, per direction.
 - Spoofed media, through the XDP program (a raw socket in the caller
   namespace, sources forged in the caller's subnet, the caller's own
   address with another port included): RTP-shaped packets and random
   bytes of random length, half to the calls' relay ports, half to random
   ports of relayd's range (mostly not allocated). --attack-pps in all.
   None may reach a call's end: they carry an SSRC tag of their own, and
   the sink counts what arrives with it.
 - SIP from a stranger (the attacker namespace, 198.18.4.2, outside the
   route's allow list): an INVITE flood (--invite-rate, never ACKed), and
   malformed SIP (--sip-garbage-rate): random bytes, torture messages with
   random edits, INVITEs whose Via is noise, seeded (--seed) as the SIP
   server's torture test does (internal/siptorture). Answers are counted
   at the stranger's sockets (its own ports and 5060, where a Via without
   a port sends them). No stranger's INVITE may reach the answerer.
 - relayd is sampled every --sample from its /metrics: go_gc_heap_live_bytes
   (the heap the last GC found live: the heap after GC, without forcing a
   collection; the runtime collects at least every two minutes) and
   go_goroutines, its process start time and its pid.

Goals (exit status 1 when one fails):
 - no media lost either way (received = sent for every chunk), no attack
   packet delivered to a call's end, every call up at the start and still
   held at the end, no stranger's call answered;
 - heap after GC grown by at most --heap-tolerance between the window
   that starts at --baseline and the one that ends the run (each a third
   of what follows the baseline, at most two minutes): each window's
   figure is the median go_gc_heap_live_bytes of the GCs that ended in it
   (at least one each). What a GC finds live includes what was in flight
   while it marked, which under the flood swings by a half from one GC to
   the next: over two runs of 10 minutes the median of two-minute windows
   moved by 3% at most, their mean by 4%, their least value by 15%, a
   one-minute window's mean by 6%. A heap that shrank passes;
 - goroutines constant: the median of each window's samples within
   --goroutine-tolerance of each other (a starved relayd briefly holds
   hundreds: a mean would count a burst as a change of level);
 - relayd never restarted nor crashed (one pid, one start time, answering
   at every sample, no panic in its log).

flags:
`

// SoakConfig configures voipgen soak.
type SoakConfig struct {
	Calls          int
	Duration       time.Duration
	Baseline       time.Duration // when the heap and goroutine reference window starts
	Sample         time.Duration
	Chunk          time.Duration
	AttackPPS      int
	InviteRate     int
	SIPGarbageRate int
	Seed           uint64
	HeapTolerance  float64 // relative
	GoroutineTol   int     // absolute
	Relayd         string
	TortureDir     string
	JSON           bool
	Out            string // report file (JSON), or ""
	Progress       io.Writer
}

// ParseSoak parses voipgen soak's flags.
func ParseSoak(args []string, out io.Writer) (SoakConfig, error) {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, soakHelp); fs.PrintDefaults() }
	c := SoakConfig{}
	fs.IntVar(&c.Calls, "calls", 1000, "concurrent SIP calls with media, held for the whole run")
	fs.DurationVar(&c.Duration, "duration", 10*time.Minute, "how long the media and the attacks run")
	fs.DurationVar(&c.Baseline, "baseline", 2*time.Minute, "start of the heap and goroutine reference window (after warm-up)")
	fs.DurationVar(&c.Sample, "sample", 2*time.Second, "how often relayd's metrics are sampled")
	fs.DurationVar(&c.Chunk, "chunk", 10*time.Second, "media chunk: the unit the sink counts by (an SSRC tag each)")
	fs.IntVar(&c.AttackPPS, "attack-pps", 2000, "spoofed RTP and garbage UDP toward relayd's media ports, packets per second (0: none)")
	fs.IntVar(&c.InviteRate, "invite-rate", 20, "INVITEs per second from a stranger outside the allow list (0: none)")
	fs.IntVar(&c.SIPGarbageRate, "sip-garbage-rate", 100, "malformed SIP datagrams per second from the stranger (0: none)")
	fs.Uint64Var(&c.Seed, "seed", 0, "seed of the attacks' randomness (0: a random one, printed)")
	fs.Float64Var(&c.HeapTolerance, "heap-tolerance", 0.05, "the most the heap after GC (the median over a window's GCs) may grow between the two windows, relative")
	fs.IntVar(&c.GoroutineTol, "goroutine-tolerance", 10, "the most the median goroutine count may differ between the two windows")
	fs.StringVar(&c.Relayd, "relayd", "", "relayd binary (default: relayd next to voipgen, else go build)")
	fs.StringVar(&c.TortureDir, "torture-dir", "", "torture messages (default: control/sip/testdata/torture above the working directory)")
	fs.BoolVar(&c.JSON, "json", false, "print the report as JSON")
	fs.StringVar(&c.Out, "out", "", "also write the report as JSON to this file")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return c, c.validate()
}

func (c *SoakConfig) validate() error {
	switch {
	case c.Calls < 1 || c.Calls > benchMaxStaticCalls:
		return fmt.Errorf("--calls %d: want 1-%d", c.Calls, benchMaxStaticCalls)
	case c.Chunk < time.Second:
		return fmt.Errorf("--chunk %v: need at least 1s", c.Chunk)
	case c.Sample < time.Second:
		return fmt.Errorf("--sample %v: need at least 1s", c.Sample)
	case c.Baseline < c.Sample:
		return fmt.Errorf("--baseline %v: need at least one sample (--sample %v) before it", c.Baseline, c.Sample)
	case c.Duration < c.Baseline+3*c.Sample:
		return fmt.Errorf("--duration %v: need --baseline and three samples more", c.Duration)
	case c.Duration/c.Chunk > soakMaxChunks:
		return fmt.Errorf("--duration %v in --chunk %v: more than %d chunks (SSRC tags)", c.Duration, c.Chunk, soakMaxChunks)
	case c.AttackPPS < 0 || c.InviteRate < 0 || c.SIPGarbageRate < 0:
		return errors.New("attack rates must not be negative")
	case c.HeapTolerance <= 0 || c.GoroutineTol < 0:
		return errors.New("tolerances must be positive")
	}
	return nil
}

// window is how long each of the two comparison windows lasts.
func (c *SoakConfig) window() time.Duration {
	return min(2*time.Minute, (c.Duration-c.Baseline)/3)
}

const (
	// soakMaxChunks keeps the chunks' SSRC tags (1..) below the ones the
	// sink must never see from a call: soakAttackTag and fwdTranscodeTag.
	soakMaxChunks = 200
	// soakAttackTag is the SSRC tag (bits 16-23) of every spoofed packet,
	// its bits 0-15 0xffff, no stream's: the sink counts what relayd
	// delivers of them.
	soakAttackTag = 0xfd
)

// Soak runs voipgen soak.
func Soak(ctx context.Context, cfg SoakConfig) (*SoakReport, error) {
	if soakRun == nil {
		return nil, errors.New("voipgen soak runs on Linux only")
	}
	return soakRun(ctx, cfg)
}

var soakRun func(context.Context, SoakConfig) (*SoakReport, error)

// SoakReport is what voipgen soak prints.
type SoakReport struct {
	Config   map[string]any   `json:"config"`
	Seed     uint64           `json:"seed"`
	Calls    SoakCalls        `json:"calls"`
	Media    [2]SoakDirection `json:"media"` // caller -> callee, callee -> caller
	Chunks   []SoakChunk      `json:"chunks"`
	Samples  []SoakSample     `json:"samples"`
	Heap     SoakCompare      `json:"heap_live_bytes"`
	Gorout   SoakCompare      `json:"goroutines"`
	Attack   SoakAttack       `json:"attack"`
	SIP      SoakSIP          `json:"sip"`
	Relayd   SoakRelayd       `json:"relayd"`
	ElapsedS float64          `json:"elapsed_s"`
	Problems []string         `json:"problems"`
	Pass     bool             `json:"pass"`
}

// SoakCalls are the legitimate calls.
type SoakCalls struct {
	Placed   int     `json:"placed"`
	Up       int     `json:"up"`       // answered (200 with SDP) at the start
	SetupS   float64 `json:"setup_s"`  // all of them
	HeldEnd  int     `json:"held_end"` // relayd's calls at the end
	Answered int64   `json:"answered"` // INVITEs the answerer took: the calls, and strangers' if any got through
	HungUp   int     `json:"hung_up"`  // calls that ended with a BYE from the caller
	Failures string  `json:"failures,omitempty"`
}

// SoakDirection is one direction's media over the whole run.
type SoakDirection struct {
	Name     string `json:"name"`
	Sent     uint64 `json:"sent"`
	Received uint64 `json:"received"`
	Lost     int64  `json:"lost"`
	// ChunksWithLoss are the chunks where received != sent.
	ChunksWithLoss int `json:"chunks_with_loss"`
	// LabDropped is what the lab's own counters saw lost outside relayd
	// in this direction (labDropKeys): a sender's veth ring full, the
	// relay's egress ring full, the sink's socket full. On a busy machine
	// these are where the softirqs ran late.
	LabDropped uint64 `json:"lab_dropped"`
	// LabDrops is LabDropped by counter.
	LabDrops map[string]uint64 `json:"lab_drops,omitempty"`
	// Nominal is what the calls' streams would have sent in this
	// direction at their rate over the run; Sent falls short of it when
	// the sender's thread got the CPU late.
	Nominal uint64 `json:"nominal"`
}

// SoakChunk is one chunk of media.
type SoakChunk struct {
	StartS   float64   `json:"start_s"`
	Tag      uint8     `json:"tag"`
	Sent     [2]uint64 `json:"sent"`
	Received [2]uint64 `json:"received"`
	ElapsedS float64   `json:"elapsed_s"`
}

// SoakSample is one sample of relayd's metrics.
type SoakSample struct {
	T          float64 `json:"t_s"`
	HeapLive   float64 `json:"heap_live_bytes"`
	HeapInuse  float64 `json:"heap_inuse_bytes"`
	Goroutines float64 `json:"goroutines"`
	GCs        float64 `json:"gc_cycles"`
	RSS        float64 `json:"rss_bytes"`
	Start      float64 `json:"process_start_time"`
	Pid        int     `json:"pid"`
	Error      string  `json:"error,omitempty"`
}

// SoakCompare compares a figure between the reference window (after
// the baseline) and the end window.
type SoakCompare struct {
	BaseFromS float64 `json:"base_from_s"`
	BaseToS   float64 `json:"base_to_s"`
	EndFromS  float64 `json:"end_from_s"`
	EndToS    float64 `json:"end_to_s"`
	// For the heap: the distinct GCs seen in each window; for goroutines
	// the samples.
	BaseN int `json:"base_n"`
	EndN  int `json:"end_n"`
	// Base and End are the compared figures, the medians.
	Base      float64 `json:"base"`
	End       float64 `json:"end"`
	BaseMean  float64 `json:"base_mean"`
	EndMean   float64 `json:"end_mean"`
	BaseMed   float64 `json:"base_median"`
	EndMed    float64 `json:"end_median"`
	BaseMin   float64 `json:"base_min"`
	BaseMax   float64 `json:"base_max"`
	EndMin    float64 `json:"end_min"`
	EndMax    float64 `json:"end_max"`
	Ratio     float64 `json:"ratio"` // end / base
	Tolerance float64 `json:"tolerance"`
	Pass      bool    `json:"pass"`
}

// SoakAttack is the spoofed media.
type SoakAttack struct {
	RTPAllocated     uint64 `json:"rtp_to_call_ports"`
	RTPRandom        uint64 `json:"rtp_to_random_ports"`
	GarbageAllocated uint64 `json:"garbage_to_call_ports"`
	GarbageRandom    uint64 `json:"garbage_to_random_ports"`
	SendErrors       uint64 `json:"send_errors"`
	// Delivered is what the calls' ends received of it: must be 0.
	Delivered uint64 `json:"delivered"`
	// RelaydDrops are relayd's drops over the run, by reason.
	RelaydDrops map[string]uint64 `json:"relayd_drops"`
	// RelaydForwarded is relayd's forwarded packets over the run, and
	// RelaydUserspace the part its userspace workers forwarded.
	RelaydForwarded uint64 `json:"relayd_forwarded"`
	RelaydUserspace uint64 `json:"relayd_userspace"`
}

func (a SoakAttack) sent() uint64 {
	return a.RTPAllocated + a.RTPRandom + a.GarbageAllocated + a.GarbageRandom
}

// SoakSIP is the stranger's SIP.
type SoakSIP struct {
	Invites         uint64            `json:"invites_sent"`
	InvitesAnswered int               `json:"invites_answered"` // distinct Call-IDs with a response
	InviteAnswers   map[string]uint64 `json:"invite_answers"`   // responses by status code, retransmissions included
	Garbage         uint64            `json:"garbage_sent"`
	GarbageAnswers  map[string]uint64 `json:"garbage_answers"` // responses by status code
	Unparsed        uint64            `json:"unparsed_answers"`
	// From relayd's metrics, over the run.
	RelaydMalformed float64            `json:"relayd_malformed"`
	RelaydRefused   map[string]float64 `json:"relayd_refused"`
	TortureMessages int                `json:"torture_messages"`
}

// SoakRelayd is what became of relayd.
type SoakRelayd struct {
	Pid      int    `json:"pid"`
	Restarts int    `json:"restarts"` // start times seen, minus one
	Exited   bool   `json:"exited"`
	Failed   int    `json:"failed_samples"`
	Panic    string `json:"panic,omitempty"`
}

// windowStats returns the mean, median, least and greatest of value over
// the samples in [from, to], one value per key (nil: per sample), and how
// many keys there were.
func windowStats(samples []SoakSample, from, to float64, value, key func(SoakSample) float64) (mean, med, lo, hi float64, n int) {
	seen := map[float64]float64{}
	for _, s := range samples {
		if s.Error != "" || s.T < from || s.T > to {
			continue
		}
		k := s.T
		if key != nil {
			k = key(s)
		}
		seen[k] = value(s)
	}
	if len(seen) == 0 {
		return 0, 0, 0, 0, 0
	}
	vs := slices.Sorted(maps.Values(seen))
	for _, v := range vs {
		mean += v
	}
	n = len(vs)
	med = vs[n/2]
	if n%2 == 0 {
		med = (vs[n/2-1] + vs[n/2]) / 2
	}
	return mean / float64(n), med, vs[0], vs[n-1], n
}

// compareWindows compares value between the reference window [b, b+w]
// and the end window [end-w, end], by the median or the mean; within says
// whether the two figures are close enough.
func compareWindows(base, last []SoakSample, b, w, end float64, value, key func(SoakSample) float64, median bool, within func(base, end float64) bool) SoakCompare {
	c := SoakCompare{BaseFromS: b, BaseToS: b + w, EndFromS: end - w, EndToS: end}
	c.BaseMean, c.BaseMed, c.BaseMin, c.BaseMax, c.BaseN = windowStats(base, b, b+w, value, key)
	c.EndMean, c.EndMed, c.EndMin, c.EndMax, c.EndN = windowStats(last, end-w, end, value, key)
	c.Base, c.End = c.BaseMean, c.EndMean
	if median {
		c.Base, c.End = c.BaseMed, c.EndMed
	}
	if c.Base > 0 {
		c.Ratio = c.End / c.Base
	}
	c.Pass = c.BaseN > 0 && c.EndN > 0 && within(c.Base, c.End)
	return c
}

// judge compares the samples and sets Problems and Pass.
func (r *SoakReport) judge(cfg SoakConfig, elapsed time.Duration) {
	end := elapsed.Seconds()
	w := cfg.window().Seconds()
	b := cfg.Baseline.Seconds()
	// The live heap changes only when a GC ends: a window's values are
	// one per GC that ended in it (keyed by the GC count), and its figure
	// is their median. What a GC finds live includes what was in flight
	// while it marked (SIP transactions, packets being parsed, the
	// sweeps' lists of every flow), which under a flood swings by a half
	// from one GC to the next; the median of a few dozen GCs holds still
	// where their mean is pulled by the high ones and their least by one
	// low one (see soakHelp).
	live := func(s SoakSample) float64 { return s.HeapLive }
	gcs := func(s SoakSample) float64 { return s.GCs }
	r.Heap = compareWindows(r.gcSamples(b, b+w), r.gcSamples(end-w, end), b, w, end, live, gcs, true,
		func(base, e float64) bool { return e/base-1 <= cfg.HeapTolerance })
	r.Heap.Tolerance = cfg.HeapTolerance
	// Goroutines by the median of the samples too: a starved relayd
	// briefly holds hundreds (SIP transactions waiting their turn), which
	// a mean would count as a change of level.
	r.Gorout = compareWindows(r.Samples, r.Samples, b, w, end, func(s SoakSample) float64 { return s.Goroutines }, nil, true,
		func(base, e float64) bool { return math.Abs(e-base) <= float64(cfg.GoroutineTol) })
	r.Gorout.Tolerance = float64(cfg.GoroutineTol)

	// relayd is one process from start to end: one pid, one start time,
	// and it answered every sample.
	starts := map[float64]bool{}
	r.Relayd.Restarts, r.Relayd.Failed = 0, 0
	for _, s := range r.Samples {
		if s.Error != "" {
			r.Relayd.Failed++
			continue
		}
		starts[s.Start] = true
		if s.Pid != r.Relayd.Pid {
			r.Relayd.Restarts++
		}
	}
	r.Relayd.Restarts += max(0, len(starts)-1)

	var p []string
	for _, d := range r.Media {
		if d.Sent == 0 {
			p = append(p, fmt.Sprintf("%s: no media sent", d.Name))
		}
		if d.Lost != 0 || d.ChunksWithLoss > 0 {
			p = append(p, fmt.Sprintf("%s: %d of %d packets lost (%d chunks of %d with loss)", d.Name, d.Lost, d.Sent, d.ChunksWithLoss, len(r.Chunks)))
		}
	}
	if r.Calls.Up != r.Calls.Placed || r.Calls.Placed != cfg.Calls {
		p = append(p, fmt.Sprintf("%d of %d calls up", r.Calls.Up, cfg.Calls))
	}
	if r.Calls.HeldEnd != r.Calls.Up {
		p = append(p, fmt.Sprintf("relayd held %d calls at the end, %d were up", r.Calls.HeldEnd, r.Calls.Up))
	}
	if r.Calls.Answered != int64(r.Calls.Up) {
		p = append(p, fmt.Sprintf("the answerer took %d INVITEs for %d calls: a stranger's got through", r.Calls.Answered, r.Calls.Up))
	}
	if r.Attack.Delivered > 0 {
		p = append(p, fmt.Sprintf("%d spoofed packets reached a call's end", r.Attack.Delivered))
	}
	if n := r.SIP.InviteAnswers["200"]; n > 0 {
		p = append(p, fmt.Sprintf("%d of the stranger's INVITEs answered 200", n))
	}
	if cfg.InviteRate > 0 && r.SIP.InvitesAnswered == 0 {
		p = append(p, "no INVITE of the stranger answered (want 403)")
	}
	if !r.Heap.Pass {
		switch {
		case r.Heap.BaseN == 0 || r.Heap.EndN == 0:
			p = append(p, fmt.Sprintf("heap after GC not measured: %d GCs in the reference window, %d in the end window", r.Heap.BaseN, r.Heap.EndN))
		default:
			p = append(p, fmt.Sprintf("heap after GC %.0f -> %.0f bytes (x%.3f): grew more than %.0f%%", r.Heap.Base, r.Heap.End, r.Heap.Ratio, 100*cfg.HeapTolerance))
		}
	}
	if !r.Gorout.Pass {
		p = append(p, fmt.Sprintf("goroutines %.1f -> %.1f (median of each window), more than %d apart", r.Gorout.Base, r.Gorout.End, cfg.GoroutineTol))
	}
	if r.Relayd.Restarts > 0 || r.Relayd.Exited || r.Relayd.Failed > 0 || r.Relayd.Panic != "" {
		p = append(p, fmt.Sprintf("relayd: %d restarts, exited %v, %d samples failed, panic %q", r.Relayd.Restarts, r.Relayd.Exited, r.Relayd.Failed, r.Relayd.Panic))
	}
	r.Problems, r.Pass = p, len(p) == 0
}

// gcSamples returns the samples whose GC ended in [from, to]: those
// whose GC count is above the count of the last sample before from.
func (r *SoakReport) gcSamples(from, to float64) []SoakSample {
	before := -1.0
	var out []SoakSample
	for _, s := range r.Samples {
		if s.Error != "" {
			continue
		}
		if s.T < from {
			before = s.GCs
			continue
		}
		if s.T <= to && s.GCs > before {
			out = append(out, s)
		}
	}
	return out
}

// WriteText prints the report.
func (r *SoakReport) WriteText(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "soak: %v calls for %v through relayd's XDP, seed %d, %.0f s in all\n", r.Config["calls"], r.Config["duration"], r.Seed, r.ElapsedS)
	fmt.Fprintf(w, "calls: %d placed, %d up in %.1f s, %d held by relayd at the end, %d INVITEs reached the answerer, %d hung up\n",
		r.Calls.Placed, r.Calls.Up, r.Calls.SetupS, r.Calls.HeldEnd, r.Calls.Answered, r.Calls.HungUp)
	if r.Calls.Failures != "" {
		fmt.Fprintf(w, "  first call failure: %s\n", r.Calls.Failures)
	}
	fmt.Fprintln(w, "media (the paced sender -> relayd XDP -> the sink):")
	fmt.Fprintln(tw, "direction\tsent\tof nominal\treceived\tlost\tchunks with loss\tof it dropped by the lab (veth rings, sink)\t")
	for _, d := range r.Media {
		pct := 0.0
		if d.Nominal > 0 {
			pct = 100 * float64(d.Sent) / float64(d.Nominal)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%d\t%d\t%d of %d\t%d\t\n", d.Name, d.Sent, pct, d.Received, d.Lost, d.ChunksWithLoss, len(r.Chunks), d.LabDropped)
	}
	tw.Flush()
	for _, d := range r.Media {
		if len(d.LabDrops) > 0 {
			fmt.Fprintf(w, "  %s, the lab's drops: %s\n", d.Name, fmtCounts(d.LabDrops))
		}
	}
	h := r.Heap
	fmt.Fprintf(w, "heap after GC (go_gc_heap_live_bytes, median over the GCs in each window): %.2f MB (%d GCs, %.0f-%.0f s; least %.2f, mean %.2f, most %.2f) -> %.2f MB (%d GCs, %.0f-%.0f s; least %.2f, mean %.2f, most %.2f): x%.4f (tolerance +%.0f%%)\n",
		h.Base/1e6, h.BaseN, h.BaseFromS, h.BaseToS, h.BaseMin/1e6, h.BaseMean/1e6, h.BaseMax/1e6,
		h.End/1e6, h.EndN, h.EndFromS, h.EndToS, h.EndMin/1e6, h.EndMean/1e6, h.EndMax/1e6, h.Ratio, 100*h.Tolerance)
	fmt.Fprintf(w, "goroutines (median of the samples in each window): %.1f (%.0f-%.0f) -> %.1f (%.0f-%.0f) (tolerance %.0f)\n",
		r.Gorout.Base, r.Gorout.BaseMin, r.Gorout.BaseMax, r.Gorout.End, r.Gorout.EndMin, r.Gorout.EndMax, r.Gorout.Tolerance)
	if n := len(r.Samples); n > 0 {
		first, last := r.Samples[0], r.Samples[n-1]
		fmt.Fprintf(w, "relayd: pid %d, %d restarts, exited %v, %d failed samples of %d; RSS %.1f -> %.1f MB, heap in use %.1f -> %.1f MB, %.0f GCs\n",
			r.Relayd.Pid, r.Relayd.Restarts, r.Relayd.Exited, r.Relayd.Failed, n, first.RSS/1e6, last.RSS/1e6, first.HeapInuse/1e6, last.HeapInuse/1e6, last.GCs-first.GCs)
	}
	a := r.Attack
	fmt.Fprintf(w, "spoofed media: %d packets (RTP %d to call ports, %d to random ports; garbage %d to call ports, %d to random ports; %d send errors), %d delivered to a call's end\n",
		a.sent(), a.RTPAllocated, a.RTPRandom, a.GarbageAllocated, a.GarbageRandom, a.SendErrors, a.Delivered)
	fmt.Fprintf(w, "relayd over the run: %d forwarded (%d by userspace), drops %s\n", a.RelaydForwarded, a.RelaydUserspace, fmtCounts(a.RelaydDrops))
	s := r.SIP
	fmt.Fprintf(w, "stranger's SIP: %d INVITEs, %d answered (responses %s); %d malformed datagrams (%d torture messages mangled), responses %s, %d unparsed\n",
		s.Invites, s.InvitesAnswered, fmtCounts(s.InviteAnswers), s.Garbage, s.TortureMessages, fmtCounts(s.GarbageAnswers), s.Unparsed)
	fmt.Fprintf(w, "relayd's SIP counters over the run: relayd_sip_malformed_total %.0f, relayd_sip_refused_total %s\n", s.RelaydMalformed, fmtFloatCounts(s.RelaydRefused))
	if r.Pass {
		fmt.Fprintln(w, "PASS")
		return
	}
	fmt.Fprintln(w, "FAIL:")
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  - %s\n", p)
	}
}

func fmtCounts(m map[string]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func fmtFloatCounts(m map[string]float64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
