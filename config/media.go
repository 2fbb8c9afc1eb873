package config

import (
	"fmt"
	"net/netip"
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
