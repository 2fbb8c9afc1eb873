package fastpath

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMonoNow: monoNow, without a system call, reads the kernel's
// CLOCK_MONOTONIC (bpf_ktime_get_ns's clock): never before a reading of
// it taken just before, and at most a few microseconds after one taken
// just after.
func TestMonoNow(t *testing.T) {
	clock := func() uint64 {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			t.Fatal(err)
		}
		return uint64(ts.Nano())
	}
	late := 0
	for range 10000 {
		before := clock()
		m := monoNow()
		after := clock()
		if m < before {
			t.Fatalf("monoNow %d before the clock's %d", m, before)
		}
		if m > after+uint64(20*time.Microsecond) {
			late++
		}
	}
	// A reading may be preempted between the two clocks; not most.
	if late > 100 {
		t.Errorf("monoNow more than 20 us after the clock in %d of 10000 readings", late)
	}
}
