package fwtest

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const (
	base   = int64(1_760_000_000_000_000_000) // unix ns the synthetic runs start at
	ptime  = 20 * time.Millisecond
	delay  = int64(time.Millisecond) // one-way delay through the pair
	runFor = 3 * time.Second
)

// synth describes synthetic streams: n of them staggered across the
// ptime, sending from base for runFor; the pair drops what is sent in
// [failAt, failAt+outage).
type synth struct {
	n      int
	failAt time.Duration // after base
	outage time.Duration
	// never lists streams whose packets stop for good at the failure.
	never map[int]bool
	// silent lists streams whose sender stopped at that offset.
	silent map[int]time.Duration
	// dup duplicates the first dup packets of each stream after the
	// outage; swap swaps the second and third arrivals after it.
	dup  int
	swap bool
}

// build returns the streams and how many packets the pair dropped.
func (s synth) build() ([]StreamRecord, int) {
	fail := base + int64(s.failAt)
	dropped := 0
	var out []StreamRecord
	for i := range s.n {
		st := StreamRecord{ID: i, Name: fmt.Sprintf("wan->lan 198.18.20.10:%d", 4000+2*i), Direction: "wan->lan"}
		offset := int64(ptime) * int64(i) / int64(s.n)
		after := 0
		stop := base + int64(runFor)
		if d, ok := s.silent[i]; ok {
			stop = base + int64(d)
		}
		for seq := uint32(1); ; seq++ {
			sent := base + offset + int64(seq-1)*int64(ptime)
			if sent >= stop {
				break
			}
			st.SentFirst, st.SentLast = 1, seq
			if sent >= fail && (s.never[i] || sent < fail+int64(s.outage)) {
				dropped++
				continue
			}
			a := Arrival{Seq: seq, At: sent + delay}
			st.Arrivals = append(st.Arrivals, a)
			if sent >= fail {
				if after < s.dup {
					st.Arrivals = append(st.Arrivals, Arrival{Seq: seq, At: a.At + 100_000})
				}
				after++
				if s.swap && after == 3 {
					n := len(st.Arrivals)
					// The second after the outage arrives after the
					// third: swap their sequence numbers.
					st.Arrivals[n-1].Seq, st.Arrivals[n-2].Seq = st.Arrivals[n-2].Seq, st.Arrivals[n-1].Seq
				}
			}
		}
		out = append(out, st)
	}
	return out, dropped
}

func TestAnalyze(t *testing.T) {
	const failAt = 1200 * time.Millisecond
	end := base + int64(runFor)
	for _, tc := range []struct {
		name  string
		synth synth
	}{
		{name: "clean", synth: synth{n: 1, failAt: failAt}},
		{name: "34 ms on 100 streams", synth: synth{n: 100, failAt: failAt, outage: 34 * time.Millisecond}},
		{name: "1500 ms on 50 streams", synth: synth{n: 50, failAt: failAt - time.Second, outage: 1500 * time.Millisecond}},
		{name: "never recovered", synth: synth{n: 100, failAt: failAt, outage: 300 * time.Millisecond, never: map[int]bool{3: true, 50: true, 99: true}}},
		{name: "duplicates", synth: synth{n: 10, failAt: failAt, outage: 60 * time.Millisecond, dup: 3}},
		{name: "reordering", synth: synth{n: 10, failAt: failAt, outage: 60 * time.Millisecond, swap: true}},
		{name: "silent before", synth: synth{n: 10, failAt: failAt, outage: 60 * time.Millisecond, silent: map[int]time.Duration{4: failAt - 200*time.Millisecond}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sy := tc.synth
			streams, dropped := sy.build()
			fail := base + int64(sy.failAt)
			f := Analyze(streams, fail, ptime, end)

			wantNever, wantSilent := len(sy.never), len(sy.silent)
			wantRecovered := sy.n - wantNever - wantSilent
			if f.Recovered != wantRecovered || f.NeverRecovered != wantNever || f.SilentBefore != wantSilent {
				t.Errorf("recovered %d never %d silent %d, want %d %d %d", f.Recovered, f.NeverRecovered, f.SilentBefore, wantRecovered, wantNever, wantSilent)
			}
			if f.Lost != uint64(dropped) {
				t.Errorf("lost %d, want the %d the pair dropped", f.Lost, dropped)
			}
			if want := uint64(sy.dup * sy.n); f.Duplicated != want {
				t.Errorf("duplicated %d, want %d", f.Duplicated, want)
			}
			wantReordered := uint64(0)
			if sy.swap {
				wantReordered = uint64(sy.n)
			}
			if f.Reordered != wantReordered {
				t.Errorf("reordered %d, want %d", f.Reordered, wantReordered)
			}
			if f.Glitch.N != wantRecovered {
				t.Errorf("glitch distribution over %d streams, want the %d recovered", f.Glitch.N, wantRecovered)
			}
			pt := float64(ptime) / 1e6
			truth := float64(sy.outage) / 1e6
			for _, s := range f.Streams {
				switch s.Status {
				case Recovered:
					if math.Abs(float64(s.GlitchMs)-truth) > pt {
						t.Errorf("stream %d: glitch %v, want within one ptime of %.1f ms", s.ID, s.GlitchMs, truth)
					}
					if want := uint32(math.Round(float64(s.GlitchMs) / pt)); s.MissingSeq != want {
						t.Errorf("stream %d: %d missing by sequence, want %d (glitch %v)", s.ID, s.MissingSeq, want, s.GlitchMs)
					}
					if s.GapStart > fail+delay || s.GapEnd < fail+int64(sy.outage) {
						t.Errorf("stream %d: gap [%d, %d] does not span the outage", s.ID, s.GapStart-fail, s.GapEnd-fail)
					}
				case NeverRecovered:
					if !sy.never[s.ID] || !math.IsInf(float64(s.GlitchMs), 1) {
						t.Errorf("stream %d never recovered (glitch %v), want it only for %v and glitch never", s.ID, s.GlitchMs, sy.never)
					}
				case SilentBefore:
					if _, ok := sy.silent[s.ID]; !ok {
						t.Errorf("stream %d silent before, want only %v", s.ID, sy.silent)
					}
				}
			}
			if wantRecovered == 0 {
				return
			}
			res := pt / float64(wantRecovered+wantNever)
			if math.Abs(float64(f.ResolutionMs)-res) > 1e-6 {
				t.Errorf("resolution %v, want %.3f ms", f.ResolutionMs, res)
			}
			if tc.synth.outage == 0 {
				// No outage: the longest gap is one interval.
				if f.Glitch.Max > 0.001 || float64(f.OutageMs) > res {
					t.Errorf("clean: glitch max %v outage %v, want 0", f.Glitch.Max, f.OutageMs)
				}
			} else if math.Abs(float64(f.OutageMs)-truth) > res {
				t.Errorf("outage %v, want within %.3f ms of %.1f", f.OutageMs, res, truth)
			}
			if f.LastBefore > fail+delay || f.FirstAfter < fail+int64(sy.outage) {
				t.Errorf("outage [%d, %d] ns from failure does not span the truth", f.LastBefore-fail, f.FirstAfter-fail)
			}

			// The timeline: 1 ms buckets from 500 ms before the failure
			// to 1 s after the outage; every arrival in it counted; none
			// during the outage (the arrivals are delay late).
			tl := f.Timeline
			if tl.Start != fail-int64(500*time.Millisecond) || tl.BucketNs != int64(time.Millisecond) {
				t.Errorf("timeline starts %d ns before with %d ns buckets, want 500 ms and 1 ms", fail-tl.Start, tl.BucketNs)
			}
			wantLen := int((min(end, f.FirstAfter+int64(time.Second)) - tl.Start + int64(time.Millisecond) - 1) / int64(time.Millisecond))
			if len(tl.All) != wantLen || len(tl.Worst) != wantLen {
				t.Errorf("timeline of %d/%d buckets, want %d", len(tl.All), len(tl.Worst), wantLen)
			}
			inWindow, worstIn := 0, 0
			for _, st := range streams {
				for _, a := range st.Arrivals {
					if a.At >= tl.Start && a.At < tl.Start+int64(len(tl.All))*tl.BucketNs {
						inWindow++
						if st.ID == tl.WorstID {
							worstIn++
						}
					}
				}
			}
			if got := sum(tl.All); got != inWindow {
				t.Errorf("timeline counts %d arrivals, want %d", got, inWindow)
			}
			if got := sum(tl.Worst); got != worstIn || worstIn == 0 {
				t.Errorf("worst stream's timeline counts %d, want %d (and some)", got, worstIn)
			}
			from := int((fail + delay - tl.Start) / tl.BucketNs)
			to := int((fail + int64(sy.outage) - tl.Start) / tl.BucketNs)
			if from+1 < to {
				if n := sum(tl.All[from+1 : to]); n != 0 {
					t.Errorf("%d arrivals in the timeline during the outage", n)
				}
			}
			worst := f.Streams[tl.WorstID]
			if float64(worst.GlitchMs) != float64(f.Glitch.Max) {
				t.Errorf("worst stream %d glitch %v, want the max %v", worst.ID, worst.GlitchMs, f.Glitch.Max)
			}
		})
	}
}

func sum(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}

func TestAnalyzeEdgeCases(t *testing.T) {
	fail := base + int64(time.Second)
	end := base + int64(2*time.Second)
	at := func(ms int) int64 { return base + int64(ms)*int64(time.Millisecond) }
	streams := []StreamRecord{
		{ID: 0, Name: "empty"},
		// Recovers, then stops for good before the end.
		{ID: 1, Name: "dies later", Arrivals: []Arrival{{1, at(980)}, {2, at(1000)}, {3, at(1100)}, {4, at(1120)}}},
		// Arrivals out of time order: sorted before the gaps are looked
		// for; the sender sent 1..6, the last never arrived.
		{ID: 2, Name: "unsorted", SentFirst: 1, SentLast: 6, Arrivals: []Arrival{
			{1, at(990)}, {3, at(1030)}, {2, at(1010)}, {5, at(1990)}, {4, at(1300)},
		}},
	}
	f := Analyze(streams, fail, ptime, end)
	want := []StreamFailover{
		{ID: 0, Name: "empty", Status: SilentBefore, GapMs: Ms(math.NaN()), GlitchMs: Ms(math.NaN())},
		{ID: 1, Name: "dies later", Status: NeverRecovered, Received: 4, Expected: 4,
			GapStart: at(1120), GapMs: Never, GlitchMs: Never},
		{ID: 2, Name: "unsorted", Status: Recovered, Received: 5, Expected: 6, Lost: 1,
			GapStart: at(1300), GapEnd: at(1990), GapMs: 690, GlitchMs: 670},
	}
	if diff := cmp.Diff(want, f.Streams, cmp.Comparer(func(a, b Ms) bool {
		return a == b || (math.IsNaN(float64(a)) && math.IsNaN(float64(b)))
	})); diff != "" {
		t.Errorf("streams (-want +got):\n%s", diff)
	}
	if f.Recovered != 1 || f.NeverRecovered != 1 || f.SilentBefore != 1 {
		t.Errorf("recovered %d never %d silent %d, want 1 1 1", f.Recovered, f.NeverRecovered, f.SilentBefore)
	}
	// The stream that died at 1120 ms stopped before the other came back
	// at 1990 ms, so it counts for the start of the outage, but the other's
	// last arrival at 1300 ms is later.
	if f.LastBefore != at(1300) || f.FirstAfter != at(1990) {
		t.Errorf("outage [%d, %d], want [%d, %d]", f.LastBefore, f.FirstAfter, at(1300), at(1990))
	}

	// Nothing recovered: the outage never ended.
	f = Analyze(streams[:2], fail, ptime, end)
	if !math.IsInf(float64(f.OutageMs), 1) || f.Glitch.N != 0 || f.Timeline.WorstID != 1 {
		t.Errorf("outage %v, glitch n %d, worst %d; want never, 0 and the stream that died", f.OutageMs, f.Glitch.N, f.Timeline.WorstID)
	}
	if len(f.Timeline.All) != int((end-(fail-int64(TimelineBefore)))/int64(time.Millisecond)) {
		t.Errorf("timeline of %d buckets, want it to run to the end", len(f.Timeline.All))
	}

	// A recording that ran for an hour after a failure nothing came back
	// from: the timeline stops at TimelineMax.
	f = Analyze(streams[1:2], fail, ptime, fail+int64(time.Hour))
	if want := int((TimelineBefore + TimelineMax) / TimelineBucket); len(f.Timeline.All) != want {
		t.Errorf("timeline of %d buckets, want %d", len(f.Timeline.All), want)
	}

	// No streams at all.
	f = Analyze(nil, fail, ptime, end)
	if f.Recovered+f.NeverRecovered+f.SilentBefore != 0 || f.Glitch.N != 0 || f.Timeline.WorstID != -1 {
		t.Errorf("no streams: %+v", f)
	}
}

func TestMsJSON(t *testing.T) {
	type doc struct{ A, B, C Ms }
	b, err := json.Marshal(doc{A: 12.5, B: Never, C: Ms(math.NaN())})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"A":12.5,"B":"never","C":null}`; string(b) != want {
		t.Errorf("got %s, want %s", b, want)
	}
	var d doc
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.A != 12.5 || !math.IsInf(float64(d.B), 1) || !math.IsNaN(float64(d.C)) {
		t.Errorf("round trip: %+v", d)
	}
	if err := json.Unmarshal([]byte(`"soon"`), &d.A); err == nil {
		t.Error(`"soon" decoded without an error`)
	}
}

func TestDistributionOf(t *testing.T) {
	v := make([]float64, 100)
	for i := range v {
		v[len(v)-1-i] = float64(i + 1) // 100 .. 1
	}
	got := DistributionOf(v)
	want := Distribution{N: 100, Min: 1, P50: 50, P90: 90, P99: 99, Max: 100, Mean: 50.5}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if v[0] != 100 {
		t.Error("DistributionOf sorted its input")
	}
	if got := DistributionOf(nil); got.N != 0 || got.String() != "-" {
		t.Errorf("of nothing: %+v %q", got, got.String())
	}
}
