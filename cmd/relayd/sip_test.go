package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
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

// stateFile writes a state file stamped with a schema and compat, as a
// relayd of that schema would leave it.
func stateFile(t *testing.T, schema, compat uint32) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		meta, _ := tx.CreateBucket([]byte("meta"))
		tx.CreateBucket([]byte("records"))
		meta.Put([]byte("schema"), binary.BigEndian.AppendUint32(nil, schema))
		meta.Put([]byte("compat"), binary.BigEndian.AppendUint32(nil, compat))
		return meta.Put([]byte("written_by"), []byte("9.9.9"))
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// TestStateFileOfANewerRelayd: relayd starts against a file a newer relayd
// wrote when that one says it may (compat), and refuses one it cannot
// read, saying why.
func TestStateFileOfANewerRelayd(t *testing.T) {
	for _, tc := range []struct {
		name           string
		schema, compat uint32
		ok             bool
	}{
		{"compatible", 2, 1, true},
		{"incompatible", 2, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "admin.sock")
			p := writeFile(t, fmt.Sprintf(`[log]
level = "info"
[admin]
listen = "unix:%s"
[dataplane]
mode = "userspace"
[media]
address = "198.18.1.1"
[sip]
listen = ["udp:127.0.0.1:%d"]
[[route]]
name = "r"
match = "."
destinations = ["sip:127.0.0.1:5999"]
[state]
path = %q
`, sock, 20000+os.Getpid()%20000, stateFile(t, tc.schema, tc.compat)))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan int, 1)
			var out, errb bytes.Buffer // the logger writes to run's stderr
			go func() { done <- run(ctx, []string{"-config", p}, &out, &errb) }()
			var code int
			if tc.ok {
				waitFor(t, func() bool { _, err := os.Stat(sock); return err == nil })
				cancel()
				code = <-done
			} else {
				code = <-done
				cancel()
			}
			log := errb.String()
			switch {
			case tc.ok && code != 0:
				t.Errorf("exit %d with a compatible newer file\n%s", code, log)
			case !tc.ok && (code != 1 || !strings.Contains(log, "state file schema not supported") || !strings.Contains(log, "9.9.9")):
				t.Errorf("exit %d with an incompatible file, log:\n%s", code, log)
			}
		})
	}
}
