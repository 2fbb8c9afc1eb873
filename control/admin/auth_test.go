package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

// TestBearerToken: with a token every endpoint but /healthz answers 401
// (RFC 6750's challenge, a JSON error) without it or with another; the
// token opens all; /healthz says only "ok" without it; the refusals are
// counted in /metrics; SetToken rotates it and "" turns it off.
func TestBearerToken(t *testing.T) {
	log := zaptest.NewLogger(t)
	xdp := dataplanetest.New(dataplane.PathXDP)
	mgr, _ := newManager(t, mgrCfg, log, xdp)
	s := New(Config{Observers: []dataplane.Observer{xdp}, Version: "test", Token: "0123456789abcdef-one"}, mgr, log)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	req := func(method, path, auth, body string) (int, http.Header, string) {
		t.Helper()
		r, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}

	for _, auth := range []string{"", "Bearer wrong-token-0123456789", "Bearer 0123456789abcdef-on", "Basic MDEyMzQ1Njc4OWFiY2RlZi1vbmU=", "0123456789abcdef-one"} {
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/v1/flows", ""}, {"POST", "/v1/flows", designFlow}, {"DELETE", "/v1/flows/1", ""},
			{"GET", "/metrics", ""}, {"GET", "/v1/calls", ""}, {"POST", "/v1/drain", ""}, {"GET", "/nosuch", ""},
		} {
			code, h, body := req(r.method, r.path, auth, r.body)
			var e ErrorBody
			if code != http.StatusUnauthorized || h.Get("WWW-Authenticate") != `Bearer realm="relayd"` ||
				json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("%s %s with %q: %d %q %q; want 401 with the challenge and a JSON error", r.method, r.path, auth, code, h.Get("WWW-Authenticate"), body)
			}
		}
	}
	if n, _ := mgr.List(); len(n) != 0 {
		t.Fatalf("a refused POST installed %d flows", len(n))
	}
	if code, _, body := req("GET", "/healthz", "", ""); code != 200 || strings.Join(strings.Fields(body), "") != `{"status":"ok"}` {
		t.Errorf("healthz without the token: %d %s; want 200 and only the status", code, body)
	}
	const good = "Bearer 0123456789abcdef-one"
	if code, _, body := req("GET", "/healthz", good, ""); code != 200 || !strings.Contains(body, `"version": "test"`) {
		t.Errorf("healthz with the token: %d %s; want the version too", code, body)
	}
	if code, _, body := req("POST", "/v1/flows", good, designFlow); code != http.StatusCreated {
		t.Errorf("POST with the token: %d %s", code, body)
	}
	_, _, metrics := req("GET", "/metrics", good, "")
	if !strings.Contains(metrics, "relayd_admin_unauthorized_requests_total 35\n") {
		t.Errorf("/metrics does not count the 35 refusals:\n%s", grepLines(metrics, "unauthorized"))
	}

	s.SetToken("fedcba9876543210-two")
	if code, _, _ := req("GET", "/v1/flows", good, ""); code != http.StatusUnauthorized {
		t.Errorf("the old token after rotation: %d, want 401", code)
	}
	if code, _, _ := req("GET", "/v1/flows", "Bearer fedcba9876543210-two", ""); code != 200 {
		t.Errorf("the new token: %d, want 200", code)
	}
	s.SetToken("")
	if code, _, _ := req("GET", "/v1/flows", "", ""); code != 200 {
		t.Errorf("no token asked for: %d, want 200", code)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
