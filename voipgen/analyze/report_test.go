package analyze

import (
	"bytes"
	"encoding/json"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/rtp"
)

// TestReportFailover feeds 100 staggered 20 ms streams that all lose what
// was sent during a 300 ms outage, and checks the per-stream glitch, its
// distribution, the outage the streams bound together and the resolution.
func TestReportFailover(t *testing.T) {
	const (
		streams = 100
		ms      = int64(time.Millisecond)
	)
	start := time.Unix(1_800_000_000, 0)
	t0 := start.UnixNano()
	down, up := t0+1000*ms+7*ms/10, t0+1300*ms+7*ms/10 // outage 1000.7 .. 1300.7 ms
	rc := &Receiver{cfg: Config{Addr: netip.MustParseAddr("198.18.2.2"), PortLo: 40000, PortHi: 40000 + 2*streams, ClockRate: 8000}, start: start}
	for i := range streams {
		pr := &portReader{port: 40000 + 2*i}
		a := &rtp.StreamAnalyzer{ClockRate: 8000}
		off := int64(i) * 20 * ms / streams // staggered across the ptime
		for k := range 100 {
			at := t0 + off + int64(k)*20*ms
			if at >= down && at < up {
				continue
			}
			h := rtp.Header{SSRC: uint32(i + 1), SequenceNumber: uint16(k), Timestamp: uint32(k) * 160}
			a.Update(&h, 172, at)
		}
		pr.streams = append(pr.streams, a)
		rc.readers = append(rc.readers, pr)
	}
	rep := rc.Report(2 * time.Second)
	f := rep.Failover
	if f == nil || f.Streams != streams || f.StreamsClean != 0 {
		t.Fatalf("failover %+v", f)
	}
	for _, s := range rep.Streams {
		if s.Glitches != 1 || s.Lost != 15 || s.MaxGlitchMs != 300 || len(s.LossPeriods) != 1 || s.LossPeriods[0].GapMs != 320 {
			t.Fatalf("stream %+v", s)
		}
		if s.MOS == nil || *s.MOS > 4.1 || s.BurstR < 10 {
			t.Errorf("stream %d: 15 packets in one burst of 100: MOS %v burst ratio %.1f", s.Port, s.MOS, s.BurstR)
		}
	}
	// The streams bracket the outage to within ptime/streams = 0.2 ms at
	// either end.
	if math.Abs(f.OutageMs-300) > 2*0.2 || math.Abs(f.ResolutionMs-0.2) > 0.001 {
		t.Errorf("outage %.3f ms at resolution %.3f ms, want 300 +- 0.4 at 0.2", f.OutageMs, f.ResolutionMs)
	}
	if f.GlitchMs.Min != 300 || f.GlitchMs.Max != 300 || rep.Totals.GlitchMsDist.P50 != 300 {
		t.Errorf("glitch distribution %+v", f.GlitchMs)
	}
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(rep); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"failover":{`, `"outage_ms":`, `"loss_periods":[{`, `"mos":`, `"max_glitch_ms":300`} {
		if !strings.Contains(b.String(), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
	b.Reset()
	rep.WriteText(&b)
	for _, s := range []string{"the 10 worst of 100 streams", "100 of 100 streams lost packets", "outage seen by all of them together: 300."} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("text report lacks %q:\n%s", s, b.String())
		}
	}
}

func TestDistribution(t *testing.T) {
	d := DistOf([]float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10})
	if d.N != 10 || d.Min != 1 || d.Max != 10 || d.P50 != 5 || d.P90 != 9 || d.P99 != 10 || d.Mean != 5.5 {
		t.Fatalf("%+v", d)
	}
	if d := DistOf([]float64{42}); d.P50 != 42 || d.P99 != 42 || d.Min != 42 {
		t.Fatalf("%+v", d)
	}
	if d := DistOf(nil); d.N != 0 || d.String() != "-" {
		t.Fatalf("%+v", d)
	}
}
