// Package loglimit rate-limits log lines that a remote party can trigger
// at will (a malformed SIP request, an ng command for an unknown call),
// per source: a flood of bad packets from one source costs a few lines
// and a periodic summary, while other sources keep their own allowance.
//
// zap's sampler cannot do this: it keys by message, so one flooding source
// would use up the allowance of a message for every source. Here the key
// is (source, message): a token bucket for each, held in a fixed-size LRU
// table, so that memory stays bounded however many sources there are.
// IPv6 sources are keyed by their /64, the smallest block a host is
// usually given, so that one host cannot get a fresh allowance per
// address.
//
// Suppressed lines are counted (relayd_log_suppressed_total) and
// reported every Report interval, per key ("N similar lines from SRC
// suppressed") for the busiest keys and in one line for the rest.
package loglimit

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Config configures a Limiter. Zero fields take their defaults.
type Config struct {
	// Component names the limiter's user in the counter's label and in
	// the summary lines ("sip", "ng").
	Component string
	// Burst lines per key pass at once; default 5.
	Burst int
	// Rate is lines per second per key once the burst is spent; default
	// 0.1 (one line every ten seconds).
	Rate float64
	// Keys is how many (source, message) keys are remembered; the least
	// recently used is forgotten past it. Default 4096.
	Keys int
	// Report is how often suppressed lines are reported; default one
	// minute.
	Report time.Duration
	// MaxReport bounds the summary lines of one report: the keys with the
	// most suppressed lines get one each, the others share one line.
	// Default 10.
	MaxReport int
}

// Limiter decides which lines pass. Safe for concurrent use; Check and
// Allow allocate nothing.
type Limiter struct {
	cfg   Config
	log   *zap.Logger // summaries
	epoch time.Time
	now   func() time.Duration // since epoch; a field so that tests can drive time
	desc  *prometheus.Desc

	suppressed atomic.Uint64 // every line suppressed so far

	mu         sync.Mutex // guards the following
	idx        map[key]int32
	ents       []entry // len(ents) keys in use, cap Keys
	head, tail int32   // LRU list through entry.prev/next, most recent at head; -1 when empty
	evicted    uint64  // suppressed lines of keys forgotten before their report
	evictedN   int     // how many such keys
	timer      *time.Timer
	armed      bool
	closed     bool
}

type key struct {
	src netip.Addr
	msg string
}

type entry struct {
	key        key
	tokens     float64
	last       time.Duration
	suppressed uint64 // since the last report
	since      time.Duration
	prev, next int32
}

type report struct {
	key   key
	n     uint64
	since time.Duration
}

// New returns a limiter that writes its summaries to log.
func New(cfg Config, log *zap.Logger) *Limiter {
	if cfg.Burst <= 0 {
		cfg.Burst = 5
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 0.1
	}
	if cfg.Keys <= 0 {
		cfg.Keys = 4096
	}
	if cfg.Report <= 0 {
		cfg.Report = time.Minute
	}
	if cfg.MaxReport <= 0 {
		cfg.MaxReport = 10
	}
	l := &Limiter{
		cfg:   cfg,
		log:   log,
		epoch: time.Now(),
		idx:   make(map[key]int32, cfg.Keys),
		ents:  make([]entry, 0, cfg.Keys),
		head:  -1,
		tail:  -1,
		desc: prometheus.NewDesc("relayd_log_suppressed_total",
			"Log lines a remote party triggered that were suppressed by the per-source log rate limit.",
			nil, prometheus.Labels{"component": cfg.Component}),
	}
	l.now = func() time.Duration { return time.Since(l.epoch) }
	l.timer = time.AfterFunc(time.Hour, l.Flush)
	l.timer.Stop()
	return l
}

// Check is zap's Logger.Check for a line that src triggered: nil when
// the level is off or src's allowance for msg is spent (the line is then
// counted as suppressed). Write the returned entry with the line's
// fields, which are thus built only for lines that are written.
func (l *Limiter) Check(log *zap.Logger, lvl zapcore.Level, src netip.Addr, msg string) *zapcore.CheckedEntry {
	if !log.Core().Enabled(lvl) || !l.Allow(src, msg) {
		return nil
	}
	return log.Check(lvl, msg)
}

// Allow reports whether a line msg that src triggered may be written
// now, and counts it as suppressed when not.
func (l *Limiter) Allow(src netip.Addr, msg string) bool {
	k := key{src: keyAddr(src), msg: msg}
	now := l.now()
	l.mu.Lock()
	i, ok := l.idx[k]
	if ok {
		l.touch(i)
	} else {
		i = l.insert(k, now)
	}
	e := &l.ents[i]
	e.tokens = min(float64(l.cfg.Burst), e.tokens+(now-e.last).Seconds()*l.cfg.Rate)
	e.last = now
	if e.tokens >= 1 {
		e.tokens--
		l.mu.Unlock()
		return true
	}
	if e.suppressed == 0 {
		e.since = now
	}
	e.suppressed++
	if !l.armed && !l.closed {
		l.armed = true
		l.timer.Reset(l.cfg.Report)
	}
	l.mu.Unlock()
	l.suppressed.Add(1)
	return false
}

// keyAddr is the part of an address a source is known by.
func keyAddr(a netip.Addr) netip.Addr {
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.Addr()
	}
	return a
}

// touch moves entry i to the head of the LRU list.
func (l *Limiter) touch(i int32) {
	if l.head == i {
		return
	}
	l.unlink(i)
	l.pushHead(i)
}

func (l *Limiter) unlink(i int32) {
	e := &l.ents[i]
	if e.prev >= 0 {
		l.ents[e.prev].next = e.next
	} else {
		l.head = e.next
	}
	if e.next >= 0 {
		l.ents[e.next].prev = e.prev
	} else {
		l.tail = e.prev
	}
}

func (l *Limiter) pushHead(i int32) {
	e := &l.ents[i]
	e.prev, e.next = -1, l.head
	if l.head >= 0 {
		l.ents[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

// insert adds k with a full bucket, reusing the least recently used
// entry when the table is full.
func (l *Limiter) insert(k key, now time.Duration) int32 {
	var i int32
	if len(l.ents) < cap(l.ents) {
		i = int32(len(l.ents))
		l.ents = l.ents[:i+1]
	} else {
		i = l.tail
		old := &l.ents[i]
		if old.suppressed > 0 {
			l.evicted += old.suppressed
			l.evictedN++
		}
		delete(l.idx, old.key)
		l.unlink(i)
	}
	l.ents[i] = entry{key: k, tokens: float64(l.cfg.Burst), last: now}
	l.idx[k] = i
	l.pushHead(i)
	return i
}

// Flush reports the lines suppressed since the last report. It runs by
// itself every Report interval while there are any.
func (l *Limiter) Flush() {
	now := l.now()
	l.mu.Lock()
	var batch []report
	for i := range l.ents {
		e := &l.ents[i]
		if e.suppressed > 0 {
			batch = append(batch, report{key: e.key, n: e.suppressed, since: e.since})
			e.suppressed = 0
		}
	}
	others, othersN := l.evicted, l.evictedN
	l.evicted, l.evictedN = 0, 0
	l.armed = false
	l.mu.Unlock()
	if len(batch) > l.cfg.MaxReport {
		slices.SortFunc(batch, func(a, b report) int { return cmp.Compare(b.n, a.n) })
		for _, r := range batch[l.cfg.MaxReport:] {
			others += r.n
			othersN++
		}
		batch = batch[:l.cfg.MaxReport]
	}
	for _, r := range batch {
		l.log.Info(fmt.Sprintf("%d similar lines from %s suppressed", r.n, r.key.src),
			zap.String("component", l.cfg.Component), zap.Uint64("suppressed", r.n),
			zap.Stringer("source", r.key.src), zap.String("line", r.key.msg), zap.Duration("over", now-r.since))
	}
	if others > 0 {
		l.log.Info(fmt.Sprintf("%d similar lines from %d other sources suppressed", others, othersN),
			zap.String("component", l.cfg.Component), zap.Uint64("suppressed", others), zap.Int("sources", othersN))
	}
}

// Close stops the periodic report after a last one. Lines suppressed
// later are still counted, and reported by an explicit Flush only.
func (l *Limiter) Close() {
	l.mu.Lock()
	l.closed = true
	l.armed = false
	l.timer.Stop()
	l.mu.Unlock()
	l.Flush()
}

// Suppressed returns how many lines were suppressed so far.
func (l *Limiter) Suppressed() uint64 { return l.suppressed.Load() }

// Describe implements prometheus.Collector.
func (l *Limiter) Describe(ch chan<- *prometheus.Desc) { ch <- l.desc }

// Collect implements prometheus.Collector.
func (l *Limiter) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(l.desc, prometheus.CounterValue, float64(l.suppressed.Load()))
}
