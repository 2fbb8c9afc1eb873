package sip

import (
	"bytes"
	"hash/maphash"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"

	"github.com/emiago/sipgo/sip"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/loglimit"
)

// sipgo's UDP transport drops every datagram its parser refuses, with a
// log line and no answer (transport_udp.go, parseAndHandle), and its
// parser refuses many malformed requests that RFC 3261 and RFC 4475 say
// to answer (negative or too large Content-Length, a bad Via, an
// unterminated quote, a Request-URI in brackets, an unknown URI scheme
// it cannot parse). It also misreads some valid ones: white space around
// ";" and "=" ends up in parameter names, so the tags of RFC 4475's
// "short tortuous INVITE" are lost.
//
// vettedConn sits between the UDP socket and sipgo (sipgo reads and
// writes the net.PacketConn it is given): it checks each request's
// syntax before sipgo sees it, answers those it refuses itself
// (statelessly, RFC 3261 8.2.7: the answer to a retransmission is the
// same) and drops those too broken to address an answer to (no Via with
// a sent-by), and gives sipgo well-formed requests with insignificant
// white space removed. Responses go to sipgo as they are. Over TCP sipgo
// closes the connection on a framing error, which leaves nothing to
// answer on; requests that parse are checked there, as over UDP, by
// refused (vet.go).

// vetter is what the vetted connections share.
type vetter struct {
	ua       string
	parser   *sip.Parser
	log      *zap.Logger
	lim      *loglimit.Limiter
	seed     maphash.Seed
	answered prometheus.Counter
	dropped  prometheus.Counter
	counters *prometheus.CounterVec
	// sent, when set (by tests), sees every datagram a listener sends.
	sent atomic.Pointer[func(to net.Addr, b []byte)]
}

func newVetter(ua string, log *zap.Logger, lim *loglimit.Limiter) *vetter {
	v := &vetter{ua: ua, parser: sip.NewParser(), log: log, lim: lim, seed: maphash.MakeSeed(),
		counters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_sip_malformed_total",
			Help: "Malformed SIP requests, by outcome: answered with an error status, or dropped (too broken to address an answer to).",
		}, []string{"outcome"}),
	}
	v.answered = v.counters.WithLabelValues("answered")
	v.dropped = v.counters.WithLabelValues("dropped")
	return v
}

// conn wraps a UDP listener's socket.
func (v *vetter) conn(pc net.PacketConn) net.PacketConn { return &vettedConn{PacketConn: pc, v: v} }

// vettedConn is one listener's socket. sipgo reads it from one goroutine
// only, so the buffers need no lock.
type vettedConn struct {
	net.PacketConn
	v       *vetter
	m       lexed
	scratch []byte
	out     []byte
}

// ReadFrom returns the next datagram sipgo is to parse.
func (c *vettedConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, from, err := c.PacketConn.ReadFrom(b)
		if err != nil || n == 0 {
			return n, from, err
		}
		if n, ok := c.vet(b, n, from); ok {
			return n, from, nil
		}
	}
}

// WriteTo sends a datagram (sipgo's and the refusals).
func (c *vettedConn) WriteTo(b []byte, to net.Addr) (int, error) {
	if f := c.v.sent.Load(); f != nil {
		(*f)(to, b)
	}
	return c.PacketConn.WriteTo(b, to)
}

// vet checks the datagram in b[:n], possibly rewriting it in place, and
// reports whether sipgo is to have it and its new length.
func (c *vettedConn) vet(b []byte, n int, from net.Addr) (int, bool) {
	data := b[:n]
	if len(bytes.Trim(data, "\x00\r\n")) == 0 {
		return n, true // keep-alives: sipgo's business
	}
	first, _, _ := bytes.Cut(data, []byte{'\n'})
	switch classify(bytes.TrimSuffix(first, []byte{'\r'})) {
	case isResponse:
		return n, true
	case notSIP:
		c.drop(from, "not a SIP request", n)
		return 0, false
	}
	if need := 2*n + 64; cap(c.scratch) < need {
		c.scratch = make([]byte, 0, need)
	}
	reason, scratch := lex(data, &c.m, c.scratch[:0])
	code := 0
	if n >= len(b) {
		// sipgo's read buffer is full: the datagram was cut.
		code, reason = sip.StatusMessageTooLarge, "Message Too Large"
	} else if lc, lr := checkRequestLine(c.m.start); lc != 0 {
		code, reason = lc, lr
	} else if reason != "" {
		code = sip.StatusBadRequest
	} else {
		code, reason, scratch = checkHeaders(&c.m, scratch)
	}
	c.scratch = scratch
	if code == 0 {
		if v := b[len(c.m.start)-7 : len(c.m.start)]; string(v) != "SIP/2.0" {
			// sipgo copies the request's SIP-Version into its answers.
			copy(v, "SIP/2.0")
		}
		if c.m.rewrite {
			n = rewrite(b, n, &c.m)
		}
		// What sipgo would still refuse is answered rather than dropped.
		if _, err := c.v.parser.ParseSIP(b[:n]); err == nil {
			return n, true
		}
		code, reason = sip.StatusBadRequest, "Bad Request"
	}
	c.refuse(from, code, reason, n)
	return 0, false
}

// rewrite writes m back into b with the canonical header values and
// returns its length. The header section only shrinks, so the body is
// moved toward the front.
func rewrite(b []byte, n int, m *lexed) int {
	w := len(m.start) + 2 // the start line stays where it is
	for _, h := range m.hdrs {
		w += copy(b[w:], h.name)
		b[w] = ':'
		w++
		v := h.value
		if h.canon != nil {
			v = h.canon
		}
		w += copy(b[w:], v)
		w += copy(b[w:], "\r\n")
	}
	w += copy(b[w:], "\r\n")
	w += copy(b[w:], b[n-len(m.body):n])
	return w
}

func (c *vettedConn) drop(from net.Addr, reason string, n int) {
	c.v.dropped.Inc()
	if ce := c.v.lim.Check(c.v.log, zap.InfoLevel, addrOf(from), "SIP datagram dropped"); ce != nil {
		ce.Write(zap.Stringer("source", from), zap.String("reason", reason), zap.Int("bytes", n))
	}
}

func addrOf(a net.Addr) netip.Addr {
	if u, ok := a.(*net.UDPAddr); ok {
		return u.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// refuse answers the request in c.m with code, as RFC 3261 8.2.6 says
// (Via, From, To with a tag, Call-ID and CSeq copied) and 18.2.2 (to the
// source address, at the top Via's port unless it asks for rport), or
// drops it when it has no Via to address the answer by.
func (c *vettedConn) refuse(from net.Addr, code int, reason string, n int) {
	src, ok := from.(*net.UDPAddr)
	var top []byte
	for _, h := range c.m.hdrs {
		if h.kind == hVia {
			top = h.value
			break
		}
	}
	if !ok || top == nil {
		c.drop(from, "no Via to answer ("+reason+")", n)
		return
	}
	// The top Via without white space, its first entry apart.
	start := len(c.scratch)
	c.scratch = canonical(c.scratch, top, true)
	canon := c.scratch[start:]
	entry, rest := splitList(canon)
	_, strict := checkVia(entry)
	host, port, rport, ok := sentBy(entry)
	if !ok {
		c.drop(from, "no sent-by in the Via ("+reason+")", n)
		return
	}
	srcIP := src.AddrPort().Addr().Unmap()
	to := &net.UDPAddr{IP: src.IP, Port: src.Port, Zone: src.Zone}
	if !rport {
		to.Port = port
		if to.Port == 0 {
			to.Port = sip.DefaultUdpPort
		}
	}

	out := append(c.out[:0], "SIP/2.0 "...)
	out = strconv.AppendInt(out, int64(code), 10)
	out = append(out, ' ')
	out = append(out, reason...)
	out = append(out, "\r\nVia: "...)
	if strict {
		out = appendTopVia(out, entry, host, srcIP, src.Port, rport)
		if len(rest) > 0 {
			out = append(out, "\r\nVia: "...)
			out = append(out, rest...)
		}
	} else {
		out = append(out, top...)
	}
	out = append(out, "\r\n"...)
	seenVia := false
	var fromV, toV, callID, cseq []byte
	for _, h := range c.m.hdrs {
		switch h.kind {
		case hVia:
			if seenVia {
				out = append(out, "Via: "...)
				out = append(out, h.value...)
				out = append(out, "\r\n"...)
			}
			seenVia = true
		case hFrom:
			fromV = firstOf(fromV, h.value)
		case hTo:
			toV = firstOf(toV, h.value)
		case hCallID:
			callID = firstOf(callID, h.value)
		case hCSeq:
			cseq = firstOf(cseq, h.value)
		}
	}
	out = appendHeader(out, "From", fromV)
	if toV != nil {
		out = append(out, "To: "...)
		out = append(out, toV...)
		if !hasTag(toV) {
			// The same tag for each retransmission: a hash of what
			// identifies the request.
			var h maphash.Hash
			h.SetSeed(c.v.seed)
			h.Write(callID)
			h.Write(fromV)
			h.Write(cseq)
			h.Write(top)
			out = append(out, ";tag="...)
			out = strconv.AppendUint(out, h.Sum64(), 36)
		}
		out = append(out, "\r\n"...)
	}
	out = appendHeader(out, "Call-ID", callID)
	out = appendHeader(out, "CSeq", cseq)
	out = appendHeader(out, "Server", []byte(c.v.ua))
	out = append(out, "Content-Length: 0\r\n\r\n"...)
	c.out = out
	if _, err := c.WriteTo(out, to); err != nil {
		c.v.log.Debug("answer to a malformed request", zap.Stringer("to", to), zap.Error(err))
	}
	c.v.answered.Inc()
	if ce := c.v.lim.Check(c.v.log, zap.InfoLevel, srcIP, "malformed SIP request answered"); ce != nil {
		ce.Write(zap.Stringer("source", from), zap.Int("code", code), zap.String("reason", reason), zap.Int("bytes", n))
	}
}

// hasTag reports whether a To value has a tag, also when it is
// malformed: an answer's To must have one (RFC 3261 8.2.6.2), and a
// second one would not help.
func hasTag(to []byte) bool {
	if tag, ok := checkAddress(to, hTo); ok {
		return tag
	}
	return bytes.Contains(bytes.ToLower(canonical(nil, to, false)), []byte(";tag="))
}

func firstOf(have, v []byte) []byte {
	if have != nil {
		return have
	}
	return v
}

func appendHeader(out []byte, name string, v []byte) []byte {
	if v == nil {
		return out
	}
	out = append(out, name...)
	out = append(out, ": "...)
	out = append(out, v...)
	return append(out, "\r\n"...)
}

// splitList splits a canonical list value at its first comma outside
// quotes.
func splitList(v []byte) (first, rest []byte) {
	inQuote, escaped := false, false
	for i, c := range v {
		switch {
		case inQuote && escaped:
			escaped = false
		case inQuote && c == '\\':
			escaped = true
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == ',':
			return v[:i], v[i+1:]
		}
	}
	return v, nil
}

// sentBy reads host and port from a canonical Via entry
// ("SIP/2.0/UDP host:port;params"), even if the rest is malformed, and
// whether it has an rport parameter without a value.
func sentBy(entry []byte) (host []byte, port int, rport, ok bool) {
	sp := bytes.IndexByte(entry, ' ')
	if sp < 0 {
		return nil, 0, false, false
	}
	p := scanner{b: entry, i: sp + 1}
	if host, ok = p.host(); !ok {
		return nil, 0, false, false
	}
	if p.eat(':') {
		d := p.run(isDigit)
		n, err := strconv.Atoi(string(d))
		if err != nil || n <= 0 || n > 65535 {
			return nil, 0, false, false
		}
		port = n
	}
	for _, prm := range bytes.Split(entry[p.i:], []byte{';'}) {
		if foldEqual(prm, "rport") {
			rport = true
		}
	}
	return host, port, rport, true
}

// appendTopVia appends the top Via entry with received (RFC 3261 18.2.1)
// and rport (RFC 3581 4) filled in.
func appendTopVia(out, entry, host []byte, src netip.Addr, srcPort int, rport bool) []byte {
	semi := bytes.IndexByte(entry, ';')
	if semi < 0 {
		semi = len(entry)
	}
	out = append(out, entry[:semi]...)
	if semi < len(entry) {
		for _, prm := range bytes.Split(entry[semi+1:], []byte{';'}) {
			switch {
			case foldEqual(prm, "rport"):
				out = append(out, ";rport="...)
				out = strconv.AppendInt(out, int64(srcPort), 10)
			case hasPrefixFold(prm, "received="):
			default:
				out = append(out, ';')
				out = append(out, prm...)
			}
		}
	}
	if rport || string(host) != src.String() {
		out = append(out, ";received="...)
		out = src.AppendTo(out)
	}
	return out
}
