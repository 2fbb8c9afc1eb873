package ng

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/ng/bencode"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
	"github.com/relayd/relayd/sdes"
)

var (
	relayInt = registry.Interface{Name: "internal", Addr: netip.MustParseAddr("198.18.1.1"), Addr6: netip.MustParseAddr("2001:2:0:1::1"), PortMin: 30000, PortMax: 30099}
	relayExt = registry.Interface{Name: "external", Addr: netip.MustParseAddr("198.18.3.1"), Advertise: netip.MustParseAddr("198.19.0.1"), PortMin: 40000, PortMax: 40099}
)

// engineRig is the ng engine on a call table over fake data planes, and
// the server in front of it.
type engineRig struct {
	xdp, us *dataplanetest.DataPlane
	calls   *call.Table
	engine  *CallEngine
	srv     *Server
	mu      sync.Mutex
	ended   []call.Info
	n       int
}

func newEngineRig(t *testing.T, mod func(*EngineConfig), ifaces ...registry.Interface) *engineRig {
	t.Helper()
	if len(ifaces) == 0 {
		ifaces = []registry.Interface{relayInt, relayExt}
	}
	r := &engineRig{xdp: dataplanetest.New(dataplane.PathXDP), us: dataplanetest.New(dataplane.PathUserspace)}
	reg, err := registry.New(registry.Config{Interfaces: ifaces}, zaptest.NewLogger(t), r.xdp, r.us)
	if err != nil {
		t.Fatal(err)
	}
	r.calls = call.NewTable(reg, zaptest.NewLogger(t))
	cfg := EngineConfig{Calls: r.calls, OnEnd: func(i call.Info) { r.mu.Lock(); r.ended = append(r.ended, i); r.mu.Unlock() }}
	if mod != nil {
		mod(&cfg)
	}
	r.engine, err = NewEngine(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	r.srv = newTestServer(t, r.engine, nil)
	return r
}

// do sends one command through the server's handler and returns the
// decoded reply.
func (r *engineRig) do(t *testing.T, kv ...any) bencode.Value {
	t.Helper()
	r.n++
	msg := append([]byte("c"+strings.Repeat("x", r.n)+" "), kdict(kv...)...)
	return decodeReply(t, exchange(t, r.srv, loopbackClient, msg))
}

func sdpOf(addr string, port string, extra ...string) string {
	fam := "IP4"
	if strings.Contains(addr, ":") {
		fam = "IP6"
	}
	return "v=0\r\no=- 7 7 IN " + fam + " " + addr + "\r\ns=-\r\nc=IN " + fam + " " + addr + "\r\nt=0 0\r\nm=audio " + port +
		" RTP/AVP 0 8 101\r\na=rtpmap:101 telephone-event/8000\r\n" + strings.Join(extra, "") + "a=sendrecv\r\n"
}

func wantOK(t *testing.T, v bencode.Value) {
	t.Helper()
	if got := v.GetString("result"); got != "ok" {
		t.Fatalf("result %q (%s), want ok", got, v.GetString("error-reason"))
	}
}

// TestEngineCall: a call offered, answered, queried and deleted as
// Kamailio drives rtpengine: both SDPs name the relay, four flows go into
// XDP, query reports the flows' counts in rtpengine's layout, delete
// removes the flows, gives the ports back and writes a record.
func TestEngineCall(t *testing.T) {
	r := newEngineRig(t, nil)
	off := r.do(t, "supports", []string{"load limit"}, "sdp", sdpOf("198.18.0.10", "4000"), "ICE", "remove",
		"replace", []string{"origin", "session-connection"}, "call-id", "call-1", "via-branch", "z9hG4bK-1",
		"received-from", []string{"IP4", "198.18.0.10"}, "from-tag", "alice", "command", "offer")
	wantOK(t, off)
	out := off.GetString("sdp")
	if !strings.Contains(out, "c=IN IP4 198.18.1.1") || !strings.Contains(out, "m=audio 300") || strings.Contains(out, "4000") {
		t.Fatalf("offer toward the callee not anchored on the relay:\n%s", out)
	}
	if !strings.Contains(out, "o=- 7 7 IN IP4 198.18.1.1\r\n") {
		t.Errorf("replace origin: want the caller's o= line with relayd's address:\n%s", out)
	}
	if !strings.Contains(out, "a=rtcp:30001\r\na=sendrecv\r\n") && !strings.Contains(out, "a=sendrecv\r\na=rtcp:") {
		t.Errorf("a=rtcp not in rtpengine's short form:\n%s", out)
	}
	ans := r.do(t, "supports", []string{"load limit"}, "sdp", sdpOf("198.18.2.2", "6000"), "call-id", "call-1",
		"from-tag", "alice", "to-tag", "bob", "command", "answer")
	wantOK(t, ans)
	back := ans.GetString("sdp")
	if !strings.Contains(back, "198.18.1.1") || strings.Contains(back, "6000") {
		t.Fatalf("answer toward the caller not anchored:\n%s", back)
	}
	// Without "replace origin" the callee's o= line stays, as rtpengine does.
	if !strings.Contains(back, "o=- 7 7 IN IP4 198.18.2.2") {
		t.Errorf("o= line of the answer replaced without replace origin:\n%s", back)
	}
	if n := r.xdp.Len(); n != 4 {
		t.Fatalf("%d XDP flows, want 4 (RTP and RTCP each way)", n)
	}
	list, _ := r.xdp.List()
	for _, fs := range list {
		if fs.Flow.Owner != dataplane.OwnerCall {
			t.Errorf("flow %s owner %s", fs.Flow.Match, fs.Flow.Owner)
		}
		if fs.Flow.ClockRate != 0 {
			r.xdp.SetStats(fs.Flow.Match, dataplane.Stats{Packets: 50, Bytes: 10000, SSRC: 0x1234, Received: 50, Lost: 0, LastSeen: time.Now()})
		}
	}
	q := r.do(t, "call-id", "call-1", "from-tag", "alice", "command", "query")
	wantOK(t, q)
	tot, _ := q.Get("totals")
	rtp, _ := tot.Get("RTP")
	if n, _ := rtp.GetInt("packets"); n != 100 {
		t.Errorf("query totals RTP packets %d, want 100: %s", n, q)
	}
	tags, _ := q.Get("tags")
	for _, tag := range []string{"alice", "bob"} {
		if _, ok := tags.Get(tag); !ok {
			t.Errorf("query lacks tag %s: %s", tag, q)
		}
	}
	ssrc, _ := q.Get("SSRC")
	if ssrc.Len() != 1 {
		t.Errorf("query SSRC %s, want one entry (both flows carry SSRC 0x1234)", ssrc)
	}
	if info := r.calls.List(); len(info) != 1 || info[0].Info().State != call.StateAnswered {
		t.Errorf("call table %v", info)
	}
	l := r.do(t, "command", "list")
	if calls, _ := l.Get("calls"); calls.Len() != 1 {
		t.Errorf("list %s", l)
	}
	del := r.do(t, "call-id", "call-1", "from-tag", "alice", "command", "delete")
	wantOK(t, del)
	if _, ok := del.Get("totals"); !ok {
		t.Errorf("delete reply without statistics: %s", del)
	}
	if r.xdp.Len() != 0 || r.calls.Len() != 0 {
		t.Errorf("%d flows, %d calls left after delete", r.xdp.Len(), r.calls.Len())
	}
	for _, p := range r.calls.Registry().Ports() {
		if p.Free != p.Pairs {
			t.Errorf("interface %q: %d of %d pairs free", p.Interface, p.Free, p.Pairs)
		}
	}
	if len(r.ended) != 1 || r.ended[0].Disposition != call.Answered || r.ended[0].Legs[call.A].FromTag != "alice" {
		t.Errorf("records %+v", r.ended)
	}
	// Delete again: rtpengine answers ok with a warning.
	again := r.do(t, "call-id", "call-1", "from-tag", "alice", "command", "delete")
	if again.GetString("result") != "ok" || again.GetString("warning") == "" {
		t.Errorf("second delete %s", again)
	}
	if l := r.do(t, "command", "list"); l.String() == "" {
		t.Error("no list reply")
	} else if calls, _ := l.Get("calls"); calls.Len() != 0 {
		t.Errorf("list after delete %s", l)
	}
}

// TestEngineDirection: direction puts each leg on its named interface;
// the SDP toward the external side names its advertised address (1:1
// NAT), the flows use its own address and ports.
func TestEngineDirection(t *testing.T) {
	r := newEngineRig(t, nil)
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "direction", []string{"internal", "external"},
		"call-id", "d", "from-tag", "a", "command", "offer"))
	ans := r.do(t, "sdp", sdpOf("198.18.2.2", "6000"), "call-id", "d", "from-tag", "a", "to-tag", "b", "command", "answer")
	wantOK(t, ans)
	if s := ans.GetString("sdp"); !strings.Contains(s, "c=IN IP4 198.18.1.1") {
		t.Errorf("answer to the internal side:\n%s", s)
	}
	st := r.calls.List()[0].Media.Streams()[0]
	if st.Ends[call.A].Relay != relayInt.Addr || st.Ends[call.B].Relay != relayExt.Addr || st.Ends[call.B].Port < 40000 {
		t.Errorf("ends %+v", st.Ends)
	}
	q := r.do(t, "call-id", "d", "command", "query")
	if !strings.Contains(q.String(), "198.18.3.1") {
		t.Errorf("query does not show the external local address: %s", q)
	}
}

// TestEngineDirectionSDP: the offer toward the external side names the
// advertised address.
func TestEngineDirectionSDP(t *testing.T) {
	r := newEngineRig(t, nil)
	off := r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "direction", []string{"internal", "external"},
		"call-id", "d", "from-tag", "a", "command", "offer")
	wantOK(t, off)
	if s := off.GetString("sdp"); !strings.Contains(s, "c=IN IP4 198.19.0.1") || !strings.Contains(s, "m=audio 400") {
		t.Errorf("offer to the external side:\n%s", s)
	}
	bad := r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "direction", []string{"internal", "dmz"},
		"call-id", "e", "from-tag", "a", "command", "offer")
	if bad.GetString("result") != "error" || !strings.Contains(bad.GetString("error-reason"), "dmz") {
		t.Errorf("unknown interface: %s", bad)
	}
	if r.calls.Len() != 1 {
		t.Errorf("%d calls: a refused offer must leave nothing", r.calls.Len())
	}
}

// TestEngineIPv6: IPv6 media on the offerer's side only, then on both.
func TestEngineIPv6(t *testing.T) {
	r := newEngineRig(t, nil)
	off := r.do(t, "sdp", sdpOf("2001:2::10", "4000"), "address-family", "IP4", "call-id", "v6", "from-tag", "a", "command", "offer")
	wantOK(t, off)
	if s := off.GetString("sdp"); !strings.Contains(s, "c=IN IP4 198.18.1.1") {
		t.Errorf("offer to an IPv4 callee:\n%s", s)
	}
	ans := r.do(t, "sdp", sdpOf("198.18.2.2", "6000"), "call-id", "v6", "from-tag", "a", "to-tag", "b", "command", "answer")
	wantOK(t, ans)
	if s := ans.GetString("sdp"); !strings.Contains(s, "c=IN IP6 2001:2:0:1::1") {
		t.Errorf("answer to the IPv6 caller:\n%s", s)
	}
	off = r.do(t, "sdp", sdpOf("2001:2::10", "4000"), "call-id", "v6b", "from-tag", "a", "command", "offer")
	if s := off.GetString("sdp"); !strings.Contains(s, "c=IN IP6 2001:2:0:1::1") {
		t.Errorf("offer to an IPv6 callee:\n%s", s)
	}
	wantOK(t, r.do(t, "sdp", sdpOf("2001:2::20", "6000"), "call-id", "v6b", "from-tag", "a", "to-tag", "b", "command", "answer"))
	list, _ := r.xdp.List()
	var six int
	for _, fs := range list {
		if fs.Flow.Match.Addr().Is6() && fs.Flow.SendTo.Addr().Is6() {
			six++
		}
	}
	if six != 4 {
		t.Errorf("%d IPv6-to-IPv6 flows, want 4 (the second call)", six)
	}
}

// TestEngineSDES: transport-protocol RTP/SAVP toward the callee: relayd
// offers its own key, the callee's answer key is taken, and the flows
// run in userspace.
func TestEngineSDES(t *testing.T) {
	r := newEngineRig(t, nil)
	off := r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "transport-protocol", "RTP/SAVP", "call-id", "s", "from-tag", "a", "command", "offer")
	wantOK(t, off)
	s := off.GetString("sdp")
	if !strings.Contains(s, "RTP/SAVP") || strings.Count(s, "a=crypto:") != 6 || !strings.Contains(s, "a=crypto:1 AEAD_AES_256_GCM inline:") {
		t.Fatalf("offer toward the callee without rtpengine's six suites relayd has:\n%s", s)
	}
	// The callee takes the fifth: AES_CM_128_HMAC_SHA1_80.
	key := s[strings.Index(s, "a=crypto:5 "):]
	key = key[:strings.Index(key, "\r\n")+2]
	if !strings.HasPrefix(key, "a=crypto:5 AES_CM_128_HMAC_SHA1_80 inline:") {
		t.Fatalf("fifth suite %q", key)
	}
	answer := strings.Replace(sdpOf("198.18.2.2", "6000", key), "RTP/AVP", "RTP/SAVP", 1)
	ans := r.do(t, "sdp", answer, "call-id", "s", "from-tag", "a", "to-tag", "b", "command", "answer")
	wantOK(t, ans)
	if b := ans.GetString("sdp"); strings.Contains(b, "crypto") || !strings.Contains(b, "RTP/AVP") {
		t.Errorf("answer to the plain caller:\n%s", b)
	}
	if r.us.Len() != 4 || r.xdp.Len() != 0 {
		t.Errorf("%d userspace, %d XDP flows; want the 4 in userspace", r.us.Len(), r.xdp.Len())
	}
	list, _ := r.us.List()
	for _, fs := range list {
		for _, k := range []*dataplane.SRTP{fs.Flow.Encrypt, fs.Flow.Decrypt} {
			if k != nil && k.Suite != "AES_CM_128_HMAC_SHA1_80" {
				t.Errorf("flow %s keyed with %s, want the suite the callee took", fs.Flow.Match, k.Suite)
			}
		}
	}
	// SDES-only-X and SDES-no-X narrow the offer.
	if got := offerSuites([]string{"only-AES_CM_128_HMAC_SHA1_32", "only-AEAD_AES_128_GCM"}); len(got) != 2 || got[0] != sdes.AEAD_AES_128_GCM {
		t.Errorf("only: %v", got)
	}
	if got := offerSuites([]string{"no-AEAD_AES_256_GCM", "no-AEAD_AES_128_GCM", "pad"}); len(got) != 4 || got[0] != sdes.AES_256_CM_HMAC_SHA1_80 {
		t.Errorf("no: %v", got)
	}
}

// TestEngineLimits: the session limit, the load limit and the port range
// are answered as Kamailio needs them to move to the next relay.
func TestEngineLimits(t *testing.T) {
	load := 0.1
	r := newEngineRig(t, func(c *EngineConfig) {
		c.MaxLoad = 1
		c.Load = func() (float64, error) { return load, nil }
	}, registry.Interface{Addr: relayInt.Addr, PortMin: 30000, PortMax: 30003})
	offer := func(id string, supports bool) bencode.Value {
		kv := []any{"sdp", sdpOf("198.18.0.10", "4000"), "call-id", id, "from-tag", "a", "command", "offer"}
		if supports {
			kv = append([]any{"supports", []string{"load limit"}}, kv...)
		}
		return r.do(t, kv...)
	}
	wantOK(t, offer("one", true))
	// Two pairs in the range: a second call has no ports.
	if got := offer("two", true); got.GetString("error-reason") != "Ran out of ports" {
		t.Errorf("ports exhausted: %s", got)
	}
	if r.calls.Len() != 1 {
		t.Errorf("%d calls after a refused offer", r.calls.Len())
	}
	r.calls.SetMaxSessions(1)
	if got := offer("three", true); got.GetString("result") != "load limit" {
		t.Errorf("session limit, client supports load limit: %s", got)
	}
	if got := offer("three", false); got.GetString("error-reason") != "Parallel session limit reached" {
		t.Errorf("session limit: %s", got)
	}
	r.calls.SetMaxSessions(0)
	load = 3
	if got := offer("four", true); got.GetString("result") != "load limit" {
		t.Errorf("load limit: %s", got)
	}
	// An offer within an existing call is not a new session.
	if got := offer("one", true); got.GetString("result") != "ok" {
		t.Errorf("re-offer under load: %s", got)
	}
}

// TestEngineErrors: commands that cannot be done, worded as rtpengine.
func TestCallEngineErrors(t *testing.T) {
	r := newEngineRig(t, nil)
	r.calls.SetCodecsAvailable(false) // built without G.729: no transcoding
	for _, tc := range []struct {
		name   string
		kv     []any
		result string
		reason string
	}{
		{"answer unknown", []any{"sdp", sdpOf("198.18.2.2", "6000"), "call-id", "x", "from-tag", "a", "to-tag", "b", "command", "answer"}, "error", "Unknown call-id"},
		{"query unknown", []any{"call-id", "x", "command", "query"}, "error", "Unknown call-id"},
		{"offer no sdp", []any{"call-id", "x", "from-tag", "a", "command", "offer"}, "error", "No SDP body in message"},
		{"offer bad sdp", []any{"sdp", "garbage", "call-id", "x", "from-tag", "a", "command", "offer"}, "error", "Failed to parse SDP"},
		{"transcode", []any{"sdp", sdpOf("198.18.0.10", "4000"), "codec", []byte("d4:maskl3:alle9:transcodel4:G729ee"), "call-id", "x", "from-tag", "a", "command", "offer"}, "error", "transcoding is not available"},
		{"DTLS", []any{"sdp", sdpOf("198.18.0.10", "4000"), "DTLS", "passive", "call-id", "x", "from-tag", "a", "command", "offer"}, "error", ""},
	} {
		got := r.do(t, tc.kv...)
		if got.GetString("result") != tc.result || tc.reason != "" && !strings.EqualFold(got.GetString("error-reason"), tc.reason) {
			t.Errorf("%s: %s, want %s %q", tc.name, got, tc.result, tc.reason)
		}
		if tc.reason == "" && got.GetString("error-reason") == "" {
			t.Errorf("%s: no error-reason", tc.name)
		}
	}
	if r.calls.Len() != 0 || r.xdp.Len() != 0 {
		t.Errorf("%d calls, %d flows after refused commands", r.calls.Len(), r.xdp.Len())
	}
	// Delete by a tag that is no party of the call: rtpengine's warning.
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "call-id", "y", "from-tag", "a", "command", "offer"))
	if got := r.do(t, "call-id", "y", "from-tag", "zzz", "command", "delete"); got.GetString("warning") == "" || r.calls.Len() != 1 {
		t.Errorf("delete with a foreign tag: %s (%d calls)", got, r.calls.Len())
	}
	// Delete by to-tag alone works once the answerer is known; by from-tag alone before.
	if got := r.do(t, "call-id", "y", "from-tag", "a", "command", "delete"); got.GetString("result") != "ok" || r.calls.Len() != 0 {
		t.Errorf("delete by from-tag: %s", got)
	}
}

// TestEngineResentAnswer: the same answer again (a retransmitted 200
// through the proxy, with a new cookie) gets the same SDP back; a late
// offer (the callee's SDP in the 200, answered in the ACK) works with the
// callee as offerer.
func TestEngineResentAnswer(t *testing.T) {
	r := newEngineRig(t, nil)
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "call-id", "r", "from-tag", "a", "command", "offer"))
	ans := sdpOf("198.18.2.2", "6000")
	first := r.do(t, "sdp", ans, "call-id", "r", "from-tag", "a", "to-tag", "b", "command", "answer")
	second := r.do(t, "sdp", ans, "call-id", "r", "from-tag", "a", "to-tag", "b", "command", "answer")
	wantOK(t, second)
	if first.GetString("sdp") != second.GetString("sdp") {
		t.Errorf("resent answer got another SDP:\n%s\n%s", first.GetString("sdp"), second.GetString("sdp"))
	}
	// Late offer: Kamailio sends the 200's SDP as an offer from the
	// callee's tag, and the ACK's as the answer.
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.2.2", "6002"), "call-id", "late", "from-tag", "callee", "to-tag", "caller", "command", "offer"))
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.10", "4002"), "call-id", "late", "from-tag", "callee", "to-tag", "caller", "command", "answer"))
	if got := r.do(t, "call-id", "late", "to-tag", "caller", "command", "delete"); got.GetString("result") != "ok" || got.GetString("warning") != "" {
		t.Errorf("delete by to-tag: %s", got)
	}
}

// TestEngineSweep: an offer never answered is ended after the media
// timeout since its last command; an answered call without media too.
func TestEngineSweep(t *testing.T) {
	r := newEngineRig(t, func(c *EngineConfig) { c.MediaTimeout = time.Minute })
	now := time.Now()
	r.engine.now = func() time.Time { return now }
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "call-id", "o", "from-tag", "a", "command", "offer"))
	r.engine.Sweep()
	if r.calls.Len() != 1 {
		t.Fatal("fresh offer swept")
	}
	now = now.Add(2 * time.Minute)
	r.engine.Sweep()
	if r.calls.Len() != 0 || r.xdp.Len() != 0 {
		t.Errorf("unanswered offer not swept: %d calls, %d flows", r.calls.Len(), r.xdp.Len())
	}
	if len(r.ended) != 1 || r.ended[0].Disposition != call.Failed {
		t.Errorf("records %+v", r.ended)
	}
	st, err := r.engine.Statistics(context.Background(), &Request{})
	if err != nil || st.Statistics.OfferTimeoutSessions != 1 || st.Statistics.ManagedSessions != 1 {
		t.Errorf("statistics %+v %v", st.Statistics, err)
	}
}

func TestEngineConfig(t *testing.T) {
	if _, err := NewEngine(EngineConfig{}, zaptest.NewLogger(t)); err == nil {
		t.Error("no call table accepted")
	}
	r := newEngineRig(t, nil)
	if _, err := NewEngine(EngineConfig{Calls: r.calls, MaxLoad: 1}, zaptest.NewLogger(t)); err == nil {
		t.Error("max load without a load source accepted")
	}
	if !errors.Is(engineError(call.ErrNoPorts), ErrNoPorts) || !errors.Is(engineError(call.ErrSessionLimit), ErrSessionLimit) {
		t.Error("engineError mapping")
	}
}

// BenchmarkEngineCall: one call's offer, answer and delete through the
// server's handler on fake data planes: the control plane's own cost,
// without the data planes' installs.
func BenchmarkEngineCall(b *testing.B) {
	r := newEngineRigB(b)
	offer := sdpOf("198.18.0.10", "4000")
	answer := sdpOf("198.18.2.2", "6000")
	b.ReportAllocs()
	for i := range b.N {
		id := fmt.Sprintf("bench-%d", i)
		for k, kv := range [][]any{
			{"sdp", offer, "call-id", id, "from-tag", "a", "command", "offer"},
			{"sdp", answer, "call-id", id, "from-tag", "a", "to-tag", "b", "command", "answer"},
			{"call-id", id, "from-tag", "a", "command", "delete"},
		} {
			msg := append([]byte(fmt.Sprintf("%s-%d ", id, k)), kdict(kv...)...)
			var got []byte
			r.srv.handle(context.Background(), loopbackClient, msg, func(p []byte) { got = p })
			if !strings.Contains(string(got), "2:ok") {
				b.Fatalf("reply %q", got)
			}
		}
	}
}

func newEngineRigB(b *testing.B) *engineRig {
	r := &engineRig{xdp: dataplanetest.New(dataplane.PathXDP), us: dataplanetest.New(dataplane.PathUserspace)}
	log := zaptest.NewLogger(b, zaptest.Level(zapcore.WarnLevel))
	reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{relayInt}}, log, r.xdp, r.us)
	if err != nil {
		b.Fatal(err)
	}
	r.calls = call.NewTable(reg, log)
	r.engine, err = NewEngine(EngineConfig{Calls: r.calls}, log)
	if err != nil {
		b.Fatal(err)
	}
	r.srv, err = New(Config{Listen: []string{"udp:127.0.0.1:0"}}, r.engine, log)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// memStore is a Store in memory.
type memStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *memStore) Put(ns, k string, v []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string][]byte)
	}
	s.m[ns+"/"+k] = append([]byte(nil), v...)
	return nil
}

func (s *memStore) Get(ns, k string) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[ns+"/"+k]
	return append([]byte(nil), v...), ok, nil
}

func (s *memStore) Delete(ns, k string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, ns+"/"+k)
	return nil
}

func (s *memStore) ForEach(ns string, f func(k string, v []byte) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.m {
		if key, ok := strings.CutPrefix(k, ns+"/"); ok {
			if err := f(key, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestEngineRestart: with a store, relayd stopping leaves an answered ng
// call up (its flows in the data plane, no record written); the next run
// takes it back: its flows are claimed, not swept, the proxy queries and
// deletes it as before. A call only offered ends at the stop.
func TestEngineRestart(t *testing.T) {
	store := &memStore{}
	r := newEngineRig(t, func(c *EngineConfig) { c.Store = store })
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "direction", []string{"internal", "external"}, "call-id", "kept", "from-tag", "a", "command", "offer"))
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.2.2", "6000"), "call-id", "kept", "from-tag", "a", "to-tag", "b", "command", "answer"))
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.11", "4000"), "call-id", "offered", "from-tag", "a", "command", "offer"))
	r.engine.Close()
	before, _ := r.xdp.List()
	if len(r.ended) != 1 || r.ended[0].Legs[call.A].CallID != "offered" {
		t.Errorf("records at the stop %+v, want only the offered call's", r.ended)
	}
	if n := r.xdp.Len(); n != 4 {
		t.Fatalf("%d flows left for the next run, want the answered call's 4", n)
	}

	// The next run, over the same data planes.
	reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{relayInt, relayExt}}, zaptest.NewLogger(t), r.xdp, r.us)
	if err != nil {
		t.Fatal(err)
	}
	calls := call.NewTable(reg, zaptest.NewLogger(t))
	e2, err := NewEngine(EngineConfig{Calls: calls, Store: store}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if n := e2.Restore(); n != 1 {
		t.Fatalf("restored %d calls, want 1", n)
	}
	if n := reg.Unclaimed(); n != 0 {
		t.Errorf("%d flows nobody claimed", n)
	}
	after, _ := r.xdp.List()
	if len(after) != len(before) {
		t.Errorf("flows changed across the restart: %d -> %d", len(before), len(after))
	}
	for i := range after {
		if after[i].Flow.ID != before[i].Flow.ID || after[i].Flow.Match != before[i].Flow.Match {
			t.Errorf("flow %s (id %d) became %s (id %d)", before[i].Flow.Match, before[i].Flow.ID, after[i].Flow.Match, after[i].Flow.ID)
		}
	}
	r2 := &engineRig{xdp: r.xdp, us: r.us, calls: calls, engine: e2, srv: newTestServer(t, e2, nil)}
	q := r2.do(t, "call-id", "kept", "command", "query")
	wantOK(t, q)
	if tags, _ := q.Get("tags"); tags.Len() != 2 {
		t.Errorf("restored call's tags %s", q)
	}
	// A re-offer after the restart keeps the legs on their interfaces.
	off := r2.do(t, "sdp", sdpOf("198.18.0.10", "4002"), "direction", []string{"internal", "external"}, "call-id", "kept", "from-tag", "a", "to-tag", "b", "command", "offer")
	wantOK(t, off)
	if s := off.GetString("sdp"); !strings.Contains(s, "198.19.0.1") {
		t.Errorf("re-offer after the restart:\n%s", s)
	}
	wantOK(t, r2.do(t, "call-id", "kept", "from-tag", "a", "command", "delete"))
	if r.xdp.Len() != 0 || calls.Len() != 0 || len(store.m) != 0 {
		t.Errorf("after delete: %d flows, %d calls, %d records", r.xdp.Len(), calls.Len(), len(store.m))
	}
}

// FuzzCallEngine: commands into the server in front of the real engine
// (fake data planes): whatever the SDP and flags, the engine never panics
// (the server would answer "internal error") and every reply decodes.
// Each input runs an offer with it as SDP and then as the whole message,
// then an answer and a delete, on a call-id of its own.
func FuzzCallEngine(f *testing.F) {
	f.Add([]byte(sdpOf("198.18.0.10", "4000")), "RTP/SAVP", "internal external")
	f.Add([]byte(sdpOf("2001:2::10", "4000", "a=rtcp-mux\r\na=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz\r\n")), "RTP/AVP", "external")
	f.Add([]byte("v=0\r\nc=IN IP4 0.0.0.0\r\nm=audio 0 RTP/AVP\r\n"), "", "")
	r := &engineRig{xdp: dataplanetest.New(dataplane.PathXDP), us: dataplanetest.New(dataplane.PathUserspace)}
	log := zap.NewNop()
	reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{relayInt, relayExt}}, log, r.xdp, r.us)
	if err != nil {
		f.Fatal(err)
	}
	r.calls = call.NewTable(reg, log)
	if r.engine, err = NewEngine(EngineConfig{Calls: r.calls}, log); err != nil {
		f.Fatal(err)
	}
	if r.srv, err = New(Config{Listen: []string{"udp:127.0.0.1:0"}}, r.engine, log); err != nil {
		f.Fatal(err)
	}
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, body []byte, proto, direction string) {
		id := fmt.Sprintf("fuzz-%d", n.Add(1))
		dir := strings.Fields(direction)
		for i, kv := range [][]any{
			{"sdp", string(body), "transport-protocol", proto, "direction", dir, "call-id", id, "from-tag", "a", "command", "offer"},
			{"sdp", sdpOf("198.18.2.2", "6000"), "call-id", id, "from-tag", "a", "to-tag", "b", "command", "answer"},
			{"call-id", id, "from-tag", "a", "command", "query"},
			{"call-id", id, "command", "delete"},
		} {
			msg := append([]byte(fmt.Sprintf("%s-%d ", id, i)), kdict(kv...)...)
			var got []byte
			r.srv.handle(context.Background(), loopbackClient, msg, func(p []byte) { got = p })
			sp := strings.IndexByte(string(got), ' ')
			v, err := bencode.Unmarshal(got[sp+1:])
			if err != nil {
				t.Fatalf("reply %q: %v", got, err)
			}
			if reason := v.GetString("error-reason"); strings.Contains(reason, "internal error") {
				t.Fatalf("engine panicked on %q", msg)
			}
		}
		if r.calls.Len() != 0 {
			t.Fatalf("%d calls left after delete", r.calls.Len())
		}
	})
}
