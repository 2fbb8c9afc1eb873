package admin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/control/admin/admintest"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/cdr"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
	"github.com/relayd/relayd/internal/testenv"
)

// capPlane is a data plane with a bounded flow table.
type capPlane struct {
	*dataplanetest.DataPlane
	max int
}

func (c capPlane) Capacity() (int, int) { return c.Len(), c.max }

// PortTableFlows reports every flow but one as found by port.
func (c capPlane) PortTableFlows() int { return c.Len() - 1 }

// Egress reports one device in fallback after 7 refused frames, one healthy.
func (c capPlane) Egress() []dataplane.Egress {
	return []dataplane.Egress{{Device: "r1", RedirectErrors: 7, Fallback: true}, {Device: "r0"}}
}

type lifecycle struct {
	*fixture
	calls *call.Table
	ctl   *admintest.Control
	call  *call.Call
}

func newLifecycle(t *testing.T) *lifecycle {
	t.Helper()
	log := zaptest.NewLogger(t)
	xdp := capPlane{dataplanetest.New(dataplane.PathXDP), 1000}
	mgr, reg := newManager(t, callRange(), log, xdp)
	calls := call.NewTable(reg, log)
	c := calls.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:alice@x", "sip:+1555@y")
	c.SetLeg(call.A, call.Leg{CallID: "a84b4c76e66710@198.18.0.2"})
	c.SetLeg(call.B, call.Leg{CallID: "relayd-b-leg-1"})
	c.Media.Ensure(0, mgrCfg.Addr, mgrCfg.Addr)
	c.Media.Edit(0, func(st *call.Stream) {
		st.Mux = true
		st.Ends[call.A].RTP = netip.MustParseAddrPort("198.18.0.2:4000")
		st.Ends[call.B].RTP = netip.MustParseAddrPort("198.18.2.2:6000")
	})
	if err := c.Media.Sync(); err != nil {
		t.Fatal(err)
	}
	ctl := &admintest.Control{Calls: calls}
	s := New(Config{
		Version: "1.2.3-test", Calls: calls, Control: ctl, Observers: []dataplane.Observer{xdp},
		CDRStats: func() cdr.Stats { return cdr.Stats{Written: 7, Posted: 5, PostErrors: 2, Dropped: 1, WriteErrors: 3} },
	}, mgr, log)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &lifecycle{fixture: &fixture{xdp: xdp.DataPlane, mgr: mgr, srv: srv}, calls: calls, ctl: ctl, call: c}
}

func TestCallBySIPCallID(t *testing.T) {
	l := newLifecycle(t)
	for _, id := range []string{l.call.ID, "a84b4c76e66710@198.18.0.2", "relayd-b-leg-1"} {
		var one call.Info
		if code := l.do(t, http.MethodGet, "/v1/calls/"+id, "", &one); code != http.StatusOK || one.ID != l.call.ID {
			t.Errorf("GET by %q: %d %+v", id, code, one.ID)
		}
	}
}

func TestHangup(t *testing.T) {
	l := newLifecycle(t)
	var e ErrorBody
	if code := l.do(t, http.MethodPost, "/v1/calls/nosuch/hangup", "", &e); code != http.StatusNotFound || e.Error == "" {
		t.Errorf("unknown call: %d %+v", code, e)
	}
	if code := l.do(t, http.MethodGet, "/v1/calls/"+l.call.ID+"/hangup", "", &e); code != http.StatusMethodNotAllowed {
		t.Errorf("GET hangup: %d", code)
	}
	l.ctl.Fail(errors.New("BYE toward leg B timed out"))
	if code := l.do(t, http.MethodPost, "/v1/calls/"+l.call.ID+"/hangup", "", &e); code != http.StatusInternalServerError || !strings.Contains(e.Error, "timed out") {
		t.Errorf("failing hangup: %d %+v", code, e)
	}
	l.ctl.Fail(nil)
	// By the caller's SIP Call-ID: relayd's call id reaches Hangup.
	var info call.Info
	if code := l.do(t, http.MethodPost, "/v1/calls/a84b4c76e66710@198.18.0.2/hangup", "", &info); code != http.StatusOK || info.State != call.StateEnded {
		t.Errorf("hangup: %d %+v", code, info)
	}
	if h := l.ctl.HungUp(); len(h) != 1 || h[0] != l.call.ID {
		t.Errorf("Hangup called with %v, want [%s]", h, l.call.ID)
	}
	if code := l.do(t, http.MethodPost, "/v1/calls/"+l.call.ID+"/hangup", "", &e); code != http.StatusNotFound {
		t.Errorf("second hangup: %d, want 404", code)
	}
}

func TestDrain(t *testing.T) {
	l := newLifecycle(t)
	var st DrainStatus
	if code := l.do(t, http.MethodGet, "/v1/drain", "", &st); code != http.StatusOK || st.Draining || st.Calls != 1 {
		t.Errorf("status before: %d %+v", code, st)
	}
	var e ErrorBody
	for _, bad := range []string{`{"timeout":"soon"}`, `{"timeout":"-1m"}`, `{"timeout":"1m","x":1}`, `[`} {
		if code := l.do(t, http.MethodPost, "/v1/drain", bad, &e); code != http.StatusBadRequest || e.Error == "" {
			t.Errorf("POST %s: %d %+v", bad, code, e)
		}
	}
	if code := l.do(t, http.MethodPost, "/v1/drain", `{"timeout":"`+strings.Repeat("9", MaxBodyBytes)+`s"}`, &e); code != http.StatusRequestEntityTooLarge {
		t.Errorf("huge body: %d", code)
	}
	if on, _ := l.ctl.Draining(); on {
		t.Fatal("a bad request started a drain")
	}
	if code := l.do(t, http.MethodPost, "/v1/drain", "", &st); code != http.StatusAccepted || !st.Draining || st.Calls != 1 {
		t.Errorf("POST without body: %d %+v", code, st)
	}
	if _, d := l.ctl.Draining(); d != DefaultDrainTimeout {
		t.Errorf("POST without body: timeout %v, want %v", d, DefaultDrainTimeout)
	}
	if code := l.do(t, http.MethodPost, "/v1/drain", `{"timeout":"90s"}`, &st); code != http.StatusAccepted || st.Timeout != "1m30s" {
		t.Errorf("POST 90s: %d %+v", code, st)
	}
	if _, d := l.ctl.Draining(); d != 90*time.Second {
		t.Errorf("POST 90s: timeout %v", d)
	}
	if code := l.do(t, http.MethodGet, "/v1/drain", "", &st); code != http.StatusOK || !st.Draining {
		t.Errorf("status after: %d %+v", code, st)
	}
}

func TestControlWithoutB2BUA(t *testing.T) {
	f := newFixture(t)
	var e ErrorBody
	for _, r := range [][2]string{{"POST", "/v1/drain"}, {"GET", "/v1/drain"}, {"POST", "/v1/calls/x/hangup"}} {
		if code := f.do(t, r[0], r[1], "", &e); code != http.StatusNotImplemented {
			t.Errorf("%s %s: %d, want 501", r[0], r[1], code)
		}
	}
}

func scrape(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s\n%s", resp.Status, b)
	}
	return b
}

// TestMetricsLifecycle: call flows count in relayd_flows and /healthz;
// ports, flow slots, redirect health, CDR counters and build info are exported; promtool
// finds nothing to complain about.
func TestMetricsLifecycle(t *testing.T) {
	l := newLifecycle(t)
	// Two pairs the call does not hold (its ports are drawn at random).
	held := map[uint16]bool{}
	for _, st := range l.call.Media.Streams() {
		for _, e := range st.Ends {
			held[e.Port] = true
		}
	}
	p := uint16(30050)
	for held[p] || held[p+2] {
		p += 4
	}
	body := fmt.Sprintf(`{"match":"198.18.1.1:%d","send_from":"198.18.1.1:%d","send_to":"198.18.2.2:5000"}`, p, p+2)
	if code := l.do(t, http.MethodPost, "/v1/flows", body, nil); code != http.StatusCreated {
		t.Fatalf("add static flow: %d", code)
	}
	b := scrape(t, l.srv.URL)
	for _, want := range []string{
		`relayd_flows{path="xdp"} 3`, // 1 static + 2 of the call (rtcp-mux)
		`relayd_flows{path="userspace"} 0`,
		`relayd_media_ports{interface="default",state="in_use"} 6`, // 3 pairs: one per leg, one the static flow's
		`relayd_media_ports{interface="default",state="free"} 94`,
		`relayd_flow_slots_used{path="xdp"} 3`,
		`relayd_flow_slots_max{path="xdp"} 1000`,
		`relayd_xdp_port_table_flows 2`,
		`relayd_cdr_written_total 7`,
		`relayd_cdr_posted_total 5`,
		`relayd_cdr_post_errors_total 2`,
		`relayd_cdr_dropped_total 1`,
		`relayd_cdr_write_errors_total 3`,
		`relayd_xdp_redirect_errors_total{device="r1"} 7`,
		`relayd_xdp_egress_fallback{device="r1"} 1`,
		`relayd_xdp_redirect_errors_total{device="r0"} 0`,
		`relayd_xdp_egress_fallback{device="r0"} 0`,
		`relayd_build_info{goversion="go`,
		`version="1.2.3-test"} 1`,
	} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	var h map[string]any
	if code := l.do(t, http.MethodGet, "/healthz", "", &h); code != http.StatusOK {
		t.Fatalf("healthz %d", code)
	}
	if fl, _ := h["flows"].(map[string]any); fl["xdp"] != float64(3) {
		t.Errorf("/healthz flows %v, want xdp 3 (call flows counted)", h["flows"])
	}
	promtool := testenv.NeedCommand(t, "promtool", "prometheus")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(b)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
