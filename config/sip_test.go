package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

const sipDoc = minimal + `
[sip]
listen = ["udp:198.18.1.1:5060", "tcp:[2001:2:0:1::1]:5060"]
max_call_duration = "2h"
rate_limit = 50
[[route]]
name = "carrier"
match = "^\\+?1"
destinations = ["sip:198.18.2.2:5060", "sip:198.18.3.2:5060;transport=tcp"]
order = "weighted"
weights = [3, 1]
attempt_timeout = "500ms"
failover_on = [503]
srtp = "offer"
codecs = ["PCMU", "telephone-event"]
transcode = ["g729", "PCMA"]
[[route]]
name = "default"
match = "."
destinations = ["sip:198.18.2.2"]
[route_server]
url = "http://127.0.0.1:8090/route"
[cdr]
path = "/var/log/relayd/cdr.jsonl"
post_url = "http://127.0.0.1:8090/cdr"
fsync_interval = "200ms"
[state]
path = "/var/lib/relayd/state.db"
`

func TestParseSIP(t *testing.T) {
	c, err := Parse([]byte(sipDoc))
	if err != nil {
		t.Fatal(err)
	}
	s := c.SIP
	if !s.Enabled() || len(s.Listeners) != 2 || s.Listeners[1].Network != "tcp" ||
		s.Listeners[1].Addr != netip.MustParseAddrPort("[2001:2:0:1::1]:5060") {
		t.Errorf("listeners %+v", s.Listeners)
	}
	if s.MaxDuration != 2*time.Hour || s.RateBurstParsed != 100 || s.RetryAfterDur != 5*time.Second {
		t.Errorf("sip %+v", s)
	}
	if len(c.Routes) != 2 {
		t.Fatalf("%d routes", len(c.Routes))
	}
	r := c.Routes[0]
	if !r.Regexp.MatchString("+1555") || r.Regexp.MatchString("44") || r.AttemptTimeoutDuration != 500*time.Millisecond ||
		r.SRTP != "offer" || len(r.FailoverOn) != 1 {
		t.Errorf("route 0 %+v", r)
	}
	if strings.Join(r.Transcode, " ") != "G729 PCMA" {
		t.Errorf("route 0 transcode %q, want canonical G729 PCMA", r.Transcode)
	}
	d := c.Routes[1]
	if d.Order != "ordered" || d.SRTP != "off" || d.AttemptTimeoutDuration != 2*time.Second || len(d.FailoverOn) != len(DefaultFailoverOn) {
		t.Errorf("route 1 defaults %+v", d)
	}
	if c.State.Path != "/var/lib/relayd/state.db" {
		t.Errorf("state path %q", c.State.Path)
	}
	if c.RouteServer.TimeoutDuration != time.Second || c.CDR.FsyncDuration != 200*time.Millisecond {
		t.Errorf("route server %+v cdr %+v", c.RouteServer, c.CDR)
	}
}

func TestParseSIPErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc, key string
		line           int
		msg            string
	}{
		{"listen", "[sip]\nlisten = [\"sctp:1.2.3.4:5060\"]\n", "sip.listen", 2, "want udp:ADDR:PORT"},
		{"route regexp", "[[route]]\nname = \"a\"\nmatch = \"(\"\ndestinations = [\"sip:198.18.2.2\"]\n", "route[0].match", 3, "not a regular expression"},
		{"second route", "[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:198.18.2.2\"]\n[[route]]\nname = \"b\"\nmatch = \".\"\ndestinations = [\"http://x\"]\n", "route[1].destinations", 8, "want sip:"},
		{"duplicate name", "[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\n[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\n", "route[1].name", 6, "twice"},
		{"weights", "[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\norder = \"weighted\"\n", "route[0].weights", 0, "one weight per destination"},
		{"srtp", "[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\nsrtp = \"maybe\"\n", "route[0].srtp", 5, "not one of off"},
		{"failover code", "[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\nfailover_on = [200]\n", "route[0].failover_on", 5, "not a final failure code"},
		{"transcode", "[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\ntranscode = [\"G729\", \"opus\"]\n", "route[0].transcode", 5, `"opus" is not a codec relayd transcodes`},
		{"transport", "[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h:5060;transport=sctp\"]\n", "route[0].destinations", 4, "transport"},
		{"unknown route key", "[[route]]\nname = \"a\"\nbogus = 1\n", "route.bogus", 3, "unknown key"},
		{"route server", "[route_server]\nurl = \"ftp://x\"\n", "route_server.url", 2, "http(s) URL"},
		{"cdr path", "[cdr]\npath = \"cdr.jsonl\"\n", "cdr.path", 2, "absolute"},
		{"state path", "[state]\npath = \"state.db\"\n", "state.path", 2, "absolute"},
		{"state key", "[state]\nfile = \"/x\"\n", "state.file", 2, "unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(minimal + tc.doc))
			if err == nil {
				t.Fatal("no error")
			}
			var found bool
			for _, e := range unjoin(err) {
				var ce *Error
				if errors.As(e, &ce) && ce.Key == tc.key && strings.Contains(ce.Msg, tc.msg) {
					found = true
					if tc.line != 0 && ce.Line != tc.line+strings.Count(minimal, "\n") {
						t.Errorf("line %d, want %d", ce.Line, tc.line+strings.Count(minimal, "\n"))
					}
				}
			}
			if !found {
				t.Errorf("error %q has no %s error containing %q", err, tc.key, tc.msg)
			}
		})
	}
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// TestRouteAllow: allow takes addresses, networks (masked) and "any";
// IPv4-mapped IPv6 is IPv4. A route without allow takes any source and
// is warned about, when the B2BUA runs; an explicit "any" is not.
func TestRouteAllow(t *testing.T) {
	c, err := Parse([]byte(minimal + `
[sip]
listen = ["udp:198.18.1.1:5060"]
[[route]]
name = "pbx"
match = "."
allow = ["198.18.0.7/24", "2001:2::2", "::ffff:198.18.9.9", "::ffff:198.18.8.0/120"]
destinations = ["sip:198.18.2.2"]
[[route]]
name = "behind-sbc"
match = "."
allow = ["any"]
destinations = ["sip:198.18.2.2"]
[[route]]
name = "legacy"
match = "."
destinations = ["sip:198.18.2.2"]
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range c.Routes[0].AllowPrefixes {
		got = append(got, p.String())
	}
	if want := "198.18.0.0/24 2001:2::2/128 198.18.9.9/32 198.18.8.0/24"; strings.Join(got, " ") != want {
		t.Errorf("allow %q, want %q", got, want)
	}
	if any := c.Routes[1].AllowPrefixes; len(any) != 2 || any[0].String() != "0.0.0.0/0" || any[1].String() != "::/0" || c.Routes[1].Open() {
		t.Errorf("allow any: %v (open %v)", any, c.Routes[1].Open())
	}
	if !c.Routes[2].Open() || c.Routes[2].AllowPrefixes != nil {
		t.Errorf("route without allow: open %v, %v", c.Routes[2].Open(), c.Routes[2].AllowPrefixes)
	}
	w := c.Warnings()
	line := strings.Count(minimal, "\n") + 14 // the third [[route]]
	if len(w) != 1 || !strings.HasPrefix(w[0], fmt.Sprintf("line %d: route[2]: route \"legacy\" takes calls from any source", line)) {
		t.Errorf("warnings %q, want one for route[2] on line %d", w, line)
	}

	// Without the B2BUA the routes do nothing: no warning.
	c, err = Parse([]byte(minimal + "[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\n"))
	if err != nil || len(c.Warnings()) != 0 {
		t.Errorf("routes without [sip] listen: %v, warnings %q", err, c.Warnings())
	}

	for _, tc := range []struct{ allow, msg string }{
		{`[]`, "empty"},
		{`["198.18.0.0/33"]`, "neither an address nor a network"},
		{`["pbx.example"]`, "neither an address nor a network"},
		{`["fe80::1%eth0"]`, "neither an address nor a network"},
	} {
		_, err := Parse([]byte(minimal + "[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\nallow = " + tc.allow + "\n"))
		var ce *Error
		if err == nil || !errors.As(unjoin(err)[0], &ce) || ce.Key != "route[0].allow" || !strings.Contains(ce.Msg, tc.msg) {
			t.Errorf("allow = %s: %v, want a route[0].allow error containing %q", tc.allow, err, tc.msg)
		}
	}
}
