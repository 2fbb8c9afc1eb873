package admin

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/admin/admintest"
	"github.com/relayd/relayd/control/call"
)

// FuzzPostFlow checks that no request body makes POST /v1/flows answer
// with a 5xx other than 501 (not implemented), or panic.
func FuzzPostFlow(f *testing.F) {
	f.Add(designFlow)
	f.Add(`{"match":"198.18.1.1:30010","action":"reflect","clock_rate":48000}`)
	f.Add(`{"match":"[2001:2::1]:30000","send_from":"[2001:2::1]:30002","send_to":"[2001:2::2]:5000"}`)
	f.Add(`{"match":"[::ffff:198.18.1.1]:30000","action":"drop"}`)
	f.Add(`{"match":"198.18.1.1:30000","send_from":"198.18.1.1:30002","send_to":"[2001:2::2]:5000"}`)
	f.Add(`{"match":"198.18.1.1:30000","expect_source":"[fe80::1%eth0]:1","action":"drop"}`)
	f.Add(`{"match":"198.18.1.1:30000","encrypt":{"suite":"AEAD_AES_128_GCM","key":"AAAA"}}`)
	f.Add(`{"match":null,"decrypt":null}`)
	f.Add(`{"match":"198.18.1.1:30010","send_from":"198.18.1.1:30012","send_to":"198.18.2.2:5000","transcode":{"from":"PCMU","to":"G729","ptime_to":30,"event_from":101,"event_to":96,"vad_to":true,"rtcp_from":"198.18.1.1:30013","rtcp_to":"198.18.2.2:5001"}}`)
	f.Add(`{"match":"198.18.1.1:30010","send_from":"198.18.1.1:30012","send_to":"198.18.2.2:5000","transcode":{"from":"g729","to":"pcma","pt_from":200,"ptime_from":25}}`)
	f.Add(`{"match":"198.18.1.1:30010","action":"drop","transcode":{"from":"PCMU","to":"PCMU","cn_to":13,"event_to":13}}`)
	// Log nowhere: *F methods may not be used inside the fuzz target.
	fx := newFixtureLog(f, zap.NewNop())
	h := fx.srv.Config.Handler
	f.Fuzz(func(t *testing.T, body string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/flows", strings.NewReader(body)))
		if rec.Code >= 500 && rec.Code != http.StatusNotImplemented {
			t.Fatalf("body %q: %d %s", body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 && !strings.Contains(rec.Body.String(), `"error"`) {
			t.Fatalf("body %q: %d without error body: %s", body, rec.Code, rec.Body)
		}
	})
}

// FuzzDrain checks that no body makes POST /v1/drain fail with a 5xx or
// panic, and that only a valid positive timeout starts a drain.
func FuzzDrain(f *testing.F) {
	f.Add(``)
	f.Add(`{"timeout":"10m"}`)
	f.Add(`{"timeout":"-1s"}`)
	f.Add(`{"timeout":"1e400h"}`)
	f.Add(`{"timeout":null}`)
	f.Add(`{} {}`)
	log := zap.NewNop()
	fx := newFixtureLog(f, log)
	f.Fuzz(func(t *testing.T, body string) {
		ctl := &admintest.Control{Calls: mustTable(t)}
		h := New(Config{Version: "fuzz", Control: ctl, Calls: ctl.Calls}, fx.mgr, log).Handler()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/drain", strings.NewReader(body)))
		on, _ := ctl.Draining()
		switch {
		case rec.Code >= 500:
			t.Fatalf("body %q: %d %s", body, rec.Code, rec.Body)
		case rec.Code == http.StatusAccepted && !on, rec.Code != http.StatusAccepted && on:
			t.Fatalf("body %q: %d but draining %v", body, rec.Code, on)
		case rec.Code >= 400 && !strings.Contains(rec.Body.String(), `"error"`):
			t.Fatalf("body %q: %d without error body: %s", body, rec.Code, rec.Body)
		}
	})
}

func mustTable(t *testing.T) *call.Table {
	t.Helper()
	_, reg := newManager(t, callRange(), zap.NewNop())
	return call.NewTable(reg, zap.NewNop())
}
