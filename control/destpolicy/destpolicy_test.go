package destpolicy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	own := []netip.Addr{
		netip.MustParseAddr("198.18.1.1"),    // media address
		netip.MustParseAddr("198.19.1.1"),    // advertised (the NAT's public side)
		netip.MustParseAddr("2001:2:0:1::1"), // media address6
		netip.MustParseAddr("198.18.1.1"),    // twice: kept once
		{},                                   // unset: ignored
	}
	deny := []netip.Prefix{
		netip.MustParsePrefix("198.18.200.0/24"),
		netip.MustParsePrefix("2001:2:0:ff00::/56"),
		netip.MustParsePrefix("::ffff:198.18.77.0/120"), // mapped: counts as 198.18.77.0/24
	}
	p := New(own, deny)
	if got := len(p.Own()); got != 3 {
		t.Errorf("own addresses = %v, want 3", p.Own())
	}
	for _, tc := range []struct {
		dst    string
		reason string // "" allowed
	}{
		{"198.18.2.2:5000", ""},
		{"[2001:2::2]:5000", ""},
		{"10.1.2.3:5000", ""}, // private ranges stay allowed
		{"192.168.1.20:5000", ""},
		{"172.16.0.9:5000", ""},
		{"[fd00::9]:5000", ""}, // unique local
		{"198.18.200.1:5000", ReasonDenied},
		{"[2001:2:0:ff10::1]:5000", ReasonDenied},
		{"198.18.77.5:5000", ReasonDenied},
		{"198.18.1.1:30000", ReasonOwn},
		{"198.18.1.1:5060", ReasonOwn},  // any port of an own address
		{"198.19.1.1:30000", ReasonOwn}, // the advertised address loops through the NAT
		{"[2001:2:0:1::1]:30000", ReasonOwn},
		{"[::ffff:198.18.1.1]:30000", ReasonOwn}, // mapped
		{"127.0.0.1:5000", ReasonLoopback},
		{"127.8.9.10:5000", ReasonLoopback},
		{"[::1]:5000", ReasonLoopback},
		{"[::ffff:127.0.0.1]:5000", ReasonLoopback},
		{"224.0.0.1:5000", ReasonMulticast},
		{"239.1.1.1:5000", ReasonMulticast},
		{"[ff02::1]:5000", ReasonMulticast},
		{"255.255.255.255:5000", ReasonBroadcast},
		{"0.0.0.0:5000", ReasonUnspecified},
		{"0.1.2.3:5000", ReasonUnspecified},
		{"[::]:5000", ReasonUnspecified},
		{"169.254.1.1:5000", ReasonLinkLocal},
		{"[fe80::1]:5000", ReasonLinkLocal},
		{"[fe80::1%eth0]:5000", ReasonLinkLocal},
		{"198.18.2.2:0", ReasonPort},
	} {
		err := p.Check(netip.MustParseAddrPort(tc.dst))
		if tc.reason == "" {
			if err != nil {
				t.Errorf("Check(%s) = %v, want allowed", tc.dst, err)
			}
			continue
		}
		var de *DeniedError
		if !errors.As(err, &de) || !errors.Is(err, ErrDenied) || de.Reason != tc.reason {
			t.Errorf("Check(%s) = %v, want %q", tc.dst, err, tc.reason)
			continue
		}
		if !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("Check(%s) = %q, does not say %q", tc.dst, err, tc.reason)
		}
		if tc.reason == ReasonDenied && !strings.Contains(err.Error(), "/") {
			t.Errorf("Check(%s) = %q, does not name the network", tc.dst, err)
		}
	}
	if err := p.Check(netip.AddrPort{}); !errors.Is(err, ErrDenied) {
		t.Errorf("Check(invalid) = %v, want denied", err)
	}
}

// A nil policy still refuses what is never a media destination.
func TestNilPolicy(t *testing.T) {
	var p *Policy
	if err := p.Check(netip.MustParseAddrPort("127.0.0.1:1")); !errors.Is(err, ErrDenied) {
		t.Errorf("nil policy allowed loopback: %v", err)
	}
	if err := p.Check(netip.MustParseAddrPort("198.18.2.2:5000")); err != nil {
		t.Errorf("nil policy: %v", err)
	}
}
