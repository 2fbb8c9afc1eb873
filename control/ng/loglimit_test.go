package ng

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestFailureLogsRateLimited: a client sending garbage and failing
// commands at will gets a few log lines, then a summary, while another
// client still gets its own; every request is still answered.
func TestFailureLogsRateLimited(t *testing.T) {
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) { return nil, ErrUnknownCall }}
	core, logs := observer.New(zap.InfoLevel)
	s, err := New(Config{Listen: []string{"udp:127.0.0.1:0"}}, e, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	flooder := netip.MustParseAddrPort("127.0.0.2:40000")
	for i := range 100 {
		if exchange(t, s, flooder, []byte(fmt.Sprintf("g%d d3:foo", i))) == nil {
			t.Fatal("garbage not answered")
		}
		if exchange(t, s, flooder, append(fmt.Appendf(nil, "q%d ", i), kdict("call-id", "nope", "command", "query")...)) == nil {
			t.Fatal("failed query not answered")
		}
	}
	exchange(t, s, loopbackClient, append([]byte("o1 "), kdict("call-id", "other", "command", "query")...))
	if n := logs.FilterMessage("ng request does not decode").Len(); n != 5 {
		t.Errorf("%d lines for 100 undecodable requests from one client, want the burst (5)", n)
	}
	if n := logs.FilterMessage("ng command failed").FilterFieldKey("from").Len(); n != 6 {
		t.Errorf("%d lines for failed commands, want 5 from the flooder and 1 from the other client", n)
	}
	if n := logs.FilterMessage("ng request refused").Len(); n != 5 {
		t.Errorf("%d refusal lines for 100 undecodable requests, want 5", n)
	}
	// 95 each of three lines: does not decode, refused, command failed.
	if v := testutil.ToFloat64(s.loglim); v != 285 {
		t.Errorf("relayd_log_suppressed_total{component=\"ng\"} %v, want 285", v)
	}
	s.Close() // reports what was suppressed
	sum := logs.FilterMessage("95 similar lines from 127.0.0.2 suppressed").All()
	if len(sum) != 3 {
		t.Fatalf("summaries %v", logs.FilterFieldKey("suppressed").All())
	}
	if n := testutil.CollectAndCount(s.Metrics(), "relayd_log_suppressed_total"); n != 1 {
		t.Errorf("Metrics() has %d relayd_log_suppressed_total series, want 1", n)
	}
}
