package bench

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// TestSummarizeTranscode: the transcode figures follow from the relays'
// ns per packet and bcg729's timings of the same run.
func TestSummarizeTranscode(t *testing.T) {
	rep := &Report{Config: map[string]any{"cpus": 2, "cpu_ghz": "2.00", "server_price_usd": 2000}}
	// relayd: 32 µs per packet at 100 calls, 28 at 200, 30 at 250 (median
	// 30),
	// lossy at 300 and short of its offer at 400; rtpengine 50 at 100.
	for _, s := range []struct {
		relay string
		calls int
		lost  int64
		ns    float64
	}{{transcodeRelayd, 100, 0, 32000}, {transcodeRelayd, 200, 0, 28000}, {transcodeRelayd, 300, 5, 20000}, {transcodeRtpengine, 100, 0, 50000}} {
		rep.Rows = append(rep.Rows, benchRowFromRuns(s.relay, benchMediaNGTranscode, s.calls, benchRuns(s.relay, uint64(100*s.calls), s.lost, s.ns), 2))
	}
	// At 250 calls nothing was lost but the workers' median delay was
	// past a packet time: not carried.
	runs := benchRuns(transcodeRelayd, 25000, 0, 30000)
	for i := range runs {
		if runs[i].Mode != "direct" {
			runs[i].WorkerDelay = &WorkerDelay{Packets: 25000, P50US: 50000, P99US: 50000, P99Over: true}
		}
	}
	behind := benchRowFromRuns(transcodeRelayd, benchMediaNGTranscode, 250, runs, 2)
	if !behind.WorkerBehind || behind.WorkerDelayP50US != 50000 {
		t.Fatalf("row with the workers' median delay 50 ms: %+v", behind)
	}
	rep.Rows = append(rep.Rows, behind)
	short := benchRowFromRuns(transcodeRelayd, benchMediaNGTranscode, 400, benchRuns(transcodeRelayd, 30000, 0, 15000), 2)
	short.SenderLimited, short.Comparable = true, false
	rep.Rows = append(rep.Rows, short)
	// bcg729: 20 µs per encoded frame, 5 µs per decoded one: 2.5 ms per
	// call and second, 400 calls per core; over 100 contexts 25 and 5:
	// 3 ms, 1.2x.
	rep.Transcode = &benchTranscodeReport{Bcg729: bcg729Cost(bcg729Timings{
		enc: []float64{19000, 20000, 21000}, dec: []float64{5000, 5000, 6000},
		nenc: []float64{25000, 24000, 26000}, ndec: []float64{5000, 6000, 5000}, contexts: 100, cpu: 1})}
	summarizeBench(rep, []string{transcodeRelayd, transcodeRtpengine}, 2, 2, 2000)
	summarizeTranscode(rep, 2)
	x := rep.Transcode
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Abs(want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	near("bcg729 ns per call second", x.Bcg729.NsPerCallSecond, 2.5e6)
	near("physical calls per core", x.Bcg729.PhysicalCallsPerCore, 400)
	near("min pair", x.Bcg729.MinNsPerFramePair, 24000)
	near("max pair", x.Bcg729.MaxNsPerFramePair, 27000)
	near("contexts ns per call second", x.Bcg729.ContextsNsPerCallSecond, 3e6)
	near("contexts over hot", x.Bcg729.ContextsOverHot, 1.2)
	near("contexts min pair", x.Bcg729.ContextsMinNsPerPair, 30000)
	near("contexts max pair", x.Bcg729.ContextsMaxNsPerPair, 31000)
	if len(x.Relays) != 2 {
		t.Fatalf("relays %+v", x.Relays)
	}
	r, e := x.Relays[0], x.Relays[1]
	near("relayd CPU per call", r.CPUNsPerCallSecond, 3e6)
	near("relayd overhead", r.OverheadNsPerCallSecond, 0.5e6)
	near("rtpengine overhead", e.OverheadNsPerCallSecond, 2.5e6)
	// Over the one step both carried, 100 calls: relayd 3.2 ms per call
	// and second, 0.7 over bcg729, against rtpengine's 2.5.
	near("overhead ratio", x.OverheadRatio, 0.28)
	if !slices.Equal(x.OverheadSteps, []int{100}) {
		t.Errorf("overhead steps %v, want [100]", x.OverheadSteps)
	}
	near("relayd calls per core", r.CallsPerCore, 1e9/3e6)
	near("relayd of the limit", r.OfPhysicalLimit, 2.5/3)
	near("relayd of the contexts limit", r.OfContextsLimit, 1)
	near("relayd calls per GHz", r.CallsPerGHz, 1e9/3e6/2)
	// Under load: the 200-call step (250 carried only by queueing, 300
	// lost packets, 400 was not offered in full): 2.8 ms per call and
	// second.
	if !slices.Equal(r.BehindSteps, []int{250}) {
		t.Errorf("relayd's steps behind %v, want [250]", r.BehindSteps)
	}
	if r.LoadCalls != 200 {
		t.Errorf("relayd's load step %d calls, want 200", r.LoadCalls)
	}
	near("relayd CPU per call under load", r.LoadCPUNsPerCallSecond, 2.8e6)
	near("relayd calls per core under load", r.LoadCallsPerCore, 1e9/2.8e6)
	near("relayd of the limit under load", r.LoadOfPhysicalLimit, 2.5/2.8)
	near("relayd calls per GHz under load", r.LoadCallsPerGHz, 1e9/2.8e6/2)
	near("relayd CPU share under load", r.LoadRelayCPU, 28000*200*100/1e9)
	if e.LoadCalls != 100 {
		t.Errorf("rtpengine's load step %d calls, want 100", e.LoadCalls)
	}
	if len(x.Checks) != 3 || !x.Checks[0].Met || !x.Checks[1].Met || !x.Checks[2].Met {
		t.Errorf("checks %+v", x.Checks)
	}
	var w strings.Builder
	rep.WriteText(&w)
	if len(x.Checks) == 3 && (x.Checks[1].Value != r.LoadOfPhysicalLimit || x.Checks[2].Value != r.LoadCallsPerGHz) {
		t.Errorf("checks %+v: want the calls per core and per GHz under load", x.Checks)
	}
	for _, want := range []string{"bcg729 per call: 2500 µs", "1.20x hot, 333 calls per core", "relayd overhead / rtpengine overhead             0.28 (goal <= 0.50): met",
		"under load, at 200 calls (relay 0.56 CPUs, the highest step carried without loss or workers behind): 2800 µs/call/s, 357 calls per core (0.89x the limit), 179 calls/GHz",
		"no loss but the workers behind (median packet delayed over 20 ms) at [250] calls: not counted as carried",
		"relayd calls per core at 200 calls / bcg729's limit 0.89 (goal >= 0.75): met"} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, w.String())
		}
	}
}
