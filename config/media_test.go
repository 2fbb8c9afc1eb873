package config

import (
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// errorsOf returns the *Error values of a (possibly joined) Parse error.
func errorsOf(t *testing.T, err error) []*Error {
	t.Helper()
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	out := make([]*Error, 0, len(errs))
	for _, e := range errs {
		var ce *Error
		if !errors.As(e, &ce) {
			t.Fatalf("error %v (%T) is not a *config.Error", e, e)
		}
		out = append(out, ce)
	}
	return out
}

// The base of the interface tests: lines 1-4.
const ifaceBase = `[dataplane]
interfaces = ["eth0"]
[media]
address = "198.18.1.1"
`

// A route that is valid but for its interfaces: [[route]] on line 1.
const ifaceRoute = `[[route]]
name = "r"
match = "."
destinations = ["sip:198.18.2.2"]
`

func TestParseMediaInterfaceErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		key  string
		line int
		msg  string // substring of the message
	}{
		{"empty name", ifaceBase + "[[media.interface]]\nname = \"\"\naddress = \"198.18.2.1\"\n",
			"media.interface[0].name", 6, "required"},
		{"no name", ifaceBase + "[[media.interface]]\naddress = \"198.18.2.1\"\n",
			"media.interface[0].name", 0, "required"},
		{"duplicate name", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress = \"198.18.2.1\"\n" +
			"[[media.interface]]\nname = \"ext\"\naddress = \"198.18.3.1\"\n",
			"media.interface[1].name", 9, `"ext" defined twice`},
		{"named default beside [media]", ifaceBase + "[[media.interface]]\nname = \"default\"\naddress = \"198.18.2.1\"\n",
			"media.interface[0].name", 6, `"default" names the [media] address's interface`},
		{"no address", ifaceBase + "[[media.interface]]\nname = \"ext\"\nports = \"40000-40999\"\n",
			"media.interface[0].address", 0, "need address or address6"},
		{"address of [media]", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress = \"198.18.1.1\"\n",
			"media.interface[0].address", 7, "already the address of media"},
		{"address6 of [media]", ifaceBase + "address6 = \"2001:2::1\"\n[[media.interface]]\nname = \"ext\"\naddress6 = \"2001:2::1\"\n",
			"media.interface[0].address6", 8, "already the address of media"},
		{"address of another interface", ifaceBase + "[[media.interface]]\nname = \"int\"\naddress = \"198.18.2.1\"\n" +
			"[[media.interface]]\nname = \"ext\"\naddress = \"198.18.2.1\"\n",
			"media.interface[1].address", 10, `already the address of media interface "int"`},
		{"address6 of another interface", ifaceBase + "[[media.interface]]\nname = \"int\"\naddress6 = \"2001:2::2\"\n" +
			"[[media.interface]]\nname = \"ext\"\naddress6 = \"2001:2::2\"\n",
			"media.interface[1].address6", 10, `already the address of media interface "int"`},
		{"bad address", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress = \"198.18.2\"\n",
			"media.interface[0].address", 7, "not an IP address"},
		{"v4 in address6", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress6 = \"198.18.2.1\"\n",
			"media.interface[0].address6", 7, "not an IPv6"},
		{"v6 in advertise", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress = \"198.18.2.1\"\nadvertise = \"2001:2::9\"\n",
			"media.interface[0].advertise", 8, "not an IPv4"},
		{"advertise without address", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress6 = \"2001:2::2\"\nadvertise = \"198.19.0.1\"\n",
			"media.interface[0].advertise", 8, "advertise needs address"},
		{"advertise6 without address6", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress = \"198.18.2.1\"\nadvertise6 = \"2001:2:0:9::1\"\n",
			"media.interface[0].advertise6", 8, "advertise6 needs address6"},
		{"[media] advertise without address", "[dataplane]\ninterfaces = [\"eth0\"]\n[media]\naddress6 = \"2001:2::1\"\nadvertise = \"198.19.0.1\"\n",
			"media.advertise", 5, "advertise needs address"},
		{"[media] advertise, no [media] address", "[dataplane]\ninterfaces = [\"eth0\"]\n[media]\nadvertise = \"198.19.0.1\"\n" +
			"[[media.interface]]\nname = \"ext\"\naddress = \"198.18.2.1\"\n",
			"media.advertise", 4, "advertise needs address"},
		{"ports format", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress = \"198.18.2.1\"\nports = \"40000\"\n",
			"media.interface[0].ports", 8, "not a range"},
		{"ports odd start", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress = \"198.18.2.1\"\nports = \"40001-40999\"\n",
			"media.interface[0].ports", 8, "must be even"},
		{"ports low", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress = \"198.18.2.1\"\nports = \"1000-1999\"\n",
			"media.interface[0].ports", 8, "below 1024"},
		{"route caller_interface", ifaceBase + ifaceRoute + "caller_interface = \"nosuch\"\n",
			"route[0].caller_interface", 9, `no media interface "nosuch"`},
		{"route callee_interface", ifaceBase + "[[media.interface]]\nname = \"ext\"\naddress = \"198.18.2.1\"\n" +
			ifaceRoute + "caller_interface = \"ext\"\ncallee_interface = \"int\"\n",
			"route[0].callee_interface", 13, `no media interface "int"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", c.Media)
			}
			errs := errorsOf(t, err)
			if len(errs) != 1 {
				t.Fatalf("%d errors, want 1:\n%v", len(errs), err)
			}
			ce := errs[0]
			if ce.Key != tt.key || ce.Line != tt.line || !strings.Contains(ce.Msg, tt.msg) {
				t.Errorf("got key %q line %d msg %q; want key %q line %d msg containing %q",
					ce.Key, ce.Line, ce.Msg, tt.key, tt.line, tt.msg)
			}
		})
	}
}

// TestParseMediaInterfaces: the default interface ([media]) first, the
// named ones in file order, ports from [media] unless an interface sets
// its own, advertised addresses parsed, routes naming interfaces accepted.
func TestParseMediaInterfaces(t *testing.T) {
	doc := `[dataplane]
interfaces = ["eth0", "eth1"]
[media]
address = "198.18.1.1"
advertise = "198.19.1.1"
ports = "20000-20999"
[[media.interface]]
name = "internal"
address = "198.18.10.1"
address6 = "2001:2:0:10::1"
[[media.interface]]
name = "external"
address = "198.18.20.1"
advertise = "198.19.20.1"
address6 = "2001:2:0:20::1"
advertise6 = "2001:2:0:ff::1"
ports = "40000-49999"
[[route]]
name = "out"
match = "."
destinations = ["sip:198.18.2.2"]
caller_interface = "internal"
callee_interface = "external"
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	want := []MediaInterface{
		{Addr: a("198.18.1.1"), AdvertiseAddr: a("198.19.1.1"), PortMin: 20000, PortMax: 20999},
		{Name: "internal", Address: "198.18.10.1", Address6: "2001:2:0:10::1",
			Addr: a("198.18.10.1"), Addr6: a("2001:2:0:10::1"), PortMin: 20000, PortMax: 20999},
		{Name: "external", Address: "198.18.20.1", Address6: "2001:2:0:20::1", Advertise: "198.19.20.1",
			Advertise6: "2001:2:0:ff::1", Ports: "40000-49999",
			Addr: a("198.18.20.1"), Addr6: a("2001:2:0:20::1"), AdvertiseAddr: a("198.19.20.1"),
			AdvertiseAddr6: a("2001:2:0:ff::1"), PortMin: 40000, PortMax: 49999},
	}
	if diff := cmp.Diff(c.MediaInterfaces(), want, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("MediaInterfaces (-got +want):\n%s", diff)
	}
	if r := c.Routes[0]; r.CallerInterface != "internal" || r.CalleeInterface != "external" {
		t.Errorf("route interfaces %q %q", r.CallerInterface, r.CalleeInterface)
	}
	for name, has := range map[string]bool{"": true, "internal": true, "external": true, "other": false} {
		if got := c.HasInterface(name); got != has {
			t.Errorf("HasInterface(%q) = %v, want %v", name, got, has)
		}
	}
}

// TestParseMediaInterfacesNoDefault: without a [media] address the named
// interfaces are all there is, the first one the default, and their ports
// default to the [media] default range.
func TestParseMediaInterfacesNoDefault(t *testing.T) {
	doc := `[dataplane]
mode = "userspace"
[[media.interface]]
name = "internal"
address6 = "2001:2:0:10::1"
[[media.interface]]
name = "external"
address = "198.18.20.1"
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	got := c.MediaInterfaces()
	var names []string
	for _, in := range got {
		names = append(names, in.Name)
		if in.PortMin != 30000 || in.PortMax != 39999 {
			t.Errorf("interface %q ports %d-%d, want the default 30000-39999", in.Name, in.PortMin, in.PortMax)
		}
	}
	if diff := cmp.Diff(names, []string{"internal", "external"}); diff != "" {
		t.Errorf("interface order (-got +want):\n%s", diff)
	}
	if got[0].Addr.IsValid() || got[0].Addr6 != netip.MustParseAddr("2001:2:0:10::1") {
		t.Errorf("default interface %+v", got[0])
	}
	if c.Media.Addr.IsValid() || c.Media.Addr6.IsValid() {
		t.Errorf("[media] addresses %v %v, want none", c.Media.Addr, c.Media.Addr6)
	}
}

// TestManPageExamples: every example of relayd.toml(5) is a valid file.
func TestManPageExamples(t *testing.T) {
	data, err := os.ReadFile("../docs/man/relayd.toml.5")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "\n.SH EXAMPLE\n")
	if !ok {
		t.Fatal("no EXAMPLE section")
	}
	rest, _, _ = strings.Cut(rest, "\n.SH ")
	rest += "\n"
	n := 0
	for {
		_, after, ok := strings.Cut(rest, ".nf\n")
		if !ok {
			break
		}
		var block string
		block, rest, _ = strings.Cut(after, ".fi\n")
		n++
		doc := strings.ReplaceAll(block, `\-`, "-")
		if _, err := Parse([]byte(doc)); err != nil {
			t.Errorf("example %d:\n%s\n%v", n, doc, err)
		}
	}
	if n < 2 {
		t.Errorf("%d examples, want the basic one and the media interfaces one", n)
	}
}

func TestParseDenyDestinations(t *testing.T) {
	c, err := Parse([]byte(ifaceBase + `deny_destinations = ["198.18.200.0/24", "198.18.201.7", "2001:2:ff::/48", "198.18.202.9/24", "::ffff:198.18.203.0/120"]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{
		netip.MustParsePrefix("198.18.200.0/24"), netip.MustParsePrefix("198.18.201.7/32"),
		netip.MustParsePrefix("2001:2:ff::/48"), netip.MustParsePrefix("198.18.202.0/24"), // masked
		netip.MustParsePrefix("198.18.203.0/24"), // unmapped
	}
	if diff := cmp.Diff(want, c.Media.DenyPrefixes, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("DenyPrefixes (-want +got):\n%s", diff)
	}
	for _, tc := range []struct{ value, msg string }{
		{`"198.18.300.0/24"`, "neither an address nor a network"},
		{`"example.com"`, "neither an address nor a network"},
		{`"fe80::1%eth0"`, "zoned"},
		{`"0.0.0.0/0"`, "every IPv4 destination"},
		{`"::/0"`, "every IPv6 destination"},
		{`"::ffff:0:0/80"`, "IPv4-mapped"},
	} {
		_, err := Parse([]byte(ifaceBase + "deny_destinations = [" + tc.value + "]\n"))
		errs := errorsOf(t, err)
		if len(errs) != 1 || errs[0].Key != "media.deny_destinations" || errs[0].Line != 5 || !strings.Contains(errs[0].Msg, tc.msg) {
			t.Errorf("deny_destinations = [%s]: errors %v, want one on line 5 with %q", tc.value, err, tc.msg)
		}
	}
}

func TestOwnAddrs(t *testing.T) {
	c, err := Parse([]byte(`[dataplane]
mode = "userspace"
[media]
address = "198.18.1.1"
advertise = "198.19.1.1"
address6 = "2001:2:0:1::1"
[[media.interface]]
name = "int"
address = "198.18.10.1"
[sip]
listen = ["udp:198.18.8.1:5060", "tcp:0.0.0.0:5060"]
[ng]
listen = ["udp:127.0.0.1:2223"]
[[route]]
name = "r"
match = "."
destinations = ["sip:198.18.2.2"]
`))
	if err != nil {
		t.Fatal(err)
	}
	got := c.OwnAddrs()
	for _, s := range []string{"198.18.1.1", "198.19.1.1", "2001:2:0:1::1", "198.18.10.1", "198.18.8.1", "127.0.0.1"} {
		if !slices.Contains(got, netip.MustParseAddr(s)) {
			t.Errorf("OwnAddrs() = %v, lacks %s", got, s)
		}
	}
	if slices.ContainsFunc(got, netip.Addr.IsUnspecified) {
		t.Errorf("OwnAddrs() = %v: a wildcard listener is not an address", got)
	}
}

func TestParseRateLimits(t *testing.T) {
	c, err := Parse([]byte(ifaceBase))
	if err != nil {
		t.Fatal(err)
	}
	if m := c.Media; m.RateLimitFactor != 4 || m.RateLimitDefaultPPS != 2000 || m.RateLimitRTCPPPS != 100 {
		t.Errorf("defaults: factor %d default %d rtcp %d", m.RateLimitFactor, m.RateLimitDefaultPPS, m.RateLimitRTCPPPS)
	}
	c, err = Parse([]byte(ifaceBase + "rate_limit_factor = 0\n"))
	if err != nil || c.Media.RateLimitFactor != 0 {
		t.Errorf("factor 0 (off): %v, %d", err, c.Media.RateLimitFactor)
	}
	for _, tc := range []struct{ line, key string }{
		{"rate_limit_factor = 1", "media.rate_limit_factor"},
		{"rate_limit_factor = 101", "media.rate_limit_factor"},
		{"rate_limit_factor = -4", "media.rate_limit_factor"},
		{"rate_limit_default_pps = 49", "media.rate_limit_default_pps"},
		{"rate_limit_default_pps = 1000001", "media.rate_limit_default_pps"},
		{"rate_limit_rtcp_pps = 0", "media.rate_limit_rtcp_pps"},
	} {
		_, err := Parse([]byte(ifaceBase + tc.line + "\n"))
		if err == nil {
			t.Errorf("%s: accepted", tc.line)
			continue
		}
		if !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), "line 5") {
			t.Errorf("%s: %v, want %s on line 5", tc.line, err, tc.key)
		}
	}
}
