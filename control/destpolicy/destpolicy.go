// Package destpolicy decides where relayd may send media. Every front
// end (the admin API's static flows, the SIP B2BUA, rtpengine's ng
// protocol) asks the same Policy, through the flow registry, before a
// flow is built toward an address a peer or an operator gave, and the
// registry asks it again before it installs or updates any flow.
//
// A relay on the internet edge takes destinations from strangers: an SDP
// c= line, an ng offer, a request to the admin API. Media sent to one of
// relayd's own addresses comes back to relayd: one packet into a flow
// that points at itself loops until the flow goes, at the full speed of
// the data plane. Media sent to loopback reaches the host's own services,
// to a broadcast or multicast address every host on a link, to a
// link-local address a neighbour the operator never meant to expose. None
// of these is a destination a call needs, so the policy refuses them all,
// with the operator's own denied networks on top. Private ranges stay
// allowed: customers and the relay's own internal side live there.
//
// The data planes drop what would loop even when a flow got past the
// control plane (bpf/relay.c, slowpath): this package is the first line,
// not the only one.
package destpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// ErrDenied is wrapped by every refusal of Check: callers branch on it
// with errors.Is (SIP 488, an ng error, HTTP 422).
var ErrDenied = errors.New("media destination not allowed")

// Reasons a destination is refused, as DeniedError.Reason gives them. They
// are short and name no configuration, so they can go back to whoever
// sent the address (a SIP Warning, an ng error-reason).
const (
	ReasonOwn         = "an address of relayd itself"
	ReasonLoopback    = "a loopback address"
	ReasonMulticast   = "a multicast address"
	ReasonBroadcast   = "a broadcast address"
	ReasonUnspecified = "an unspecified address"
	ReasonLinkLocal   = "a link-local address"
	ReasonDenied      = "in a denied network"
	ReasonPort        = "port 0"
)

// DeniedError is a refused destination and why.
type DeniedError struct {
	Dest   netip.AddrPort
	Reason string // one of the Reason constants
	// Network is the operator's denied network that holds Dest, for
	// ReasonDenied.
	Network netip.Prefix
}

func (e *DeniedError) Error() string {
	if e.Network.IsValid() {
		return fmt.Sprintf("media destination %s is %s (%s)", e.Dest, e.Reason, e.Network)
	}
	return fmt.Sprintf("media destination %s is %s", e.Dest, e.Reason)
}

// Unwrap makes errors.Is(err, ErrDenied) hold.
func (e *DeniedError) Unwrap() error { return ErrDenied }

// Policy is the destination policy. Create it with New; the zero value
// refuses only the special-purpose addresses. Safe for concurrent use (it
// never changes after New).
type Policy struct {
	own  []netip.Addr
	deny []netip.Prefix
}

// New returns the policy for a relay whose own addresses are own (every
// media interface's address and advertised address, and the addresses
// relayd listens on for signalling) with the operator's denied networks.
// Invalid and duplicate entries are ignored; IPv4-mapped IPv6 addresses
// count as IPv4.
func New(own []netip.Addr, deny []netip.Prefix) *Policy {
	p := &Policy{}
	for _, a := range own {
		if !a.IsValid() {
			continue
		}
		a = a.Unmap().WithZone("")
		if !slices.Contains(p.own, a) {
			p.own = append(p.own, a)
		}
	}
	for _, d := range deny {
		if !d.IsValid() {
			continue
		}
		if d.Addr().Is4In6() && d.Bits() >= 96 {
			d = netip.PrefixFrom(d.Addr().Unmap(), d.Bits()-96)
		}
		d = d.Masked()
		if !slices.Contains(p.deny, d) {
			p.deny = append(p.deny, d)
		}
	}
	return p
}

// Own returns relayd's own addresses as the policy knows them.
func (p *Policy) Own() []netip.Addr { return slices.Clone(p.own) }

// Deny returns the operator's denied networks.
func (p *Policy) Deny() []netip.Prefix { return slices.Clone(p.deny) }

var (
	broadcast4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	// "This network" (RFC 791, RFC 1122 3.2.1.3): a source address only,
	// never a destination.
	thisNet4 = netip.MustParsePrefix("0.0.0.0/8")
)

// Check returns nil when relayd may send media to dst, else a
// *DeniedError (wrapping ErrDenied). A nil Policy refuses only the
// special-purpose addresses.
func (p *Policy) Check(dst netip.AddrPort) error {
	if r, network := p.reason(dst); r != "" {
		return &DeniedError{Dest: dst, Reason: r, Network: network}
	}
	return nil
}

func (p *Policy) reason(dst netip.AddrPort) (string, netip.Prefix) {
	r := special(dst)
	if r != "" || p == nil {
		return r, netip.Prefix{}
	}
	a := dst.Addr().Unmap().WithZone("")
	if slices.Contains(p.own, a) {
		return ReasonOwn, netip.Prefix{}
	}
	for _, d := range p.deny {
		if d.Contains(a) {
			return ReasonDenied, d
		}
	}
	return "", netip.Prefix{}
}

// special returns why dst is no destination for media whatever the
// relay's configuration, or "".
func special(dst netip.AddrPort) string {
	a := dst.Addr().Unmap()
	switch {
	case !a.IsValid() || a.IsUnspecified() || a.Is4() && thisNet4.Contains(a):
		return ReasonUnspecified
	case dst.Port() == 0:
		return ReasonPort
	case a.IsLoopback():
		return ReasonLoopback
	case a.IsMulticast():
		return ReasonMulticast
	case a == broadcast4:
		return ReasonBroadcast
	case a.IsLinkLocalUnicast():
		return ReasonLinkLocal
	}
	return ""
}
