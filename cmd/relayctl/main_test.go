package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/control"
	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

func newServer(t *testing.T) (*httptest.Server, *dataplanetest.DataPlane) {
	t.Helper()
	xdp := dataplanetest.New(dataplane.PathXDP)
	log := zaptest.NewLogger(t)
	reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{{
		Addr: netip.MustParseAddr("198.18.1.1"), PortMin: 30000, PortMax: 39999,
	}}}, log, xdp)
	if err != nil {
		t.Fatal(err)
	}
	mgr := control.NewManager(reg, log)
	srv := httptest.NewServer(admin.New(admin.Config{Observers: []dataplane.Observer{xdp}, Version: "v-test"}, mgr, log).Handler())
	t.Cleanup(srv.Close)
	return srv, xdp
}

func ctl(t *testing.T, api string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"-api", api}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestFlowCommands(t *testing.T) {
	srv, xdp := newServer(t)
	code, out, errs := ctl(t, srv.URL, "flow", "add", "--match", "198.18.1.1:30000", "--send-from", "198.18.1.1:30002",
		"--send-to", "198.18.2.2:5000", "--expect-source", "198.18.0.2:4000", "--clock-rate", "48000", "--rate-cap-pps", "300")
	if code != 0 {
		t.Fatalf("flow add: exit %d, stderr %q", code, errs)
	}
	if !strings.Contains(out, "ID") || !strings.Contains(out, "198.18.2.2:5000") {
		t.Errorf("flow add table:\n%s", out)
	}
	fs, _ := xdp.List()
	if len(fs) != 1 || fs[0].Flow.ClockRate != 48000 || fs[0].Flow.ExpectSource != netip.MustParseAddrPort("198.18.0.2:4000") ||
		fs[0].Flow.RateCap != (dataplane.RateCap{PPS: 300, Burst: 300}) {
		t.Fatalf("data plane flows = %+v", fs)
	}

	code, out, _ = ctl(t, srv.URL, "--json", "flow", "add", "--match", "198.18.1.1:30004", "--action", "drop")
	var f admin.Flow
	if code != 0 || json.Unmarshal([]byte(out), &f) != nil || f.ID != 2 || f.Action != "drop" || f.ClockRate != 8000 {
		t.Fatalf("flow add --json: exit %d, %q", code, out)
	}

	_ = xdp.SetStats(netip.MustParseAddrPort("198.18.1.1:30000"), dataplane.Stats{Packets: 42, LastSeen: time.Unix(1700000000, 0)})
	code, out, _ = ctl(t, srv.URL, "flows")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[1], "1 ") || !strings.Contains(lines[1], "42") ||
		!strings.Contains(lines[1], "2023-11-14T22:13:20.000Z") || !strings.HasPrefix(lines[2], "2 ") {
		t.Errorf("flows: exit %d\n%s", code, out)
	}
	code, out, _ = ctl(t, srv.URL, "flows", "--json")
	var l admin.FlowList
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || len(l.Flows) != 2 || l.Flows[0].Packets != 42 {
		t.Errorf("flows --json: exit %d, %q", code, out)
	}
	if code, out, _ = ctl(t, srv.URL, "flow", "get", "2"); code != 0 || !strings.Contains(out, "drop") {
		t.Errorf("flow get: exit %d\n%s", code, out)
	}
	if code, _, _ = ctl(t, srv.URL, "flow", "del", "2"); code != 0 || xdp.Len() != 1 {
		t.Errorf("flow del: exit %d, %d flows left", code, xdp.Len())
	}
}

func TestAPIErrors(t *testing.T) {
	srv, _ := newServer(t)
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"flow", "get", "9"}, "relayctl: flow 9: no such flow\n"},
		{[]string{"flow", "del", "9"}, "relayctl: flow 9: no such flow\n"},
		{[]string{"flow", "add", "--match", "198.18.1.9:30000", "--action", "drop"}, "not a relay media address"},
		{[]string{"flow", "add", "--match", "198.18.1.1:30000", "--mode", "userspace", "--action", "drop"}, "not implemented"},
		{[]string{"flow", "add", "--match", "nonsense"}, "relayctl: match: \"nonsense\" is not address:port"},
	}
	for _, tt := range tests {
		code, out, errs := ctl(t, srv.URL, tt.args...)
		if code != 1 || out != "" || !strings.HasPrefix(errs, "relayctl: ") || !strings.Contains(errs, tt.msg) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 and %q", tt.args, code, out, errs, tt.msg)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	srv, _ := newServer(t)
	for _, args := range [][]string{
		{}, {"bogus"}, {"flow"}, {"flow", "get"}, {"flow", "get", "x"}, {"flow", "add"},
		{"flow", "add", "--match", "198.18.1.1:30000", "extra"}, {"flow", "frob"},
	} {
		if code, _, errs := ctl(t, srv.URL, args...); code != 2 || !strings.Contains(errs, "usage:") {
			t.Errorf("%v: exit %d, stderr %q; want 2 with usage", args, code, errs)
		}
	}
}

func TestStatsAndHealth(t *testing.T) {
	srv, xdp := newServer(t)
	xdp.SetCounters([]dataplane.Counter{{Verdict: "forward", Reason: "tx", Packets: 7, Bytes: 700}})
	code, out, _ := ctl(t, srv.URL, "stats")
	if code != 0 || !strings.Contains(out, `relayd_packets_total{reason="tx",verdict="forward"} 7`) {
		t.Errorf("stats: exit %d\n%s", code, out)
	}
	if code, out, _ = ctl(t, srv.URL, "health"); code != 0 || out != "ok (version v-test)\n" {
		t.Errorf("health: exit %d, %q", code, out)
	}
	if code, _, errs := ctl(t, "http://127.0.0.1:1", "health"); code != 1 || !strings.HasPrefix(errs, "relayctl: ") {
		t.Errorf("unreachable: exit %d, %q", code, errs)
	}
	// A non-JSON error body still gives a message.
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "nope", http.StatusBadGateway)
	}))
	defer plain.Close()
	if code, _, errs := ctl(t, plain.URL, "flows"); code != 1 || errs != "relayctl: 502 Bad Gateway\n" {
		t.Errorf("plain error: exit %d, %q", code, errs)
	}
}

func TestUnixSocket(t *testing.T) {
	srv, _ := newServer(t)
	sock := filepath.Join(t.TempDir(), "admin.sock")
	l, err := admin.Listen("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	us := &http.Server{Handler: srv.Config.Handler}
	go us.Serve(l)
	t.Cleanup(func() { us.Close() })
	if code, out, errs := ctl(t, "unix:"+sock, "health"); code != 0 || !strings.HasPrefix(out, "ok") {
		t.Errorf("health over unix socket: exit %d, %q %q", code, out, errs)
	}
}

// TestToken: against an API that asks for a token, relayctl sends the one
// in -token-file or $RELAYCTL_TOKEN_FILE; without it the refusal says
// where relayctl looks; a token file others may read is refused.
func TestToken(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	log := zaptest.NewLogger(t)
	reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{{
		Addr: netip.MustParseAddr("198.18.1.1"), PortMin: 30000, PortMax: 39999,
	}}}, log, xdp)
	if err != nil {
		t.Fatal(err)
	}
	const token = "relayctl-test-token-0123456789"
	srv := httptest.NewServer(admin.New(admin.Config{Version: "v-test", Token: token}, control.NewManager(reg, log), log).Handler())
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := ctl(t, srv.URL, "-token-file", file, "flows"); code != 0 {
		t.Errorf("with -token-file: exit %d\n%s%s", code, out, errs)
	}
	t.Setenv("RELAYCTL_TOKEN_FILE", file)
	if code, out, errs := ctl(t, srv.URL, "flows"); code != 0 {
		t.Errorf("with $RELAYCTL_TOKEN_FILE: exit %d\n%s%s", code, out, errs)
	}
	t.Setenv("RELAYCTL_TOKEN_FILE", "")
	defer func(f string) { defaultTokenFile = f }(defaultTokenFile)
	defaultTokenFile = filepath.Join(dir, "absent")
	if code, _, errs := ctl(t, srv.URL, "flows"); code != 1 || !strings.Contains(errs, "bearer token") || !strings.Contains(errs, "-token-file") {
		t.Errorf("without a token: exit %d %q; want 1 and where relayctl reads the token", code, errs)
	}
	os.Chmod(file, 0o644)
	if code, _, errs := ctl(t, srv.URL, "-token-file", file, "flows"); code != 2 || !strings.Contains(errs, "mode 0644") {
		t.Errorf("a world-readable token file: exit %d %q; want 2 and the mode", code, errs)
	}
	// The default file is read when it exists, and refused as any other.
	defaultTokenFile = file
	if code, _, errs := ctl(t, srv.URL, "flows"); code != 2 || !strings.Contains(errs, "mode 0644") {
		t.Errorf("a world-readable default token file: exit %d %q; want 2", code, errs)
	}
	os.Chmod(file, 0o600)
	if code, out, errs := ctl(t, srv.URL, "flows"); code != 0 {
		t.Errorf("the default token file: exit %d\n%s%s", code, out, errs)
	}
}
