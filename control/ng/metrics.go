package ng

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Reasons of relayd_ng_ignored_total.
const (
	ignoredNotAllowed = "not_allowed" // sender outside the allow list
	ignoredMalformed  = "malformed"   // no cookie: nothing to answer
	ignoredOverload   = "overload"    // the worker queue was full
	ignoredTooLarge   = "too_large"   // reply larger than a datagram
)

// metrics are the server's Prometheus collectors. Safe for concurrent use.
type metrics struct {
	commands   *prometheus.CounterVec
	duplicates prometheus.Counter
	ignored    *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	more       []prometheus.Collector // the server's other collectors
}

func newMetrics() *metrics {
	m := &metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_ng_commands_total",
			Help: "ng commands answered, by command and result (ok, pong, error, load limit).",
		}, []string{"command", "result"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relayd_ng_duplicates_total",
			Help: "ng requests resent with a cookie already seen, answered from the cookie cache.",
		}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_ng_ignored_total",
			Help: "ng messages not answered, by reason (not_allowed, malformed, overload, too_large).",
		}, []string{"reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "relayd_ng_command_duration_seconds",
			Help:    "Time the engine took for an ng command.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"command"}),
	}
	for _, r := range []string{ignoredNotAllowed, ignoredMalformed, ignoredOverload, ignoredTooLarge} {
		m.ignored.WithLabelValues(r)
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.commands.Describe(ch)
	m.duplicates.Describe(ch)
	m.ignored.Describe(ch)
	m.duration.Describe(ch)
	for _, c := range m.more {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.commands.Collect(ch)
	m.duplicates.Collect(ch)
	m.ignored.Collect(ch)
	m.duration.Collect(ch)
	for _, c := range m.more {
		c.Collect(ch)
	}
}
