package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

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

// TestReloadCredentials: a reload reads the auth_file again and hands a
// changed one to the B2BUA, also when nothing in the config changed.
func TestReloadCredentials(t *testing.T) {
	dir := t.TempDir()
	users := filepath.Join(dir, "sip-users")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(users, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("pbx1:one\n")
	path := filepath.Join(dir, "relayd.toml")
	doc := "[dataplane]\nmode = \"userspace\"\n[media]\naddress = \"198.18.1.1\"\n[sip]\nauth_file = \"" + users + "\"\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cur, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []*config.Credentials
	r := &reloader{path: path, log: zaptest.NewLogger(t), cur: cur, setCredentials: func(c *config.Credentials) { got = append(got, c) }}
	if err := r.reload(); err != nil || len(got) != 0 {
		t.Fatalf("reload of the same file: %v, %d credential updates", err, len(got))
	}
	write("pbx1:two\npbx2:three\n")
	if err := r.reload(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Len() != 2 {
		t.Fatalf("credential updates %v, want one with 2 users", got)
	}
	if pw, _ := got[0].Password("pbx1"); pw != "two" {
		t.Errorf("pbx1's new password %q", pw)
	}
	write("pbx1 two\n")
	if err := r.reload(); err == nil || len(got) != 1 {
		t.Errorf("reload of a malformed auth_file: %v, %d updates; want an error and the users kept", err, len(got))
	}
}
