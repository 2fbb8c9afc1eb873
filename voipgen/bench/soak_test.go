package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestParseSoak(t *testing.T) {
	c, err := ParseSoak(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Calls != 1000 || c.Duration != 10*time.Minute || c.Baseline != 2*time.Minute || c.HeapTolerance != 0.05 || c.window() != 2*time.Minute {
		t.Errorf("defaults %+v", c)
	}
	c, err = ParseSoak([]string{"--calls", "100", "--duration", "60s", "--baseline", "36s", "--sample", "1s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.window() != 8*time.Second {
		t.Errorf("window %v, want a third of the 24 s after the baseline", c.window())
	}
	for _, bad := range [][]string{
		{"--calls", "0"},
		{"--calls", "6000"},
		{"--duration", "2m", "--baseline", "2m"},
		{"--baseline", "0s"},
		{"--chunk", "100ms"},
		{"--duration", "1h", "--chunk", "1s"},
		{"--attack-pps", "-1"},
		{"--heap-tolerance", "0"},
		{"extra"},
	} {
		if _, err := ParseSoak(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSoakSampleParse(t *testing.T) {
	text := `# HELP go_goroutines Number of goroutines that currently exist.
go_goroutines 42
go_gc_heap_live_bytes 5.5e+06
go_memstats_heap_inuse_bytes 8e+06
go_gc_duration_seconds{quantile="0.5"} 1e-05
go_gc_duration_seconds_count 17
process_resident_memory_bytes 3.2e+07
process_start_time_seconds 1.7e+09
relayd_sip_malformed_total{reason="syntax"} 3
relayd_sip_malformed_total{reason="version"} 2
relayd_sip_refused_total{reason="source"} 9
`
	var s SoakSample
	if err := s.parse(text); err != nil {
		t.Fatal(err)
	}
	if s.Goroutines != 42 || s.HeapLive != 5.5e6 || s.GCs != 17 || s.RSS != 3.2e7 || s.Start != 1.7e9 || s.HeapInuse != 8e6 {
		t.Errorf("%+v", s)
	}
	if err := new(SoakSample).parse("go_goroutines 1\n"); err == nil || !strings.Contains(err.Error(), "go_gc_heap_live_bytes") {
		t.Errorf("missing metrics: %v", err)
	}
	c := parseSoakSIP(text)
	if c.malformed != 5 || c.refused["source"] != 9 {
		t.Errorf("%+v", c)
	}
}

// soakReportFor is a passing run of cfg: one sample a second, a GC every
// two seconds, the live heap alternating between floor and twice the
// floor, 30 goroutines.
func soakReportFor(cfg SoakConfig, floor func(t float64) float64) *SoakReport {
	r := &SoakReport{Config: map[string]any{"calls": cfg.Calls}}
	r.Calls = SoakCalls{Placed: cfg.Calls, Up: cfg.Calls, HeldEnd: cfg.Calls, Answered: int64(cfg.Calls)}
	r.Media[0] = SoakDirection{Name: "a", Sent: 100, Received: 100}
	r.Media[1] = SoakDirection{Name: "b", Sent: 100, Received: 100}
	r.SIP.InvitesAnswered = 10
	r.Relayd.Pid = 7
	for t := 0.0; t <= cfg.Duration.Seconds(); t++ {
		gc := float64(int(t) / 2)
		live := floor(t)
		if int(gc)%2 == 1 {
			live *= 2
		}
		r.Samples = append(r.Samples, SoakSample{T: t, HeapLive: live, GCs: gc, Goroutines: 30, Pid: 7, Start: 1})
	}
	return r
}

func TestSoakJudge(t *testing.T) {
	cfg, err := ParseSoak([]string{"--calls", "10", "--duration", "60s", "--baseline", "30s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	flat := func(float64) float64 { return 4e6 }
	r := soakReportFor(cfg, flat)
	r.judge(cfg, cfg.Duration)
	if !r.Pass || r.Heap.Base != 6e6 || r.Heap.End != 6e6 || r.Heap.BaseN != 6 || r.Heap.BaseMin != 4e6 || r.Heap.BaseMax != 8e6 || r.Gorout.Base != 30 {
		t.Fatalf("a steady run: %+v %+v %v", r.Heap, r.Gorout, r.Problems)
	}
	for _, tc := range []struct {
		name  string
		spoil func(r *SoakReport)
		want  string
	}{
		{"loss", func(r *SoakReport) { r.Media[1].Received--; r.Media[1].Lost = 1; r.Media[1].ChunksWithLoss = 1 }, "1 of 100 packets lost"},
		{"leak", func(r *SoakReport) {
			for i := range r.Samples {
				r.Samples[i].HeapLive *= 1 + r.Samples[i].T/300 // 20% a minute
			}
		}, "heap after GC"},
		{"no GC at the end", func(r *SoakReport) {
			for i := range r.Samples {
				if r.Samples[i].T >= 45 {
					r.Samples[i].GCs, r.Samples[i].HeapLive = 22, 4e6
				}
			}
		}, "not measured"},
		{"goroutines", func(r *SoakReport) {
			for i := range r.Samples {
				if r.Samples[i].T >= 50 {
					r.Samples[i].Goroutines = 300
				}
			}
		}, "goroutines"},
		{"restart", func(r *SoakReport) { r.Samples[40].Start = 2 }, "relayd"},
		{"crash", func(r *SoakReport) { r.Samples[59].Error = "connection refused" }, "relayd"},
		{"leaked media", func(r *SoakReport) { r.Attack.Delivered = 3 }, "spoofed packets reached"},
		{"stranger answered", func(r *SoakReport) { r.Calls.Answered++ }, "a stranger's got through"},
		{"call lost", func(r *SoakReport) { r.Calls.HeldEnd-- }, "relayd held 9 calls"},
		{"stranger unanswered", func(r *SoakReport) { r.SIP.InvitesAnswered = 0 }, "no INVITE of the stranger answered"},
	} {
		r := soakReportFor(cfg, flat)
		tc.spoil(r)
		r.judge(cfg, cfg.Duration)
		if r.Pass || !strings.Contains(strings.Join(r.Problems, "; "), tc.want) {
			t.Errorf("%s: pass %v, problems %q, want %q", tc.name, r.Pass, r.Problems, tc.want)
		}
	}
	// A heap that shrank is no leak.
	r = soakReportFor(cfg, func(t float64) float64 { return 4e6 * (1 - t/300) })
	r.judge(cfg, cfg.Duration)
	if !r.Pass || r.Heap.Ratio >= 0.95 {
		t.Errorf("a shrinking heap: pass %v, ratio %.3f, %q", r.Pass, r.Heap.Ratio, r.Problems)
	}
	var buf bytes.Buffer
	r.WriteText(&buf)
	if !strings.Contains(buf.String(), "PASS") {
		t.Errorf("text:\n%s", buf.String())
	}
}
