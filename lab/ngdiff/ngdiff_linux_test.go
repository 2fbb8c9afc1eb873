package ngdiff

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/rtpengine"
)

// rtpengineIgnore are the reply keys whose presence depends on timing
// even between two rtpengines: none so far.
var rtpengineIgnore = []string{}

// TestRTPEngineAgainstItself: two rtpengines, one in the relay namespace
// and one in relay2, get the same sequence and must reply alike. This
// proves the harness and the sequence; relayd takes B's place once its ng
// server lands.
func TestRTPEngineAgainstItself(t *testing.T) {
	steps, err := LoadSteps("testdata/steps.json")
	if err != nil {
		t.Fatal(err)
	}
	l := lab.NewT(t)
	if err := l.AddRelay2(); err != nil {
		t.Fatal(err)
	}
	a := rtpengine.StartT(t, l, rtpengine.Options{Threads: 1})
	b := rtpengine.StartT(t, l, rtpengine.Options{Threads: 1, NS: l.Relay2, NGAddr: netip.MustParseAddrPort("127.0.0.1:2223")})
	dial := func(e *rtpengine.Engine) Server {
		c, err := e.NS.DialUDP("udp4", "", e.NGAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return Server{Name: "rtpengine@" + e.NS.Name(), Conn: c}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	results, diffs, err := Run(ctx, steps, dial(a), dial(b), Options{Ignore: rtpengineIgnore})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(steps) {
		t.Fatalf("%d results for %d steps", len(results), len(steps))
	}
	for _, d := range diffs {
		t.Errorf("%v", d)
	}
	for _, r := range results {
		t.Logf("%s: %s / %s %s", r.Step.Name, r.A.Result, r.B.Result, r.A.Value.GetString("error-reason"))
	}
}
