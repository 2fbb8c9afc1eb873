// Package flowkey lays out the key the BPF programs look flows up by
// (struct flow_key in bpf/relay.c, struct steer_key in bpf/steer.c): address
// family, relay port in network byte order, and the relay address in 16
// bytes, IPv4 in the first four.
package flowkey

import "net/netip"

// Linux address family numbers, as the kernel stores them.
const (
	AFInet  = 2
	AFInet6 = 10
)

// Parts returns the family, address bytes and port (network byte order, as
// a native uint16 holds it in memory on little-endian hosts) of ap.
func Parts(ap netip.AddrPort) (family uint8, addr [16]byte, port uint16) {
	a := ap.Addr().Unmap()
	if a.Is4() {
		b := a.As4()
		copy(addr[:], b[:])
		family = AFInet
	} else {
		addr = a.As16()
		family = AFInet6
	}
	p := ap.Port()
	return family, addr, p<<8 | p>>8
}
