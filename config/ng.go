package config

import (
	"net/netip"
	"strings"
)

// NG is the [ng] section: the rtpengine ng control protocol, so that a
// SIP proxy (Kamailio's rtpengine module) drives relayd as it drives
// rtpengine (docs/ng.md). Off without listen addresses.
type NG struct {
	// Listen are "udp:IP:PORT", "tcp:IP:PORT" or "http:IP:PORT" (the
	// HTTP POST form), like [sip] listen; typically
	// ["udp:127.0.0.1:2223"].
	Listen []string `toml:"listen"`
	// Allow are the addresses or networks ("198.18.6.2",
	// "198.18.6.0/24") of the proxies allowed to send commands. ng has
	// no authentication: a listener on a non-loopback address needs it;
	// anything else is ignored and counted. Empty: loopback only.
	Allow []string `toml:"allow"`
	// MaxLoad, above zero, answers new calls "load limit" while the
	// 1-minute load average per CPU is above it (rtpengine's max-load).
	MaxLoad float64 `toml:"max_load"`

	AllowPrefixes []netip.Prefix `toml:"-"` // parsed Allow
}

// Enabled reports whether the ng front end runs.
func (n *NG) Enabled() bool { return len(n.Listen) > 0 }

func (c *Config) validateNG(bad func(key, format string, args ...any)) {
	n := &c.NG
	n.AllowPrefixes = nil
	for _, a := range n.Allow {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			addr, aerr := netip.ParseAddr(a)
			if aerr != nil {
				bad("ng.allow", "%q is neither an address nor a network (like 198.18.6.0/24)", a)
				continue
			}
			p = netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())
		}
		n.AllowPrefixes = append(n.AllowPrefixes, p.Masked())
	}
	for _, l := range n.Listen {
		network, addr, ok := strings.Cut(l, ":")
		if !ok || (network != "udp" && network != "tcp" && network != "http") {
			bad("ng.listen", "%q: want udp:IP:PORT, tcp:IP:PORT or http:IP:PORT", l)
			continue
		}
		ap, err := netip.ParseAddrPort(addr)
		if err != nil || ap.Port() == 0 {
			bad("ng.listen", "%q: %q is not IP:PORT (IPv6 as [addr]:port)", l, addr)
			continue
		}
		if !ap.Addr().IsLoopback() && len(n.AllowPrefixes) == 0 {
			bad("ng.allow", "ng listens on %s, not loopback: name the proxies allowed to send commands (ng has no authentication)", ap)
		}
	}
	if n.MaxLoad < 0 {
		bad("ng.max_load", "%v is negative", n.MaxLoad)
	}
	if c.Media.MaxSessions < 0 {
		bad("media.max_sessions", "%d is negative", c.Media.MaxSessions)
	}
}
