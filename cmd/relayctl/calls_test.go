package main

import (
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/control"
	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

func TestCallsCommand(t *testing.T) {
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
	c.SetRoute("carrier")
	srv := httptest.NewServer(admin.New(admin.Config{Version: "v", Calls: calls}, mgr, log).Handler())
	defer srv.Close()

	code, out, errs := ctl(t, srv.URL, "calls")
	if code != 0 || !strings.Contains(out, c.ID) || !strings.Contains(out, "carrier") || !strings.Contains(out, "trying") {
		t.Errorf("calls: exit %d %q %q", code, out, errs)
	}
	code, out, _ = ctl(t, srv.URL, "calls", "--json")
	if code != 0 || !strings.Contains(out, `"calls"`) || !strings.Contains(out, `"sip:alice@198.18.0.2"`) {
		t.Errorf("calls --json: exit %d %q", code, out)
	}
	code, out, _ = ctl(t, srv.URL, "call", c.ID)
	if code != 0 || !strings.Contains(out, `"id": "`+c.ID+`"`) {
		t.Errorf("call ID: exit %d %q", code, out)
	}
	if code, _, errs := ctl(t, srv.URL, "call", "nosuch"); code != 1 || !strings.Contains(errs, "no call") {
		t.Errorf("unknown call: exit %d %q", code, errs)
	}
	if code, _, _ := ctl(t, srv.URL, "call"); code != 2 {
		t.Errorf("call without id: exit %d, want 2", code)
	}
}
