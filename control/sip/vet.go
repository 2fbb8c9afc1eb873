package sip

import (
	"strings"

	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"
)

// refused answers, over any transport, requests that parse but that RFC
// 3261 says a UAS must refuse before looking at them further (sections
// 8.2.1 to 8.2.3 and RFC 4475 3.1.2.16 to 3.3.15), and reports whether
// it did. ACKs are never answered.
func (s *Server) refused(req *sip.Request, tx sip.ServerTransaction) bool {
	if req.IsAck() {
		return false
	}
	code, reason := 0, ""
	var extra []sip.Header
	switch {
	case !strings.EqualFold(req.SipVersion, "SIP/2.0"):
		code, reason = sip.StatusVersionNotSupported, "Version Not Supported"
	default:
		if missing := missingHeader(req); missing != "" {
			code, reason = sip.StatusBadRequest, "Missing "+missing
		} else if dup := repeatedHeader(req); dup != "" {
			code, reason = sip.StatusBadRequest, "Multiple "+dup
		} else if !strings.EqualFold(string(req.CSeq().MethodName), string(req.Method)) {
			// sipgo upper-cases the request's method, not CSeq's: the
			// comparison cannot be exact (methods are case-sensitive).
			code, reason = sip.StatusBadRequest, "CSeq Method Mismatch"
		} else if sc := req.Recipient.Scheme; !strings.EqualFold(sc, "sip") && !strings.EqualFold(sc, "sips") {
			code, reason = statusUnsupportedURIScheme, "Unsupported URI Scheme"
		} else if tags := unsupported(req); tags != "" {
			code, reason = sip.StatusBadExtension, "Bad Extension"
			extra = append(extra, sip.NewHeader("Unsupported", tags))
		} else if req.IsInvite() && !acceptsSDP(req) {
			// The 2xx would carry SDP (RFC 4475 3.3.15).
			code, reason = sip.StatusNotAcceptable, "Not Acceptable"
			extra = append(extra, sip.NewHeader("Accept", "application/sdp"))
		}
	}
	if code == 0 {
		return false
	}
	res := sip.NewResponseFromRequest(req, code, reason, nil)
	res.SipVersion = "SIP/2.0"
	for _, h := range extra {
		res.AppendHeader(h)
	}
	res.AppendHeader(sip.NewHeader("Server", s.cfg.UserAgent))
	tx.Respond(res)
	s.vet.answered.Inc()
	src := sourceOf(req)
	if ce := s.loglim.Check(s.log, zap.InfoLevel, src.Addr(), "SIP request refused"); ce != nil {
		ce.Write(zap.Stringer("source", src), zap.String("method", string(req.Method)), zap.Int("code", code), zap.String("reason", reason))
	}
	return true
}

// statusUnsupportedURIScheme is RFC 3261's 416 (sipgo names the HTTP
// meaning of the number).
const statusUnsupportedURIScheme = 416

// missingHeader names the first header field every request must have
// (RFC 3261 8.1.1) that req lacks. Max-Forwards is not required: RFC 2543
// clients do not send it and a UAS loses nothing without it.
func missingHeader(req *sip.Request) string {
	switch {
	case req.Via() == nil:
		return "Via"
	case req.From() == nil:
		return "From"
	case req.To() == nil:
		return "To"
	case req.CallID() == nil:
		return "Call-ID"
	case req.CSeq() == nil:
		return "CSeq"
	}
	return ""
}

// singleValued are header fields a request has at most once (RFC 4475
// 3.3.8).
var singleValued = []string{"From", "To", "Call-ID", "CSeq", "Max-Forwards", "Content-Length", "Content-Type"}

func repeatedHeader(req *sip.Request) string {
	for _, name := range singleValued {
		if len(req.GetHeaders(name)) > 1 {
			return name
		}
	}
	return ""
}

// unsupported lists the option tags of req's Require that relayd does
// not support, which is all of them (RFC 3261 8.2.2.3: 420 with an
// Unsupported header; not for CANCEL, whose INVITE settled that).
// Proxy-Require is for proxies: a UAS ignores it.
func unsupported(req *sip.Request) string {
	if req.IsCancel() {
		return ""
	}
	var tags []string
	for _, h := range req.GetHeaders("Require") {
		for t := range strings.SplitSeq(h.Value(), ",") {
			if t = strings.TrimSpace(t); t != "" {
				tags = append(tags, t)
			}
		}
	}
	return strings.Join(tags, ", ")
}

// acceptsSDP: no Accept (SDP is the default, RFC 3261 20.1), or one whose
// media ranges take application/sdp.
func acceptsSDP(req *sip.Request) bool {
	hs := req.GetHeaders("Accept")
	if len(hs) == 0 {
		return true
	}
	for _, h := range hs {
		for r := range strings.SplitSeq(h.Value(), ",") {
			r, _, _ = strings.Cut(r, ";")
			switch strings.ToLower(strings.TrimSpace(r)) {
			case "application/sdp", "application/*", "*/*":
				return true
			}
		}
	}
	return false
}

// knownMethods are methods relayd recognizes but does not serve: 405.
// Others are not implemented: 501 (RFC 3261 8.2.1, 21.5.2).
var knownMethods = map[sip.RequestMethod]bool{
	sip.REGISTER: true, sip.MESSAGE: true, sip.SUBSCRIBE: true, sip.NOTIFY: true,
	sip.REFER: true, sip.INFO: true, sip.PRACK: true, sip.PUBLISH: true,
}

// noRoute answers methods relayd has no handler for.
func (s *Server) noRoute(req *sip.Request, tx sip.ServerTransaction) {
	code, reason := sip.StatusMethodNotAllowed, "Method Not Allowed"
	if !knownMethods[req.Method] {
		code, reason = sip.StatusNotImplemented, "Not Implemented"
	}
	res := sip.NewResponseFromRequest(req, code, reason, nil)
	res.AppendHeader(sip.NewHeader("Allow", allowed))
	tx.Respond(res)
}

// noDialog answers an in-dialog request for a dialog relayd does not
// have: 481, and a rate-limited line, since strangers can send these at
// will.
func (s *Server) noDialog(req *sip.Request, tx sip.ServerTransaction) {
	respond(tx, req, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist")
	src := sourceOf(req)
	if ce := s.loglim.Check(s.log, zap.InfoLevel, src.Addr(), "SIP request for an unknown dialog"); ce != nil {
		callID := ""
		if h := req.CallID(); h != nil {
			callID = h.Value()
		}
		ce.Write(zap.Stringer("source", src), zap.String("method", string(req.Method)), zap.String("call_id", callID))
	}
}
