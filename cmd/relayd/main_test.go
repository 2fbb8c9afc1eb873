package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "relayd.toml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckExample: the packaged config attaches to nothing, and both
// -check and -prepare (the unit's first step) refuse it, naming the file
// and each key to edit.
func TestCheckExample(t *testing.T) {
	const path = "../../systemd/relayd.toml"
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The lines of the two keys to edit: the first "interfaces = " and
	// the first "address = " after [media].
	lineOf := func(after, key string) int {
		seen := after == ""
		for i, l := range strings.Split(string(text), "\n") {
			switch {
			case l == after:
				seen = true
			case seen && strings.HasPrefix(l, key+" = "):
				return i + 1
			}
		}
		t.Fatalf("%s: no %q after %q", path, key, after)
		return 0
	}
	for _, flag := range []string{"-check", "-prepare"} {
		code, out, errs := runMain(t, flag, "-config", path)
		if code != 1 || out != "" {
			t.Errorf("%s: exit %d, stdout %q, want 1 and nothing", flag, code, out)
		}
		for _, want := range []string{fmt.Sprintf("%s: line %d: dataplane.interfaces: ", path, lineOf("[dataplane]", "interfaces")),
			fmt.Sprintf("%s: line %d: media.address: ", path, lineOf("[media]", "address"))} {
			if !strings.Contains(errs, want) {
				t.Errorf("%s: stderr %q lacks %q", flag, errs, want)
			}
		}
	}
}

func TestCheckErrors(t *testing.T) {
	p := writeFile(t, "[dataplane]\ninterfaces = [\"eth0\"]\n[media]\naddress = \"198.18.1.1\"\nport = \"30000-39999\"\n")
	code, out, errs := runMain(t, "-check", "-config", p)
	if code == 0 || out != "" {
		t.Errorf("exit %d, stdout %q", code, out)
	}
	if want := p + ": line 5: media.port: unknown key"; !strings.Contains(errs, want) {
		t.Errorf("stderr %q lacks %q", errs, want)
	}
	code, _, errs = runMain(t, "-check", "-config", filepath.Join(t.TempDir(), "none.toml"))
	if code == 0 || !strings.Contains(errs, "no such file") {
		t.Errorf("missing file: exit %d, stderr %q", code, errs)
	}
}

// TestCheckWarnsOpenRoute: a route without allow takes calls from any
// source; -check still accepts the config but says so, naming the file,
// the line and the route.
func TestCheckWarnsOpenRoute(t *testing.T) {
	base := "[dataplane]\nmode = \"userspace\"\n[media]\naddress = \"198.18.1.1\"\n[sip]\nlisten = [\"udp:198.18.1.1:5060\"]\n" +
		"[[route]]\nname = \"carrier\"\nmatch = \".\"\ndestinations = [\"sip:198.18.2.2\"]\n"
	p := writeFile(t, base)
	code, out, errs := runMain(t, "-check", "-config", p)
	if code != 0 || out != "config OK\n" {
		t.Errorf("exit %d, stdout %q, want 0 and config OK", code, out)
	}
	if want := "relayd: warning: " + p + `: line 7: route[0]: route "carrier" takes calls from any source`; !strings.Contains(errs, want) {
		t.Errorf("stderr %q lacks %q", errs, want)
	}
	p = writeFile(t, base+"allow = [\"198.18.0.0/24\"]\n")
	if code, out, errs := runMain(t, "-check", "-config", p); code != 0 || out != "config OK\n" || errs != "" {
		t.Errorf("route with allow: exit %d, stdout %q, stderr %q; want 0, config OK and no warning", code, out, errs)
	}
}

// TestCheckAuthFile: -check refuses an auth_file its group or others may
// read, naming the file, and accepts it once it is private.
func TestCheckAuthFile(t *testing.T) {
	users := filepath.Join(t.TempDir(), "sip-users")
	if err := os.WriteFile(users, []byte("pbx1:pw-9f3k\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(users, 0o644)
	p := writeFile(t, "[dataplane]\nmode = \"userspace\"\n[media]\naddress = \"198.18.1.1\"\n[sip]\nlisten = [\"udp:198.18.1.1:5060\"]\n"+
		"auth_file = \""+users+"\"\n[[route]]\nname = \"carrier\"\nmatch = \".\"\ndestinations = [\"sip:198.18.2.2\"]\nauth_users = [\"pbx1\"]\n")
	code, out, errs := runMain(t, "-check", "-config", p)
	if want := "sip.auth_file: " + users + " has mode 0644: others may read or change it"; code != 1 || out != "" || !strings.Contains(errs, want) {
		t.Errorf("world-readable auth_file: exit %d, stdout %q, stderr %q; want 1 and %q", code, out, errs, want)
	}
	if strings.Contains(errs, "pw-9f3k") {
		t.Errorf("-check printed a password: %q", errs)
	}
	if err := os.Chmod(users, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runMain(t, "-check", "-config", p); code != 0 || out != "config OK\n" || errs != "" {
		t.Errorf("private auth_file: exit %d, stdout %q, stderr %q; want 0, config OK, no warning", code, out, errs)
	}
}

func TestFlags(t *testing.T) {
	if code, out, _ := runMain(t, "-version"); code != 0 || !strings.HasPrefix(out, "relayd ") {
		t.Errorf("-version: exit %d, %q", code, out)
	}
	if code, _, _ := runMain(t, "-bogus"); code != 2 {
		t.Errorf("-bogus: exit %d, want 2", code)
	}
	if code, _, _ := runMain(t, "extra"); code != 2 {
		t.Errorf("extra argument: exit %d, want 2", code)
	}
}

// TestUserspaceModeServes runs the daemon in mode userspace (no data plane
// needed) on a unix socket and stops it.
func TestUserspaceModeServes(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	p := writeFile(t, "[log]\nlevel = \"warn\"\n[admin]\nlisten = \"unix:"+sock+"\"\n[dataplane]\nmode = \"userspace\"\n[media]\naddress = \"198.18.1.1\"\n")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		var out, errb bytes.Buffer
		done <- run(ctx, []string{"-config", p}, &out, &errb)
	}()
	waitFor(t, func() bool { _, err := os.Stat(sock); return err == nil })
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d after cancel, want 0", code)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for range 500 {
		if ok() {
			return
		}
		sleep()
	}
	t.Fatal("timed out")
}

// TestUnitVerifies runs systemd-analyze verify on systemd/relayd.service
// with the binary paths pointed at a file that exists.
func TestUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	unit, err := os.ReadFile("../../systemd/relayd.service")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(unit), "/usr/bin/relayd", bin)
	if text == string(unit) {
		t.Fatal("unit does not run /usr/bin/relayd")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "relayd.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// verify runs man for each Documentation= page: point MANPATH at the
	// pages the package installs.
	for _, page := range []string{"relayd.8", "relayd.toml.5", "relayctl.1"} {
		b, err := os.ReadFile(filepath.Join("../../docs/man", page))
		if err != nil {
			t.Fatal(err)
		}
		sec := filepath.Join(dir, "man", "man"+page[len(page)-1:])
		if err := os.MkdirAll(sec, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sec, page), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(analyze, "verify", path)
	cmd.Env = append(os.Environ(), "MANPATH="+filepath.Join(dir, "man"))
	out, err := cmd.CombinedOutput()
	// verify exits 0 with warnings about other units on the system;
	// anything naming our unit is a problem.
	if err != nil || strings.Contains(string(out), "relayd.service") {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func sleep() { time.Sleep(10 * time.Millisecond) }

// TestCheckDenyDestinations: relayd -check names the line of a
// deny_destinations entry that is no address or network, and accepts
// good ones.
func TestCheckDenyDestinations(t *testing.T) {
	base := "[dataplane]\ninterfaces = [\"eth0\"]\n[media]\naddress = \"198.18.1.1\"\n"
	p := writeFile(t, base+"deny_destinations = [\"198.18.200.0/24\", \"2001:2:ff::1\"]\n")
	if code, out, errs := runMain(t, "-check", "-config", p); code != 0 || strings.TrimSpace(out) != "config OK" {
		t.Errorf("good deny_destinations: exit %d, %q %q", code, out, errs)
	}
	p = writeFile(t, base+"deny_destinations = [\"198.18.200.0/33\"]\n")
	code, _, errs := runMain(t, "-check", "-config", p)
	if want := p + ": line 5: media.deny_destinations: "; code == 0 || !strings.Contains(errs, want) {
		t.Errorf("bad deny_destinations: exit %d, stderr %q lacks %q", code, errs, want)
	}
}
