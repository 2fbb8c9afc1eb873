package slowpath

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// The scheduling policies of Config.Scheduling, named as sched(7) and
// rtpengine's --scheduling name them.
const (
	SchedOther = "other" // SCHED_OTHER: the kernel's default, fair share by nice value
	SchedBatch = "batch" // SCHED_BATCH: as other, a small penalty on wake-up
	SchedFIFO  = "fifo"  // SCHED_FIFO: real time, runs until it blocks or a higher priority runs
	SchedRR    = "rr"    // SCHED_RR: real time, round robin among equal priorities
)

// CheckScheduling reports whether policy and priority are a valid
// Config.Scheduling and Config.Priority.
func CheckScheduling(policy string, priority int) error {
	switch policy {
	case "", SchedOther, SchedBatch:
		if priority < -20 || priority > 19 {
			return fmt.Errorf("priority %d: a nice value, -20 (highest) to 19, under scheduling %q", priority, policyName(policy))
		}
	case SchedFIFO, SchedRR:
		if priority < 1 || priority > 99 {
			return fmt.Errorf("priority %d: a real-time priority, 1 to 99, under scheduling %q", priority, policy)
		}
	default:
		return fmt.Errorf("scheduling %q: want %s, %s, %s or %s", policy, SchedOther, SchedBatch, SchedFIFO, SchedRR)
	}
	return nil
}

func policyName(p string) string {
	if p == "" {
		return SchedOther
	}
	return p
}

// ApplyScheduling sets the calling thread's scheduling policy and
// priority (checked by CheckScheduling). The default, policy "" with
// priority 0, leaves the thread as it is. Threads the caller's thread
// creates start back at the kernel's default (SCHED_FLAG_RESET_ON_FORK).
// The caller must hold its thread (runtime.LockOSThread) and never give
// it back to the runtime: other goroutines would run with it.
func ApplyScheduling(policy string, priority int) error {
	if policy == "" && priority == 0 {
		return nil
	}
	attr := unix.SchedAttr{Flags: unix.SCHED_FLAG_RESET_ON_FORK}
	switch policy {
	case "", SchedOther:
		attr.Policy, attr.Nice = unix.SCHED_NORMAL, int32(priority)
	case SchedBatch:
		attr.Policy, attr.Nice = unix.SCHED_BATCH, int32(priority)
	case SchedFIFO:
		attr.Policy, attr.Priority = unix.SCHED_FIFO, uint32(priority)
	case SchedRR:
		attr.Policy, attr.Priority = unix.SCHED_RR, uint32(priority)
	default:
		return CheckScheduling(policy, priority)
	}
	if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
		what := fmt.Sprintf("nice %d", priority)
		if policy == SchedFIFO || policy == SchedRR {
			what = fmt.Sprintf("priority %d", priority)
		}
		return fmt.Errorf("scheduling %s, %s: %w (needs CAP_SYS_NICE, or a matching RLIMIT_NICE or RLIMIT_RTPRIO: under systemd LimitNICE= or LimitRTPRIO=, and RestrictRealtime=no for fifo and rr)",
			policyName(policy), what, err)
	}
	return nil
}
