package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testcert"
)

const sipDoc = minimal + `
[sip]
listen = ["udp:198.18.1.1:5060", "tcp:[2001:2:0:1::1]:5060"]
max_call_duration = "2h"
rate_limit = 50
wait_timer = "5s"
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
	if s.MaxDuration != 2*time.Hour || s.RateBurstParsed != 100 || s.RetryAfterDur != 5*time.Second || s.WaitDuration != 5*time.Second {
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
		{"wait timer", "[sip]\nwait_timer = \"40s\"\n", "sip.wait_timer", 2, "from 1s to 32s"},
		{"wait timer short", "[sip]\nwait_timer = \"500ms\"\n", "sip.wait_timer", 2, "from 1s to 32s"},
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

// TestAuthConfig: auth_users need an auth_file; the algorithms default to
// SHA-256 then MD5 and are canonical upper case; bad names, realms and
// algorithms are errors naming their key.
func TestAuthConfig(t *testing.T) {
	c, err := Parse([]byte(minimal + "[sip]\nauth_file = \"/etc/relayd/sip-users\"\nauth_algorithms = [\"md5\"]\n" +
		"[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\nauth_users = [\"alice\", \"pbx-1\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := c.SIP; s.AuthRealm != "relayd" || strings.Join(s.AuthAlgorithms, " ") != "MD5" || s.Credentials != nil {
		t.Errorf("sip %+v", s)
	}
	if c.Routes[0].Open() {
		t.Error("a route with auth_users is open")
	}
	c, _ = Parse([]byte(minimal))
	if strings.Join(c.SIP.AuthAlgorithms, " ") != "SHA-256 MD5" {
		t.Errorf("default algorithms %q", c.SIP.AuthAlgorithms)
	}
	route := "[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\n"
	for _, tc := range []struct{ doc, key, msg string }{
		{route + "auth_users = [\"alice\"]\n", "route[0].auth_users", "needs [sip] auth_file"},
		{"[sip]\nauth_file = \"/x\"\n" + route + "auth_users = [\"al ice\"]\n", "route[0].auth_users", "not a user name"},
		{"[sip]\nauth_file = \"/x\"\n" + route + "auth_users = [\"a:b\"]\n", "route[0].auth_users", "not a user name"},
		{"[sip]\nauth_file = \"/x\"\n" + route + "auth_users = [\"a\", \"a\"]\n", "route[0].auth_users", "twice"},
		{"[sip]\nauth_file = \"users\"\n", "sip.auth_file", "absolute"},
		{"[sip]\nauth_realm = \"a\\\"b\"\n", "sip.auth_realm", "no quotes"},
		{"[sip]\nauth_algorithms = [\"SHA-512\"]\n", "sip.auth_algorithms", "not SHA-256 or MD5"},
		{"[sip]\nauth_algorithms = [\"MD5\", \"md5\"]\n", "sip.auth_algorithms", "twice"},
		{"[sip]\nauth_algorithms = []\n", "sip.auth_algorithms", "empty"},
	} {
		_, err := Parse([]byte(minimal + tc.doc))
		found := false
		for _, e := range unjoin(err) {
			var ce *Error
			if errors.As(e, &ce) && ce.Key == tc.key && strings.Contains(ce.Msg, tc.msg) {
				found = true
			}
		}
		if !found {
			t.Errorf("%q: %v, want a %s error containing %q", tc.doc, err, tc.key, tc.msg)
		}
	}
}

// TestLoadAuthFile: Load reads the auth_file's users; it refuses a file
// others may read or write, a malformed line (naming it, never the
// password), a missing file, and a route user the file lacks.
func TestLoadAuthFile(t *testing.T) {
	dir := t.TempDir()
	users := filepath.Join(dir, "sip-users")
	conf := filepath.Join(dir, "relayd.toml")
	write := func(path, content string, mode os.FileMode) {
		t.Helper()
		os.Remove(path)
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	doc := minimal + "[sip]\nauth_file = \"" + users + "\"\n[[route]]\nname = \"a\"\nmatch = \".\"\ndestinations = [\"sip:h\"]\nauth_users = [\"alice\"]\n"
	write(conf, doc, 0o644)
	write(users, "# PBXes\nalice:s3cret:with:colons\n\nbob: spaced \n", 0o600)
	c, err := Load(conf)
	if err != nil {
		t.Fatal(err)
	}
	if pw, ok := c.SIP.Credentials.Password("alice"); !ok || pw != "s3cret:with:colons" {
		t.Errorf("alice's password %q, %v", pw, ok)
	}
	if pw, _ := c.SIP.Credentials.Password("bob"); pw != " spaced " || c.SIP.Credentials.Len() != 2 {
		t.Errorf("bob's password %q, %d users", pw, c.SIP.Credentials.Len())
	}
	if s := fmt.Sprintf("%v %+v %#v", c.SIP.Credentials, c.SIP, c.SIP.Credentials); strings.Contains(s, "s3cret") {
		t.Errorf("printing the config shows a password: %s", s)
	}

	for _, tc := range []struct {
		content string
		mode    os.FileMode
		msg     string
	}{
		{"alice:pw-9f3k\n", 0o644, "has mode 0644: others may read or change it"},
		{"alice:pw-9f3k\n", 0o640, "has mode 0640"},
		{"alice:pw-9f3k\n", 0o602, "has mode 0602"},
		{"alice:pw-9f3k\nbob\n", 0o600, "line 2: want user:password"},
		{"alice:pw-9f3k\nalice:other\n", 0o600, `line 2: user "alice" defined twice`},
		{"bob:pw-9f3k\n", 0o600, `route[0].auth_users: user "alice" is not in`},
	} {
		write(users, tc.content, tc.mode)
		_, err := Load(conf)
		if err == nil || !strings.Contains(err.Error(), tc.msg) || strings.Contains(err.Error(), "pw-9f3k") {
			t.Errorf("auth_file %q mode %04o: %v, want an error containing %q and no password", tc.content, tc.mode, err, tc.msg)
		}
	}
	os.Remove(users)
	if _, err := Load(conf); err == nil || !strings.Contains(err.Error(), "sip.auth_file: cannot read it") {
		t.Errorf("missing auth_file: %v", err)
	}
}

// TestTLSConfig: tls: listeners need tls_cert and tls_key, which need a
// tls: listener; destinations take transport=tls, which needs one too;
// sdes_tls_only with srtp offer or require refuses plain destinations.
// Load reads the pair (the key from a private file) and the CAs.
func TestTLSConfig(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	certFile, keyFile := ca.Issue(t, "198.18.1.1").WriteFiles(t, dir)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	sip := fmt.Sprintf("[sip]\nlisten = [\"tls:198.18.1.1:5061\"]\ntls_cert = %q\ntls_key = %q\ntls_ca = %q\n", certFile, keyFile, caFile)
	route := "[[route]]\nname = \"a\"\nmatch = \".\"\nallow = [\"any\"]\n"
	doc := minimal + sip + route + "destinations = [\"sip:198.18.2.2;transport=tls\"]\nsrtp = \"offer\"\nsdes_tls_only = true\n"
	conf := filepath.Join(dir, "relayd.toml")
	if err := os.WriteFile(conf, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(conf)
	if err != nil {
		t.Fatal(err)
	}
	if l := c.SIP.Listeners; len(l) != 1 || l[0].Network != "tls" || c.SIP.TLSCertificate == nil || c.SIP.TLSRoots == nil || !c.Routes[0].SDESTLSOnly {
		t.Errorf("listeners %+v, certificate %v, roots %v, route %+v", l, c.SIP.TLSCertificate != nil, c.SIP.TLSRoots != nil, c.Routes[0])
	}

	os.Chmod(keyFile, 0o644)
	if _, err := Load(conf); err == nil || !strings.Contains(err.Error(), "sip.tls_key: "+keyFile+" has mode 0644") {
		t.Errorf("world-readable key: %v", err)
	}
	other := t.TempDir()
	_, otherKey := ca.Issue(t, "198.18.1.1").WriteFiles(t, other)
	os.WriteFile(conf, []byte(strings.Replace(doc, keyFile, otherKey, 1)), 0o644)
	if _, err := Load(conf); err == nil || !strings.Contains(err.Error(), "private key does not match public key") {
		t.Errorf("key of another certificate: %v", err)
	}

	for _, tc := range []struct{ doc, key, msg string }{
		{"[sip]\nlisten = [\"tls:198.18.1.1:5061\"]\n", "sip.tls_cert", "needs tls_cert and tls_key"},
		{"[sip]\nlisten = [\"udp:198.18.1.1:5060\"]\ntls_cert = \"/c\"\ntls_key = \"/k\"\n", "sip.tls_cert", "has none"},
		{"[sip]\nlisten = [\"udp:198.18.1.1:5060\"]\n" + route + "destinations = [\"sip:198.18.2.2;transport=tls\"]\n", "route[0].destinations", "needs a tls: address"},
		{sip + route + "destinations = [\"sip:198.18.2.2;transport=tcp\"]\nsrtp = \"require\"\nsdes_tls_only = true\n", "route[0].destinations", "sdes_tls_only refuses"},
		{"[sip]\nlisten = [\"tls:198.18.1.1:5061\"]\ntls_cert = \"c.pem\"\ntls_key = \"/k\"\n", "sip.tls_cert", "absolute"},
	} {
		_, err := Parse([]byte(minimal + tc.doc))
		found := false
		for _, e := range unjoin(err) {
			var ce *Error
			if errors.As(e, &ce) && ce.Key == tc.key && strings.Contains(ce.Msg, tc.msg) {
				found = true
			}
		}
		if !found {
			t.Errorf("%q: %v, want a %s error containing %q", tc.doc, err, tc.key, tc.msg)
		}
	}
	// srtp = "off" with sdes_tls_only toward a plain destination is fine:
	// relayd terminates the keys.
	if _, err := Parse([]byte(minimal + sip + route + "destinations = [\"sip:198.18.2.2\"]\nsdes_tls_only = true\n")); err != nil {
		t.Errorf("srtp off, plain destination: %v", err)
	}
}
