package ng

import (
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetricsRegister(t *testing.T) {
	s := newTestServer(t, &fakeEngine{}, nil)
	exchange(t, s, loopbackClient, append([]byte("m1 "), kdict("command", "query", "call-id", "c")...))
	exchange(t, s, loopbackClient, append([]byte("m2 "), kdict("command", "bogus")...))
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(s.Metrics()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"relayd_ng_commands_total", "relayd_ng_duplicates_total", "relayd_ng_ignored_total", "relayd_ng_command_duration_seconds"} {
		if !names[n] {
			t.Errorf("%s not gathered (have %v)", n, names)
		}
	}
	if n := testutil.ToFloat64(s.metrics.commands.WithLabelValues("query", "ok")); n != 1 {
		t.Errorf("query ok %v, want 1", n)
	}
	if n := testutil.ToFloat64(s.metrics.commands.WithLabelValues("other", "error")); n != 1 {
		t.Errorf("other error %v, want 1", n)
	}
}

// The read loops never wait for a worker: a full queue drops and counts.
func TestQueueFullDrops(t *testing.T) {
	s := newTestServer(t, &fakeEngine{}, func(c *Config) { c.Queue = 1 })
	j := job{from: loopbackClient, msg: []byte("a d7:command4:pinge"), send: func([]byte) {}}
	if !s.submit(j) {
		t.Fatal("first request dropped")
	}
	if s.submit(j) {
		t.Fatal("second request queued past the limit")
	}
	if n := testutil.ToFloat64(s.metrics.ignored.WithLabelValues(ignoredOverload)); n != 1 {
		t.Errorf("overload %v, want 1", n)
	}
	if s.submit(job{from: netip.MustParseAddrPort("[2001:2::1]:1"), msg: j.msg, send: j.send}) {
		t.Error("outside client queued")
	}
}
