package lab

import "net/netip"

// NewNS creates a named network namespace outside any Lab, like
// `ip netns add name`, for packages that build their own topologies
// (lab/fwpair). The caller closes it. IPv6 duplicate address detection is
// off in it, as in a Lab.
func NewNS(name string) (*NS, error) {
	if err := (&Config{Prefix: name}).validate(); err != nil {
		return nil, err
	}
	ns, err := newNamedNS(name)
	if err != nil {
		return nil, err
	}
	for _, key := range []string{"net/ipv6/conf/all/accept_dad", "net/ipv6/conf/default/accept_dad"} {
		if err := ns.SetSysctl(key, "0"); err != nil {
			ns.close()
			return nil, err
		}
	}
	return ns, nil
}

// Close releases a namespace made by NewNS and removes its name. The kernel
// destroys it once no process or socket is left in it. Only for namespaces
// from NewNS: a Lab closes its own.
func (ns *NS) Close() error { return ns.close() }

// DeleteNS removes the named namespace's name, as `ip netns delete` does;
// for leftovers of an earlier run. It is not an error if there is none.
func DeleteNS(name string) error { return deleteNamedNS(name) }

// AddVeth creates the veth pair name, in ns, and peer, in peerNS.
func (ns *NS) AddVeth(name, peer string, peerNS *NS) error { return ns.addVeth(name, peer, peerNS) }

// AddAddr adds the address p to the interface ifname (IPv6 without
// duplicate address detection).
func (ns *NS) AddAddr(ifname string, p netip.Prefix) error { return ns.addAddr(ifname, p) }

// AddRoute adds a route to dst via gw on ifname.
func (ns *NS) AddRoute(ifname string, dst netip.Prefix, gw netip.Addr) error {
	return ns.addRoute(ifname, dst, gw)
}

// DeleteLinks deletes the named interfaces, and so their veth peers, if
// they exist.
func (ns *NS) DeleteLinks(names ...string) error { return ns.deleteLinks(names...) }
