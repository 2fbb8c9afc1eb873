package slowpath

import (
	"net/netip"
	"testing"

	"github.com/relayd/relayd/dataplane"
)

func TestLatch(t *testing.T) {
	const window = int64(3e9)
	routable := netip.MustParseAddrPort("198.18.0.2:4000") // benchmarking range: routable
	private := netip.MustParseAddrPort("192.168.1.10:4000")
	natted := netip.MustParseAddrPort("198.18.0.2:61000")
	attacker := netip.MustParseAddrPort("198.18.4.2:4000")
	type step struct {
		src  netip.AddrPort
		at   int64
		ok   bool
		want latchResult
	}
	for _, tc := range []struct {
		name      string
		signalled netip.AddrPort
		steps     []step
	}{
		{"routable signalled address: only its address latches", routable, []step{
			{attacker, 0, false, latchNone},       // first packet starts the window, rejected
			{natted, 1e9, true, latchLearned},     // the caller behind NAT, new port
			{attacker, 1.5e9, false, latchNone},   // RTP Bleed attempt
			{natted, 2e9, true, latchNone},        // same source
			{routable, 2.5e9, true, latchLearned}, // rebinding within the window
			{routable, 3.5e9, true, latchLocked},  // window over: locked
			{natted, 4e9, false, latchNone},       // locked: others refused
			{routable, 5e9, true, latchNone},
		}},
		{"private signalled address: any source latches in the window", private, []step{
			{natted, 0, true, latchLearned},
			{attacker, 1e9, true, latchLearned}, // indistinguishable from a NAT rebinding
			{natted, 2e9, true, latchLearned},
			{natted, 4e9, true, latchLocked},
			{attacker, 5e9, false, latchNone},
		}},
		{"no signalled address", netip.AddrPort{}, []step{
			{natted, 0, true, latchLearned},
			{natted, 10e9, true, latchLocked},
			{attacker, 11e9, false, latchNone},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &flowState{flow: dataplane.Flow{Match: netip.MustParseAddrPort("198.18.1.1:30000"), ExpectSource: tc.signalled, Latch: true}}
			for i, s := range tc.steps {
				ok, res := f.latch(s.src, 1e18+s.at, window)
				if ok != s.ok || res != s.want {
					t.Fatalf("step %d (%s at %.1fs): accepted %v result %d, want %v %d", i, s.src, float64(s.at)/1e9, ok, res, s.ok, s.want)
				}
			}
		})
	}
}

func TestRoutable(t *testing.T) {
	for a, want := range map[string]bool{
		"198.18.0.2": true, "2001:2::2": true, "8.8.8.8": true,
		"10.0.0.1": false, "172.16.5.4": false, "192.168.1.1": false, "100.64.0.1": false,
		"127.0.0.1": false, "169.254.1.1": false, "fd00::1": false, "fe80::1": false, "::": false,
		"::ffff:192.168.1.1": false,
	} {
		if got := dataplane.Routable(netip.MustParseAddr(a)); got != want {
			t.Errorf("Routable(%s) = %v, want %v", a, got, want)
		}
	}
}
