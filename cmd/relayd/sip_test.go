package main

import (
	"strings"
	"testing"
)

func TestCheckSIP(t *testing.T) {
	p := writeFile(t, `[dataplane]
interfaces = ["eth0"]
[media]
address = "198.18.1.1"
[sip]
listen = ["udp:198.18.1.1:5060", "tcp:198.18.1.1:5060"]
[[route]]
name = "carrier"
match = "^\\+?1"
destinations = ["sip:198.18.2.2:5060", "sip:198.18.3.2:5060;transport=tcp"]
order = "ordered"
attempt_timeout = "2s"
failover_on = [404, 408, 480, 500, 502, 503, 603]
srtp = "off"
codecs = ["PCMU", "PCMA", "telephone-event"]
[route_server]
url = "http://127.0.0.1:8090/route"
[cdr]
path = "/var/log/relayd/cdr.jsonl"
post_url = ""
`)
	if code, out, errs := runMain(t, "-check", "-config", p); code != 0 || strings.TrimSpace(out) != "config OK" {
		t.Errorf("the issue's example: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	p = writeFile(t, "[dataplane]\ninterfaces = [\"eth0\"]\n[media]\naddress = \"198.18.1.1\"\n[[route]]\nname = \"a\"\nmatch = \"(\"\ndestinations = [\"sip:h\"]\n")
	if code, _, errs := runMain(t, "-check", "-config", p); code == 0 || !strings.Contains(errs, "line 7: route[0].match") {
		t.Errorf("bad route: exit %d, stderr %q", code, errs)
	}
}
