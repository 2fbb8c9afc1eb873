package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/internal/testenv"
)

// TestJournald runs a real systemd-journald in a private mount namespace
// (its own /run, so the host's journal is not touched) and relayd with
// stderr on a journal stream, connected and announced in JOURNAL_STREAM as
// systemd does for a service: relayd's error line is stored at priority 3
// and found by journalctl -p err, its info lines at 6 are not.
func TestJournald(t *testing.T) {
	testenv.NeedRoot(t)
	journald := "/lib/systemd/systemd-journald"
	if _, err := os.Stat(journald); err != nil {
		testenv.Skip(t, "%s: %v (Debian package systemd)", journald, err)
	}
	journalctl := testenv.NeedCommand(t, "journalctl", "systemd")
	cfg := strings.Replace(mustRead(t, sipConfig(t, filepath.Join(t.TempDir(), "admin.sock"), 5060, "")),
		"udp:127.0.0.1:5060", "udp:198.18.99.1:5060", 1)
	config := writeFile(t, cfg)
	type result struct {
		all, errs string
		err       error
	}
	done := make(chan result, 1)
	go func() {
		// This thread gets a mount namespace of its own and is never
		// handed back: it ends with the goroutine. Everything below runs
		// on it, so the processes it starts share its /run.
		runtime.LockOSThread()
		var r result
		r.all, r.errs, r.err = journalRun(journald, journalctl, config)
		done <- r
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("journald test timed out")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	prio := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(r.all))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct{ MESSAGE, PRIORITY string }
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		var m struct{ Msg string }
		if json.Unmarshal([]byte(e.MESSAGE), &m) == nil && m.Msg != "" {
			prio[m.Msg] = e.PRIORITY
		}
	}
	if prio["relayd starting"] != "6" || prio["relayd stopped"] != "3" {
		t.Errorf("priorities %v: want relayd starting at 6, relayd stopped at 3\n%s", prio, r.all)
	}
	if !strings.Contains(r.errs, "relayd stopped") || !strings.Contains(r.errs, "198.18.99.1:5060") || strings.Contains(r.errs, "relayd starting") {
		t.Errorf("journalctl -p err:\n%s", r.errs)
	}
}

// journalRun is TestJournald's part in the private mount namespace: start
// journald, run relayd on a journal stream, read the journal back (all of
// relayd's entries as JSON, and those at priority err or higher).
func journalRun(journald, journalctl, config string) (all, errs string, err error) {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return "", "", fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return "", "", err
	}
	if err := unix.Mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"); err != nil {
		return "", "", err
	}
	if err := os.MkdirAll("/run/systemd/journal", 0o755); err != nil {
		return "", "", err
	}
	jd := exec.Command(journald)
	if err := jd.Start(); err != nil {
		return "", "", err
	}
	defer func() { jd.Process.Kill(); jd.Wait() }()
	const stream = "/run/systemd/journal/stdout"
	var conn net.Conn
	for i := 0; ; i++ {
		if conn, err = net.Dial("unix", stream); err == nil {
			break
		}
		if i == 100 {
			return "", "", fmt.Errorf("journald stream socket: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The stream protocol's header: identifier, unit, default priority,
	// level prefix on, no forwarding to syslog, kmsg or console.
	if _, err := conn.Write([]byte("relayd\n\n6\n1\n0\n0\n0\n")); err != nil {
		return "", "", err
	}
	f, err := conn.(*net.UnixConn).File()
	conn.Close()
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return "", "", err
	}
	relayd := exec.Command(os.Args[0])
	relayd.Env = append(os.Environ(), "RELAYD_TEST_MAIN=1", "RELAYD_TEST_ARGS=-config "+config,
		fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
	relayd.Stdout, relayd.Stderr = f, f
	if err := relayd.Run(); err == nil {
		return "", "", fmt.Errorf("relayd with an unbindable SIP address exited 0")
	}
	f.Close()
	var out, eout []byte
	for i := 0; i < 50; i++ { // journald stores the stream asynchronously
		out, err = exec.Command(journalctl, "-D", "/run/log/journal", "-t", "relayd", "-o", "json", "--no-pager").Output()
		if err == nil && strings.Contains(string(out), "relayd stopped") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	eout, err = exec.Command(journalctl, "-D", "/run/log/journal", "-t", "relayd", "-p", "err", "-o", "cat", "--no-pager").Output()
	if err != nil {
		return string(out), "", fmt.Errorf("journalctl -p err: %w", err)
	}
	return string(out), string(eout), nil
}
