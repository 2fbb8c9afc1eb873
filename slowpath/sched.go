package slowpath

import "fmt"

// The scheduling policies of Config.Scheduling, named as sched(7) and
// rtpengine's --scheduling name them.
const (
	SchedOther = "other" // SCHED_OTHER: the kernel's default, fair share by nice value
	SchedBatch = "batch" // SCHED_BATCH: as other, a small penalty on wake-up
	SchedFIFO  = "fifo"  // SCHED_FIFO: real time, runs until it blocks or a higher priority runs
	SchedRR    = "rr"    // SCHED_RR: real time, round robin among equal priorities
)

// checkScheduling reports whether policy and priority are a valid
// Config.Scheduling and Config.Priority.
func checkScheduling(policy string, priority int) error {
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
