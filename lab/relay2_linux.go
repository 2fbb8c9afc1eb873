package lab

import "net/netip"

// Names of the second relay's link.
const (
	RelayRelay2IfName = "r3" // in relay, towards relay2
	Relay2IfName      = "b0" // in relay2, towards relay
)

// Addresses of the second relay, see AddRelay2.
var (
	relay2LinkRelay4  = netip.MustParseAddr("198.18.6.1")
	relay2LinkRelay6  = netip.MustParseAddr("2001:2:0:6::1")
	relay2Addr4       = netip.MustParseAddr("198.18.6.2")
	relay2Addr6       = netip.MustParseAddr("2001:2:0:6::2")
	relay2Media4      = netip.MustParseAddr("198.18.7.1")
	relay2Media6      = netip.MustParseAddr("2001:2:0:7::1")
	relay2MediaPrefix = []netip.Prefix{netip.PrefixFrom(relay2Media4, 32), netip.PrefixFrom(relay2Media6, 128)}
)

// AddRelay2 adds a fifth namespace, relay2: a second media relay host
// behind the relay's r3, for tests of a SIP proxy in the relay namespace
// that balances calls over two media relays. relay2 has 198.18.6.2/24 and
// 2001:2:0:6::2/64 on b0 (its control address, Relay2Addr4/6) and the
// media addresses 198.18.7.1 and 2001:2:0:7::1 on its lo (Relay2Media4/6);
// its default route goes via the relay, which routes the media addresses
// to it, so the caller and the callee reach both relays' media through the
// relay namespace. The standard topology is unchanged. Idempotent.
func (l *Lab) AddRelay2() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Relay2 != nil {
		return nil
	}
	ns, err := newNamedNS(l.prefix + "relay2")
	if err != nil {
		return err
	}
	l.Relay2 = ns
	l.Relay2Addr4, l.Relay2Addr6 = relay2Addr4, relay2Addr6
	l.Relay2Media4, l.Relay2Media6 = relay2Media4, relay2Media6
	for _, key := range []string{"net/ipv6/conf/all/accept_dad", "net/ipv6/conf/default/accept_dad"} {
		if err := ns.SetSysctl(key, "0"); err != nil {
			return err
		}
	}
	if err := l.Relay.addVeth(RelayRelay2IfName, Relay2IfName, ns); err != nil {
		return err
	}
	for _, k := range []struct {
		ns   *NS
		name string
	}{{ns, Relay2IfName}, {l.Relay, RelayRelay2IfName}} {
		if err := k.ns.SetTxChecksum(k.name, false); err != nil {
			return err
		}
	}
	for _, k := range []struct {
		ns   *NS
		name string
	}{{ns, "lo"}, {ns, Relay2IfName}, {l.Relay, RelayRelay2IfName}} {
		if err := k.ns.SetLinkUp(k.name); err != nil {
			return err
		}
	}
	if err := l.Relay.SetSysctl("net/ipv6/conf/"+RelayRelay2IfName+"/forwarding", "1"); err != nil {
		return err
	}
	for _, a := range []struct {
		ns     *NS
		ifname string
		addr   netip.Prefix
	}{
		{ns, Relay2IfName, netip.PrefixFrom(relay2Addr4, 24)},
		{ns, Relay2IfName, netip.PrefixFrom(relay2Addr6, 64)},
		{ns, "lo", relay2MediaPrefix[0]},
		{ns, "lo", relay2MediaPrefix[1]},
		{l.Relay, RelayRelay2IfName, netip.PrefixFrom(relay2LinkRelay4, 24)},
		{l.Relay, RelayRelay2IfName, netip.PrefixFrom(relay2LinkRelay6, 64)},
	} {
		if err := a.ns.addAddr(a.ifname, a.addr); err != nil {
			return err
		}
	}
	for _, gw := range []netip.Addr{relay2LinkRelay4, relay2LinkRelay6} {
		if err := ns.addDefaultRoute(Relay2IfName, gw); err != nil {
			return err
		}
	}
	via := map[bool]netip.Addr{true: relay2Addr4, false: relay2Addr6}
	for _, p := range relay2MediaPrefix {
		if err := l.Relay.addRoute(RelayRelay2IfName, p, via[p.Addr().Is4()]); err != nil {
			return err
		}
	}
	return nil
}
