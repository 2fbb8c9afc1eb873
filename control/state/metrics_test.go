package state

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestMetrics: the counters say what was written, concurrent writes
// share commits, and the file's size is the file's.
func TestMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, Config{Path: path})
	defer s.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Metrics())
	if problems, err := testutil.CollectAndLint(s.Metrics()); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}

	const n = 100
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := s.Put("sip", strconv.Itoa(i), []byte(strings.Repeat("x", 1000))); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := s.Delete("sip", "7"); err != nil {
		t.Fatal(err)
	}
	got := gather(t, reg)
	for name, want := range map[string]float64{
		`relayd_state_writes_total{op="put"}`:           n,
		`relayd_state_writes_total{op="delete"}`:        1,
		`relayd_state_record_bytes_total`:               n * 1000,
		`relayd_state_write_seconds_count{op="put"}`:    n,
		`relayd_state_write_seconds_count{op="delete"}`: 1,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
	// 101 writes in fewer commits (the puts were concurrent), at least
	// one for the delete after them.
	if c := got["relayd_state_commits_total"]; c < 2 || c >= n {
		t.Errorf("%v commits for %d concurrent puts and a delete", c, n)
	}
	if got["relayd_state_disk_writes_total"] < got["relayd_state_commits_total"] {
		t.Errorf("%v disk writes for %v commits", got["relayd_state_disk_writes_total"], got["relayd_state_commits_total"])
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got["relayd_state_file_bytes"] != float64(fi.Size()) {
		t.Errorf("file bytes %v, the file has %d", got["relayd_state_file_bytes"], fi.Size())
	}
	t.Logf("%v commits for %d puts and a delete", got["relayd_state_commits_total"], n)

	// A write the store fails counts as an error, not as bytes.
	if got["relayd_state_write_errors_total"] != 0 {
		t.Errorf("write errors %v, want 0", got["relayd_state_write_errors_total"])
	}
	s.Close()
	if err := s.Put("sip", "late", []byte("v")); err == nil {
		t.Fatal("put to a closed store: no error")
	}
	got = gather(t, reg)
	if got["relayd_state_write_errors_total"] != 1 || got[`relayd_state_writes_total{op="put"}`] != n+1 || got["relayd_state_record_bytes_total"] != n*1000 {
		t.Errorf("after a failed put: errors %v, puts %v, bytes %v", got["relayd_state_write_errors_total"],
			got[`relayd_state_writes_total{op="put"}`], got["relayd_state_record_bytes_total"])
	}
}

// gather flattens the registry's metrics to name{labels} -> value;
// histograms give their _count.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]float64)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			var v float64
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				name += "_count"
				v = float64(m.GetHistogram().GetSampleCount())
			}
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			out[name] = v
		}
	}
	return out
}
