// Package measure accounts the CPU time that a benchmark's processes and
// kernel threads spend, to express it per packet.
//
// On veth, XDP and the kernel's forwarding run in softirq context, mostly
// in the task that sent the packet (softirqs run when its syscall enables
// bottom halves again) and otherwise in ksoftirqd/N. A relay daemon's own
// process time therefore says little; what a relay costs is the increase of
// the CPU time of every task involved (sender, sink, daemon, ksoftirqd)
// over a run of the same load without the relay (docs/architecture.md, "Lab and measurement").
//
// Sources:
//   - /proc/PID/task/TID/schedstat, first field: the thread's time on CPU
//     in nanoseconds (se.sum_exec_runtime, scheduler clock); second field:
//     its time runnable but waiting on a run queue, which tells when a
//     benchmark's threads were kept from a CPU (by each other, or by
//     other processes on a shared machine). It includes
//     softirq work done in the thread's context as long as the kernel is
//     built without CONFIG_IRQ_TIME_ACCOUNTING (then softirq time is
//     subtracted from the task and only /proc/stat shows it); IRQTimeAccounting
//     tells which. Softirqs that run on the exit of an interrupt that hit
//     the idle task are in no task's time. Threads that exit between two
//     snapshots are lost; threads that start are counted in full.
//   - /proc/stat, per CPU idle + iowait: the whole machine, including work
//     of unrelated processes. With NO_HZ the kernel keeps idle time exactly,
//     but /proc/stat reports it in USER_HZ (10 ms) units, so it suits runs
//     of seconds and serves as a cross-check. The busy fields of /proc/stat
//     are sampled by the tick and are not used.
package measure

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// UserHZ is the unit of the /proc/stat times: USER_HZ is 100 on every
// Linux architecture that matters here.
const UserHZ = 100

// Target names what to account under Label: all threads of process PID,
// or only the threads TIDs of it.
type Target struct {
	Label string
	PID   int
	TIDs  []int // empty: every thread of PID
}

// CPUStat is one CPU's line of /proc/stat, in USER_HZ units.
type CPUStat struct {
	CPU                                  int // -1 for the "cpu" total line
	User, Nice, System, Idle, IOWait     uint64
	IRQ, SoftIRQ, Steal, Guest, GuestNic uint64
}

// IdleNs returns idle + iowait in nanoseconds.
func (c CPUStat) IdleNs() uint64 { return (c.Idle + c.IOWait) * uint64(time.Second/UserHZ) }

// StealNs returns steal time in nanoseconds.
func (c CPUStat) StealNs() uint64 { return c.Steal * uint64(time.Second/UserHZ) }

// Snapshot is the CPU time of a set of targets and of every CPU at one
// moment. Its zero value is empty.
type Snapshot struct {
	At time.Time
	// Tasks maps label to thread id to on-CPU nanoseconds.
	Tasks map[string]map[int]uint64
	// Waits maps label to thread id to nanoseconds spent runnable on a
	// run queue.
	Waits map[string]map[int]uint64
	// Labels in the order the targets were given.
	Labels []string
	// CPUs is the per-CPU part of /proc/stat (without the total line).
	CPUs []CPUStat
}

// Sampler takes snapshots. The zero value reads /proc.
type Sampler struct {
	Proc string // procfs root, default "/proc"; tests point it at testdata
	now  func() time.Time
}

func (s *Sampler) proc() string {
	if s.Proc == "" {
		return "/proc"
	}
	return s.Proc
}

// Snapshot reads the CPU time of the targets' threads and of every CPU.
// A target whose process is gone contributes nothing; other read errors
// are returned.
func (s *Sampler) Snapshot(targets []Target) (Snapshot, error) {
	snap := Snapshot{Tasks: make(map[string]map[int]uint64), Waits: make(map[string]map[int]uint64)}
	if s.now != nil {
		snap.At = s.now()
	} else {
		snap.At = time.Now()
	}
	for _, t := range targets {
		m, mw := snap.Tasks[t.Label], snap.Waits[t.Label]
		if m == nil {
			m, mw = make(map[int]uint64), make(map[int]uint64)
			snap.Tasks[t.Label], snap.Waits[t.Label] = m, mw
			snap.Labels = append(snap.Labels, t.Label)
		}
		tids := t.TIDs
		if len(tids) == 0 {
			var err error
			if tids, err = s.threads(t.PID); err != nil {
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				return snap, err
			}
		}
		for _, tid := range tids {
			b, err := os.ReadFile(filepath.Join(s.proc(), strconv.Itoa(t.PID), "task", strconv.Itoa(tid), "schedstat"))
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
				continue // exited
			}
			if err != nil {
				return snap, err
			}
			run, wait, _, err := ParseSchedstat(b)
			if err != nil {
				return snap, fmt.Errorf("thread %d of %d: %w", tid, t.PID, err)
			}
			m[tid], mw[tid] = run, wait
		}
	}
	b, err := os.ReadFile(filepath.Join(s.proc(), "stat"))
	if err != nil {
		return snap, err
	}
	if snap.CPUs, err = ParseStat(b); err != nil {
		return snap, err
	}
	return snap, nil
}

func (s *Sampler) threads(pid int) ([]int, error) {
	ents, err := os.ReadDir(filepath.Join(s.proc(), strconv.Itoa(pid), "task"))
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// FindByComm returns the pids of the processes whose name (/proc/PID/comm)
// starts with prefix, for example "ksoftirqd/", sorted.
func (s *Sampler) FindByComm(prefix string) ([]int, error) {
	ents, err := os.ReadDir(s.proc())
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.proc(), e.Name(), "comm"))
		if err != nil {
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(string(b)), prefix) {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids, nil
}

// ParseSchedstat parses /proc/PID/task/TID/schedstat: time on CPU (ns),
// time waiting on a run queue (ns) and the number of time slices.
func ParseSchedstat(b []byte) (run, wait, slices uint64, err error) {
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, 0, 0, fmt.Errorf("schedstat %q: want 3 fields", bytes.TrimSpace(b))
	}
	var v [3]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
			return 0, 0, 0, fmt.Errorf("schedstat %q: %w", bytes.TrimSpace(b), err)
		}
	}
	return v[0], v[1], v[2], nil
}

// ParseStat returns the per-CPU lines of /proc/stat ("cpuN ..."), without
// the total line. Missing trailing fields (older kernels) are zero.
func ParseStat(b []byte) ([]CPUStat, error) {
	var cpus []CPUStat
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		n, err := strconv.Atoi(f[0][3:])
		if err != nil {
			return nil, fmt.Errorf("/proc/stat: line %q", f[0])
		}
		var v [10]uint64
		for i := 0; i < len(v) && i+1 < len(f); i++ {
			if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
				return nil, fmt.Errorf("/proc/stat: %s: %w", f[0], err)
			}
		}
		cpus = append(cpus, CPUStat{CPU: n, User: v[0], Nice: v[1], System: v[2], Idle: v[3], IOWait: v[4],
			IRQ: v[5], SoftIRQ: v[6], Steal: v[7], Guest: v[8], GuestNic: v[9]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(cpus) == 0 {
		return nil, errors.New("/proc/stat: no cpu lines")
	}
	return cpus, nil
}

// Usage is the CPU time spent between two snapshots.
type Usage struct {
	Elapsed time.Duration
	// ByLabel is the on-CPU time of each label's threads, in the order of
	// the targets.
	ByLabel []LabelTime
	// Tasks is the on-CPU time of all threads of all targets, each thread
	// counted once even when two labels share it.
	Tasks time.Duration
	// Busy is the whole machine's non-idle time from /proc/stat: CPUs x
	// elapsed - (idle + iowait + steal), 10 ms resolution per CPU.
	Busy time.Duration
	// Steal is the time the hypervisor ran something else.
	Steal time.Duration
}

// LabelTime is one label's CPU time, and the time its threads were
// runnable but waited for a CPU.
type LabelTime struct {
	Label string
	Time  time.Duration
	Wait  time.Duration
}

// Get returns the time of label, 0 if absent.
func (u Usage) Get(label string) time.Duration {
	for _, l := range u.ByLabel {
		if l.Label == label {
			return l.Time
		}
	}
	return 0
}

// Diff returns the CPU time spent from a to b (b taken later). Threads only
// in b count in full; threads only in a have exited and are lost.
func Diff(a, b Snapshot) Usage {
	u := Usage{Elapsed: b.At.Sub(a.At)}
	seen := make(map[int]bool)
	for _, label := range b.Labels {
		var sum, wait uint64
		for tid, nb := range b.Tasks[label] {
			na := a.Tasks[label][tid]
			if nb < na {
				continue // a reused thread id
			}
			sum += nb - na
			if wb, wa := b.Waits[label][tid], a.Waits[label][tid]; wb >= wa {
				wait += wb - wa
			}
			if !seen[tid] {
				seen[tid] = true
				u.Tasks += time.Duration(nb - na)
			}
		}
		u.ByLabel = append(u.ByLabel, LabelTime{label, time.Duration(sum), time.Duration(wait)})
	}
	if len(a.CPUs) == len(b.CPUs) && len(b.CPUs) > 0 {
		var idle, steal uint64
		for i := range b.CPUs {
			idle += b.CPUs[i].IdleNs() - a.CPUs[i].IdleNs()
			steal += b.CPUs[i].StealNs() - a.CPUs[i].StealNs()
		}
		u.Steal = time.Duration(steal)
		u.Busy = time.Duration(len(b.CPUs))*u.Elapsed - time.Duration(idle) - u.Steal
	}
	return u
}

// NsPerPacket returns d divided by packets in nanoseconds, 0 without
// packets.
func NsPerPacket(d time.Duration, packets uint64) float64 {
	if packets == 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / float64(packets)
}

// IRQTimeAccounting reports whether the running kernel subtracts interrupt
// and softirq time from task times (CONFIG_IRQ_TIME_ACCOUNTING), as far as
// /proc/config.gz tells; ok is false when it cannot tell. When true, the
// per-task figures miss softirq work and only /proc/stat busy time has it.
func IRQTimeAccounting() (on, ok bool) {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return false, false
	}
	defer f.Close()
	on, err = irqTimeAccounting(f)
	return on, err == nil
}

func irqTimeAccounting(r io.Reader) (bool, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return false, err
	}
	sc := bufio.NewScanner(zr)
	for sc.Scan() {
		if sc.Text() == "CONFIG_IRQ_TIME_ACCOUNTING=y" {
			return true, nil
		}
	}
	return false, sc.Err()
}
