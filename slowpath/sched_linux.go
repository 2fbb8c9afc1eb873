package slowpath

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// applyScheduling sets the calling thread's scheduling policy and
// priority (checked by checkScheduling). The default, policy "" with
// priority 0, leaves the thread as it is. Threads the caller's thread
// creates start back at the kernel's default (SCHED_FLAG_RESET_ON_FORK).
// The caller must hold its thread (runtime.LockOSThread) and never give
// it back to the runtime: other goroutines would run with it.
func applyScheduling(policy string, priority int) error {
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
		return checkScheduling(policy, priority)
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
