package sip

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/loglimit"
)

func TestCheckAddress(t *testing.T) {
	for _, c := range []struct {
		v    string
		kind hkind
		ok   bool
		tag  bool
	}{
		{`sip:user@example.com`, hTo, true, false},
		{`<sip:user@example.com>;tag=1`, hTo, true, true},
		{`"J Rosenberg \\\""       <sip:jdrosen@example.com> ; tag = 98asjd8`, hFrom, true, true},
		{`sip:vivekg@chair-dnrc.example.com ;   tag    = 1918181833n`, hTo, true, true},
		{`caller<sip:caller@example.com>;tag=323`, hFrom, true, true},
		{"token1~` token2'+_ token3*%!.- <sip:mundane@example.com>;fromParam''~+*_!.-%=\"работающий\";tag=_token~1'+`*%!-.", hFrom, true, true},
		{"\"BEL:\\\x07 NUL:\\\x00 DEL:\\\x7f\" <sip:1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*@example.com>", hTo, true, false},
		{`isbn:2983792873`, hTo, true, false},
		{"J\xc3\xbcrgen M\xc3\xbcller <sip:j@example.com>;tag=7", hFrom, true, true}, // UTF-8 unquoted: taken
		{`<name:John_Smith>`, hContact, true, false},
		{`*`, hContact, true, false},
		{`<sip:a@b>, "x" <sip:c@d>;expires=3`, hContact, true, false},
		{`"Mr. J. User <sip:j.user@example.com>`, hTo, false, false},                     // unterminated quote
		{`Bell, Alexander <sip:a.g.bell@example.com>;tag=43`, hFrom, false, false},       // comma in a display name
		{`"Watson, Thomas" < sip:t.watson@example.org >`, hTo, false, false},             // LWS in brackets
		{`sip:user@example.com?Route=%3Csip:sip.example.com%3E`, hContact, false, false}, // ? outside brackets
		{`"Joe" <sip:joe@example.org>;;;;`, hContact, false, false},                      // empty parameters
		{`<sip:a@b>, <sip:c@d>`, hTo, false, false},                                      // two Tos
		{`sip:services.example.com;lr`, hRoute, false, false},                            // Route needs brackets
		{`<sip:a@b`, hTo, false, false},
		{``, hTo, false, false},
	} {
		tag, ok := checkAddress([]byte(c.v), c.kind)
		if ok != c.ok || tag != c.tag {
			t.Errorf("checkAddress(%q) = tag %v ok %v, want %v %v", c.v, tag, ok, c.tag, c.ok)
		}
	}
}

func TestCheckVia(t *testing.T) {
	for _, c := range []struct {
		v      string
		ok     bool
		host   string
		port   int
		cookie bool
	}{
		{`SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKkdjuw`, true, "192.0.2.1", 0, true},
		{`SIP  /   2.0 /UDP 192.0.2.2;branch=390skdjuw`, true, "192.0.2.2", 0, false},
		{`SIP  / 2.0  / TCP     spindle.example.com   ;   branch  =   z9hG4bK9ikj8  ,  SIP  /    2.0   / UDP  192.168.255.111   ; branch= z9hG4bK30239`, true, "spindle.example.com", 0, true},
		{`SIP/2.0/UDP [2001:db8::1]:5070;rport;received=2001:db8::2`, true, "[2001:db8::1]", 5070, false},
		{`SIP/2.0/UDP host : 5060;branch=z9hG4bK`, true, "host", 5060, false}, // the bare cookie is no RFC 3261 branch
		{`SIP/2.0/UDP 192.0.2.15;;,;,,`, false, "", 0, false},
		{`SIP/2.0/UDP`, false, "", 0, false},
		{`SIP/2.0/UDP host:99999`, false, "", 0, false},
		{`HTTP/1.1/TCP host`, false, "", 0, false},
		{`SIP/2.0/UDP host,`, false, "", 0, false},
	} {
		v, ok := checkVia([]byte(c.v))
		if ok != c.ok || string(v.host) != c.host || v.port != c.port || v.cookie != c.cookie {
			t.Errorf("checkVia(%q) = %q %d cookie %v ok %v, want %q %d %v %v", c.v, v.host, v.port, v.cookie, ok, c.host, c.port, c.cookie, c.ok)
		}
	}
}

func TestCheckRequestLine(t *testing.T) {
	for _, c := range []struct {
		line string
		code int
	}{
		{"INVITE sip:user@example.com SIP/2.0", 0},
		{"OPTIONS sips:user@example.com sip/2.0", 0},
		{"!interesting-Method0123456789_*+`.%indeed'~ sip:1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*:&it+has=1,weird!*pas$wo~d_too.(doesn't-it)@example.com SIP/2.0", 0},
		{"OPTIONS sip:user;par=u%40example.net@example.com SIP/2.0", 0},
		{"INVITE  sip:user@example.com  SIP/2.0", 400},
		{"OPTIONS sip:remote-target@example.com SIP/2.0  ", 400},
		{"INVITE sip:user@example.com; lr SIP/2.0", 400},
		{"INVITE <sip:user@example.com> SIP/2.0", 400},
		{"INVITE sip:user@example.com?Route=%3Csip:example.com%3E SIP/2.0", 400},
		{"OPTIONS sip:t.watson@example.org SIP/7.0", 505},
		{"OPTIONS sip:t.watson@example.org SIP/2", 400},
		{"OPTIONS soap.beep://192.0.2.103:3002 SIP/2.0", 416},
		{"OPTIONS tel:+15551234 SIP/2.0", 416},
		{"INVITE sip:alan@jasomi.com", 400},
	} {
		if code, reason := checkRequestLine([]byte(c.line)); code != c.code {
			t.Errorf("checkRequestLine(%q) = %d %q, want %d", c.line, code, reason, c.code)
		}
	}
}

func TestCanonical(t *testing.T) {
	for _, c := range []struct {
		in, out string
		via     bool
	}{
		{`"J Rosenberg \\\""       <sip:jdrosen@example.com> ; tag = 98asjd8`, `"J Rosenberg \\\"" <sip:jdrosen@example.com>;tag=98asjd8`, false},
		{`"a ; b" <sip:x@y;lr>`, `"a ; b" <sip:x@y;lr>`, false}, // quotes and brackets kept
		{`SIP  / 2.0  / TCP     spindle.example.com   ;   branch  =   z9hG4bK9ikj8  ,  SIP / 2.0 / UDP h : 5060`, `SIP/2.0/TCP spindle.example.com;branch=z9hG4bK9ikj8,SIP/2.0/UDP h:5060`, true},
		{`sip:a@b`, `sip:a@b`, false},
	} {
		if got := string(canonical(nil, []byte(c.in), c.via)); got != c.out {
			t.Errorf("canonical(%q) = %q, want %q", c.in, got, c.out)
		}
	}
}

// testConn is a vettedConn that records what it would send.
type sink struct {
	net.PacketConn
	to  net.Addr
	out []byte
}

func (s *sink) WriteTo(b []byte, to net.Addr) (int, error) {
	s.to, s.out = to, append(s.out[:0], b...)
	return len(b), nil
}

func newTestConn() (*vettedConn, *sink) {
	s := &sink{}
	v := newVetter("relayd", zap.NewNop(), loglimit.New(loglimit.Config{}, zap.NewNop()))
	return v.conn(s).(*vettedConn), s
}

// TestVetRewrite: a valid request with insignificant white space reaches
// sipgo rewritten so that sipgo reads its tags; its body is intact.
func TestVetRewrite(t *testing.T) {
	c, s := newTestConn()
	data, err := os.ReadFile("testdata/torture/valid/wsinv.dat")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 32768)
	n := copy(b, data)
	from := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 9), Port: 5060}
	n, ok := c.vet(b, n, from)
	if !ok || s.out != nil {
		t.Fatalf("wsinv refused: %q", s.out)
	}
	msg, err := sip.ParseMessage(b[:n])
	if err != nil {
		t.Fatal(err)
	}
	req := msg.(*sip.Request)
	if tag, _ := req.From().Params.Get("tag"); tag != "98asjd8" {
		t.Errorf("From tag %q", tag)
	}
	if tag, _ := req.To().Params.Get("tag"); tag != "1918181833n" {
		t.Errorf("To tag %q", tag)
	}
	vias := req.GetHeaders("Via")
	if len(vias) != 3 || vias[1].(*sip.ViaHeader).Host != "spindle.example.com" || vias[1].(*sip.ViaHeader).Transport != "TCP" {
		t.Errorf("Vias %v", vias)
	}
	if len(req.Body()) != 150 || string(req.Body()[:4]) != "v=0\r" {
		t.Errorf("body %q", req.Body())
	}
}

// TestVetStatelessAnswer: the answer to a refused request copies the
// request's fields, adds a To tag (the same for a retransmission) and
// received, and goes to the Via's port at the source address.
func TestVetStatelessAnswer(t *testing.T) {
	c, s := newTestConn()
	data := []byte("OPTIONS sip:t.watson@example.org SIP/7.0\r\nVia: SIP/7.0/UDP c.example.com;branch=z9hG4bKkdjuw, SIP/2.0/UDP d.example.com\r\n" +
		"Via: SIP/2.0/TCP e.example.com\r\nMax-Forwards: 70\r\nf: A. Bell <sip:a.g.bell@example.com>;tag=qweoiqpe\r\n" +
		"t: T. Watson <sip:t.watson@example.org>\r\ni: badvers.31417@c.example.com\r\nCSeq: 1 OPTIONS\r\nl: 0\r\n\r\n")
	from := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 9), Port: 40000}
	var answers []string
	for range 2 {
		b := make([]byte, 32768)
		if _, ok := c.vet(b, copy(b, data), from); ok {
			t.Fatal("SIP/7.0 passed")
		}
		answers = append(answers, string(s.out))
	}
	want := "SIP/2.0 505 Version Not Supported\r\n" +
		"Via: SIP/7.0/UDP c.example.com;branch=z9hG4bKkdjuw;received=192.0.2.9\r\n" +
		"Via: SIP/2.0/UDP d.example.com\r\nVia: SIP/2.0/TCP e.example.com\r\n" +
		"From: A. Bell <sip:a.g.bell@example.com>;tag=qweoiqpe\r\n" +
		"To: T. Watson <sip:t.watson@example.org>;tag="
	if len(answers[0]) < len(want) || answers[0][:len(want)] != want {
		t.Fatalf("answer\n%s\nwant it to start\n%s", answers[0], want)
	}
	if answers[0] != answers[1] {
		t.Errorf("a retransmission got another answer:\n%s\n%s", answers[0], answers[1])
	}
	if to := s.to.(*net.UDPAddr); !to.IP.Equal(from.IP) || to.Port != 5060 {
		t.Errorf("answered to %v, want 192.0.2.9:5060", s.to)
	}
}

// BenchmarkVetInvite is the pre-parser's cost on a valid INVITE (its
// lexer and checks, then sipgo's parse that makes sure sipgo takes it),
// beside sipgo's own parse, which follows in any case.
func BenchmarkVetInvite(b *testing.B) {
	data, err := os.ReadFile("testdata/torture/invalid/baddate.dat") // valid but for its Date
	if err != nil {
		b.Fatal(err)
	}
	from := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 9), Port: 5060}
	b.Run("vet", func(b *testing.B) {
		c, _ := newTestConn()
		buf := make([]byte, 32768)
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := c.vet(buf, copy(buf, data), from); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("sipgo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := sip.ParseMessage(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzVet: the pre-parser never panics; what it passes on, sipgo
// parses, no longer than it came; what it answers is a SIP/2.0 response
// to a request with a Via.
func FuzzVet(f *testing.F) {
	files, _ := filepath.Glob("testdata/torture/*/*.dat")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	c, s := newTestConn()
	from := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 9), Port: 5060}
	f.Fuzz(func(t *testing.T, data []byte) {
		b := make([]byte, 32768)
		in := copy(b, data)
		s.out = s.out[:0]
		n, ok := c.vet(b, in, from)
		if ok {
			if n > in {
				t.Fatalf("grew from %d to %d bytes", in, n)
			}
			if classify(firstLineOf(b[:n])) == isRequest {
				if _, err := sip.ParseMessage(b[:n]); err != nil {
					t.Fatalf("passed a request sipgo refuses: %v\n%q", err, b[:n])
				}
			}
			return
		}
		if len(s.out) == 0 {
			return // dropped
		}
		if !bytes.HasPrefix(s.out, []byte("SIP/2.0 ")) || !bytes.HasSuffix(s.out, []byte("\r\n\r\n")) {
			t.Fatalf("answer %q", s.out)
		}
		if !viaLine.Match(data) {
			t.Fatalf("answered %q without a Via", data)
		}
	})
}

func firstLineOf(b []byte) []byte {
	l, _, _ := bytes.Cut(b, []byte{'\n'})
	return bytes.TrimSuffix(l, []byte{'\r'})
}
