package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/relayd/relayd/config"
)

func TestChangedKeys(t *testing.T) {
	base := "[dataplane]\nmode = \"userspace\"\n[media]\naddress = \"198.18.1.1\"\n"
	parse := func(extra string) *config.Config {
		t.Helper()
		c, err := config.Parse([]byte(base + extra))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	route := "[[route]]\nname = \"a\"\nmatch = \"^1\"\ndestinations = [\"sip:198.18.2.2\"]\n"
	a := parse("[log]\nlevel = \"info\"\n" + route)
	for _, tc := range []struct {
		extra string
		want  []string
	}{
		{"[log]\nlevel = \"info\"\n" + route, nil},
		{"[log]\nlevel = \"debug\"\n" + route, []string{"log.level"}},
		{"[log]\nlevel = \"info\"\n", []string{"route"}},
		{"[log]\nlevel = \"info\"\n[route_server]\nurl = \"http://127.0.0.1:8090/route\"\n" + route, []string{"route_server.url"}},
		{"[log]\nlevel = \"info\"\nformat = \"console\"\n[sip]\nlisten = [\"udp:198.18.1.1:5060\"]\n" + route, []string{"log.format", "sip.listen"}},
	} {
		got := changedKeys(a, parse(tc.extra))
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%q (-want +got):\n%s", tc.extra, d)
		}
	}
	// A different media address changes media.address, not its parsed copy.
	b := parse("[log]\nlevel = \"info\"\n" + route)
	b.Media.Address = "198.18.1.2"
	if got := changedKeys(a, b); !cmp.Equal(got, []string{"media.address"}) {
		t.Errorf("media address: %v", got)
	}
}
