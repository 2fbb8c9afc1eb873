package loglimit

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// clock is a limiter's time, moved by hand.
type clock struct{ t time.Duration }

func newTest(t *testing.T, cfg Config) (*Limiter, *clock, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	l := New(cfg, zap.New(core))
	c := &clock{}
	l.now = func() time.Duration { return c.t }
	t.Cleanup(func() { l.timer.Stop() })
	return l, c, logs
}

var (
	srcA = netip.MustParseAddr("192.0.2.1")
	srcB = netip.MustParseAddr("192.0.2.2")
)

func TestBurstThenSteadyRate(t *testing.T) {
	l, c, _ := newTest(t, Config{Burst: 3, Rate: 2}) // 2 lines/s after 3
	passed := 0
	for range 100 {
		if l.Allow(srcA, "bad") {
			passed++
		}
	}
	if passed != 3 {
		t.Fatalf("burst: %d of 100 passed, want 3", passed)
	}
	// 10 s at 100 lines/s: 2 lines/s pass.
	passed = 0
	for range 1000 {
		c.t += 10 * time.Millisecond
		if l.Allow(srcA, "bad") {
			passed++
		}
	}
	if passed < 19 || passed > 21 {
		t.Errorf("steady: %d lines passed in 10 s at 2/s", passed)
	}
	if got, want := l.Suppressed(), uint64(1100-3-passed); got != want {
		t.Errorf("suppressed %d, want %d", got, want)
	}
	// Another source and another message have their own allowance.
	if !l.Allow(srcB, "bad") || !l.Allow(srcA, "other") {
		t.Error("a flood from one source used another key's allowance")
	}
	// After a quiet period the burst is back, no more.
	c.t += time.Hour
	passed = 0
	for range 10 {
		if l.Allow(srcA, "bad") {
			passed++
		}
	}
	if passed != 3 {
		t.Errorf("after a pause %d passed, want the burst (3)", passed)
	}
}

func TestIPv6KeyedBySlash64(t *testing.T) {
	l, _, _ := newTest(t, Config{Burst: 1})
	if !l.Allow(netip.MustParseAddr("2001:db8:1:2::1"), "m") {
		t.Fatal("first line suppressed")
	}
	if l.Allow(netip.MustParseAddr("2001:db8:1:2::ffff"), "m") {
		t.Error("another address of the same /64 got a fresh allowance")
	}
	if !l.Allow(netip.MustParseAddr("2001:db8:1:3::1"), "m") {
		t.Error("another /64 was suppressed")
	}
	if l.Allow(netip.MustParseAddr("::ffff:192.0.2.1"), "m"); l.Allow(srcA, "m") {
		t.Error("a v4-mapped address and its IPv4 address are different sources")
	}
}

func TestBoundedMemory(t *testing.T) {
	l, c, logs := newTest(t, Config{Burst: 1, Keys: 64, MaxReport: 5})
	// 100000 sources, each flooding a little: the table never grows past
	// 64 keys, and the lines of forgotten keys are still reported.
	for i := range 100000 {
		src := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		for range 3 {
			l.Allow(src, "bad")
		}
		c.t += time.Microsecond
	}
	if len(l.ents) != 64 || len(l.idx) != 64 || cap(l.ents) != 64 {
		t.Fatalf("table holds %d entries (%d indexed, cap %d), want 64", len(l.ents), len(l.idx), cap(l.ents))
	}
	// The LRU list links every entry once.
	seen := 0
	for i := l.head; i >= 0; i = l.ents[i].next {
		seen++
		if seen > 64 {
			t.Fatal("LRU list loops")
		}
	}
	if seen != 64 {
		t.Fatalf("LRU list has %d entries, want 64", seen)
	}
	l.Flush()
	var total uint64
	lines := logs.TakeAll()
	for _, e := range lines {
		total += uint64(e.ContextMap()["suppressed"].(uint64))
	}
	if total != 200000 || l.Suppressed() != 200000 {
		t.Errorf("reported %d suppressed lines, counted %d, want 200000", total, l.Suppressed())
	}
	if len(lines) != 6 { // MaxReport keys, then one line for the rest
		t.Errorf("%d summary lines, want 6", len(lines))
	}
	last := lines[len(lines)-1].Message
	if !strings.HasSuffix(last, "other sources suppressed") {
		t.Errorf("last summary %q", last)
	}
}

func TestSummaryLine(t *testing.T) {
	l, c, logs := newTest(t, Config{Component: "sip", Burst: 2, Report: time.Minute})
	log, _ := observer.New(zap.InfoLevel)
	lg := zap.New(log)
	written := 0
	for range 12 {
		if ce := l.Check(lg, zap.InfoLevel, srcA, "malformed SIP request"); ce != nil {
			ce.Write()
			written++
		}
		c.t += time.Millisecond
	}
	if written != 2 {
		t.Fatalf("%d lines written, want 2", written)
	}
	// A disabled level spends no token and counts nothing.
	if ce := l.Check(lg, zap.DebugLevel, srcB, "debug line"); ce != nil || l.Suppressed() != 10 {
		t.Fatalf("debug line: %v, suppressed %d", ce, l.Suppressed())
	}
	if !l.armed {
		t.Fatal("no report scheduled after a suppression")
	}
	c.t += time.Minute
	l.Flush()
	got := logs.TakeAll()
	if len(got) != 1 {
		t.Fatalf("%d summary lines: %v", len(got), got)
	}
	e := got[0]
	if want := "10 similar lines from 192.0.2.1 suppressed"; e.Message != want {
		t.Errorf("summary %q, want %q", e.Message, want)
	}
	f := e.ContextMap()
	if f["line"] != "malformed SIP request" || f["component"] != "sip" || f["suppressed"] != uint64(10) || f["source"] != "192.0.2.1" {
		t.Errorf("summary fields %v", f)
	}
	// Nothing new: no second summary.
	l.Flush()
	if n := logs.Len(); n != 0 {
		t.Errorf("%d summary lines for nothing suppressed", n)
	}
	if v := testutil.ToFloat64(l); v != 10 {
		t.Errorf("relayd_log_suppressed_total %v, want 10", v)
	}
	if err := testutil.CollectAndCompare(l, strings.NewReader(`
# HELP relayd_log_suppressed_total Log lines a remote party triggered that were suppressed by the per-source log rate limit.
# TYPE relayd_log_suppressed_total counter
relayd_log_suppressed_total{component="sip"} 10
`)); err != nil {
		t.Error(err)
	}
}

func TestReportRunsByItself(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	l := New(Config{Burst: 1, Report: 20 * time.Millisecond}, zap.New(core))
	defer l.Close()
	l.Allow(srcA, "x")
	l.Allow(srcA, "x")
	deadline := time.Now().Add(5 * time.Second)
	for logs.Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no summary within 5 s of a 20 ms report interval")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if m := logs.All()[0].Message; m != "1 similar lines from 192.0.2.1 suppressed" {
		t.Errorf("summary %q", m)
	}
}

func TestAllocationFree(t *testing.T) {
	l, c, _ := newTest(t, Config{Burst: 1, Keys: 256})
	lg := zap.NewNop()
	srcs := make([]netip.Addr, 1000) // more sources than keys: the eviction path too
	for i := range srcs {
		srcs[i] = netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)})
	}
	for _, s := range srcs { // warm the map to its size
		l.Allow(s, "m")
	}
	i := 0
	allocs := testing.AllocsPerRun(10000, func() {
		c.t += time.Microsecond
		l.Allow(srcs[i%len(srcs)], "m")
		if ce := l.Check(lg, zapcore.InfoLevel, srcs[i%len(srcs)], "m"); ce != nil {
			ce.Write()
		}
		i++
	})
	if allocs != 0 {
		t.Errorf("%v allocations per line", allocs)
	}
}

func BenchmarkAllowSuppressed(b *testing.B) {
	l := New(Config{Burst: 1}, zap.NewNop())
	defer l.Close()
	src := netip.MustParseAddr("192.0.2.1")
	b.ReportAllocs()
	for b.Loop() {
		l.Allow(src, "malformed SIP request")
	}
}

func BenchmarkAllowManySources(b *testing.B) {
	l := New(Config{Burst: 1, Keys: 4096}, zap.NewNop())
	defer l.Close()
	srcs := make([]netip.Addr, 65536)
	for i := range srcs {
		srcs[i] = netip.MustParseAddr(fmt.Sprintf("10.%d.%d.1", i>>8, i&255))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Allow(srcs[i&65535], "malformed SIP request")
		i++
	}
}

// TestTwoComponentsOneRegistry: the SIP and ng front ends each export
// relayd_log_suppressed_total; one registry takes both.
func TestTwoComponentsOneRegistry(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	sip := New(Config{Component: "sip", Burst: 1}, zap.NewNop())
	ng := New(Config{Component: "ng", Burst: 1}, zap.NewNop())
	defer sip.Close()
	defer ng.Close()
	reg.MustRegister(sip, ng)
	for range 3 {
		sip.Allow(srcA, "x")
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP relayd_log_suppressed_total Log lines a remote party triggered that were suppressed by the per-source log rate limit.
# TYPE relayd_log_suppressed_total counter
relayd_log_suppressed_total{component="ng"} 0
relayd_log_suppressed_total{component="sip"} 2
`), "relayd_log_suppressed_total"); err != nil {
		t.Error(err)
	}
}
