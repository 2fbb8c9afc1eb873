package lab

import (
	"fmt"
	"net/netip"
)

// RecreateCallerLink deletes the relay's veth toward the caller (r0, and so
// its peer c0) and builds it again with the same names, addresses, routes
// and settings, as a VLAN or bond rebuilt or a driver reloaded would: the
// interfaces come back with new ifindexes, and whatever was attached to the
// old r0 (an XDP link) is severed. RelayCallerIf and CallerIf are updated.
func (l *Lab) RecreateCallerLink() error {
	if err := l.Relay.deleteLinks(RelayCallerIfName); err != nil {
		return fmt.Errorf("recreate %s: %w", RelayCallerIfName, err)
	}
	if err := l.Relay.addVeth(RelayCallerIfName, CallerIfName, l.Caller); err != nil {
		return err
	}
	links := []struct {
		ns   *NS
		name string
		iff  *Iface
	}{{l.Caller, CallerIfName, &l.CallerIf}, {l.Relay, RelayCallerIfName, &l.RelayCallerIf}}
	for _, k := range links {
		if err := k.ns.SetTxChecksum(k.name, false); err != nil {
			return err
		}
		if err := k.ns.SetLinkUp(k.name); err != nil {
			return err
		}
		// GRO once the link is up (see build).
		if err := k.ns.SetGRO(k.name, true); err != nil {
			return err
		}
	}
	if err := l.Relay.SetSysctl("net/ipv6/conf/"+RelayCallerIfName+"/forwarding", "1"); err != nil {
		return err
	}
	for _, a := range []struct {
		ns     *NS
		ifname string
		addr   netip.Prefix
	}{
		{l.Caller, CallerIfName, netip.PrefixFrom(l.CallerAddr4, 24)},
		{l.Caller, CallerIfName, netip.PrefixFrom(l.CallerAddr6, 64)},
		{l.Relay, RelayCallerIfName, netip.PrefixFrom(l.RelayCallerAddr4, 24)},
		{l.Relay, RelayCallerIfName, netip.PrefixFrom(l.RelayCallerAddr6, 64)},
	} {
		if err := a.ns.addAddr(a.ifname, a.addr); err != nil {
			return err
		}
	}
	for _, gw := range []netip.Addr{l.RelayCallerAddr4, l.RelayCallerAddr6} {
		if err := l.Caller.addDefaultRoute(CallerIfName, gw); err != nil {
			return err
		}
	}
	for _, k := range links {
		iff, err := k.ns.Iface(k.name)
		if err != nil {
			return err
		}
		*k.iff = iff
	}
	return nil
}
