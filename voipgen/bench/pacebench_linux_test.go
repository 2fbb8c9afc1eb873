package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// TestPacebench runs the pacing comparison at a small scale: both senders'
// streams all arrive, and voipgen's arrive without loss.
func TestPacebench(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedCommand(t, "sipp", "sip-tester")
	var progress bytes.Buffer
	rows, err := Pace(context.Background(), PaceConfig{calls: []int{20}, duration: 2 * time.Second, rate: 100}, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Sender != "voipgen" || rows[1].Sender != "sipp" {
		t.Fatalf("rows %+v", rows)
	}
	for _, r := range rows {
		t.Logf("%s %d calls: %d streams, %d packets, %d lost; max gap ms %v; jitter ms %v %s", r.Sender, r.Calls, r.Streams, r.Packets, r.Lost, r.MaxGapMs, r.JitterMs, r.Note)
		if r.Streams != 20 || r.Packets < 20*90 || r.Note != "" {
			t.Errorf("%s: %+v", r.Sender, r)
		}
	}
	if rows[0].Lost != 0 || rows[0].Packets != 20*100 {
		t.Errorf("voipgen: %d packets, %d lost; want 2000 and none", rows[0].Packets, rows[0].Lost)
	}
}
