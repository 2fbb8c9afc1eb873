package sip

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relayd/relayd/control/call"
)

// TestMetricsCounters: every disposition is exported from the start, at
// 0; ended calls count per disposition and answered ones once more; no
// precomputed rate gauges remain.
func TestMetricsCounters(t *testing.T) {
	m := newMetrics()
	m.active = func() int { return 1 }
	m.callStarted()
	m.callStarted()
	m.callEnded(call.Answered, true)
	m.callEnded(call.MediaTimeout, true)
	m.callEnded(call.Failed, false)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	want := `
# HELP relayd_sip_calls_total Calls ended, by disposition.
# TYPE relayd_sip_calls_total counter
relayd_sip_calls_total{disposition="answered"} 1
relayd_sip_calls_total{disposition="canceled"} 0
relayd_sip_calls_total{disposition="failed"} 1
relayd_sip_calls_total{disposition="max_duration"} 0
relayd_sip_calls_total{disposition="media_timeout"} 1
relayd_sip_calls_total{disposition="rejected"} 0
relayd_sip_calls_total{disposition="shutdown"} 0
# HELP relayd_sip_calls_answered_total Calls ended that had been answered (the numerator of the ASR).
# TYPE relayd_sip_calls_answered_total counter
relayd_sip_calls_answered_total 2
# HELP relayd_calls_started_total INVITEs that created a call.
# TYPE relayd_calls_started_total counter
relayd_calls_started_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "relayd_sip_calls_total", "relayd_sip_calls_answered_total", "relayd_calls_started_total"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if n := mf.GetName(); n == "relayd_cps" || n == "relayd_asr" {
			t.Errorf("rate gauge %s still exported", n)
		}
	}
}
