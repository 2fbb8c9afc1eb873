package sip

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/control/call"
)

// Metrics are the B2BUA's Prometheus metrics. It implements
// prometheus.Collector; safe for concurrent use.
type Metrics struct {
	setup       prometheus.Histogram
	rateLimited atomic.Uint64
	started     atomic.Uint64

	mu       sync.Mutex // guards the following
	attempts map[int]uint64
	ended    map[call.Disposition]uint64
	active   func() int
	recent   []time.Time // call arrivals in the last cpsWindow
	answered uint64
	finished uint64
}

const cpsWindow = 10 * time.Second

var (
	activeDesc      = prometheus.NewDesc("relayd_calls_active", "Calls in progress.", nil, nil)
	attemptsDesc    = prometheus.NewDesc("relayd_call_attempts_total", "Call attempts toward destinations by final SIP code (0: timeout or transport error).", []string{"code"}, nil)
	callsDesc       = prometheus.NewDesc("relayd_calls_total", "Calls ended, by disposition.", []string{"disposition"}, nil)
	startedDesc     = prometheus.NewDesc("relayd_calls_started_total", "INVITEs that created a call.", nil, nil)
	asrDesc         = prometheus.NewDesc("relayd_asr", "Answer-seizure ratio: answered calls over ended calls, 0 before the first.", nil, nil)
	cpsDesc         = prometheus.NewDesc("relayd_cps", "New calls per second over the last 10 seconds.", nil, nil)
	rateLimitedDesc = prometheus.NewDesc("relayd_sip_rate_limited_total", "INVITEs refused by the per-source rate limit.", nil, nil)
)

func newMetrics() *Metrics {
	return &Metrics{
		setup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "relayd_call_setup_seconds",
			Help:    "Time from the INVITE to the relayed 200 OK.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		attempts: make(map[int]uint64),
		ended:    make(map[call.Disposition]uint64),
	}
}

func (m *Metrics) callStarted() {
	m.started.Add(1)
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recent = append(m.recent, now)
	m.trim(now)
}

// trim drops arrivals older than the window; m.mu must be held.
func (m *Metrics) trim(now time.Time) {
	i := 0
	for i < len(m.recent) && now.Sub(m.recent[i]) > cpsWindow {
		i++
	}
	if i > 0 {
		m.recent = append(m.recent[:0], m.recent[i:]...)
	}
}

func (m *Metrics) attempt(code int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.attempts[code]++
}

func (m *Metrics) callEnded(d call.Disposition, answered bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ended[d]++
	m.finished++
	if answered {
		m.answered++
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{activeDesc, attemptsDesc, callsDesc, startedDesc, asrDesc, cpsDesc, rateLimitedDesc} {
		ch <- d
	}
	m.setup.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	now := time.Now()
	m.trim(now)
	cps := float64(len(m.recent)) / cpsWindow.Seconds()
	asr := 0.0
	if m.finished > 0 {
		asr = float64(m.answered) / float64(m.finished)
	}
	for code, n := range m.attempts {
		ch <- prometheus.MustNewConstMetric(attemptsDesc, prometheus.CounterValue, float64(n), strconv.Itoa(code))
	}
	for d, n := range m.ended {
		ch <- prometheus.MustNewConstMetric(callsDesc, prometheus.CounterValue, float64(n), string(d))
	}
	active := m.active
	m.mu.Unlock()
	if active != nil {
		ch <- prometheus.MustNewConstMetric(activeDesc, prometheus.GaugeValue, float64(active()))
	}
	ch <- prometheus.MustNewConstMetric(startedDesc, prometheus.CounterValue, float64(m.started.Load()))
	ch <- prometheus.MustNewConstMetric(asrDesc, prometheus.GaugeValue, asr)
	ch <- prometheus.MustNewConstMetric(cpsDesc, prometheus.GaugeValue, cps)
	ch <- prometheus.MustNewConstMetric(rateLimitedDesc, prometheus.CounterValue, float64(m.rateLimited.Load()))
	m.setup.Collect(ch)
}
