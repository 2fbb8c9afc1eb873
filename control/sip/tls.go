package sip

import (
	"bytes"
	"crypto/tls"
	"strings"

	"github.com/emiago/sipgo/sip"

	"github.com/relayd/relayd/control/call"
)

// serverTLS is the configuration of the tls listeners: at least TLS 1.2.
func serverTLS(c *tls.Config) *tls.Config {
	c = c.Clone()
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// clientTLS is the configuration toward TLS destinations: their
// certificate verified (the stack names the destination's host or
// address as the server name), at least TLS 1.2.
func clientTLS(c *tls.Config) *tls.Config {
	if c == nil {
		c = &tls.Config{}
	}
	c = c.Clone()
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// sdesIn reports whether an SDP body carries SDES keys (a=crypto lines).
func sdesIn(body []byte) bool {
	for line := range bytes.Lines(body) {
		if bytes.HasPrefix(bytes.TrimLeft(line, " \t"), []byte("a=crypto:")) {
			return true
		}
	}
	return false
}

// legTransport returns the transport of a leg's signalling: udp, tcp or
// tls.
func (bc *b2bCall) legTransport(side call.Side) string {
	if side == call.A {
		if t := bc.c.Leg(call.A).Transport; t != "" {
			return strings.ToLower(t)
		}
		bc.mu.Lock()
		defer bc.mu.Unlock()
		if bc.a != nil {
			return strings.ToLower(bc.a.InviteRequest.Transport())
		}
		return strings.ToLower(bc.held.a.Transport)
	}
	return strings.ToLower(bc.c.Leg(call.B).Transport)
}

// sdesExposed reports whether, under a route with sdes_tls_only, an SDP
// body with keys would cross a leg in clear; it returns the leg's
// transport.
func (bc *b2bCall) sdesExposed(side call.Side, body []byte) (string, bool) {
	bc.mu.Lock()
	only := bc.rt.SDESTLSOnly
	bc.mu.Unlock()
	if !only || !sdesIn(body) {
		return "", false
	}
	t := bc.legTransport(side)
	return t, t != "tls"
}

// sdesRefusal is the answer to a call or re-offer whose SDES keys would
// cross a leg in clear (RFC 4568 8.3 wants them on a secure channel):
// 488 with a Warning that says which leg (RFC 3261 20.43: 399,
// miscellaneous, for a person reading the trace).
func sdesRefusal(side call.Side, transport string) attemptResult {
	leg := "caller's"
	if side == call.B {
		leg = "callee's"
	}
	return attemptResult{final: true, disposition: call.Rejected, code: sip.StatusNotAcceptableHere, reason: "Not Acceptable Here",
		headers: []sip.Header{sip.NewHeader("Warning", `399 relayd "SDES keys would cross the `+leg+` leg over `+transport+`: this route takes them over TLS only"`)}}
}
