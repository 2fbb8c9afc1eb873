package config

import (
	"fmt"
	"net/netip"
	"strings"
)

// MediaInterface is one [[media.interface]]: a named set of relay media
// addresses, as rtpengine's --interface=NAME/ADDRESS!ADVERTISED. Front
// ends choose one per leg: SIP routes with caller_interface and
// callee_interface, ng with direction or interface. The unnamed [media]
// address, when set, is the default; otherwise the first named one is.
type MediaInterface struct {
	Name       string `toml:"name"`       // required, unique
	Address    string `toml:"address"`    // IPv4 media address
	Address6   string `toml:"address6"`   // IPv6 media address; at least one of the two
	Advertise  string `toml:"advertise"`  // what SDP names instead of address (1:1 NAT)
	Advertise6 string `toml:"advertise6"` // what SDP names instead of address6
	Ports      string `toml:"ports"`      // "A-B"; default [media] ports

	Addr, Addr6                   netip.Addr `toml:"-"` // parsed addresses; invalid when unset
	AdvertiseAddr, AdvertiseAddr6 netip.Addr `toml:"-"` // parsed advertised addresses
	PortMin, PortMax              uint16     `toml:"-"` // parsed Ports
}

// MediaInterfaces returns every media interface, the default first: the
// unnamed one of [media] (name "") when it has an address, then the named
// ones in file order.
func (c *Config) MediaInterfaces() []MediaInterface {
	m := &c.Media
	var out []MediaInterface
	if m.Addr.IsValid() || m.Addr6.IsValid() {
		out = append(out, MediaInterface{
			Addr: m.Addr, Addr6: m.Addr6, AdvertiseAddr: m.AdvertiseAddr, AdvertiseAddr6: m.AdvertiseAddr6,
			PortMin: m.PortMin, PortMax: m.PortMax,
		})
	}
	return append(out, m.Interfaces...)
}

// HasInterface reports whether a media interface has this name ("" is
// the default, always there).
func (c *Config) HasInterface(name string) bool {
	if name == "" {
		return true
	}
	for _, in := range c.Media.Interfaces {
		if in.Name == name {
			return true
		}
	}
	return false
}

// parseAddrs parses an address pair and its advertised pair under key.
func parseAddrs(key string, a4, a6, adv4, adv6 *string, p4, p6, padv4, padv6 *netip.Addr, bad func(key, format string, args ...any)) {
	for _, f := range []struct {
		name  string
		s     *string
		want4 bool
		dst   *netip.Addr
	}{
		{"address", a4, true, p4}, {"address6", a6, false, p6},
		{"advertise", adv4, true, padv4}, {"advertise6", adv6, false, padv6},
	} {
		if *f.s == "" {
			continue
		}
		a, err := parseMediaAddr(*f.s, f.want4)
		if err != nil {
			bad(key+"."+f.name, "%v", err)
			continue
		}
		*f.dst = a
	}
	if *adv4 != "" && *a4 == "" {
		bad(key+".advertise", "advertise needs address (it replaces address in SDP)")
	}
	if *adv6 != "" && *a6 == "" {
		bad(key+".advertise6", "advertise6 needs address6 (it replaces address6 in SDP)")
	}
}

// validateInterfaces checks the [[media.interface]] tables.
func (c *Config) validateInterfaces(bad func(key, format string, args ...any)) {
	m := &c.Media
	addrs := make(map[netip.Addr]string)
	for _, a := range []netip.Addr{m.Addr, m.Addr6} {
		if a.IsValid() {
			addrs[a] = "media"
		}
	}
	names := make(map[string]bool)
	for i := range m.Interfaces {
		in := &m.Interfaces[i]
		key := fmt.Sprintf("media.interface[%d]", i)
		switch {
		case in.Name == "":
			bad(key+".name", "required")
		case names[in.Name]:
			bad(key+".name", "media interface %q defined twice", in.Name)
		case in.Name == "default" && (m.Addr.IsValid() || m.Addr6.IsValid()):
			bad(key+".name", `"default" names the [media] address's interface; choose another name`)
		}
		names[in.Name] = true
		if in.Address == "" && in.Address6 == "" {
			bad(key+".address", "need address or address6")
		}
		parseAddrs(key, &in.Address, &in.Address6, &in.Advertise, &in.Advertise6,
			&in.Addr, &in.Addr6, &in.AdvertiseAddr, &in.AdvertiseAddr6, bad)
		for _, f := range []struct {
			name string
			a    netip.Addr
		}{{"address", in.Addr}, {"address6", in.Addr6}} {
			if !f.a.IsValid() {
				continue
			}
			if other, dup := addrs[f.a]; dup {
				bad(key+"."+f.name, "%s is already the address of %s: an address belongs to one interface", f.a, other)
			}
			addrs[f.a] = fmt.Sprintf("media interface %q", in.Name)
		}
		if in.Ports == "" {
			in.PortMin, in.PortMax = m.PortMin, m.PortMax
			continue
		}
		lo, hi, err := ParsePortRange(in.Ports)
		if err != nil {
			bad(key+".ports", "%v", err)
		}
		in.PortMin, in.PortMax = lo, hi
	}
	for i, r := range c.Routes {
		for _, f := range [...]struct{ key, name string }{
			{"caller_interface", r.CallerInterface}, {"callee_interface", r.CalleeInterface},
		} {
			if !c.HasInterface(f.name) {
				bad(fmt.Sprintf("route[%d].%s", i, f.key), "no media interface %q", f.name)
			}
		}
	}
}

// validateDeny parses [media] deny_destinations.
func (c *Config) validateDeny(bad func(key, format string, args ...any)) {
	m := &c.Media
	m.DenyPrefixes = nil
	for _, s := range m.DenyDestinations {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				bad("media.deny_destinations", "%q is neither an address nor a network (like 203.0.113.0/24)", s)
				continue
			}
			if a.Zone() != "" {
				bad("media.deny_destinations", "%q: zoned addresses are not supported", s)
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		a := p.Addr()
		switch {
		case a.Is4In6() && p.Bits() < 96:
			bad("media.deny_destinations", "%q: an IPv4-mapped network needs at least 96 bits", s)
			continue
		case a.Is4In6():
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		if p.Bits() == 0 {
			family := "IPv6"
			if p.Addr().Is4() {
				family = "IPv4"
			}
			bad("media.deny_destinations", "%q denies every %s destination: leave that family's media address unset instead", s, family)
			continue
		}
		m.DenyPrefixes = append(m.DenyPrefixes, p.Masked())
	}
}

// OwnAddrs returns the addresses that are relayd's own as far as the
// configuration knows: every media interface's address and advertised
// address, and the addresses the SIP, ng and admin listeners bind (when
// not a wildcard). Media never goes to them (control/destpolicy).
func (c *Config) OwnAddrs() []netip.Addr {
	var out []netip.Addr
	add := func(a netip.Addr) {
		if a.IsValid() && !a.IsUnspecified() {
			out = append(out, a.Unmap())
		}
	}
	for _, in := range c.MediaInterfaces() {
		add(in.Addr)
		add(in.Addr6)
		add(in.AdvertiseAddr)
		add(in.AdvertiseAddr6)
	}
	for _, l := range c.SIP.Listeners {
		add(l.Addr.Addr())
	}
	for _, l := range c.NG.Listen {
		if _, addr, ok := strings.Cut(l, ":"); ok {
			if ap, err := netip.ParseAddrPort(addr); err == nil {
				add(ap.Addr())
			}
		}
	}
	if ap, err := netip.ParseAddrPort(c.Admin.Listen); err == nil {
		add(ap.Addr())
	}
	return out
}

// Bounds of the [media] rate_limit_* keys. A factor under 2 would drop a
// stream's own telephone events sent besides its audio; the ceilings stay
// within what the data planes store (dataplane.MaxRatePPS).
const (
	MinRateLimitFactor  = 2
	MaxRateLimitFactor  = 100
	MinRateLimitPPS     = 10
	MaxRateLimitPPS     = 1_000_000
	minRateLimitDefault = 50
)

// validateRates checks the [media] rate_limit_* keys.
func (c *Config) validateRates(bad func(key, format string, args ...any)) {
	m := &c.Media
	if f := m.RateLimitFactor; f != 0 && (f < MinRateLimitFactor || f > MaxRateLimitFactor) {
		bad("media.rate_limit_factor", "%d is not 0 (no caps) or from %d to %d", f, MinRateLimitFactor, MaxRateLimitFactor)
	}
	if p := m.RateLimitDefaultPPS; p < minRateLimitDefault || p > MaxRateLimitPPS {
		bad("media.rate_limit_default_pps", "%d is not from %d to %d packets per second", p, minRateLimitDefault, MaxRateLimitPPS)
	}
	if p := m.RateLimitRTCPPPS; p < MinRateLimitPPS || p > MaxRateLimitPPS {
		bad("media.rate_limit_rtcp_pps", "%d is not from %d to %d packets per second", p, MinRateLimitPPS, MaxRateLimitPPS)
	}
}
