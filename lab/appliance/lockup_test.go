package appliance

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

func TestGuestLockup(t *testing.T) {
	for _, tc := range []struct {
		console, want string
	}{
		{"[    0.245738] rcu: Preemptible hierarchical RCU implementation.\n[   19.9] 9p: Installing v9fs\n", ""},
		{"[  235.809451] rcu: INFO: rcu_preempt self-detected stall on CPU\n", "[  235.809451] rcu: INFO: rcu_preempt self-detected stall on CPU"},
		{"ok\n[  260.763948] watchdog: BUG: soft lockup - CPU#0 stuck for 44s! [voipgen:1163]\n", "[  260.763948] watchdog: BUG: soft lockup - CPU#0 stuck for 44s! [voipgen:1163]"},
	} {
		if got := GuestLockup([]byte(tc.console)); got != tc.want {
			t.Errorf("GuestLockup(%q) = %q, want %q", tc.console, got, tc.want)
		}
	}
}

func TestLockupReport(t *testing.T) {
	con := "[  1.0] boot\n[  194.4] rcu: INFO: rcu_preempt self-detected stall on CPU\n[  194.4] RIP: 0010:__udp4_lib_lookup+0x9e/0x2a0\n[  194.5] Call Trace:\n"
	got := LockupReport([]byte(con), 1000)
	if want := con[len("[  1.0] boot\n"):]; got != want {
		t.Errorf("LockupReport = %q, want %q", got, want)
	}
	if got := LockupReport([]byte(con), 20); got != "[  194.4] rcu: INFO:" {
		t.Errorf("LockupReport cut to 20 bytes = %q", got)
	}
	if got := LockupReport([]byte("[  1.0] boot\n"), 1000); got != "" {
		t.Errorf("LockupReport of a console without a lockup = %q, want none", got)
	}
}

func TestWatchBoot(t *testing.T) {
	dir := t.TempDir()
	console := dir + "/console.log"
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(console, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Stopped at the ACPI devices: stalled.
	write("[    1.072025] pnp: PnP ACPI: found 6 devices\n")
	if !watchBoot(context.Background(), console, 2*time.Second) {
		t.Error("a console silent before init: not reported stalled")
	}
	// At init: not stalled, however long it is silent after.
	write("[    9.1] Run /init as init process\n")
	if watchBoot(context.Background(), console, 2*time.Second) {
		t.Error("a console that reached init: reported stalled")
	}
	// A console that keeps growing is not stalled either.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	write("")
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			f, err := os.OpenFile(console, os.O_APPEND|os.O_WRONLY, 0)
			if err == nil {
				fmt.Fprintf(f, "[ %d.0] line\n", i)
				f.Close()
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	if watchBoot(ctx, console, 2*time.Second) {
		t.Error("a growing console: reported stalled")
	}
}
