package sip

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/control/call"
)

// Metrics are the B2BUA's Prometheus metrics: counters, from which
// Prometheus derives rates (CPS: rate(relayd_calls_started_total); ASR:
// rate(relayd_sip_calls_answered_total) / rate(relayd_sip_calls_total)).
// It implements prometheus.Collector; safe for concurrent use.
type Metrics struct {
	setup       prometheus.Histogram
	rateLimited atomic.Uint64
	started     atomic.Uint64
	answered    atomic.Uint64

	mu       sync.Mutex // guards the following
	refusals map[string]uint64
	attempts map[int]uint64
	ended    map[call.Disposition]uint64
	active   func() int
	more     []prometheus.Collector // the front end's other collectors
}

// dispositions are the label values of relayd_sip_calls_total present
// from the start, so that rate() and absent() work before the first call.
var dispositions = []call.Disposition{
	call.Answered, call.Failed, call.Canceled, call.Rejected, call.MediaTimeout, call.MaxDuration, call.Shutdown,
}

// Reasons of relayd_sip_refused_total: why an INVITE was refused before
// it became a call.
const (
	refusedSource      = "source"      // outside the allow list of every route matching the user (403)
	refusedChallenged  = "challenged"  // no credentials, or a stale nonce, for a route with auth_users (401)
	refusedCredentials = "credentials" // credentials refused: unknown user, wrong password, wrong digest uri (403, 400)
	refusedUser        = "user"        // authenticated, but no route matching the user lists the caller's user (403)
)

var refusedReasons = []string{refusedSource, refusedChallenged, refusedCredentials, refusedUser}

const refusedHelp = "INVITEs refused before routing, by reason: source (outside the allow list of every route matching the user, 403), " +
	"challenged (no credentials or a stale nonce, 401), credentials (refused, 403), user (authenticated, not a user of the route, 403)."

var (
	refusedDesc     = prometheus.NewDesc("relayd_sip_refused_total", refusedHelp, []string{"reason"}, nil)
	activeDesc      = prometheus.NewDesc("relayd_calls_active", "Calls in progress.", nil, nil)
	attemptsDesc    = prometheus.NewDesc("relayd_call_attempts_total", "Call attempts toward destinations by final SIP code (0: timeout or transport error).", []string{"code"}, nil)
	callsDesc       = prometheus.NewDesc("relayd_sip_calls_total", "Calls ended, by disposition.", []string{"disposition"}, nil)
	answeredDesc    = prometheus.NewDesc("relayd_sip_calls_answered_total", "Calls ended that had been answered (the numerator of the ASR).", nil, nil)
	startedDesc     = prometheus.NewDesc("relayd_calls_started_total", "INVITEs that created a call.", nil, nil)
	rateLimitedDesc = prometheus.NewDesc("relayd_sip_rate_limited_total", "INVITEs refused by the per-source rate limit.", nil, nil)
)

func newMetrics() *Metrics {
	m := &Metrics{
		setup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "relayd_call_setup_seconds",
			Help:    "Time from the INVITE to the relayed 200 OK.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		attempts: make(map[int]uint64),
		ended:    make(map[call.Disposition]uint64),
		refusals: make(map[string]uint64),
	}
	for _, d := range dispositions {
		m.ended[d] = 0
	}
	for _, r := range refusedReasons {
		m.refusals[r] = 0
	}
	return m
}

func (m *Metrics) callStarted() { m.started.Add(1) }

func (m *Metrics) refused(reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refusals[reason]++
}

func (m *Metrics) attempt(code int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.attempts[code]++
}

func (m *Metrics) callEnded(d call.Disposition, answered bool) {
	m.mu.Lock()
	m.ended[d]++
	m.mu.Unlock()
	if answered {
		m.answered.Add(1)
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{activeDesc, attemptsDesc, callsDesc, answeredDesc, startedDesc, rateLimitedDesc, refusedDesc} {
		ch <- d
	}
	m.setup.Describe(ch)
	for _, c := range m.more {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	for code, n := range m.attempts {
		ch <- prometheus.MustNewConstMetric(attemptsDesc, prometheus.CounterValue, float64(n), strconv.Itoa(code))
	}
	for d, n := range m.ended {
		ch <- prometheus.MustNewConstMetric(callsDesc, prometheus.CounterValue, float64(n), string(d))
	}
	for r, n := range m.refusals {
		ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(n), r)
	}
	active := m.active
	m.mu.Unlock()
	if active != nil {
		ch <- prometheus.MustNewConstMetric(activeDesc, prometheus.GaugeValue, float64(active()))
	}
	ch <- prometheus.MustNewConstMetric(answeredDesc, prometheus.CounterValue, float64(m.answered.Load()))
	ch <- prometheus.MustNewConstMetric(startedDesc, prometheus.CounterValue, float64(m.started.Load()))
	ch <- prometheus.MustNewConstMetric(rateLimitedDesc, prometheus.CounterValue, float64(m.rateLimited.Load()))
	m.setup.Collect(ch)
	for _, c := range m.more {
		c.Collect(ch)
	}
}
