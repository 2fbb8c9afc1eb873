package fwtest

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// FailureKind is how the master was made to fail.
type FailureKind string

// The failures the experiment causes.
const (
	AdminStop     FailureKind = "admin-stop"     // keepalived stopped on the master
	AdminPriority FailureKind = "admin-priority" // the master's VRRP priority lowered
	CrashLinks    FailureKind = "crash-links"    // the master's links cut
	CrashKill     FailureKind = "crash-kill"     // the master's keepalived and conntrackd killed
	// RecoveryPreempt: the old master back, taking over again.
	RecoveryPreempt FailureKind = "recovery-preempt"
)

// The categories of failure kinds, and of reference figures.
const (
	Administrative = "administrative"
	Crash          = "crash"
	Recovery       = "recovery"
	Throughput     = "throughput" // a reference figure of the throughput search
)

// Category is Administrative, Crash or Recovery; "" for a kind it does
// not know.
func (k FailureKind) Category() string {
	switch k {
	case AdminStop, AdminPriority:
		return Administrative
	case CrashLinks, CrashKill:
		return Crash
	case RecoveryPreempt:
		return Recovery
	}
	return ""
}

// The stream kinds.
const (
	Bidirectional = "bidirectional"
	OneWayWANLAN  = "one-way wan->lan"
)

// FailoverCase is one combination the experiment fails the pair in; its
// repetitions share it.
type FailoverCase struct {
	Kind        FailureKind `json:"kind"`
	VRRPVersion int         `json:"vrrp_version"`
	AdvertMs    float64     `json:"advert_ms"` // VRRP advertisement interval
	Conntrackd  bool        `json:"conntrackd"`
	Ruleset     string      `json:"ruleset"`
	Streams     string      `json:"streams"` // Bidirectional or OneWayWANLAN
	// After is, for RecoveryPreempt, the failure recovered from.
	After FailureKind `json:"after,omitempty"`
}

// String is a one-line label such as
// "admin-stop vrrp3/1000ms conntrackd-on stateful bidirectional".
func (c FailoverCase) String() string {
	ct := "conntrackd-off"
	if c.Conntrackd {
		ct = "conntrackd-on"
	}
	kind := string(c.Kind)
	if c.After != "" {
		kind += " after " + string(c.After)
	}
	return fmt.Sprintf("%s vrrp%d/%gms %s %s %s", kind, c.VRRPVersion, c.AdvertMs, ct, c.Ruleset, c.Streams)
}

// FailoverRow is one repetition of one failover case.
type FailoverRow struct {
	Case FailoverCase `json:"case"`
	Rep  int          `json:"rep"` // 1-based
	// The per-stream glitch over the streams that recovered.
	GlitchP50      Ms     `json:"glitch_p50_ms"`
	GlitchMax      Ms     `json:"glitch_max_ms"`
	OutageMs       Ms     `json:"outage_ms"` // what all streams together saw
	Streams        int    `json:"streams"`
	Recovered      int    `json:"recovered"`
	NeverRecovered int    `json:"never_recovered"`
	SilentBefore   int    `json:"silent_before"`
	Lost           uint64 `json:"lost"`
	Duplicated     uint64 `json:"duplicated"`
	// VRRPMs and SyncMs are the caller's, from keepalived's and
	// conntrackd's own logs: from the failure to the backup's MASTER
	// transition, and to conntrackd's commit of the synced state. nil when
	// not known.
	VRRPMs *float64 `json:"vrrp_ms"`
	SyncMs *float64 `json:"sync_ms"`

	// SIP is the signalling of the run's calls through the pair, when the
	// run had it (Config.SIP); on the failure row only.
	SIP *SIPResult `json:"sip,omitempty"`

	Analysis *Failover `json:"analysis,omitempty"`
}

// SIPResult is what the calls' signalling through the pair did: calls
// placed, answered, and hung up with a BYE the far end answered after the
// failure and the recovery.
type SIPResult struct {
	Calls       int      `json:"calls"`
	Established int      `json:"established"`
	Ended       int      `json:"ended"`            // BYE answered 200
	Errors      []string `json:"errors,omitempty"` // the first few
}

// NewFailoverRow fills a row from an analysis.
func NewFailoverRow(c FailoverCase, rep int, f Failover) FailoverRow {
	r := FailoverRow{Case: c, Rep: rep, GlitchP50: Ms(math.NaN()), GlitchMax: Ms(math.NaN()), OutageMs: f.OutageMs,
		Streams: len(f.Streams), Recovered: f.Recovered, NeverRecovered: f.NeverRecovered, SilentBefore: f.SilentBefore,
		Lost: f.Lost, Duplicated: f.Duplicated, Analysis: &f}
	if f.Glitch.N > 0 {
		r.GlitchP50, r.GlitchMax = f.Glitch.P50, f.Glitch.Max
	}
	return r
}

// FloatOf returns a pointer to v, for VRRPMs and SyncMs.
func FloatOf(v float64) *float64 { return &v }

// FailoverSummary is one case over its repetitions.
type FailoverSummary struct {
	Case FailoverCase `json:"case"`
	Reps int          `json:"reps"`
	// The median and the max over the repetitions of each repetition's
	// median glitch, and the max of every glitch of every repetition.
	MedianP50 Ms `json:"median_p50_ms"`
	MaxP50    Ms `json:"max_p50_ms"`
	Max       Ms `json:"max_ms"`
	// The outage all streams saw: median and max over repetitions.
	MedianOutage   Ms     `json:"median_outage_ms"`
	MaxOutage      Ms     `json:"max_outage_ms"`
	NeverRecovered int    `json:"never_recovered"` // over all repetitions
	Lost           uint64 `json:"lost"`
	Duplicated     uint64 `json:"duplicated"`
	// Medians over the repetitions that have them; NaN (null) when none.
	VRRPMs Ms `json:"vrrp_ms"`
	SyncMs Ms `json:"sync_ms"`
}

// ThroughputRow is one throughput search.
type ThroughputRow struct {
	Case        string  `json:"case"`
	PacketBytes int     `json:"packet_bytes"` // IP packet size
	PtimeMs     float64 `json:"ptime_ms"`
	Directions  int     `json:"directions"` // streams per call
	// AtLeast is the rate found (SearchResult.AtLeast) and Calls and Mbps
	// what it carries.
	AtLeast     int          `json:"at_least_pps"`
	Lo          int          `json:"lo_pps"`
	Hi          int          `json:"hi_pps"`
	SenderBound bool         `json:"sender_bound"`
	Calls       int          `json:"calls"`
	Mbps        float64      `json:"mbps"`
	Result      string       `json:"result"` // SearchResult.String
	Search      SearchResult `json:"search"`
}

// NewThroughputRow fills a row from a search over packets of packetBytes
// (IP) sent every ptime, directions streams per call.
func NewThroughputRow(name string, r SearchResult, packetBytes int, ptime time.Duration, directions int) ThroughputRow {
	return ThroughputRow{Case: name, PacketBytes: packetBytes, PtimeMs: float64(MsOf(ptime)), Directions: directions,
		AtLeast: r.AtLeast, Lo: r.Lo, Hi: r.Hi, SenderBound: r.SenderBound,
		Calls: Calls(float64(r.AtLeast), ptime, directions), Mbps: Mbps(float64(r.AtLeast), packetBytes),
		Result: r.String(), Search: r}
}

// RefRow is a published figure to hold the measured ones against.
type RefRow struct {
	Figure     string  `json:"figure"`
	Source     string  `json:"source"`
	Value      float64 `json:"value"`
	Unit       string  `json:"unit"` // "pps" or "ms"
	Conditions string  `json:"conditions"`
	// Match is what it compares with: Throughput, or the failure category
	// (Administrative, Crash) whose cases' median glitch it is set beside.
	Match string `json:"match"`
}

// ThesisSource labels the thesis's figures.
const ThesisSource = "OpenBSD 3.8 CARP+pfsync, thesis"

// ThesisReference is the thesis's figures: the forwarding limit for
// VoIP-sized packets and the glitches of an administrative and of a
// power-cycle failover.
func ThesisReference() []RefRow {
	return []RefRow{
		{Figure: "zero-loss forwarding limit", Source: ThesisSource, Value: 125000, Unit: "pps",
			Conditions: "VoIP-sized packets", Match: Throughput},
		{Figure: "failover glitch", Source: ThesisSource, Value: 300, Unit: "ms",
			Conditions: "CARP turned off administratively, ~80 kpps", Match: Administrative},
		{Figure: "failover glitch", Source: ThesisSource, Value: 3000, Unit: "ms",
			Conditions: "master power-cycled", Match: Crash},
	}
}

// Comparison sets one measured figure of this run beside a reference one.
// Ratio is Measured / Reference.Value.
type Comparison struct {
	Reference RefRow   `json:"reference"`
	Case      string   `json:"case"`
	Measured  *float64 `json:"measured"`       // nil when nothing was measured (no stream recovered)
	Note      string   `json:"note,omitempty"` // e.g. "sender-bound: at least"
	Ratio     *float64 `json:"ratio"`          // nil when not computable
}

// Report is the experiment's outcome. Its zero value is an empty report;
// it is not safe for concurrent use while being filled.
type Report struct {
	Title      string          `json:"title"`
	Config     any             `json:"config,omitempty"` // the run's configuration, as the caller has it
	Throughput []ThroughputRow `json:"throughput"`
	Failovers  []FailoverRow   `json:"failovers"`
	Reference  []RefRow        `json:"reference"`
}

// Summaries is one row per failover case, in the order the cases first
// appear.
func (r *Report) Summaries() []FailoverSummary {
	var cases []FailoverCase
	for _, f := range r.Failovers {
		if !slices.Contains(cases, f.Case) {
			cases = append(cases, f.Case)
		}
	}
	var out []FailoverSummary
	for _, c := range cases {
		s := FailoverSummary{Case: c}
		var p50s, maxes, outages, vrrp, sync []float64
		for _, f := range r.Failovers {
			if f.Case != c {
				continue
			}
			s.Reps++
			s.NeverRecovered += f.NeverRecovered
			s.Lost += f.Lost
			s.Duplicated += f.Duplicated
			if !math.IsNaN(float64(f.GlitchP50)) {
				p50s = append(p50s, float64(f.GlitchP50))
				maxes = append(maxes, float64(f.GlitchMax))
			}
			if !math.IsNaN(float64(f.OutageMs)) {
				outages = append(outages, float64(f.OutageMs))
			}
			if f.VRRPMs != nil {
				vrrp = append(vrrp, *f.VRRPMs)
			}
			if f.SyncMs != nil {
				sync = append(sync, *f.SyncMs)
			}
		}
		s.MedianP50, s.MaxP50 = median(p50s), maxOf(p50s)
		s.Max = maxOf(maxes)
		s.MedianOutage, s.MaxOutage = median(outages), maxOf(outages)
		s.VRRPMs, s.SyncMs = median(vrrp), median(sync)
		out = append(out, s)
	}
	return out
}

// median is the middle value (the mean of the two middle ones), NaN of
// nothing.
func median(v []float64) Ms {
	if len(v) == 0 {
		return Ms(math.NaN())
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if n := len(s); n%2 == 0 {
		return Ms((s[n/2-1] + s[n/2]) / 2)
	}
	return Ms(s[len(s)/2])
}

func maxOf(v []float64) Ms {
	if len(v) == 0 {
		return Ms(math.NaN())
	}
	return Ms(slices.Max(v))
}

// Comparisons sets each reference figure beside every measured figure of
// this run it matches: a throughput figure beside each search, a failover
// figure beside the median glitch of each case of its category.
func (r *Report) Comparisons() []Comparison {
	var out []Comparison
	sums := r.Summaries()
	for _, ref := range r.Reference {
		add := func(c Comparison) {
			c.Reference = ref
			if c.Measured != nil && ref.Value != 0 {
				c.Ratio = FloatOf(*c.Measured / ref.Value)
			}
			out = append(out, c)
		}
		switch ref.Match {
		case Throughput:
			for _, t := range r.Throughput {
				c := Comparison{Case: t.Case, Measured: FloatOf(float64(t.AtLeast))}
				switch {
				case t.SenderBound:
					c.Note = "sender-bound: at least"
				case t.Search.AboveHi:
					c.Note = "above the range searched: at least"
				}
				add(c)
			}
		default:
			for _, s := range sums {
				if s.Case.Kind.Category() != ref.Match {
					continue
				}
				c := Comparison{Case: s.Case.String(),
					Note: fmt.Sprintf("median over %d reps of the per-stream median; max %s", s.Reps, s.Max)}
				if m := float64(s.MedianP50); !math.IsNaN(m) {
					c.Measured = FloatOf(m)
				}
				if s.NeverRecovered > 0 {
					c.Note += fmt.Sprintf("; %d streams never recovered", s.NeverRecovered)
				}
				add(c)
			}
		}
	}
	return out
}

// WriteText writes the report as tables.
func (r *Report) WriteText(w io.Writer) {
	if r.Title != "" {
		fmt.Fprintf(w, "%s\n\n", r.Title)
	}
	if len(r.Throughput) > 0 {
		fmt.Fprintln(w, "Throughput (highest rate with every trial within the loss threshold)")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "case\tpkt B\tptime\tresult\tbracket pps\tcalls\tMbit/s\tsteps")
		for _, t := range r.Throughput {
			fmt.Fprintf(tw, "%s\t%d\t%g ms\t%s\t[%d, %d]\t%d\t%.1f\t%d\n", t.Case, t.PacketBytes, t.PtimeMs, t.Result,
				t.Lo, t.Hi, t.Calls, t.Mbps, len(t.Search.Steps))
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	if len(r.Failovers) > 0 {
		fmt.Fprintln(w, "Failovers (glitch: media missing per stream, over the streams that recovered)")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "case\trep\tglitch p50\tglitch max\toutage\tstreams\tnever recovered\tsilent before\tlost\tdup\tVRRP\tconntrackd")
		for _, f := range r.Failovers {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", f.Case, f.Rep, f.GlitchP50, f.GlitchMax, f.OutageMs,
				f.Streams, f.NeverRecovered, f.SilentBefore, f.Lost, f.Duplicated, optMs(f.VRRPMs), optMs(f.SyncMs))
		}
		tw.Flush()
		fmt.Fprintln(w)
		var sipRows []FailoverRow
		for _, f := range r.Failovers {
			if f.SIP != nil {
				sipRows = append(sipRows, f)
			}
		}
		if len(sipRows) > 0 {
			fmt.Fprintln(w, "SIP through the pair (calls placed before the failure, hung up after the recovery)")
			tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "case	rep	calls	answered	ended by BYE	errors")
			for _, f := range sipRows {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", f.Case, f.Rep, f.SIP.Calls, f.SIP.Established, f.SIP.Ended, strings.Join(f.SIP.Errors, "; "))
			}
			tw.Flush()
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "Failover cases over repetitions (median and max of the per-rep median glitch, max of all)")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "case\treps\tmedian p50\tmax p50\tmax\tmedian outage\tnever recovered\tlost\tdup\tVRRP\tconntrackd")
		for _, s := range r.Summaries() {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", s.Case, s.Reps, s.MedianP50, s.MaxP50, s.Max, s.MedianOutage,
				s.NeverRecovered, s.Lost, s.Duplicated, s.VRRPMs, s.SyncMs)
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	if cmps := r.Comparisons(); len(cmps) > 0 {
		fmt.Fprintln(w, "Reference figures beside this run's (ratio = measured / reference)")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "reference\tsource\tvalue\tmeasured case\tmeasured\tratio\tnote")
		for _, c := range cmps {
			ratio := "-"
			if c.Ratio != nil {
				ratio = fmt.Sprintf("%.2f", *c.Ratio)
			}
			fmt.Fprintf(tw, "%s (%s)\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Reference.Figure, c.Reference.Conditions, c.Reference.Source,
				figure(c.Reference.Value, c.Reference.Unit), c.Case, optFigure(c.Measured, c.Reference.Unit), ratio, c.Note)
		}
		tw.Flush()
	} else if len(r.Reference) > 0 {
		fmt.Fprintln(w, "Reference figures (nothing measured to set beside them)")
		for _, ref := range r.Reference {
			fmt.Fprintf(w, "  %s (%s): %s, %s\n", ref.Figure, ref.Conditions, figure(ref.Value, ref.Unit), ref.Source)
		}
	}
}

func optMs(v *float64) string {
	if v == nil {
		return "-"
	}
	return Ms(*v).String()
}

func optFigure(v *float64, unit string) string {
	if v == nil {
		return "-"
	}
	return figure(*v, unit)
}

func figure(v float64, unit string) string {
	switch {
	case math.IsInf(v, 1):
		return "never"
	case math.IsNaN(v):
		return "-"
	case unit == "pps":
		return fmt.Sprintf("%.0f pps", v)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// reportJSON is the report as written: the rows and what is derived from
// them.
type reportJSON struct {
	Title       string            `json:"title"`
	Config      any               `json:"config,omitempty"`
	Throughput  []ThroughputRow   `json:"throughput"`
	Failovers   []FailoverRow     `json:"failovers"`
	Summaries   []FailoverSummary `json:"summaries"`
	Reference   []RefRow          `json:"reference"`
	Comparisons []Comparison      `json:"comparisons"`
}

// WriteJSON writes the report, its per-case summaries and its
// comparisons with the reference figures, indented.
func (r *Report) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	if err := e.Encode(reportJSON{Title: r.Title, Config: r.Config, Throughput: r.Throughput, Failovers: r.Failovers,
		Summaries: r.Summaries(), Reference: r.Reference, Comparisons: r.Comparisons()}); err != nil {
		return fmt.Errorf("report json: %w", err)
	}
	return nil
}

// WriteOutputs writes report.json, report.txt and the plots (PNG and SVG
// each) into dir, creating it, and returns the files written.
func (r *Report) WriteOutputs(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var files []string
	write := func(name string, fill func(io.Writer) error) error {
		path := filepath.Join(dir, name)
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		err = fill(f)
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("report: %w", cerr)
		}
		if err != nil {
			return err
		}
		files = append(files, path)
		return nil
	}
	if err := write("report.json", r.WriteJSON); err != nil {
		return files, err
	}
	if err := write("report.txt", func(w io.Writer) error { r.WriteText(w); return nil }); err != nil {
		return files, err
	}
	plots, err := r.plots(dir)
	files = append(files, plots...)
	return files, err
}

// slug makes a file name part of a case label.
func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(s) {
		switch {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
			b.WriteRune(c)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}
