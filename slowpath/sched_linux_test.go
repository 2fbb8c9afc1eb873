package slowpath

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/lab"
)

// namedWorkers returns the thread ids of this process's threads named
// relayd-wN, by N.
func namedWorkers(t *testing.T) map[int]int {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/comm")
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[int]int)
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		n, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "relayd-w")
		if !ok {
			continue
		}
		id, err := strconv.Atoi(n)
		if err != nil {
			t.Fatalf("%s: %q", p, b)
		}
		tid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		got[id] = tid
	}
	return got
}

// TestPoolScheduling: each worker's thread is named relayd-wN and runs
// with the configured policy and priority, reset on fork; the default
// leaves it as the process was; the threads end with the pool.
func TestPoolScheduling(t *testing.T) {
	enterTestNS(t, "198.18.1.1/32")
	self, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		policy   string
		priority int
		want     uint32 // SCHED_*
	}{
		{"", 0, self.Policy},
		{SchedFIFO, 7, unix.SCHED_FIFO},
		{SchedRR, 3, unix.SCHED_RR},
		{SchedBatch, 5, unix.SCHED_BATCH},
		{SchedOther, -4, unix.SCHED_NORMAL},
		{"", 2, unix.SCHED_NORMAL},
	} {
		name := tc.policy
		if name == "" {
			name = "default"
		}
		t.Run(name+"_"+strconv.Itoa(tc.priority), func(t *testing.T) {
			p, err := New(Config{Workers: 2, Scheduling: tc.policy, Priority: tc.priority}, zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			threads := namedWorkers(t)
			for id, tid := range threads {
				if tid == os.Getpid() {
					t.Errorf("relayd-w%d on the process's main thread", id)
				}
			}
			if len(threads) != 2 {
				p.Close()
				t.Fatalf("worker threads %v, want relayd-w0 and relayd-w1", threads)
			}
			for id, tid := range threads {
				a, err := unix.SchedGetAttr(tid, 0)
				if err != nil {
					t.Fatal(err)
				}
				wantNice, wantPrio := self.Nice, uint32(0)
				switch {
				case tc.want == unix.SCHED_FIFO || tc.want == unix.SCHED_RR:
					wantNice, wantPrio = 0, uint32(tc.priority)
				case tc.policy != "" || tc.priority != 0:
					wantNice = int32(tc.priority)
				}
				if a.Policy != tc.want || a.Priority != wantPrio || a.Nice != wantNice {
					t.Errorf("relayd-w%d (thread %d): policy %d priority %d nice %d, want %d %d %d", id, tid, a.Policy, a.Priority, a.Nice, tc.want, wantPrio, wantNice)
				}
				if changed := tc.policy != "" || tc.priority != 0; changed != (a.Flags&unix.SCHED_FLAG_RESET_ON_FORK != 0) {
					t.Errorf("relayd-w%d: flags %#x: reset on fork should be set exactly when the scheduling was changed", id, a.Flags)
				}
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			// The threads end with their goroutines, not handed back
			// to the runtime with their CPU and policy.
			deadline := time.Now().Add(2 * time.Second)
			for len(namedWorkers(t)) > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if left := namedWorkers(t); len(left) > 0 {
				t.Errorf("worker threads left after Close: %v", left)
			}
		})
	}
	for _, bad := range []struct {
		policy   string
		priority int
	}{{SchedFIFO, 0}, {SchedRR, 100}, {SchedOther, -21}, {"", 20}, {"idle", 0}, {"deadline", 1}} {
		if _, err := New(Config{Workers: 1, Scheduling: bad.policy, Priority: bad.priority}, zaptest.NewLogger(t)); err == nil {
			t.Errorf("scheduling %q priority %d: accepted", bad.policy, bad.priority)
		} else {
			t.Logf("scheduling %q priority %d: %v", bad.policy, bad.priority, err)
		}
	}
}

// TestPoolSchedulingRefused runs itself again without CAP_SYS_NICE and
// with RLIMIT_RTPRIO 0, as relayd runs under its unit: real time and a
// lower nice value fail New with an error that says what to allow, and
// leave no worker running; a higher nice value needs no privilege.
func TestPoolSchedulingRefused(t *testing.T) {
	if os.Getenv("SLOWPATH_SCHED_CHILD") == "" {
		if os.Geteuid() != 0 {
			lab.SkipOrFail(t, "needs root: runs itself without CAP_SYS_NICE")
		}
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Fatal("setpriv (util-linux) not found:", err)
		}
		cmd := exec.Command("prlimit", "--rtprio=0", "--nice=0", "--", setpriv, "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", "--",
			os.Args[0], "-test.run=^TestPoolSchedulingRefused$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "SLOWPATH_SCHED_CHILD=1")
		out, err := cmd.CombinedOutput()
		t.Logf("without CAP_SYS_NICE:\n%s", out)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), "--- PASS: TestPoolSchedulingRefused") {
			t.Fatal("the run without CAP_SYS_NICE did not pass")
		}
		return
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil || eff&(1<<unix.CAP_SYS_NICE) != 0 {
				t.Fatalf("CapEff %s: CAP_SYS_NICE still held (%v)", strings.TrimSpace(hex), err)
			}
		}
	}
	enterTestNS(t, "198.18.1.1/32")
	for _, tc := range []struct {
		policy   string
		priority int
	}{{SchedFIFO, 10}, {SchedRR, 1}, {SchedOther, -5}} {
		_, err := New(Config{Workers: 2, Scheduling: tc.policy, Priority: tc.priority}, zaptest.NewLogger(t))
		if err == nil {
			t.Fatalf("scheduling %s priority %d: started without CAP_SYS_NICE", tc.policy, tc.priority)
		}
		t.Logf("scheduling %s priority %d: %v", tc.policy, tc.priority, err)
		if msg := err.Error(); !strings.Contains(msg, "operation not permitted") || !strings.Contains(msg, "LimitRTPRIO=") {
			t.Errorf("scheduling %s priority %d: %v: want the errno and what to allow", tc.policy, tc.priority, err)
		}
		time.Sleep(50 * time.Millisecond)
		if left := namedWorkers(t); len(left) > 0 {
			t.Errorf("worker threads left after a refused start: %v", left)
		}
	}
	p, err := New(Config{Workers: 1, Scheduling: SchedBatch, Priority: 10}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("batch at nice 10 (lower priority): %v", err)
	}
	p.Close()
}

// TestWorkerOffMainThread: a worker whose goroutine starts on the
// process's main thread (made to look so) moves to a thread of its own,
// and the first thread goes back to the runtime unnamed and alive: pin
// would otherwise rename the process and the thread would be parked for
// good when the worker ends.
func TestWorkerOffMainThread(t *testing.T) {
	enterTestNS(t, "198.18.1.1/32")
	var first atomic.Int64
	defer func(f func() bool) { onMainThread = f }(onMainThread)
	onMainThread = func() bool {
		return first.CompareAndSwap(0, int64(unix.Gettid()))
	}
	p, err := New(Config{Workers: 1, Scheduling: SchedBatch, Priority: 3}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	threads := namedWorkers(t)
	held := int(first.Load())
	if held == 0 || len(threads) != 1 || threads[0] == held {
		p.Close()
		t.Fatalf("worker threads %v, the thread run started on %d: want relayd-w0 on another", threads, held)
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/comm", held))
	if err != nil {
		p.Close()
		t.Fatalf("the thread run started on: %v", err)
	}
	if a, err := unix.SchedGetAttr(held, 0); err != nil || a.Policy != unix.SCHED_NORMAL || a.Nice != 0 {
		t.Errorf("the thread run started on (%q): %+v, %v: want it as the runtime made it", strings.TrimSpace(string(comm)), a, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", held)); err != nil {
		t.Errorf("the thread run started on ended with the worker: %v", err)
	}
}
