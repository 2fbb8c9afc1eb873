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
	natted2 := netip.MustParseAddrPort("198.18.0.2:62000")
	spoofed := netip.MustParseAddrPort("198.18.0.2:4999") // the caller's address, another port
	privateNAT := netip.MustParseAddrPort("198.18.7.7:50000")
	const learned, locked, both = latchLearned, latchLocked, latchLearned | latchLocked
	for _, tc := range []struct {
		name      string
		signalled netip.AddrPort
		trusted   bool // LatchAddress: the control plane vouches for the address
		steps     []step
	}{
		{"routable: the exact source wins over a spoof that came first", routable, false, []step{
			{attacker, 0, false, latchNone},   // another address: refused; the window starts
			{spoofed, 0.5e9, true, latchNone}, // accepted, but media does not go to it
			{spoofed, 0.6e9, true, latchNone},
			{routable, 1e9, true, learned},     // the signalled address and port: learned at once
			{spoofed, 1.5e9, false, latchNone}, // RTP Bleed attempt after: refused
			{attacker, 2e9, false, latchNone},
			{routable, 5e9, true, locked}, // window over
		}},
		{"routable: a NAT that kept the address is learned when the window ends", routable, false, []step{
			{natted, 0, true, latchNone},       // pending
			{attacker, 1e9, false, latchNone},  // another address
			{natted2, 1.5e9, false, latchNone}, // the same rank, later: the first wins
			{natted, 2e9, true, latchNone},
			{natted, 3.5e9, true, both}, // window over: learned and locked
			{natted2, 4e9, false, latchNone},
			{routable, 4.5e9, false, latchNone}, // locked: even the signalled port
		}},
		{"routable: strangers alone never latch", routable, false, []step{
			{attacker, 0, false, latchNone},
			{attacker, 4e9, false, latchNone},
			{routable, 5e9, true, both}, // the real party, late
		}},
		{"private signalled address: the first source is learned, a later one is refused", private, false, []step{
			{privateNAT, 0, true, learned},
			{attacker, 1e9, false, latchNone}, // the same rank: indistinguishable, the first wins
			{privateNAT, 2e9, true, latchNone},
			{private, 2.5e9, true, learned}, // the exact signalled source outranks it
			{privateNAT, 3e9, false, latchNone},
			{private, 3.5e9, true, locked},
		}},
		{"private signalled address: the learned source locks when the window ends", private, false, []step{
			{privateNAT, 0, true, learned},
			{privateNAT, 4e9, true, locked},
			{attacker, 5e9, false, latchNone},
		}},
		{"private address vouched for (RTCP after RTP): other addresses refused", private, true, []step{
			{attacker, 0, false, latchNone},
			{netip.AddrPortFrom(private.Addr(), 4999), 0.5e9, true, latchNone}, // its address: pending
			{private, 1e9, true, learned},
			{privateNAT, 1.5e9, false, latchNone},
			{private, 3.5e9, true, locked},
		}},
		{"no signalled address", netip.AddrPort{}, false, []step{
			{natted, 0, true, learned},
			{attacker, 1e9, false, latchNone},
			{natted, 10e9, true, locked},
			{attacker, 11e9, false, latchNone},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &flowState{flow: dataplane.Flow{Match: netip.MustParseAddrPort("198.18.1.1:30000"), ExpectSource: tc.signalled, Latch: true, LatchAddress: tc.trusted}}
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
