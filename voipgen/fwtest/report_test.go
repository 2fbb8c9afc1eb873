package fwtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testReport is a report of a synthetic run: two searches (one
// sender-bound), an administrative case of two repetitions, a crash case
// of three with a stream that never recovered, and a crash case where
// nothing recovered.
func testReport(t *testing.T) *Report {
	t.Helper()
	r := &Report{Title: "fwpair synthetic", Config: map[string]any{"streams": 40}, Reference: ThesisReference()}
	for _, tc := range []struct {
		name             string
		limit, senderMax int
	}{
		{"stateful, 200 B", 118000, 0},
		{"stateless, 200 B", 300000, 160000},
	} {
		p := &fakePair{limit: tc.limit, senderMax: tc.senderMax}
		res, err := Search(context.Background(), SearchConfig{Lo: 1000, Hi: 250000, Resolution: 500}, p.trial, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Throughput = append(r.Throughput, NewThroughputRow(tc.name, res, 200, ptime, 2))
	}
	admin := FailoverCase{Kind: AdminStop, VRRPVersion: 3, AdvertMs: 1000, Conntrackd: true, Ruleset: "stateful", Streams: Bidirectional}
	crash := FailoverCase{Kind: CrashLinks, VRRPVersion: 3, AdvertMs: 1000, Conntrackd: true, Ruleset: "stateful", Streams: OneWayWANLAN}
	dead := FailoverCase{Kind: CrashKill, VRRPVersion: 2, AdvertMs: 100, Conntrackd: false, Ruleset: "stateless", Streams: OneWayWANLAN}
	const failAt = 1200 * time.Millisecond
	for _, run := range []struct {
		c      FailoverCase
		rep    int
		synth  synth
		vrrpMs *float64
	}{
		{admin, 1, synth{n: 40, failAt: failAt, outage: 34 * time.Millisecond}, FloatOf(31)},
		{admin, 2, synth{n: 40, failAt: failAt, outage: 74 * time.Millisecond}, FloatOf(70)},
		{crash, 1, synth{n: 40, failAt: failAt, outage: 1100 * time.Millisecond}, FloatOf(1090)},
		{crash, 2, synth{n: 40, failAt: failAt, outage: 1300 * time.Millisecond, never: map[int]bool{7: true}}, nil},
		{crash, 3, synth{n: 40, failAt: failAt, outage: 1500 * time.Millisecond, dup: 2}, FloatOf(1480)},
		{dead, 1, synth{n: 4, failAt: failAt, never: map[int]bool{0: true, 1: true, 2: true, 3: true}}, nil},
	} {
		streams, _ := run.synth.build()
		f := Analyze(streams, base+int64(run.synth.failAt), ptime, base+int64(runFor))
		row := NewFailoverRow(run.c, run.rep, f)
		row.VRRPMs = run.vrrpMs
		r.Failovers = append(r.Failovers, row)
	}
	return r
}

func TestReportSummaries(t *testing.T) {
	r := testReport(t)
	sums := r.Summaries()
	if len(sums) != 3 {
		t.Fatalf("%d summaries, want 3 cases", len(sums))
	}
	for _, s := range sums {
		// What the summary says, recomputed from the rows.
		var p50s, maxes, vrrp []float64
		never := 0
		var lost, dup uint64
		for _, f := range r.Failovers {
			if f.Case != s.Case {
				continue
			}
			if f.Recovered > 0 {
				p50s = append(p50s, float64(f.GlitchP50))
				maxes = append(maxes, float64(f.GlitchMax))
			}
			if f.VRRPMs != nil {
				vrrp = append(vrrp, *f.VRRPMs)
			}
			never += f.NeverRecovered
			lost += f.Lost
			dup += f.Duplicated
		}
		slices.Sort(p50s)
		slices.Sort(vrrp)
		want := FailoverSummary{Case: s.Case, Reps: s.Reps, NeverRecovered: never, Lost: lost, Duplicated: dup,
			MedianP50: Ms(math.NaN()), MaxP50: Ms(math.NaN()), Max: Ms(math.NaN()), VRRPMs: Ms(math.NaN()), SyncMs: Ms(math.NaN()),
			MedianOutage: s.MedianOutage, MaxOutage: s.MaxOutage}
		if n := len(p50s); n > 0 {
			want.MedianP50 = Ms(p50s[n/2])
			if n%2 == 0 {
				want.MedianP50 = Ms((p50s[n/2-1] + p50s[n/2]) / 2)
			}
			want.MaxP50, want.Max = Ms(p50s[n-1]), Ms(slices.Max(maxes))
		}
		if n := len(vrrp); n > 0 {
			want.VRRPMs = Ms(vrrp[n/2])
			if n%2 == 0 {
				want.VRRPMs = Ms((vrrp[n/2-1] + vrrp[n/2]) / 2)
			}
		}
		if diff := cmp.Diff(want, s, cmp.Comparer(func(a, b Ms) bool {
			return a == b || math.Abs(float64(a-b)) < 1e-9 || (math.IsNaN(float64(a)) && math.IsNaN(float64(b)))
		})); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s.Case, diff)
		}
	}
	if sums[0].Reps != 2 || sums[1].Reps != 3 || sums[1].NeverRecovered != 1 || sums[2].NeverRecovered != 4 {
		t.Errorf("reps %d %d, never recovered %d %d; want 2 3 and 1 4", sums[0].Reps, sums[1].Reps, sums[1].NeverRecovered, sums[2].NeverRecovered)
	}
	// The administrative case's median of the per-rep median glitch lies
	// between its two outages (34 and 74 ms), within a ptime.
	if m := float64(sums[0].MedianP50); m < 34-20 || m > 74+20 {
		t.Errorf("admin median glitch %v, want between 14 and 94 ms", sums[0].MedianP50)
	}
}

func TestReportComparisons(t *testing.T) {
	r := testReport(t)
	cmps := r.Comparisons()
	// Two searches beside the throughput figure, one case beside the
	// administrative one, two beside the crash one (power cycle).
	var got []string
	for _, c := range cmps {
		got = append(got, fmt.Sprintf("%s %g: %s", c.Reference.Match, c.Reference.Value, c.Case))
		if c.Reference.Source != ThesisSource {
			t.Errorf("reference %q labelled %q, want %q", c.Reference.Figure, c.Reference.Source, ThesisSource)
		}
		switch {
		case c.Measured == nil:
			if c.Ratio != nil {
				t.Errorf("%s: a ratio %v without a measured figure", c.Case, *c.Ratio)
			}
		case c.Ratio == nil || math.Abs(*c.Ratio-*c.Measured/c.Reference.Value) > 1e-12:
			t.Errorf("%s: ratio %v, want %v / %v", c.Case, c.Ratio, *c.Measured, c.Reference.Value)
		}
	}
	sums := r.Summaries()
	want := []string{
		"throughput 125000: stateful, 200 B",
		"throughput 125000: stateless, 200 B",
		"administrative 300: " + sums[0].Case.String(),
		"crash 3000: " + sums[1].Case.String(),
		"crash 3000: " + sums[2].Case.String(),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("comparisons (-want +got):\n%s", diff)
	}
	if m := cmps[0].Measured; m == nil || *m > 118000 || *m < 118000-500 {
		t.Errorf("stateful throughput measured %v, want within 500 below 118000", m)
	}
	if !strings.Contains(cmps[1].Note, "sender-bound") || *cmps[1].Measured != 160000 {
		t.Errorf("stateless throughput %v %q, want 160000 and sender-bound", *cmps[1].Measured, cmps[1].Note)
	}
	if cmps[4].Measured != nil {
		t.Errorf("nothing recovered, but measured %v", *cmps[4].Measured)
	}
}

func TestReportText(t *testing.T) {
	r := testReport(t)
	var b bytes.Buffer
	r.WriteText(&b)
	text := b.String()
	t.Log("\n" + text)
	sums := r.Summaries()
	cmps := r.Comparisons()
	for _, want := range []string{
		"fwpair synthetic",
		"stateful, 200 B", "stateless, 200 B", "sender-bound",
		sums[0].Case.String(), sums[1].Case.String(), sums[2].Case.String(),
		ThesisSource, "125000 pps", "300.0 ms", "3000.0 ms", "master power-cycled",
		fmt.Sprintf("%d", r.Throughput[0].Calls),
		fmt.Sprintf("%.2f", *cmps[0].Ratio),
		fmt.Sprintf("%.2f", *cmps[2].Ratio),
		"31.0 ms", // a VRRP time from the logs
		"1 streams never recovered",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q", want)
		}
	}
	// One line per failover repetition with its case and rep, and the
	// crash case's never-recovered count in its summary line.
	for _, f := range r.Failovers {
		if !hasLine(text, f.Case.String(), fmt.Sprintf(" %d ", f.Rep)) {
			t.Errorf("no line for %s rep %d", f.Case, f.Rep)
		}
	}
	if !hasLine(text, sums[2].Case.String(), " 1 ", " 4 ") {
		t.Errorf("no summary line for %s with its 4 never-recovered streams", sums[2].Case)
	}
	for _, verdict := range []string{"goal", "met", "PASS"} {
		if strings.Contains(text, verdict) {
			t.Errorf("text has a verdict %q", verdict)
		}
	}
}

// hasLine reports whether a line of text holds every part.
func hasLine(text string, parts ...string) bool {
	for _, l := range strings.Split(text, "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l+" ", p)
		}
		if ok {
			return true
		}
	}
	return false
}

func TestReportJSON(t *testing.T) {
	r := testReport(t)
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Title       string
		Config      map[string]any
		Throughput  []ThroughputRow
		Failovers   []FailoverRow
		Summaries   []FailoverSummary
		Reference   []RefRow
		Comparisons []struct {
			Case     string
			Measured *float64
			Ratio    *float64
		}
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Title != r.Title || got.Config["streams"] != float64(40) {
		t.Errorf("title %q config %v", got.Title, got.Config)
	}
	if diff := cmp.Diff(ThesisReference(), got.Reference); diff != "" {
		t.Errorf("reference (-want +got):\n%s", diff)
	}
	if len(got.Throughput) != 2 || got.Throughput[1].Search.SenderBound != true || got.Throughput[0].Calls != Calls(float64(got.Throughput[0].AtLeast), ptime, 2) {
		t.Errorf("throughput rows %+v", got.Throughput)
	}
	if len(got.Failovers) != len(r.Failovers) || len(got.Summaries) != 3 || len(got.Comparisons) != 5 {
		t.Fatalf("%d failovers, %d summaries, %d comparisons; want %d, 3, 5", len(got.Failovers), len(got.Summaries), len(got.Comparisons), len(r.Failovers))
	}
	for i, f := range got.Failovers {
		w := r.Failovers[i]
		if f.NeverRecovered != w.NeverRecovered || f.Lost != w.Lost || f.Duplicated != w.Duplicated || f.Analysis == nil ||
			len(f.Analysis.Streams) != len(w.Analysis.Streams) || len(f.Analysis.Timeline.All) != len(w.Analysis.Timeline.All) {
			t.Errorf("failover %d did not survive JSON", i)
		}
	}
	// The never-recovered streams read "never".
	if !bytes.Contains(b.Bytes(), []byte(`"glitch_ms": "never"`)) {
		t.Error(`no "glitch_ms": "never" in the JSON`)
	}
	if got.Summaries[2].NeverRecovered != 4 || !math.IsNaN(float64(got.Summaries[2].MedianP50)) {
		t.Errorf("dead case: never recovered %d, median %v; want 4 and null", got.Summaries[2].NeverRecovered, got.Summaries[2].MedianP50)
	}
	if got.Comparisons[4].Measured != nil || got.Comparisons[0].Ratio == nil {
		t.Errorf("comparisons %+v", got.Comparisons)
	}
}

func TestWriteOutputs(t *testing.T) {
	r := testReport(t)
	dir := filepath.Join(t.TempDir(), "out")
	files, err := r.WriteOutputs(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	sums := r.Summaries()
	want := []string{"report.json", "report.txt"}
	for i, s := range sums {
		base := fmt.Sprintf("timeline-%d-%s", i+1, slug(s.Case.String()))
		want = append(want, base+".png", base+".svg")
	}
	want = append(want, "glitch-cdf.png", "glitch-cdf.svg", "throughput-steps.png", "throughput-steps.svg")
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		switch filepath.Ext(f) {
		case ".png":
			if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) || len(b) < 1000 {
				t.Errorf("%s: not a PNG (%d bytes)", f, len(b))
			}
		case ".svg":
			if !bytes.Contains(b, []byte("<svg")) || len(b) < 1000 {
				t.Errorf("%s: not an SVG (%d bytes)", f, len(b))
			}
		default:
			if len(b) == 0 {
				t.Errorf("%s is empty", f)
			}
		}
	}

	// An empty report writes its report and no plots.
	files, err = (&Report{}).WriteOutputs(t.TempDir())
	if err != nil || len(files) != 2 {
		t.Errorf("empty report: %v, %v; want report.json and report.txt", files, err)
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"admin-stop vrrp3/1000ms conntrackd-on stateful one-way wan->lan": "admin-stop-vrrp3-1000ms-conntrackd-on-stateful-one-way-wan-lan",
		"  A  b ":   "a-b",
		"x/../../y": "x-y",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestReportSIP: a run with SIP signalling shows its calls, answered and
// ended ones, and its errors, in the text and the JSON.
func TestReportSIP(t *testing.T) {
	r := testReport(t)
	r.Failovers[0].SIP = &SIPResult{Calls: 20, Established: 20, Ended: 19, Errors: []string{"BYE: transaction timeout"}}
	var text bytes.Buffer
	r.WriteText(&text)
	if !strings.Contains(text.String(), "SIP through the pair") {
		t.Fatalf("no SIP table:\n%s", text.String())
	}
	var line string
	for _, l := range strings.Split(text.String(), "\n") {
		if strings.Contains(l, "BYE: transaction timeout") {
			line = l
		}
	}
	if f := strings.Fields(line); len(f) < 4 || !strings.Contains(line, " 20 ") || !strings.Contains(line, " 19 ") {
		t.Errorf("SIP row %q lacks the counts 20 and 19", line)
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"ended":19`) && !strings.Contains(js.String(), `"ended": 19`) {
		t.Errorf("JSON lacks the SIP result:\n%.2000s", js.String())
	}
}
