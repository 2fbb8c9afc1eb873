package hostprep

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
)

// fakeProcSys makes a /proc/sys with forwarding off for each interface;
// v6 lists those that also have IPv6.
func fakeProcSys(t *testing.T, ifaces []string, v6 map[string]bool) string {
	t.Helper()
	root := t.TempDir()
	for _, name := range ifaces {
		fams := []string{"ipv4"}
		if v6[name] {
			fams = append(fams, "ipv6")
		}
		for _, fam := range fams {
			dir := filepath.Join(root, "net", fam, "conf", name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "forwarding"), []byte("0\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Global switches, which Prepare must leave alone.
	for _, fam := range []string{"ipv4", "ipv6"} {
		dir := filepath.Join(root, "net", fam, "conf", "all")
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "forwarding"), []byte("0\n"), 0o644)
	}
	return root
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestForwardingPerInterface: forwarding goes on for the configured
// interfaces only, IPv6 where the interface has it, never "all"; nft gets
// the ruleset on its standard input (here a script that saves it).
func TestForwardingPerInterface(t *testing.T) {
	proc := fakeProcSys(t, []string{"eth1", "eth2", "eth3"}, map[string]bool{"eth1": true})
	saved := filepath.Join(t.TempDir(), "ruleset")
	nft := filepath.Join(t.TempDir(), "nft")
	if err := os.WriteFile(nft, []byte("#!/bin/sh\ntest \"$1 $2\" = \"-f -\" && cat > "+saved+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := Prepare(Config{Interfaces: []string{"eth1", "eth2"}, Nft: nft, procSys: proc}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"net/ipv4/conf/eth1/forwarding": "1",
		"net/ipv6/conf/eth1/forwarding": "1",
		"net/ipv4/conf/eth2/forwarding": "1",
		"net/ipv4/conf/eth3/forwarding": "0",
		"net/ipv4/conf/all/forwarding":  "0",
		"net/ipv6/conf/all/forwarding":  "0",
	} {
		if got := read(t, filepath.Join(proc, path)); got != want {
			t.Errorf("%s = %s, want %s", path, got, want)
		}
	}
	if got, want := read(t, saved), strings.TrimSpace(Ruleset([]string{"eth1", "eth2"})); got != want {
		t.Errorf("nft got\n%s\nwant\n%s", got, want)
	}
}

func TestPrepareErrors(t *testing.T) {
	log := zaptest.NewLogger(t)
	proc := fakeProcSys(t, []string{"eth1"}, nil)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"missing interface", Config{Interfaces: []string{"eth9"}, Nft: "true"}, "interface eth9: no such interface (dataplane.interfaces)"},
		{"quote in name", Config{Interfaces: []string{`a"b`}, Nft: "true"}, "quotes and backslashes"},
		{"nft fails", Config{Interfaces: []string{"eth1"}, Nft: "false"}, "load forward-drop rule with false: exit status 1"},
		{"no nft", Config{Interfaces: []string{"eth1"}, Nft: "/nonexistent/nft"}, "load forward-drop rule"},
		{"pin path off bpffs", Config{PinPath: t.TempDir(), Nft: "true"}, "(dataplane.pin_path) is not on a bpf filesystem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.procSys = proc
			err := Prepare(tc.cfg, log)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Prepare = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestRulesetWithoutInterfaces(t *testing.T) {
	// Only the delete: a config without XDP interfaces leaves no rule.
	if got, want := Ruleset(nil), "table inet relayd\ndelete table inet relayd\n"; got != want {
		t.Errorf("Ruleset(nil) = %q, want %q", got, want)
	}
}
