package bench

import (
	"math"
	"strings"
	"testing"
)

// TestSummarizeTranscode: the transcode figures follow from the relays'
// ns per packet and bcg729's timings of the same run.
func TestSummarizeTranscode(t *testing.T) {
	rep := &Report{Config: map[string]any{"cpus": 2, "cpu_ghz": "2.00", "server_price_usd": 2000}}
	for _, s := range []struct {
		relay string
		ns    float64
	}{{transcodeRelayd, 30000}, {transcodeRtpengine, 50000}} {
		rep.Rows = append(rep.Rows, benchRowFromRuns(s.relay, benchMediaNGTranscode, 100, benchRuns(s.relay, 10000, 0, s.ns), 2))
	}
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
	near("overhead ratio", x.OverheadRatio, 0.2)
	near("relayd calls per core", r.CallsPerCore, 1e9/3e6)
	near("relayd of the limit", r.OfPhysicalLimit, 2.5/3)
	near("relayd of the contexts limit", r.OfContextsLimit, 1)
	near("relayd calls per GHz", r.CallsPerGHz, 1e9/3e6/2)
	if len(x.Checks) != 3 || !x.Checks[0].Met || !x.Checks[1].Met || !x.Checks[2].Met {
		t.Errorf("checks %+v", x.Checks)
	}
	var w strings.Builder
	rep.WriteText(&w)
	for _, want := range []string{"bcg729 per call: 2500 µs", "1.20x hot, 333 calls per core", "relayd overhead / rtpengine overhead             0.20 (goal <= 0.50): met"} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, w.String())
		}
	}
}
