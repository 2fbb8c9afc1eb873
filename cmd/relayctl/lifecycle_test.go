package main

import (
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/control"
	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/control/admin/admintest"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

func TestHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		var out, errb strings.Builder
		if code := run(args, &out, &errb); code != 0 || !strings.Contains(out.String(), "drain [--timeout 10m]") {
			t.Errorf("%v: exit %d, stdout %q", args, code, out.String())
		}
	}
	var out, errb strings.Builder
	if code := run([]string{"--version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "relayctl ") {
		t.Errorf("--version: exit %d, %q", code, out.String())
	}
}

func newCallServer(t *testing.T) (*httptest.Server, *call.Call, *admintest.Control) {
	t.Helper()
	xdp := dataplanetest.New(dataplane.PathXDP)
	log := zaptest.NewLogger(t)
	relay := netip.MustParseAddr("198.18.1.1")
	reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{{Addr: relay, PortMin: 30000, PortMax: 39999}}}, log, xdp)
	if err != nil {
		t.Fatal(err)
	}
	mgr := control.NewManager(reg, log)
	calls := call.NewTable(reg, log)
	c := calls.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:alice@198.18.0.2", "sip:+1555@198.18.1.1")
	c.SetLeg(call.A, call.Leg{CallID: "3848276298220188511@198.18.0.2"})
	ctl := &admintest.Control{Calls: calls}
	srv := httptest.NewServer(admin.New(admin.Config{Version: "v", Calls: calls, Control: ctl}, mgr, log).Handler())
	t.Cleanup(srv.Close)
	return srv, c, ctl
}

func TestCallAndHangup(t *testing.T) {
	srv, c, fake := newCallServer(t)
	code, out, errs := ctl(t, srv.URL, "call", "3848276298220188511@198.18.0.2")
	if code != 0 || !strings.Contains(out, `"id": "`+c.ID+`"`) {
		t.Errorf("call by SIP Call-ID: exit %d %q %q", code, out, errs)
	}
	if code, _, errs := ctl(t, srv.URL, "hangup", "nosuch"); code != 1 || !strings.Contains(errs, `no call "nosuch"`) {
		t.Errorf("hangup of an unknown call: exit %d, stderr %q", code, errs)
	}
	if code, _, errs := ctl(t, srv.URL, "hangup"); code != 2 || !strings.Contains(errs, "usage:") {
		t.Errorf("hangup without id: exit %d, stderr %q", code, errs)
	}
	code, out, errs = ctl(t, srv.URL, "hangup", "3848276298220188511@198.18.0.2")
	if code != 0 || !strings.Contains(out, "hung up "+c.ID) {
		t.Errorf("hangup: exit %d %q %q", code, out, errs)
	}
	if h := fake.HungUp(); len(h) != 1 || h[0] != c.ID {
		t.Errorf("hung up %v, want [%s]", h, c.ID)
	}
}

func TestDrainCommand(t *testing.T) {
	srv, _, fake := newCallServer(t)
	code, out, errs := ctl(t, srv.URL, "drain", "--status")
	if code != 0 || out != "not draining: 1 calls in progress\n" {
		t.Errorf("status before: exit %d %q %q", code, out, errs)
	}
	for _, bad := range [][]string{{"drain", "--timeout", "x"}, {"drain", "--timeout", "-1s"}, {"drain", "now"}} {
		if code, _, errs := ctl(t, srv.URL, bad...); code != 2 || !strings.Contains(errs, "usage:") {
			t.Errorf("%v: exit %d, stderr %q", bad, code, errs)
		}
	}
	code, out, errs = ctl(t, srv.URL, "drain", "--timeout", "2m")
	if code != 0 || !strings.Contains(out, "hung up after 2m0s") {
		t.Errorf("drain: exit %d %q %q", code, out, errs)
	}
	if on, d := fake.Draining(); !on || d != 2*time.Minute {
		t.Errorf("Drain: %v %v, want on for 2m", on, d)
	}
	code, out, _ = ctl(t, srv.URL, "drain")
	if _, d := fake.Draining(); code != 0 || d != 10*time.Minute {
		t.Errorf("drain without timeout: exit %d %q, timeout %v", code, out, d)
	}
	code, out, _ = ctl(t, srv.URL, "drain", "--status", "--json")
	if code != 0 || !strings.Contains(out, `"draining": true`) {
		t.Errorf("status after: exit %d %q", code, out)
	}
}
