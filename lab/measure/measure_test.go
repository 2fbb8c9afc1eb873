package measure

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseSchedstat(t *testing.T) {
	run, wait, slices, err := ParseSchedstat([]byte("123456789 42 7\n"))
	if err != nil || run != 123456789 || wait != 42 || slices != 7 {
		t.Errorf("got %d %d %d %v", run, wait, slices, err)
	}
	for _, bad := range []string{"", "1 2", "a b c", "-1 2 3"} {
		if _, _, _, err := ParseSchedstat([]byte(bad)); err == nil {
			t.Errorf("ParseSchedstat(%q): no error", bad)
		}
	}
}

func TestParseStat(t *testing.T) {
	b, err := os.ReadFile("testdata/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseStat(b)
	if err != nil {
		t.Fatal(err)
	}
	want := []CPUStat{
		{CPU: 0, User: 34900, System: 5805, Idle: 115915, IOWait: 262, SoftIRQ: 297, Steal: 110},
		{CPU: 1, User: 34735, System: 5753, Idle: 116059, IOWait: 212, SoftIRQ: 348, Steal: 98},
	}
	if d := cmp.Diff(got, want); d != "" {
		t.Errorf("ParseStat (-got +want):\n%s", d)
	}
	if got[0].IdleNs() != (115915+262)*10_000_000 {
		t.Errorf("IdleNs = %d", got[0].IdleNs())
	}
	// Old kernels have fewer fields.
	old, err := ParseStat([]byte("cpu 1 2 3 4\ncpu0 1 2 3 4\n"))
	if err != nil || len(old) != 1 || old[0].Idle != 4 || old[0].Steal != 0 {
		t.Errorf("short line: %+v %v", old, err)
	}
	if _, err := ParseStat([]byte("intr 1\n")); err == nil {
		t.Error("no cpu lines: no error")
	}
}

func TestFindByComm(t *testing.T) {
	s := Sampler{Proc: "testdata/proc"}
	got, err := s.FindByComm("ksoftirqd/")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(got, []int{14, 22}); d != "" {
		t.Errorf("FindByComm (-got +want):\n%s", d)
	}
}

// copyTree copies testdata/proc to a temporary directory that the test can
// change.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSnapshotDiff(t *testing.T) {
	root := copyTree(t, "testdata/proc")
	t0 := time.Unix(1000, 0)
	now := t0
	s := Sampler{Proc: root, now: func() time.Time { return now }}
	targets := []Target{
		{Label: "relayd", PID: 100},
		{Label: "relayd-main", PID: 100, TIDs: []int{100}},
		{Label: "ksoftirqd", PID: 14},
		{Label: "ksoftirqd", PID: 22},
		{Label: "gone", PID: 999},
	}
	a, err := s.Snapshot(targets)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(a.Tasks["relayd"], map[int]uint64{100: 1000000, 101: 2500000}); d != "" {
		t.Errorf("relayd threads (-got +want):\n%s", d)
	}

	// One second later: relayd's threads ran 3 ms and 1 ms more (the first
	// waited 0.1 ms more on a run queue), a new thread 102 ran 0.5 ms
	// (after waiting 0.2 ms), ksoftirqd/0 4 ms; every CPU was idle for
	// 0.8 s and CPU 1 lost 0.1 s to steal.
	now = t0.Add(time.Second)
	write(t, filepath.Join(root, "100/task/100/schedstat"), "4000000 100500 12\n")
	write(t, filepath.Join(root, "100/task/101/schedstat"), "3500000 0 4\n")
	os.MkdirAll(filepath.Join(root, "100/task/102"), 0o755)
	write(t, filepath.Join(root, "100/task/102/schedstat"), "500000 200000 1\n")
	write(t, filepath.Join(root, "14/task/14/schedstat"), "4007000 20 5\n")
	later, err := os.ReadFile("testdata/stat-later")
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(root, "stat"), string(later))
	b, err := s.Snapshot(targets)
	if err != nil {
		t.Fatal(err)
	}
	u := Diff(a, b)
	want := Usage{
		Elapsed: time.Second,
		ByLabel: []LabelTime{
			{"relayd", 4500 * time.Microsecond, 300 * time.Microsecond},
			{"relayd-main", 3 * time.Millisecond, 100 * time.Microsecond},
			{"ksoftirqd", 4 * time.Millisecond, 0},
			{"gone", 0, 0},
		},
		Tasks: 8500 * time.Microsecond, // relayd-main is part of relayd
		Busy:  2*time.Second - 1600*time.Millisecond - 100*time.Millisecond,
		Steal: 100 * time.Millisecond,
	}
	if d := cmp.Diff(u, want); d != "" {
		t.Errorf("Diff (-got +want):\n%s", d)
	}
	if got := u.Get("ksoftirqd"); got != 4*time.Millisecond {
		t.Errorf("Get(ksoftirqd) = %v", got)
	}
	if got := NsPerPacket(u.Tasks, 10000); got != 850 {
		t.Errorf("NsPerPacket = %v, want 850", got)
	}
	if got := NsPerPacket(u.Tasks, 0); got != 0 {
		t.Errorf("NsPerPacket without packets = %v, want 0", got)
	}
}

func TestIRQTimeAccounting(t *testing.T) {
	for _, c := range []struct {
		config string
		want   bool
	}{
		{"CONFIG_TICK_CPU_ACCOUNTING=y\n# CONFIG_IRQ_TIME_ACCOUNTING is not set\n", false},
		{"CONFIG_IRQ_TIME_ACCOUNTING=y\n", true},
	} {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write([]byte(c.config))
		zw.Close()
		got, err := irqTimeAccounting(&buf)
		if err != nil || got != c.want {
			t.Errorf("%q: got %v %v, want %v", c.config, got, err, c.want)
		}
	}
}

// TestSelf reads this process's own threads from the real /proc.
func TestSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc")
	}
	var s Sampler
	targets := []Target{{Label: "self", PID: os.Getpid()}}
	a, err := s.Snapshot(targets)
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := range 20_000_000 {
		x += i * i
	}
	_ = x
	b, err := s.Snapshot(targets)
	if err != nil {
		t.Fatal(err)
	}
	if u := Diff(a, b); u.Get("self") <= 0 || len(b.CPUs) == 0 {
		t.Errorf("no CPU time measured: %+v", u)
	}
}
