package flowkey

import (
	"net/netip"
	"testing"
)

func TestParts(t *testing.T) {
	f, a, p := Parts(netip.MustParseAddrPort("198.18.1.1:30000"))
	if f != AFInet || a != [16]byte{198, 18, 1, 1} || p != 0x3075 {
		t.Errorf("IPv4: %d %v %#x", f, a, p)
	}
	f, a, p = Parts(netip.MustParseAddrPort("[::ffff:198.18.1.1]:30000"))
	if f != AFInet || a != [16]byte{198, 18, 1, 1} {
		t.Errorf("IPv4-mapped: %d %v %#x", f, a, p)
	}
	f, a, _ = Parts(netip.MustParseAddrPort("[2001:2::1]:5"))
	if f != AFInet6 || a != netip.MustParseAddr("2001:2::1").As16() {
		t.Errorf("IPv6: %d %v", f, a)
	}
}
