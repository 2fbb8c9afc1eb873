package sip

import (
	"bytes"
	"strconv"
)

// This file is the syntax side of the pre-parser (vetconn.go): a lexer
// that splits a datagram into start line, unfolded header fields and
// body, and checks of the RFC 3261 grammar (section 25) for what sipgo's
// parser either drops without a word (so relayd would never answer) or
// reads wrongly. Only the start line and the header fields relayd or
// sipgo interpret are checked; others may hold any text.

// hkind is a header field the pre-parser checks.
type hkind uint8

const (
	hOther hkind = iota
	hVia
	hFrom
	hTo
	hContact
	hCallID
	hCSeq
	hMaxForwards
	hContentLength
	hContentType
	hRoute
	hRecordRoute
)

// hnames are the header fields' names in the reasons of 400s.
var hnames = [...]string{hOther: "Header", hVia: "Via", hFrom: "From", hTo: "To", hContact: "Contact", hCallID: "Call-ID",
	hCSeq: "CSeq", hMaxForwards: "Max-Forwards", hContentLength: "Content-Length", hContentType: "Content-Type",
	hRoute: "Route", hRecordRoute: "Record-Route"}

// badReasons are the reason phrases of 400s for a malformed header field,
// made once so that answering allocates no string.
var badReasons = func() (r [len(hnames)]string) {
	for i, n := range hnames {
		r[i] = "Bad " + n
	}
	return r
}()

var missingReasons = func() (r [len(hnames)]string) {
	for i, n := range hnames {
		r[i] = "Missing " + n
	}
	return r
}()

var multipleReasons = func() (r [len(hnames)]string) {
	for i, n := range hnames {
		r[i] = "Multiple " + n
	}
	return r
}()

func headerKind(name []byte) hkind {
	if len(name) == 1 {
		switch name[0] | 0x20 {
		case 'v':
			return hVia
		case 'f':
			return hFrom
		case 't':
			return hTo
		case 'm':
			return hContact
		case 'i':
			return hCallID
		case 'l':
			return hContentLength
		case 'c':
			return hContentType
		}
		return hOther
	}
	for k := hVia; k <= hRecordRoute; k++ {
		if foldEqual(name, hnames[k]) {
			return k
		}
	}
	return hOther
}

// foldEqual compares ASCII case-insensitively.
func foldEqual(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		if lower(b[i]) != lower(s[i]) {
			return false
		}
	}
	return true
}

func hasPrefixFold(b []byte, s string) bool {
	return len(b) >= len(s) && foldEqual(b[:len(s)], s)
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func isWS(c byte) bool { return c == ' ' || c == '\t' }

func isAlpha(c byte) bool { return 'a' <= c|0x20 && c|0x20 <= 'z' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// isToken: RFC 3261 token characters.
func isToken(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	switch c {
	case '-', '.', '!', '%', '*', '_', '+', '`', '\'', '~':
		return true
	}
	return false
}

// isDisplay: characters of an unquoted display name: tokens, and UTF-8,
// which RFC 3261 wants quoted but user agents send as it is, and which
// is no separator to misread.
func isDisplay(c byte) bool { return isToken(c) || c >= 0x80 }

// isValue: characters of a parameter value that is a token or a host
// (an IPv6 reference, or an IPv6 address in received=).
func isValue(c byte) bool { return isToken(c) || c == ':' || c == '[' || c == ']' }

func allDigits(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isDigit(c) {
			return false
		}
	}
	return true
}

// header is one header field of a lexed message. name and value are in
// the vetter's scratch buffer; value is unfolded (each line break with
// its white space is one SP, as sipgo's parser does) and trimmed.
type header struct {
	name, value []byte
	kind        hkind
	canon       []byte // value with insignificant white space removed, when that differs
}

// lexed is a datagram split by lex.
type lexed struct {
	start   []byte // the start line
	hdrs    []header
	body    []byte
	rewrite bool // some header's canon differs from its value
}

// lex splits data into m, copying the start line and the header fields
// into scratch (which should have room for 2*len(data) bytes more, so
// that nothing reallocates). It returns a reason when the header section
// is malformed; m then still holds every field it could read, to address
// the answer with.
func lex(data []byte, m *lexed, scratch []byte) (string, []byte) {
	m.hdrs = m.hdrs[:0]
	m.body, m.rewrite = nil, false
	line, pos, reason := nextLine(data, 0)
	start := len(scratch)
	scratch = append(scratch, line...)
	m.start = scratch[start:]
	fail := func(r string) {
		if reason == "" {
			reason = r
		}
	}
	for pos < len(data) {
		var r string
		line, pos, r = nextLine(data, pos)
		fail(r)
		if bytes.IndexByte(line, '\r') >= 0 {
			continue // nothing to copy into an answer
		}
		if len(line) == 0 && r == "" {
			m.body = data[pos:]
			return reason, scratch
		}
		if len(line) > 0 && isWS(line[0]) { // a continuation
			if len(m.hdrs) == 0 {
				fail("Bad Header")
				continue
			}
			h := &m.hdrs[len(m.hdrs)-1]
			cont := bytes.TrimRight(bytes.TrimLeft(line, " \t"), " \t")
			if len(cont) == 0 {
				continue
			}
			// The value is the last thing in scratch: grow it in place.
			vs := len(scratch) - len(h.value)
			if len(h.value) > 0 {
				scratch = append(scratch, ' ')
			}
			scratch = append(scratch, cont...)
			h.value = scratch[vs:]
			continue
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 0 {
			fail("Bad Header")
			continue
		}
		name := bytes.TrimRight(line[:colon], " \t")
		good := len(name) > 0
		for _, c := range name {
			good = good && isToken(c)
		}
		if !good {
			fail("Bad Header")
			continue
		}
		value := bytes.TrimRight(bytes.TrimLeft(line[colon+1:], " \t"), " \t")
		n := len(scratch)
		scratch = append(scratch, name...)
		scratch = append(scratch, value...)
		m.hdrs = append(m.hdrs, header{name: scratch[n : n+len(name)], value: scratch[n+len(name):], kind: headerKind(name)})
	}
	fail("Missing End of Headers")
	return reason, scratch
}

// nextLine returns the line at pos without its CRLF and where the next
// starts, or a reason when the line has no CRLF or holds a lone CR or LF.
func nextLine(data []byte, pos int) ([]byte, int, string) {
	i := bytes.IndexByte(data[pos:], '\n')
	if i < 0 {
		return data[pos:], len(data), "Missing CRLF"
	}
	if i == 0 || data[pos+i-1] != '\r' {
		return data[pos : pos+i], pos + i + 1, "Bare LF"
	}
	line := data[pos : pos+i-1]
	if bytes.IndexByte(line, '\r') >= 0 {
		return line, pos + i + 1, "Bare CR"
	}
	return line, pos + i + 1, ""
}

// startKind tells requests from responses and from what is not SIP.
type startKind uint8

const (
	notSIP startKind = iota
	isRequest
	isResponse
)

func classify(start []byte) startKind {
	if hasPrefixFold(start, "SIP/") {
		return isResponse
	}
	i := 0
	for i < len(start) && isToken(start[i]) {
		i++
	}
	if i == 0 || i == len(start) || start[i] != ' ' {
		return notSIP
	}
	return isRequest
}

// checkRequestLine checks "Method SP Request-URI SP SIP-Version",
// returning the status and reason to refuse it with, or 0.
func checkRequestLine(start []byte) (int, string) {
	sp1 := bytes.IndexByte(start, ' ')
	rest := start[sp1+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 {
		return 400, "Bad Request-Line"
	}
	uri, version := rest[:sp2], rest[sp2+1:]
	if len(version) == 0 || bytes.IndexByte(version, ' ') >= 0 {
		// Extra SP inside or after the line (RFC 4475 3.1.2.8 to 3.1.2.10):
		// the RFC lets either refuse it or read past it; relayd refuses.
		return 400, "Bad Request-Line"
	}
	if !hasPrefixFold(version, "SIP/") {
		return 400, "Bad SIP-Version"
	}
	major, minor, ok := bytes.Cut(version[4:], []byte{'.'})
	if !ok || !allDigits(major) || !allDigits(minor) {
		return 400, "Bad SIP-Version"
	}
	if string(version[4:]) != "2.0" {
		return 505, "Version Not Supported"
	}
	return checkRequestURI(uri)
}

// checkRequestURI: an absolute URI, without LWS or brackets (RFC 4475
// 3.1.2.7); relayd serves sip and sips only (416); a SIP URI must not
// carry headers in a Request-URI (RFC 3261 19.1.1, RFC 4475 3.1.2.11).
func checkRequestURI(uri []byte) (int, string) {
	colon := schemeEnd(uri)
	if colon < 0 {
		return 400, "Bad Request-URI"
	}
	for _, c := range uri {
		if c <= ' ' || c >= 0x7f || c == '<' || c == '>' || c == '"' {
			return 400, "Bad Request-URI"
		}
	}
	scheme := uri[:colon]
	if !foldEqual(scheme, "sip") && !foldEqual(scheme, "sips") {
		return 416, "Unsupported URI Scheme"
	}
	hostpart := uri[colon+1:]
	if at := bytes.IndexByte(hostpart, '@'); at >= 0 {
		hostpart = hostpart[at+1:]
	}
	if bytes.IndexByte(hostpart, '?') >= 0 {
		return 400, "Headers Not Allowed in Request-URI"
	}
	if len(hostpart) == 0 || hostpart[0] == ';' || hostpart[0] == ':' {
		return 400, "Bad Request-URI"
	}
	return 0, ""
}

// schemeEnd returns the index of the colon ending b's URI scheme, or -1.
func schemeEnd(b []byte) int {
	if len(b) == 0 || !isAlpha(b[0]) {
		return -1
	}
	for i := 1; i < len(b); i++ {
		c := b[i]
		switch {
		case c == ':':
			return i
		case isAlpha(c) || isDigit(c) || c == '+' || c == '-' || c == '.':
		default:
			return -1
		}
	}
	return -1
}

// scanner walks a header field value.
type scanner struct {
	b      []byte
	i      int
	cookie bool // a branch parameter with RFC 3261's magic cookie was read
}

func (p *scanner) eof() bool { return p.i >= len(p.b) }

func (p *scanner) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

// sws skips optional white space and reports whether there was any.
func (p *scanner) sws() bool {
	n := p.i
	for p.i < len(p.b) && isWS(p.b[p.i]) {
		p.i++
	}
	return p.i > n
}

func (p *scanner) eat(c byte) bool {
	if p.peek() == c && !p.eof() {
		p.i++
		return true
	}
	return false
}

func (p *scanner) run(ok func(byte) bool) []byte {
	n := p.i
	for p.i < len(p.b) && ok(p.b[p.i]) {
		p.i++
	}
	return p.b[n:p.i]
}

// quoted consumes a quoted-string: qdtext (UTF-8 allowed) and
// quoted-pairs, closed by DQUOTE.
func (p *scanner) quoted() bool {
	if !p.eat('"') {
		return false
	}
	for p.i < len(p.b) {
		c := p.b[p.i]
		p.i++
		switch {
		case c == '"':
			return true
		case c == '\\':
			if p.i >= len(p.b) || p.b[p.i] > 0x7f || p.b[p.i] == '\r' || p.b[p.i] == '\n' {
				return false
			}
			p.i++
		case c < ' ' && c != '\t', c == 0x7f:
			return false
		}
	}
	return false // unterminated
}

// param consumes generic-param: token [ EQUAL ( token / host /
// quoted-string ) ], returning its name.
func (p *scanner) param() ([]byte, bool) {
	name := p.run(isToken)
	if len(name) == 0 {
		return nil, false
	}
	p.sws()
	if p.eat('=') {
		p.sws()
		if p.peek() == '"' {
			return name, p.quoted()
		}
		v := p.run(isValue)
		if len(v) == 0 {
			return nil, false
		}
		if foldEqual(name, "branch") && len(v) > len(magicCookie) && string(v[:len(magicCookie)]) == magicCookie {
			p.cookie = true
		}
	}
	return name, true
}

// params consumes *( SEMI generic-param ), reporting whether a tag was
// among them.
func (p *scanner) params() (tag, ok bool) {
	for {
		save := p.i
		p.sws()
		if !p.eat(';') {
			p.i = save
			return tag, true
		}
		p.sws()
		name, ok := p.param()
		if !ok {
			return false, false
		}
		if foldEqual(name, "tag") {
			tag = true
		}
	}
}

// uriInBrackets consumes "<" addr-spec ">" (the "<" already taken): no
// white space inside (RFC 4475 3.1.2.14), an absolute URI.
func (p *scanner) uriInBrackets() bool {
	end := bytes.IndexByte(p.b[p.i:], '>')
	if end <= 0 {
		return false
	}
	uri := p.b[p.i : p.i+end]
	if schemeEnd(uri) < 0 {
		return false
	}
	for _, c := range uri {
		if c <= ' ' || c == 0x7f || c == '<' || c == '"' {
			return false
		}
	}
	p.i += end + 1
	return true
}

// address consumes ( name-addr / addr-spec ) *( SEMI generic-param ).
// A bare addr-spec must not hold a ",", "?" or ";" of its own (RFC 3261
// 20, RFC 4475 3.1.2.13): here ";" ends it and "," or "?" are errors.
// brackets requires a name-addr (Route, Record-Route).
func (p *scanner) address(brackets bool) (tag, ok bool) {
	p.sws()
	switch p.peek() {
	case '"':
		if !p.quoted() {
			return false, false
		}
		p.sws()
		if !p.eat('<') || !p.uriInBrackets() {
			return false, false
		}
		return p.params()
	case '<':
		p.i++
		if !p.uriInBrackets() {
			return false, false
		}
		return p.params()
	}
	start := p.i
	tok := p.run(isDisplay)
	if len(tok) == 0 {
		return false, false
	}
	if p.peek() == ':' && schemeEnd(p.b[start:]) == len(tok) {
		if brackets {
			return false, false
		}
		uri := p.run(func(c byte) bool {
			return c > ' ' && c != 0x7f && c != ';' && c != ',' && c != '<' && c != '>' && c != '"'
		})
		if bytes.IndexByte(uri, '?') >= 0 {
			return false, false
		}
		return p.params()
	}
	// display-name = *(token LWS), then LAQUOT.
	for {
		ws := p.sws()
		if p.eat('<') {
			break
		}
		if !ws || len(p.run(isDisplay)) == 0 {
			return false, false
		}
	}
	if !p.uriInBrackets() {
		return false, false
	}
	return p.params()
}

// checkAddress checks a From or To value (one address) or a Contact,
// Route or Record-Route value (a list), reporting for From and To
// whether it has a tag.
func checkAddress(v []byte, kind hkind) (tag, ok bool) {
	if kind == hContact && string(v) == "*" {
		return false, true
	}
	p := scanner{b: v}
	for {
		tag, ok = p.address(kind == hRoute || kind == hRecordRoute)
		if !ok {
			return false, false
		}
		p.sws()
		if p.eof() {
			return tag, true
		}
		if (kind != hContact && kind != hRoute && kind != hRecordRoute) || !p.eat(',') {
			return false, false
		}
	}
}

// magicCookie starts the branch of RFC 3261 transactions (8.1.1.7).
const magicCookie = "z9hG4bK"

// via is what relayd needs of a Via value's first entry.
type via struct {
	host   []byte
	port   int  // 0: none
	cookie bool // its branch has the magic cookie
}

// checkVia checks via-parm *( COMMA via-parm ) and returns the first
// entry's sent-by.
func checkVia(v []byte) (via, bool) {
	p := scanner{b: v}
	var first via
	for n := 0; ; n++ {
		e, ok := p.viaParm()
		if !ok {
			return via{}, false
		}
		if n == 0 {
			first = e
		}
		p.sws()
		if p.eof() {
			return first, true
		}
		if !p.eat(',') {
			return via{}, false
		}
	}
}

// viaParm: sent-protocol LWS sent-by *( SEMI via-params ), where
// sent-protocol = "SIP" SLASH DIGITS "." DIGITS SLASH transport and
// sent-by = host [ COLON port ].
func (p *scanner) viaParm() (via, bool) {
	p.sws()
	if !foldEqual(p.run(isToken), "SIP") {
		return via{}, false
	}
	p.sws()
	if !p.eat('/') {
		return via{}, false
	}
	p.sws()
	major, minor, ok := bytes.Cut(p.run(isToken), []byte{'.'})
	if !ok || !allDigits(major) || !allDigits(minor) {
		return via{}, false
	}
	p.sws()
	if !p.eat('/') {
		return via{}, false
	}
	p.sws()
	if len(p.run(isToken)) == 0 || !p.sws() {
		return via{}, false
	}
	var e via
	if e.host, ok = p.host(); !ok {
		return via{}, false
	}
	save := p.i
	p.sws()
	if p.eat(':') {
		p.sws()
		port := p.run(isDigit)
		n, err := strconv.Atoi(string(port))
		if len(port) == 0 || len(port) > 5 || err != nil || n == 0 || n > 65535 {
			return via{}, false
		}
		e.port = n
	} else {
		p.i = save
	}
	p.cookie = false
	if _, ok := p.params(); !ok {
		return via{}, false
	}
	e.cookie = p.cookie
	return e, true
}

// host: hostname, IPv4 address or IPv6 reference.
func (p *scanner) host() ([]byte, bool) {
	if p.peek() == '[' {
		end := bytes.IndexByte(p.b[p.i:], ']')
		if end < 3 {
			return nil, false
		}
		h := p.b[p.i : p.i+end+1]
		for _, c := range h[1 : len(h)-1] {
			if !isDigit(c) && !('a' <= c|0x20 && c|0x20 <= 'f') && c != ':' && c != '.' {
				return nil, false
			}
		}
		p.i += end + 1
		return h, true
	}
	h := p.run(func(c byte) bool { return isAlpha(c) || isDigit(c) || c == '-' || c == '.' || c == '_' })
	return h, len(h) > 0
}

// checkCSeq: 1*DIGIT LWS Method, the number below 2**31 (RFC 3261 8.1.1.5;
// sipgo refuses larger ones).
func checkCSeq(v []byte) bool {
	p := scanner{b: v}
	num := p.run(isDigit)
	if len(num) == 0 || len(num) > 10 || !p.sws() {
		return false
	}
	if n, err := strconv.ParseUint(string(num), 10, 32); err != nil || n > 1<<31-1 {
		return false
	}
	method := p.run(isToken)
	return len(method) > 0 && p.eof()
}

// checkContentType: m-type SLASH m-subtype *( SEMI m-parameter ).
func checkContentType(v []byte) bool {
	p := scanner{b: v}
	if len(p.run(isToken)) == 0 {
		return false
	}
	p.sws()
	if !p.eat('/') {
		return false
	}
	p.sws()
	if len(p.run(isToken)) == 0 {
		return false
	}
	if _, ok := p.params(); !ok {
		return false
	}
	p.sws()
	return p.eof()
}

// checkHeaders checks the header fields relayd and sipgo read, in their
// order, and the Content-Length against the datagram. It returns 0 or the
// status and reason to refuse the request with.
func checkHeaders(m *lexed, scratch []byte) (int, string, []byte) {
	method, _, _ := bytes.Cut(m.start, []byte{' '})
	contentLength := -1
	var seen [len(hnames)]bool
	topCookie, fromTag := false, false
	for i := range m.hdrs {
		h := &m.hdrs[i]
		switch h.kind {
		case hFrom, hTo, hCallID, hCSeq, hMaxForwards, hContentType:
			// RFC 4475 3.3.8. The answer copies the first.
			if seen[h.kind] {
				return 400, multipleReasons[h.kind], scratch
			}
		}
		first := !seen[h.kind]
		seen[h.kind] = true
		ok := true
		switch h.kind {
		case hVia:
			var v via
			v, ok = checkVia(h.value)
			if first {
				topCookie = v.cookie
			}
		case hFrom:
			fromTag, ok = checkAddress(h.value, h.kind)
		case hTo, hContact, hRoute, hRecordRoute:
			_, ok = checkAddress(h.value, h.kind)
		case hCallID:
			ok = len(h.value) > 0 && !bytes.ContainsAny(h.value, " \t")
		case hCSeq:
			ok = checkCSeq(h.value)
			if ok && !bytes.Equal(h.value[bytes.LastIndexAny(h.value, " \t")+1:], method) {
				// Methods are case-sensitive (RFC 3261 7.1); sipgo
				// upper-cases the request's, so the exact check is here.
				return 400, "CSeq Method Mismatch", scratch
			}
		case hMaxForwards:
			n, err := strconv.Atoi(string(h.value))
			ok = allDigits(h.value) && err == nil && n <= 255
		case hContentLength:
			if contentLength >= 0 {
				return 400, "Multiple Content-Length", scratch // RFC 4475 3.3.9: no way to know the body
			}
			n, err := strconv.Atoi(string(h.value))
			ok = allDigits(h.value) && err == nil && len(h.value) <= 9
			contentLength = n
		case hContentType:
			ok = checkContentType(h.value)
		}
		if !ok {
			return 400, badReasons[h.kind], scratch
		}
		switch h.kind {
		case hVia, hFrom, hTo, hContact, hRoute, hRecordRoute:
			n := len(scratch)
			scratch = canonical(scratch, h.value, h.kind == hVia)
			if c := scratch[n:]; !bytes.Equal(c, h.value) {
				h.canon = c
				m.rewrite = true
			} else {
				scratch = scratch[:n]
			}
		}
	}
	if contentLength > len(m.body) {
		// Over UDP the datagram is the whole message (RFC 3261 18.3).
		return 400, "Content-Length Exceeds Message", scratch
	}
	for _, k := range [...]hkind{hVia, hFrom, hTo, hCallID, hCSeq} {
		// RFC 3261 8.1.1. Without a Via there is no one to answer; without
		// the others sipgo answers at the source port instead of the Via's.
		if !seen[k] {
			return 400, missingReasons[k], scratch
		}
	}
	if !topCookie && !fromTag {
		// An RFC 2543 request is matched to its transaction by its From
		// tag among others (RFC 3261 17.2.3); sipgo refuses it without
		// one, answering at the source port instead of the Via's.
		return 400, "Missing From Tag", scratch
	}
	return 0, "", scratch
}

// canonical appends v without the white space the grammar makes
// insignificant (around ";", "=", ",", and in a Via around "/" and ":"),
// other runs of it made one SP, quoted strings and bracketed URIs as
// they are. sipgo reads such white space into parameter names and
// values ("tag " = " 98asjd8"), which breaks dialog and transaction
// matching (RFC 4475 3.1.1.1). It only deletes, so the result is never
// longer than v.
func canonical(dst, v []byte, via bool) []byte {
	sep := func(c byte) bool { return c == ';' || c == '=' || c == ',' || via && (c == '/' || c == ':') }
	inQuote, inBracket, escaped := false, false, false
	start := len(dst)
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case inQuote:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inQuote = false
			}
		case inBracket:
			inBracket = c != '>'
		case c == '"':
			inQuote = true
		case c == '<':
			inBracket = true
		case isWS(c):
			j := i
			for j < len(v) && isWS(v[j]) {
				j++
			}
			if len(dst) > start && j < len(v) && !sep(dst[len(dst)-1]) && !sep(v[j]) {
				dst = append(dst, ' ')
			}
			i = j - 1
			continue
		}
		dst = append(dst, c)
	}
	return dst
}
