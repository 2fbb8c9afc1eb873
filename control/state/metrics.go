package state

import (
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
)

const (
	opPut = iota
	opDelete
	opCount
)

var opNames = [opCount]string{opPut: "put", opDelete: "delete"}

var (
	writesDesc = prometheus.NewDesc("relayd_state_writes_total",
		"Records written (put) and removed (delete) in the state file, by operation; failed ones count in relayd_state_write_errors_total too.", []string{"op"}, nil)
	writeErrorsDesc = prometheus.NewDesc("relayd_state_write_errors_total",
		"Puts and deletes that failed: the call went on but would not be taken back (or left behind) by a restart.", nil, nil)
	writeBytesDesc = prometheus.NewDesc("relayd_state_record_bytes_total",
		"Bytes of the records put.", nil, nil)
	commitsDesc = prometheus.NewDesc("relayd_state_commits_total",
		"Transactions committed, each with its fsyncs: concurrent puts and deletes share one (group commit).", nil, nil)
	diskWritesDesc = prometheus.NewDesc("relayd_state_disk_writes_total",
		"Writes to the file the commits made (runs of pages and meta pages).", nil, nil)
	diskWriteTimeDesc = prometheus.NewDesc("relayd_state_disk_write_seconds_total",
		"Time the commits spent writing and syncing their pages (without the meta page's).", nil, nil)
	fileBytesDesc = prometheus.NewDesc("relayd_state_file_bytes",
		"Size of the state file.", nil, nil)
	freePagesDesc = prometheus.NewDesc("relayd_state_free_pages",
		"Pages of the state file free for reuse.", nil, nil)
)

// metrics are the store's counters; Store.Metrics exports them.
type metrics struct {
	writes  [opCount]atomic.Uint64
	errors  atomic.Uint64
	bytes   atomic.Uint64
	commits atomic.Uint64
	lastTx  atomic.Int64 // the last write transaction a put or delete ran in
	// wait is how long puts and deletes took to be durable (the batch's
	// delay, the other writes of the batch and the commit).
	wait *prometheus.HistogramVec
}

func newMetrics() metrics {
	return metrics{wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "relayd_state_write_seconds",
		Help: "How long a put or delete took until durable, by operation: the group commit's delay, the batch's other writes and the commit with its fsyncs.",
		// A commit is one or two fsyncs: from tens of microseconds on
		// NVMe to tens of milliseconds on a loaded disk.
		Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .02, .05, .1, .25, 1},
	}, []string{"op"})}
}

// sharing counts tx's commit once, from the first write that runs in it
// (a batch runs its writes one after the other in one transaction).
func (m *metrics) sharing(tx *bolt.Tx) {
	if id := int64(tx.ID()); m.lastTx.Swap(id) != id {
		tx.OnCommit(func() { m.commits.Add(1) })
	}
}

func (m *metrics) done(op int, n int, start time.Time, err error) {
	m.writes[op].Add(1)
	if err != nil {
		m.errors.Add(1)
		return
	}
	m.bytes.Add(uint64(n))
	m.wait.WithLabelValues(opNames[op]).Observe(time.Since(start).Seconds())
}

// Metrics returns a Prometheus collector of the store's writes, commits
// and file.
func (s *Store) Metrics() prometheus.Collector { return (*storeCollector)(s) }

type storeCollector Store

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{writesDesc, writeErrorsDesc, writeBytesDesc, commitsDesc, diskWritesDesc, diskWriteTimeDesc, fileBytesDesc, freePagesDesc} {
		ch <- d
	}
	c.m.wait.Describe(ch)
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	m := &c.m
	for op, name := range opNames {
		ch <- prometheus.MustNewConstMetric(writesDesc, prometheus.CounterValue, float64(m.writes[op].Load()), name)
	}
	ch <- prometheus.MustNewConstMetric(writeErrorsDesc, prometheus.CounterValue, float64(m.errors.Load()))
	ch <- prometheus.MustNewConstMetric(writeBytesDesc, prometheus.CounterValue, float64(m.bytes.Load()))
	ch <- prometheus.MustNewConstMetric(commitsDesc, prometheus.CounterValue, float64(m.commits.Load()))
	st := c.db.Stats()
	ch <- prometheus.MustNewConstMetric(diskWritesDesc, prometheus.CounterValue, float64(st.TxStats.GetWrite()))
	ch <- prometheus.MustNewConstMetric(diskWriteTimeDesc, prometheus.CounterValue, st.TxStats.GetWriteTime().Seconds())
	ch <- prometheus.MustNewConstMetric(freePagesDesc, prometheus.GaugeValue, float64(st.FreePageN))
	if fi, err := os.Stat(c.db.Path()); err == nil {
		ch <- prometheus.MustNewConstMetric(fileBytesDesc, prometheus.GaugeValue, float64(fi.Size()))
	}
	m.wait.Collect(ch)
}
