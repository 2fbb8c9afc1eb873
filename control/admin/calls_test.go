package admin

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

func TestCalls(t *testing.T) {
	log := zaptest.NewLogger(t)
	xdp := dataplanetest.New(dataplane.PathXDP)
	mgr, reg := newManager(t, callRange(), log, xdp)
	calls := call.NewTable(reg, log)
	c := calls.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:alice@x", "sip:+1555@y")
	c.SetLeg(call.A, call.Leg{CallID: "leg-a"})
	c.Media.Ensure(0, mgrCfg.Addr, mgrCfg.Addr)
	c.Media.Edit(0, func(st *call.Stream) {
		st.Mux = true
		st.Ends[call.A].RTP = netip.MustParseAddrPort("198.18.0.2:4000")
		st.Ends[call.B].RTP = netip.MustParseAddrPort("198.18.2.2:6000")
	})
	if err := c.Media.Sync(); err != nil {
		t.Fatal(err)
	}
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "relayd_test_gauge", Help: "test"})
	s := New(Config{Version: "test", Calls: calls, Collectors: []prometheus.Collector{gauge}}, mgr, log)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	f := &fixture{xdp: xdp, mgr: mgr, srv: srv}

	var list CallList
	if code := f.do(t, http.MethodGet, "/v1/calls", "", &list); code != http.StatusOK {
		t.Fatalf("list: %d", code)
	}
	if len(list.Calls) != 1 || list.Calls[0].ID != c.ID || list.Calls[0].Legs[call.A].CallID != "leg-a" || len(list.Calls[0].Flows) != 2 {
		t.Errorf("calls %+v", list.Calls)
	}
	var one call.Info
	if code := f.do(t, http.MethodGet, "/v1/calls/"+c.ID, "", &one); code != http.StatusOK || one.From != "sip:alice@x" {
		t.Errorf("get: %d %+v", code, one)
	}
	var e ErrorBody
	if code := f.do(t, http.MethodGet, "/v1/calls/nosuch", "", &e); code != http.StatusNotFound || e.Error == "" {
		t.Errorf("unknown call: %d %+v", code, e)
	}
	if code := f.do(t, http.MethodDelete, "/v1/calls/"+c.ID, "", &e); code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: %d", code)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "relayd_test_gauge 0") {
		t.Error("extra collector not in /metrics")
	}
	c.End(call.Answered, 200, "")
	calls.Remove(c)
	if code := f.do(t, http.MethodGet, "/v1/calls", "", &list); code != http.StatusOK || len(list.Calls) != 0 {
		t.Errorf("after the end: %d %+v", code, list)
	}
}

func TestCallsWithoutB2BUA(t *testing.T) {
	f := newFixture(t)
	var list CallList
	if code := f.do(t, http.MethodGet, "/v1/calls", "", &list); code != http.StatusOK || list.Calls == nil || len(list.Calls) != 0 {
		t.Errorf("%d %+v", code, list)
	}
}
