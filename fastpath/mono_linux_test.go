package fastpath

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
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

// TestSlotHintMapped: a flow's slot hint is written through relayd's
// mapping of port_slots, and the program's map holds it.
func TestSlotHintMapped(t *testing.T) {
	if !portTableSupported {
		t.Skip("port_flows and port_slots are mapped on amd64 only")
	}
	e := newTestEnv(t)
	fl := dataplane.Flow{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000}
	other := dataplane.Flow{Match: ap(relay4, 30004), SendFrom: ap(relay4, 30006), SendTo: ap(callee4, 5002), ClockRate: 8000}
	for _, f := range []dataplane.Flow{other, fl} {
		if err := e.fp.Install(f); err != nil {
			t.Fatal(err)
		}
	}
	slot := slotOf(t, e.fp, fl)
	if slot == 0 {
		t.Fatal("the second flow in slot 0")
	}
	if got := e.fp.ports.hints[30000].slot; got != slot {
		t.Errorf("mapped hint for port 30000: %d, want %d", got, slot)
	}
	if got := portSlot(t, e.fp, 30000); got != slot {
		t.Errorf("port_slots[30000] by lookup: %d, want %d", got, slot)
	}
}
