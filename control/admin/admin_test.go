package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/relayd/relayd/control"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

var mgrCfg = registry.Interface{
	Addr:    netip.MustParseAddr("198.18.1.1"),
	Addr6:   netip.MustParseAddr("2001:2::1"),
	PortMin: 30000,
	PortMax: 39999,
}

// newManager returns a static flow manager over a registry of the
// interface and data planes; the registry is there for call tables.
func newManager(t testing.TB, in registry.Interface, log *zap.Logger, planes ...dataplane.DataPlane) (*control.Manager, *registry.Registry) {
	t.Helper()
	reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{in}}, log, planes...)
	if err != nil {
		t.Fatal(err)
	}
	return control.NewManager(reg, log), reg
}

// callRange is the interface of the call tests: 100 ports.
func callRange() registry.Interface {
	in := mgrCfg
	in.PortMax = 30099
	return in
}

type fixture struct {
	xdp *dataplanetest.DataPlane
	mgr *control.Manager
	srv *httptest.Server
}

func newFixture(t *testing.T, planes ...dataplane.DataPlane) *fixture {
	t.Helper()
	return newFixtureLog(t, zaptest.NewLogger(t), planes...)
}

func newFixtureLog(t testing.TB, log *zap.Logger, planes ...dataplane.DataPlane) *fixture {
	t.Helper()
	xdp := dataplanetest.New(dataplane.PathXDP)
	mgr, _ := newManager(t, mgrCfg, log, append([]dataplane.DataPlane{xdp}, planes...)...)
	s := New(Config{Observers: []dataplane.Observer{xdp}, Version: "test"}, mgr, log)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &fixture{xdp: xdp, mgr: mgr, srv: srv}
}

// do sends a request and decodes the JSON answer into out (if not nil).
func (f *fixture) do(t *testing.T, method, path, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); path != "/metrics" && ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, path, ct)
	}
	if resp.StatusCode >= 400 {
		var e ErrorBody
		if err := json.Unmarshal(b, &e); err != nil || e.Error == "" {
			t.Errorf("%s %s: %d with body %q, want {\"error\": ...}", method, path, resp.StatusCode, b)
		}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

const designFlow = `{"match": "198.18.1.1:30000", "expect_source": "198.18.0.2:4000",
 "send_from": "198.18.1.1:30002", "send_to": "198.18.2.2:5000", "mode": "xdp"}`

func TestFlowLifecycle(t *testing.T) {
	f := newFixture(t)
	var created Flow
	if code := f.do(t, "POST", "/v1/flows", designFlow, &created); code != http.StatusCreated {
		t.Fatalf("POST: %d", code)
	}
	want := Flow{ID: 1, Match: "198.18.1.1:30000", ExpectSource: "198.18.0.2:4000", SendFrom: "198.18.1.1:30002",
		SendTo: "198.18.2.2:5000", Mode: "xdp", Action: "forward", ClockRate: 8000, Path: "xdp"}
	if created != want {
		t.Errorf("created = %+v\nwant %+v", created, want)
	}

	seen := time.Date(2026, 1, 2, 3, 4, 5, 678_900_000, time.UTC)
	if err := f.xdp.SetStats(netip.MustParseAddrPort("198.18.1.1:30000"), dataplane.Stats{
		Packets: 100, Bytes: 20000, Dropped: 3, Lost: 2, Jitter: 80, LastSeen: seen, SSRC: 0xdeadbeef, Received: 98,
	}); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if code := f.do(t, "GET", "/v1/flows/1", "", &raw); code != http.StatusOK {
		t.Fatalf("GET: %d", code)
	}
	for k, v := range map[string]any{"packets": 100.0, "bytes": 20000.0, "dropped": 3.0, "lost": 2.0,
		"jitter_ms": 10.0, "last_seen": "2026-01-02T03:04:05.678Z", "ssrc": float64(0xdeadbeef), "received": 98.0, "id": 1.0} {
		if raw[k] != v {
			t.Errorf("GET /v1/flows/1: %s = %v, want %v", k, raw[k], v)
		}
	}

	// A second flow, never seen: last_seen is null.
	var second map[string]any
	if code := f.do(t, "POST", "/v1/flows", `{"match":"198.18.1.1:30004","action":"drop","clock_rate":0}`, &second); code != http.StatusCreated {
		t.Fatalf("POST drop: %d", code)
	}
	if v, ok := second["last_seen"]; !ok || v != nil {
		t.Errorf("last_seen of new flow = %v (present %v), want null", v, ok)
	}
	if second["action"] != "drop" || second["clock_rate"] != 0.0 || second["id"] != 2.0 {
		t.Errorf("second flow = %v", second)
	}

	var list FlowList
	if code := f.do(t, "GET", "/v1/flows", "", &list); code != http.StatusOK {
		t.Fatalf("GET list: %d", code)
	}
	if len(list.Flows) != 2 || list.Flows[0].ID != 1 || list.Flows[0].Packets != 100 || list.Flows[1].ID != 2 {
		t.Errorf("list = %+v", list)
	}

	var deleted Flow
	if code := f.do(t, "DELETE", "/v1/flows/1", "", &deleted); code != http.StatusOK {
		t.Fatalf("DELETE: %d", code)
	}
	if deleted.ID != 1 || deleted.Packets != 100 {
		t.Errorf("deleted = %+v", deleted)
	}
	if f.xdp.Len() != 1 {
		t.Errorf("data plane has %d flows, want 1", f.xdp.Len())
	}
	if code := f.do(t, "GET", "/v1/flows/1", "", nil); code != http.StatusNotFound {
		t.Errorf("GET deleted: %d, want 404", code)
	}
}

func TestEmptyListIsArray(t *testing.T) {
	f := newFixture(t)
	var raw map[string]json.RawMessage
	f.do(t, "GET", "/v1/flows", "", &raw)
	if string(raw["flows"]) != "[]" {
		t.Errorf("flows = %s, want []", raw["flows"])
	}
}

func TestStatusCodes(t *testing.T) {
	f := newFixture(t)
	if code := f.do(t, "POST", "/v1/flows", designFlow, nil); code != http.StatusCreated {
		t.Fatalf("setup POST: %d", code)
	}
	tests := []struct {
		name, method, path, body string
		want                     int
		msg                      string
	}{
		{"health", "GET", "/healthz", "", 200, ""},
		{"bad json", "POST", "/v1/flows", `{"match":`, 400, "bad JSON"},
		{"empty body", "POST", "/v1/flows", ``, 400, "empty body"},
		{"not an object", "POST", "/v1/flows", `[1]`, 400, "bad JSON"},
		{"trailing data", "POST", "/v1/flows", `{"match":"198.18.1.1:30010","action":"drop"} {}`, 400, "after the object"},
		{"unknown field", "POST", "/v1/flows", `{"match":"198.18.1.1:30010","colour":"red"}`, 400, "colour"},
		{"wrong type", "POST", "/v1/flows", `{"match":30010}`, 400, "bad JSON"},
		{"missing match", "POST", "/v1/flows", `{"send_to":"198.18.2.2:5000"}`, 400, "match: required"},
		{"bad address", "POST", "/v1/flows", `{"match":"198.18.1.1"}`, 400, "not address:port"},
		{"bad mode", "POST", "/v1/flows", `{"match":"198.18.1.1:30010","mode":"dpdk"}`, 400, "mode"},
		{"bad action", "POST", "/v1/flows", `{"match":"198.18.1.1:30010","action":"punt"}`, 400, "action"},
		{"negative clock rate", "POST", "/v1/flows", `{"match":"198.18.1.1:30010","clock_rate":-1}`, 400, "bad JSON"},
		{"forward without send_to", "POST", "/v1/flows", `{"match":"198.18.1.1:30010"}`, 400, "send_from"},
		{"match not relay", "POST", "/v1/flows", `{"match":"198.18.1.9:30010","action":"drop"}`, 422, "not a relay media address"},
		{"match port out of range", "POST", "/v1/flows", `{"match":"198.18.1.1:80","action":"drop"}`, 422, "ports 30000-39999"},
		{"send_from not relay", "POST", "/v1/flows", `{"match":"198.18.1.1:30010","send_from":"198.18.1.2:30012","send_to":"198.18.2.2:5000"}`, 422, "send_from"},
		{"conflict", "POST", "/v1/flows", designFlow, 409, "already in use"},
		{"userspace", "POST", "/v1/flows", `{"match":"198.18.1.1:30010","action":"drop","mode":"userspace"}`, 501, "not implemented"},
		{"srtp", "POST", "/v1/flows", `{"match":"198.18.1.1:30010","send_from":"198.18.1.1:30012","send_to":"198.18.2.2:5000",
			"decrypt":{"suite":"AES_CM_128_HMAC_SHA1_80","key":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd"}}`, 501, "not implemented"},
		{"srtp bad key", "POST", "/v1/flows", `{"match":"198.18.1.1:30010","send_from":"198.18.1.1:30012","send_to":"198.18.2.2:5000",
			"decrypt":{"suite":"AES_CM_128_HMAC_SHA1_80","key":"AAAA"}}`, 400, "needs 30"},
		{"crypto unknown field", "POST", "/v1/flows", `{"match":"198.18.1.1:30010","decrypt":{"suite":"x","key":"AAAA","mki":1}}`, 400, "mki"},
		{"too large", "POST", "/v1/flows", `{"match":"` + strings.Repeat("1", MaxBodyBytes) + `"}`, 413, "larger than"},
		{"get unknown", "GET", "/v1/flows/99", "", 404, "no such flow"},
		{"delete unknown", "DELETE", "/v1/flows/99", "", 404, "no such flow"},
		{"bad id", "GET", "/v1/flows/abc", "", 400, "not a positive integer"},
		{"zero id", "DELETE", "/v1/flows/0", "", 400, "not a positive integer"},
		{"method", "PUT", "/v1/flows", "{}", 405, "not allowed"},
		{"method on flow", "POST", "/v1/flows/1", "{}", 405, "not allowed"},
		{"unknown path", "GET", "/v2/calls", "", 404, "no such endpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e ErrorBody
			var out any = &e
			if tt.want < 400 {
				out = nil
			}
			if code := f.do(t, tt.method, tt.path, tt.body, out); code != tt.want {
				t.Errorf("%s %s: %d, want %d (%s)", tt.method, tt.path, code, tt.want, e.Error)
			}
			if !strings.Contains(e.Error, tt.msg) {
				t.Errorf("error %q does not contain %q", e.Error, tt.msg)
			}
		})
	}
}

func TestDataPlaneErrorStatus(t *testing.T) {
	f := newFixture(t)
	f.xdp.SetCapacity(1)
	if code := f.do(t, "POST", "/v1/flows", designFlow, nil); code != 201 {
		t.Fatalf("POST: %d", code)
	}
	if code := f.do(t, "POST", "/v1/flows", `{"match":"198.18.1.1:30010","action":"drop"}`, nil); code != http.StatusServiceUnavailable {
		t.Errorf("POST into full table: %d, want 503", code)
	}
	f.xdp.FailWith(errors.New("map gone"))
	if code := f.do(t, "GET", "/v1/flows", "", nil); code != http.StatusInternalServerError {
		t.Errorf("GET with failing data plane: %d, want 500", code)
	}
}

func TestUserspacePlaneRegistered(t *testing.T) {
	user := dataplanetest.New(dataplane.PathUserspace)
	f := newFixture(t, user)
	var fl Flow
	if code := f.do(t, "POST", "/v1/flows", `{"match":"198.18.1.1:30010","action":"drop","mode":"userspace"}`, &fl); code != 201 {
		t.Fatalf("POST userspace: %d", code)
	}
	if fl.Path != "userspace" || user.Len() != 1 {
		t.Errorf("flow %+v; userspace plane has %d flows", fl, user.Len())
	}
}

func TestPanicRecovered(t *testing.T) {
	s := &Server{log: zaptest.NewLogger(t)}
	h := s.recoverer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 500 || !strings.Contains(rec.Body.String(), `"error": "internal error"`) {
		t.Errorf("panic gave %d %q", rec.Code, rec.Body)
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t)
	f.do(t, "POST", "/v1/flows", designFlow, nil)
	f.xdp.SetCounters([]dataplane.Counter{
		{Verdict: "forward", Reason: "tx", Packets: 10, Bytes: 2000},
		{Verdict: "drop", Reason: "wrong_source", Packets: 2, Bytes: 400},
	})
	f.xdp.SetInterfaces([]dataplane.Interface{{Name: "veth0", Index: 3, Mode: "native"}, {Name: "vlan7", Index: 4, Mode: "native", Gone: true}})
	resp, err := http.Get(f.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	body := string(b)
	for _, want := range []string{
		`relayd_packets_total{reason="tx",verdict="forward"} 10`,
		`relayd_bytes_total{reason="tx",verdict="forward"} 2000`,
		`relayd_packets_total{reason="wrong_source",verdict="drop"} 2`,
		`relayd_flows{path="xdp"} 1`,
		`relayd_flows{path="userspace"} 0`,
		`relayd_xdp_attached{interface="veth0",mode="native"} 1`,
		`relayd_xdp_attached{interface="vlan7",mode="native"} 0`, // deleted while relayd runs
		`go_goroutines`,
		"\ngo_gc_heap_live_bytes ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if f.xdp.Calls("Counters") != 1 {
		t.Errorf("Counters called %d times, want 1 per scrape", f.xdp.Calls("Counters"))
	}
	// A failing observer does not break the scrape.
	f.xdp.FailWith(errors.New("map gone"))
	resp2, err := http.Get(f.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp2.Body)
	resp2.Body.Close()
	if resp2.StatusCode != 200 || !strings.Contains(string(b), "go_goroutines") {
		t.Errorf("scrape with failing observer: %d", resp2.StatusCode)
	}
}

// TestShutdownBeforeServe: relayd stopped as it starts calls Shutdown
// before the admin server's goroutine reached Serve; Serve then returns
// at once instead of serving.
func TestShutdownBeforeServe(t *testing.T) {
	log := zaptest.NewLogger(t)
	mgr, _ := newManager(t, mgrCfg, log)
	s := New(Config{}, mgr, log)
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after Shutdown: %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve after Shutdown still serving after 5 s")
	}
}

func TestUnixListener(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "admin.sock")
	log := zaptest.NewLogger(t)
	mgr, _ := newManager(t, mgrCfg, log)
	for range 2 { // the second round (a relayd started again) finds a stale socket file
		s := New(Config{}, mgr, log)
		l, err := Listen("unix:" + path)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(l) }()
		c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}}
		resp, err := c.Get("http://relayd/healthz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"ok"`)) {
			t.Errorf("healthz over unix socket: %d %s", resp.StatusCode, b)
		}
		c.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		// Simulate a crash leaving the socket behind: net.UnixListener
		// removes it on Close, so recreate a socket file.
		if ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"}); err == nil {
			ul.SetUnlinkOnClose(false)
			ul.Close()
		}
	}
	if _, err := Listen("unix:" + dir); err == nil {
		t.Error("Listen on a directory path succeeded")
	}
}

func TestTCPListener(t *testing.T) {
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := Listen("127.0.0.1:99999"); err == nil {
		t.Error("bad port accepted")
	}
}

// TestTranscodeFlow: a transcoding flow goes to the userspace plane with
// every default filled in, comes back as requested, and bad conversions
// get 400 with the field named.
func TestTranscodeFlow(t *testing.T) {
	user := dataplanetest.New(dataplane.PathUserspace)
	f := newFixture(t, user)
	const base = `"match":"198.18.1.1:30010","send_from":"198.18.1.1:30012","send_to":"198.18.2.2:5000"`
	var fl Flow
	body := `{` + base + `,"transcode":{"from":"pcmu","to":"G729","ptime_to":30,"event_from":101,"event_to":96,
		"vad_to":true,"ssrc":1234,"rtcp_from":"198.18.1.1:30013","rtcp_to":"198.18.2.2:5001"}}`
	if code := f.do(t, "POST", "/v1/flows", body, &fl); code != http.StatusCreated {
		t.Fatalf("POST: %d", code)
	}
	if fl.Path != "userspace" || user.Len() != 1 {
		t.Fatalf("flow %+v; userspace plane has %d flows, want it there", fl, user.Len())
	}
	pt := func(v uint8) *uint8 { return &v }
	want := &Transcode{From: "PCMU", To: "G729", PtimeFrom: 20, PtimeTo: 30, PTFrom: pt(0), PTTo: pt(18),
		EventFrom: 101, EventTo: 96, VADTo: true, SSRC: 1234, RTCPFrom: "198.18.1.1:30013", RTCPTo: "198.18.2.2:5001"}
	if diff := cmp.Diff(want, fl.Transcode); diff != "" {
		t.Errorf("transcode as returned (-want +got):\n%s", diff)
	}
	if fl.TranscodeStats == nil {
		t.Errorf("no transcode_stats on a transcoding flow")
	}
	for _, tt := range []struct {
		name, transcode, msg string
		code                 int
	}{
		{"unknown codec", `{"from":"PCMU","to":"opus"}`, "to: \"opus\" is not PCMU, PCMA or G729", 400},
		{"bad ptime", `{"from":"PCMU","to":"G729","ptime_to":25}`, "ptime 25", 400},
		{"event clash", `{"from":"PCMU","to":"G729","event_to":18}`, "distinct payload types", 400},
		{"pt out of range", `{"from":"PCMU","to":"G729","pt_to":200}`, "0 to 127", 400},
		{"rtcp_from not relay", `{"from":"PCMU","to":"G729","rtcp_from":"198.18.1.9:30013","rtcp_to":"198.18.2.2:5001"}`, "rtcp_from", 422},
		{"bad rtcp_to", `{"from":"PCMU","to":"G729","rtcp_to":"x"}`, "rtcp_to", 400},
		{"unknown field", `{"from":"PCMU","to":"G729","bitrate":8}`, "bitrate", 400},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var e ErrorBody
			body := `{"match":"198.18.1.1:30020","send_from":"198.18.1.1:30022","send_to":"198.18.2.2:5000","transcode":` + tt.transcode + `}`
			if code := f.do(t, "POST", "/v1/flows", body, &e); code != tt.code || !strings.Contains(e.Error, tt.msg) {
				t.Errorf("POST: %d %q, want %d and %q", code, e.Error, tt.code, tt.msg)
			}
		})
	}
}

// TestPostFlowDeniedDestination: a flow whose send_to is a relay media
// address (its own match, another relay port), loopback, broadcast,
// link-local or a transcoding flow's rtcp_to on loopback is refused with
// 422 and a JSON error naming why, and nothing is installed: one packet
// into a flow pointing at relayd would loop at the data plane's speed.
func TestPostFlowDeniedDestination(t *testing.T) {
	user := dataplanetest.New(dataplane.PathUserspace)
	f := newFixture(t, user)
	flow := func(sendTo string) string {
		return `{"match": "198.18.1.1:30000", "send_from": "198.18.1.1:30002", "send_to": "` + sendTo + `"}`
	}
	for _, tc := range []struct{ name, body, why string }{
		{"its own match", flow("198.18.1.1:30000"), "relayd itself"},
		{"another relay port", flow("198.18.1.1:30010"), "relayd itself"},
		{"the relay's IPv6 address", `{"match": "[2001:2::1]:30000", "send_from": "[2001:2::1]:30002", "send_to": "[2001:2::1]:30000"}`, "relayd itself"},
		{"loopback", flow("127.0.0.1:5000"), "loopback"},
		{"broadcast", flow("255.255.255.255:5000"), "broadcast"},
		{"link-local", flow("169.254.1.1:5000"), "link-local"},
		{"rtcp_to on loopback", `{"match": "198.18.1.1:30000", "send_from": "198.18.1.1:30002", "send_to": "198.18.2.2:5000",
			"transcode": {"from": "PCMU", "to": "PCMA", "rtcp_from": "198.18.1.1:30003", "rtcp_to": "127.0.0.1:5001"}}`, "loopback"},
	} {
		var e ErrorBody
		code := f.do(t, "POST", "/v1/flows", tc.body, &e)
		if code != http.StatusUnprocessableEntity || !strings.Contains(e.Error, tc.why) {
			t.Errorf("%s: %d %q, want 422 saying %q", tc.name, code, e.Error, tc.why)
		}
	}
	if f.xdp.Len() != 0 || user.Len() != 0 {
		t.Errorf("%d flows installed", f.xdp.Len()+user.Len())
	}
}

// TestCollectWorkers: the workers' delays become a cumulative histogram
// in seconds, the wake-ups three counters (socket, nap, signal), then the
// batches, the AF_XDP packets, the AF_XDP drops (no frame, ring full), the
// fill rings' frames (a gauge) and the lock waits.
func TestCollectWorkers(t *testing.T) {
	st := dataplane.WorkerStats{Wakeups: 7, Naps: 3, Interrupts: 5, Batches: 9, AFXDP: 4, AFXDPNoFrame: 11, AFXDPRingFull: 12, AFXDPFillFrames: 1024, LockWaits: 6, Flows: []int{40, 2}, DelaySum: 1500 * time.Microsecond}
	st.Delay[0], st.Delay[4], st.Delay[len(dataplane.DelayBounds)] = 2, 5, 1 // 2 under 5 us, 5 in (50, 100] us, 1 above 50 ms
	ch := make(chan prometheus.Metric, 20)
	collectWorkers(ch, st)
	close(ch)
	var got []string
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		if h := pb.GetHistogram(); h != nil {
			if h.GetSampleCount() != 8 || h.GetSampleSum() != 0.0015 {
				t.Errorf("histogram count %d sum %v, want 8 and 0.0015", h.GetSampleCount(), h.GetSampleSum())
			}
			for _, b := range h.GetBucket() {
				got = append(got, fmt.Sprintf("%g:%d", b.GetUpperBound(), b.GetCumulativeCount()))
			}
			continue
		}
		if g := pb.GetGauge(); g != nil {
			var labels string
			for _, l := range pb.GetLabel() {
				labels += fmt.Sprintf("{%s=%s}", l.GetName(), l.GetValue())
			}
			got = append(got, fmt.Sprint("gauge", labels, ":", g.GetValue()))
			continue
		}
		got = append(got, fmt.Sprint(pb.GetCounter().GetValue()))
	}
	want := "5e-06:2 1e-05:2 2.5e-05:2 5e-05:2 0.0001:7 0.0002:7 0.0003:7 0.0005:7 0.00075:7 0.001:7 0.002:7 0.005:7 0.01:7 0.05:7 7 3 5 9 4 11 12 gauge:1024 6 gauge{worker=0}:40 gauge{worker=1}:2"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("got %s\nwant %s", g, want)
	}
}
