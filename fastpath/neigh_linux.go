package fastpath

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// resolveNeighbour makes sure the next hop towards dst has a resolved
// neighbour entry, so the flow's first packet is forwarded by XDP instead of
// being punted with fib_no_neigh. It asks the kernel to resolve (or refresh)
// the entry the way `ip neigh replace ADDR dev DEV use` does and waits up to
// wait for the answer. It returns the next hop and whether it is resolved.
func resolveNeighbour(dst netip.Addr, wait time.Duration) (netip.Addr, bool, error) {
	routes, err := netlink.RouteGet(dst.AsSlice())
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("route to %s: %w", dst, err)
	}
	if len(routes) == 0 {
		return netip.Addr{}, false, fmt.Errorf("no route to %s", dst)
	}
	r := routes[0]
	if r.Type == unix.RTN_LOCAL || r.LinkIndex == 0 {
		return netip.Addr{}, false, fmt.Errorf("%s is local", dst)
	}
	nh := dst
	if r.Gw != nil {
		if a, ok := netip.AddrFromSlice(r.Gw); ok {
			nh = a.Unmap()
		}
	}
	family := netlink.FAMILY_V4
	if nh.Is6() {
		family = netlink.FAMILY_V6
	}
	if resolved(r.LinkIndex, family, nh) {
		return nh, true, nil
	}
	err = netlink.NeighSet(&netlink.Neigh{
		LinkIndex: r.LinkIndex,
		Family:    family,
		IP:        net.IP(nh.AsSlice()),
		Flags:     netlink.NTF_USE,
	})
	if err != nil {
		return nh, false, fmt.Errorf("resolve neighbour %s: %w", nh, err)
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if resolved(r.LinkIndex, family, nh) {
			return nh, true, nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nh, false, nil
}

// resolved reports whether the neighbour entry is one bpf_fib_lookup
// accepts (NUD_VALID).
func resolved(link, family int, ip netip.Addr) bool {
	ns, err := netlink.NeighList(link, family)
	if err != nil {
		return false
	}
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip {
			return n.State&nudValid != 0
		}
	}
	return false
}
