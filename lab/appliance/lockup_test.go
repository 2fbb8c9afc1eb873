package appliance

import "testing"

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
