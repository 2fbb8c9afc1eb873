package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/watchdog"
)

// syncBuffer is a bytes.Buffer safe for the daemon's logger and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// notifySocket is a systemd notification socket: NOTIFY_SOCKET points at
// it for the test, and each datagram relayd sends is delivered on msgs.
func notifySocket(t *testing.T) <-chan string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	msgs := make(chan string, 100)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			select {
			case msgs <- string(buf[:n]):
			default:
			}
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return msgs
}

func freeUDPPort(t *testing.T) int {
	t.Helper()
	for {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		pc.Close()
		if l, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			return port
		}
	}
}

// testDaemon is relayd run in this process.
type testDaemon struct {
	cancel context.CancelFunc
	done   chan int
	log    *syncBuffer
	sock   string
	config string
}

func startDaemon(t *testing.T, config string) *testDaemon {
	t.Helper()
	d := &testDaemon{done: make(chan int, 1), log: &syncBuffer{}, config: config}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	go func() {
		var out bytes.Buffer
		d.done <- run(ctx, []string{"-config", config}, &out, d.log)
	}()
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("relayd log:\n%s", d.log.String())
		}
	})
	return d
}

// stop cancels the daemon and returns its exit code.
func (d *testDaemon) stop() int {
	d.cancel()
	select {
	case code := <-d.done:
		d.done <- code
		return code
	case <-time.After(20 * time.Second):
		return -1
	}
}

func (d *testDaemon) get(t *testing.T, path string) []byte {
	t.Helper()
	c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.sock)
	}}, Timeout: 5 * time.Second}
	resp, err := c.Get("http://relayd" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

func sipConfig(t *testing.T, sock string, port int, extra string) string {
	return writeFile(t, fmt.Sprintf(`[log]
level = "info"
[admin]
listen = "unix:%s"
[dataplane]
mode = "userspace"
workers = 2
[media]
address = "198.18.1.1"
ports = "30000-30099"
[sip]
listen = ["udp:127.0.0.1:%d", "tcp:127.0.0.1:%d"]
[[route]]
name = "a"
match = "^1"
destinations = ["sip:198.18.2.2:5060"]
%s`, sock, port, port, extra))
}

func waitMsg(t *testing.T, msgs <-chan string, want string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case m := <-msgs:
			if strings.Contains(m, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no %q from relayd within %v", want, d)
		}
	}
}

// TestReadyWatchdogReload runs relayd with SIP listeners under a fake
// systemd (notification socket, WATCHDOG_USEC): READY=1 comes only once
// SIP answers on every listener, WATCHDOG=1 follows while the probes
// answer, /metrics passes promtool, and a SIGHUP applies log level and
// routes and names what needs a restart.
func TestReadyWatchdogReload(t *testing.T) {
	testenv.NeedRoot(t) // the userspace data plane's BPF and raw sockets
	msgs := notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "800000")
	t.Setenv("WATCHDOG_PID", fmt.Sprint(os.Getpid()))
	sock := filepath.Join(t.TempDir(), "admin.sock")
	port := freeUDPPort(t)
	d := startDaemon(t, sipConfig(t, sock, port, ""))
	d.sock = sock
	waitMsg(t, msgs, "READY=1", 20*time.Second)
	// Ready means bound and answering, on every listener.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, network := range []string{"udp", "tcp"} {
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if err := watchdog.SIPOptions(network, mustAddrPort(t, addr))(ctx); err != nil {
			t.Errorf("SIP %s right after READY=1: %v", network, err)
		}
	}
	// A watchdog of 800ms: checks every 200ms, each probe within 200ms.
	waitMsg(t, msgs, "WATCHDOG=1", 2*time.Second)
	waitMsg(t, msgs, "WATCHDOG=1", 2*time.Second)

	metrics := d.get(t, "/metrics")
	for _, want := range []string{`relayd_sip_calls_total{disposition="media_timeout"} 0`, `relayd_build_info{`, `relayd_media_ports{interface="default",state="free"} 100`, `relayd_flow_slots_max{path="userspace"}`} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	promtool := testenv.NeedCommand(t, "promtool", "prometheus")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(metrics)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

	// Reload: a level, a route and a restart-only key changed.
	if err := os.WriteFile(d.config, []byte(strings.Replace(strings.Replace(strings.Replace(
		mustRead(t, d.config), `level = "info"`, `level = "debug"`, 1),
		`match = "^1"`, `match = "^2"`, 1),
		`ports = "30000-30099"`, "ports = \"30000-30099\"\ntimeout = \"30s\"", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(d.log.String(), "need a restart") })
	log := d.log.String()
	if !strings.Contains(log, `"applied": ["route", "log.level"]`) && !strings.Contains(log, `"applied":["route","log.level"]`) &&
		!strings.Contains(log, `"applied":["log.level","route"]`) {
		t.Errorf("reload did not apply log.level and route:\n%s", log)
	}
	if !strings.Contains(log, `"keys":["media.timeout"]`) {
		t.Errorf("reload warning does not name media.timeout:\n%s", log)
	}
	waitFor(t, func() bool { return strings.Contains(d.log.String(), `"level":"debug"`) })
	// A config that does not load changes nothing; relayd stays healthy.
	os.WriteFile(d.config, []byte("[log]\nlevel = \"loud\"\n"), 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, func() bool { return strings.Contains(d.log.String(), "reload: config not applied") })
	waitMsg(t, msgs, "WATCHDOG=1", 2*time.Second) // still healthy
	if code := d.stop(); code != 0 {
		t.Errorf("exit %d after cancel", code)
	}
}

// TestBindFailureFailsStart: a SIP listener on an address the host does
// not have, or an admin address in use, fails the start: non-zero exit,
// the address in an error line, and no READY=1.
func TestBindFailureFailsStart(t *testing.T) {
	testenv.NeedRoot(t)
	msgs := notifySocket(t)
	sock := filepath.Join(t.TempDir(), "admin.sock")
	cfg := strings.Replace(mustRead(t, sipConfig(t, sock, 5060, "")), "udp:127.0.0.1:5060", "udp:198.18.99.1:5060", 1)
	d := startDaemon(t, writeFile(t, cfg))
	select {
	case code := <-d.done:
		d.done <- code
		if code == 0 {
			t.Errorf("exit 0 with an unbindable SIP listener")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("relayd still running with an unbindable SIP listener")
	}
	log := d.log.String()
	if !strings.Contains(log, `"level":"error"`) || !strings.Contains(log, "udp:198.18.99.1:5060") || !strings.Contains(log, "cannot assign requested address") {
		t.Errorf("no error naming the address:\n%s", log)
	}
	select {
	case m := <-msgs:
		t.Errorf("relayd notified %q", m)
	default:
	}

	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg = strings.Replace(mustRead(t, sipConfig(t, sock, freeUDPPort(t), "")), "unix:"+sock, taken.Addr().String(), 1)
	d = startDaemon(t, writeFile(t, cfg))
	if code := d.stop(); code == 0 {
		t.Errorf("exit 0 with the admin address in use")
	}
	if log := d.log.String(); !strings.Contains(log, taken.Addr().String()) {
		t.Errorf("no error naming the admin address:\n%s", log)
	}
	select {
	case m := <-msgs:
		t.Errorf("relayd notified %q", m)
	default:
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustAddrPort(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// TestWatchdogStopsWhenWedged runs relayd as a process under a fake
// systemd with a 1 s watchdog: it pets while running, sends nothing while
// stopped with SIGSTOP (systemd would restart it after WatchdogSec), and
// pets again once continued.
func TestWatchdogStopsWhenWedged(t *testing.T) {
	testenv.NeedRoot(t)
	msgs := notifySocket(t)
	sock := filepath.Join(t.TempDir(), "admin.sock")
	cmd := exec.Command(os.Args[0])
	// No WATCHDOG_PID: the child's pid is not known before it starts.
	cmd.Env = append(os.Environ(), "RELAYD_TEST_MAIN=1", "RELAYD_TEST_ARGS=-config "+sipConfig(t, sock, freeUDPPort(t), ""),
		"WATCHDOG_USEC=1000000")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("relayd log:\n%s", stderr.String())
		}
	})
	waitMsg(t, msgs, "READY=1", 20*time.Second)
	waitMsg(t, msgs, "WATCHDOG=1", 2*time.Second)
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a datagram sent just before the stop
	for len(msgs) > 0 {
		<-msgs
	}
	select {
	case m := <-msgs:
		t.Fatalf("stopped relayd notified %q", m)
	case <-time.After(1500 * time.Millisecond): // longer than WatchdogSec
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitMsg(t, msgs, "WATCHDOG=1", 2*time.Second)
}

// TestAdminToken: with admin.token_file set, relayd's API refuses
// requests without the token and takes them with it; rewriting the file
// and reloading (SIGHUP) rotates it; and -check refuses an admin address
// other hosts can reach when no token is configured.
func TestAdminToken(t *testing.T) {
	testenv.NeedRoot(t) // the userspace data plane's BPF and raw sockets
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin.token")
	if err := os.WriteFile(tokenFile, []byte("first-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "admin.sock")
	cfg := strings.Replace(mustRead(t, sipConfig(t, sock, freeUDPPort(t), "")), "[admin]\n", fmt.Sprintf("[admin]\ntoken_file = %q\n", tokenFile), 1)
	d := startDaemon(t, writeFile(t, cfg))
	d.sock = sock
	waitFor(t, func() bool { return strings.Contains(d.log.String(), "relayd ready") })
	status := func(token string) int {
		t.Helper()
		c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", sock)
		}}, Timeout: 5 * time.Second}
		req, _ := http.NewRequest("GET", "http://relayd/v1/flows", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(""); got != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", got)
	}
	if got := status("first-token-0123456789"); got != http.StatusOK {
		t.Errorf("the token: %d, want 200", got)
	}
	if err := os.WriteFile(tokenFile, []byte("second-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(d.log.String(), "admin API token read again") })
	if a, b := status("first-token-0123456789"), status("second-token-0123456789"); a != http.StatusUnauthorized || b != http.StatusOK {
		t.Errorf("after rotation: old token %d, new %d; want 401, 200", a, b)
	}
	// A token file others can read fails the reload and keeps the token.
	os.Chmod(tokenFile, 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, func() bool { return strings.Contains(d.log.String(), "reload: config not applied") })
	if got := status("second-token-0123456789"); got != http.StatusOK {
		t.Errorf("after a refused reload: %d, want the token kept (200)", got)
	}
	if code := d.stop(); code != 0 {
		t.Errorf("exit %d", code)
	}

	open := writeFile(t, strings.Replace(strings.Replace(mustRead(t, d.config), fmt.Sprintf("token_file = %q\n", tokenFile), "", 1),
		"listen = \"unix:"+sock+"\"", `listen = "0.0.0.0:9900"`, 1))
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"-check", "-config", open}, &out, &errs); code == 0 ||
		!strings.Contains(errs.String(), "admin.listen") || !strings.Contains(errs.String(), "set admin.token_file") {
		t.Errorf("-check of an open admin address without a token: exit %d, %q", code, errs.String())
	}
}
