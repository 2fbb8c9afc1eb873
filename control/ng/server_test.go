package ng

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relayd/relayd/control/ng/bencode"
)

func decodeReply(t *testing.T, b []byte) bencode.Value {
	t.Helper()
	v, err := bencode.Unmarshal(b)
	if err != nil {
		t.Fatalf("reply %q: %v", b, err)
	}
	return v
}

// The replies the server makes itself match rtpengine 10.5's, captured
// from it for the same requests.
func TestErrorRepliesMatchRtpengine(t *testing.T) {
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) {
		switch r.Command {
		case CmdQuery, CmdAnswer:
			return nil, ErrUnknownCall
		case CmdDelete:
			return nil, fmt.Errorf("call %s: %w", r.CallID, ErrUnknownCall)
		case CmdOffer:
			return nil, ErrBadSDP
		}
		return nil, nil
	}}
	s := newTestServer(t, e, nil)
	sdpB := "v=0\r\n"
	tests := []struct {
		name string
		msg  []byte
	}{
		{"ping-reply", kdict("command", "ping")},
		{"delete-unknown-reply", kdict("call-id", "nope", "from-tag", "x", "command", "delete")},
		{"delete-unknown-fatal-reply", kdict("call-id", "nope", "from-tag", "x", "flags", []string{"fatal"}, "command", "delete")},
		{"query-unknown-reply", kdict("call-id", "nope", "command", "query")},
		{"query-no-callid-reply", kdict("command", "query")},
		{"no-command-reply", kdict("call-id", "x")},
		{"invalid-format-reply", []byte("hello")},
		{"unknown-command-reply", kdict("command", "frobnicate")},
		{"offer-no-sdp-reply", kdict("call-id", "c2", "from-tag", "f", "command", "offer")},
		{"offer-no-fromtag-reply", kdict("call-id", "c2", "sdp", testSDP, "command", "offer")},
		{"answer-no-totag-reply", kdict("call-id", "c2", "from-tag", "f", "sdp", sdpB, "command", "answer")},
		{"answer-unknown-reply", kdict("call-id", "c3", "from-tag", "f", "to-tag", "t", "sdp", sdpB, "command", "answer")},
		{"offer-bad-sdp-reply", kdict("call-id", "c2", "from-tag", "f", "sdp", "garbage", "command", "offer")},
		{"list-negative-reply", kdict("command", "list", "limit", -1)},
		{"command-int-reply", kdict("command", 5)},
		{"empty-payload-reply", nil},
		{"list-not-dict-reply", []byte("dl4:pinge")},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := append([]byte(fmt.Sprintf("c%d ", i)), tt.msg...)
			got := decodeReply(t, exchange(t, s, loopbackClient, msg))
			want := captured(t, tt.name)
			if !got.Equal(want) {
				t.Errorf("reply %v, rtpengine %v", got, want)
			}
		})
	}
	// list -1 is rtpengine's "invalid limit"; with -1 meaning absent
	// internally, the engine must not have seen it.
	for _, r := range e.calls {
		if r.Command == CmdList {
			t.Errorf("engine got list with limit %d", r.Limit)
		}
	}
}

func TestJSONRequests(t *testing.T) {
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) {
		return &Reply{Calls: []string{"a", "b"}}, nil
	}}
	s := newTestServer(t, e, nil)
	for name, tc := range map[string]struct{ msg, want string }{
		"json-ping-reply": {`j1 {"command":"ping"}`, ""},
		"json-bad-reply":  {`j2 {"command":`, ""},
	} {
		got := exchange(t, s, loopbackClient, []byte(tc.msg))
		want := captured(t, name) // rtpengine's JSON, parsed
		gv, err := decodeJSON(got)
		if err != nil {
			t.Fatalf("%s: reply %q is not JSON: %v", name, got, err)
		}
		if !gv.Equal(want) {
			t.Errorf("%s: reply %s, rtpengine %v", name, got, want)
		}
	}
	got := exchange(t, s, loopbackClient, []byte(`j3 {"command":"list","limit":1,"flags":["trust-address"],"x":null,"strict-source":true}`))
	if string(got) != `{"calls":["a"],"result":"ok"}` {
		t.Errorf("JSON list reply %s", got)
	}
	if r := e.last(); r.Limit != 1 || !r.Flags.Has("trust-address") || !r.Flags.Has("strict-source") {
		t.Errorf("JSON request parsed as %+v", r)
	}
}

func TestPingDoesNotCallEngine(t *testing.T) {
	e := &fakeEngine{}
	s := newTestServer(t, e, nil)
	got := decodeReply(t, exchange(t, s, loopbackClient, encode(t, "p1", bencode.Dict(bencode.Entry{Key: "command", Value: bencode.String("ping")}))))
	if got.GetString("result") != "pong" || e.count() != 0 {
		t.Errorf("ping: %v, engine calls %d", got, e.count())
	}
}

func TestCommandsReachEngine(t *testing.T) {
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) {
		switch r.Command {
		case CmdOffer, CmdAnswer:
			return &Reply{SDP: "v=0 " + r.Command}, nil
		case CmdList:
			return &Reply{Calls: make([]string, 40)}, nil
		case CmdStatistics:
			return &Reply{Statistics: &Statistics{SessionsOwn: 3}}, nil
		case CmdDelete:
			return &Reply{Warning: "lingering"}, nil
		}
		return &Reply{Call: &CallStats{}}, nil
	}}
	s := newTestServer(t, e, nil)
	for i, tc := range []struct {
		msg   []byte
		check func(v bencode.Value) bool
	}{
		{kamailioOffer("c1"), func(v bencode.Value) bool { return v.GetString("sdp") == "v=0 offer" }},
		{kdict("command", "answer", "call-id", "c1", "from-tag", "f", "to-tag", "t", "sdp", "v=0"), func(v bencode.Value) bool { return v.GetString("sdp") == "v=0 answer" }},
		{kdict("command", "list"), func(v bencode.Value) bool { c, _ := v.Get("calls"); return c.Len() == 32 }},
		{kdict("command", "list", "limit", "3"), func(v bencode.Value) bool { c, _ := v.Get("calls"); return c.Len() == 3 }},
		{kdict("command", "statistics"), func(v bencode.Value) bool {
			st, _ := v.Get("statistics")
			cur, _ := st.Get("currentstatistics")
			n, _ := cur.GetInt("sessionsown")
			return n == 3
		}},
		{kdict("command", "delete", "call-id", "c1"), func(v bencode.Value) bool { return v.GetString("warning") == "lingering" }},
		{kdict("command", "query", "call-id", "c1"), func(v bencode.Value) bool { _, ok := v.Get("totals"); return ok }},
	} {
		v := decodeReply(t, exchange(t, s, loopbackClient, append([]byte(fmt.Sprintf("k%d ", i)), tc.msg...)))
		if v.GetString("result") != "ok" || !tc.check(v) {
			t.Errorf("%q: reply %v", tc.msg, v)
		}
	}
	if e.count() != 7 {
		t.Errorf("engine calls %d, want 7", e.count())
	}
	// Other rtpengine commands are refused without the engine.
	v := decodeReply(t, exchange(t, s, loopbackClient, append([]byte("u1 "), kdict("command", "play media", "call-id", "c")...)))
	if v.GetString("error-reason") != "Unsupported command" || e.count() != 7 {
		t.Errorf("play media: %v", v)
	}
}

func TestEngineErrors(t *testing.T) {
	var mu sync.Mutex
	var next error
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) {
		mu.Lock()
		defer mu.Unlock()
		return nil, next
	}}
	s := newTestServer(t, e, nil)
	offer := func(supports bool) []byte {
		if supports {
			return kamailioOffer("c1")
		}
		return kdict("command", "offer", "call-id", "c1", "from-tag", "f", "sdp", "v=0")
	}
	tests := []struct {
		err      error
		supports bool
		want     bencode.Value
	}{
		{ErrSessionLimit, true, errorDict(ResultLoadLimit, "Parallel session limit reached")},
		{ErrSessionLimit, false, errorDict(ResultError, "Parallel session limit reached")},
		{fmt.Errorf("cpu: %w", ErrCPULimit), true, errorDict(ResultLoadLimit, "CPU usage limit exceeded")},
		{ErrLoadLimit, false, errorDict(ResultError, "Parallel session limit reached")},
		{ErrBandwidthLimit, true, errorDict(ResultLoadLimit, "Bandwidth limit exceeded")},
		{fmt.Errorf("allocate: %w", ErrNoPorts), true, errorDict(ResultError, "Ran out of ports")},
		{errors.New("disk on fire"), true, errorDict(ResultError, "disk on fire")},
	}
	for i, tt := range tests {
		mu.Lock()
		next = tt.err
		mu.Unlock()
		got := decodeReply(t, exchange(t, s, loopbackClient, append([]byte(fmt.Sprintf("e%d ", i)), offer(tt.supports)...)))
		if !got.Equal(tt.want) {
			t.Errorf("%v (supports %v): reply %v, want %v", tt.err, tt.supports, got, tt.want)
		}
	}
	if n := testutil.ToFloat64(s.metrics.commands.WithLabelValues("offer", "load limit")); n != 3 {
		t.Errorf("load limit count %v, want 3", n)
	}
	// A panicking engine answers an error and the server lives on.
	e.fn = func(ctx context.Context, r *Request) (*Reply, error) { panic("boom") }
	got := decodeReply(t, exchange(t, s, loopbackClient, append([]byte("panic "), offer(true)...)))
	if got.GetString("result") != "error" {
		t.Errorf("panic: %v", got)
	}
}

func TestCookieCache(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1800000000, 0)}
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) {
		return &Reply{SDP: fmt.Sprintf("n=%d", time.Now().UnixNano())}, nil
	}}
	s := newTestServer(t, e, func(c *Config) { c.Now = clock.now; c.CacheTTL = 30 * time.Second; c.CacheEntries = 4 })
	msg := append([]byte("same "), kamailioOffer("c1")...)
	first := exchange(t, s, loopbackClient, msg)
	for range 5 { // Kamailio's resends
		clock.advance(time.Second)
		if again := exchange(t, s, loopbackClient, msg); string(again) != string(first) {
			t.Fatalf("resend answered %q, first %q", again, first)
		}
	}
	if e.count() != 1 {
		t.Fatalf("engine ran %d times for one cookie", e.count())
	}
	if n := testutil.ToFloat64(s.metrics.duplicates); n != 5 {
		t.Errorf("duplicates %v, want 5", n)
	}
	// The same cookie from another client is another request.
	exchange(t, s, netip.MustParseAddrPort("127.0.0.2:5060"), msg)
	if e.count() != 2 {
		t.Errorf("engine ran %d times, want 2 (other client)", e.count())
	}
	// After the TTL the cookie is forgotten.
	clock.advance(31 * time.Second)
	exchange(t, s, loopbackClient, msg)
	if e.count() != 3 {
		t.Errorf("engine ran %d times, want 3 (expired)", e.count())
	}
	// Bounded: many cookies keep at most CacheEntries.
	for i := range 20 {
		exchange(t, s, loopbackClient, append([]byte(fmt.Sprintf("x%d ", i)), kdict("command", "ping")...))
	}
	if n := s.cache.len(); n > 4 {
		t.Errorf("cache holds %d entries, limit 4", n)
	}
}

// A resend arriving while the first copy still runs waits for its reply;
// the command runs once.
func TestCookieCacheConcurrentDuplicate(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) {
		started <- struct{}{}
		<-release
		return &Reply{SDP: "v=0 slow"}, nil
	}}
	s := newTestServer(t, e, nil)
	msg := append([]byte("slow "), kamailioOffer("c1")...)
	replies := make(chan []byte, 3)
	var wg sync.WaitGroup
	wg.Go(func() { s.handle(context.Background(), loopbackClient, msg, func(b []byte) { replies <- b }) })
	<-started
	for range 2 {
		s.handle(context.Background(), loopbackClient, msg, func(b []byte) { replies <- b })
	}
	select {
	case b := <-replies:
		t.Fatalf("duplicate answered before the command finished: %q", b)
	default:
	}
	close(release)
	wg.Wait()
	for range 3 {
		select {
		case b := <-replies:
			if !strings.Contains(string(b), "v=0 slow") {
				t.Errorf("reply %q", b)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a duplicate got no reply")
		}
	}
	if e.count() != 1 {
		t.Errorf("engine ran %d times", e.count())
	}
}

func TestNoCookieNoReply(t *testing.T) {
	s := newTestServer(t, &fakeEngine{}, nil)
	for _, msg := range []string{"", "nocookie", " d7:command4:pinge"} {
		if got := exchange2(s, msg); got != nil {
			t.Errorf("%q answered %q", msg, got)
		}
	}
	if n := testutil.ToFloat64(s.metrics.ignored.WithLabelValues(ignoredMalformed)); n != 3 {
		t.Errorf("malformed %v, want 3", n)
	}
}

func exchange2(s *Server, msg string) []byte {
	var got []byte
	s.handle(context.Background(), loopbackClient, []byte(msg), func(b []byte) { got = b })
	return got
}

func TestAllowList(t *testing.T) {
	e := &fakeEngine{}
	s := newTestServer(t, e, nil) // loopback only
	if s.submit(job{from: netip.MustParseAddrPort("198.18.0.1:5060"), msg: []byte("a d7:command4:pinge"), send: func([]byte) {}}) {
		t.Error("non-loopback client accepted without an allow list")
	}
	if !s.allowed(netip.MustParseAddr("::1")) || !s.allowed(netip.MustParseAddr("::ffff:127.0.0.1")) {
		t.Error("loopback refused")
	}
	s2 := newTestServer(t, e, func(c *Config) {
		c.Listen = []string{"udp:198.18.0.1:2223"}
		c.Allow = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24")}
	})
	if !s2.allowed(netip.MustParseAddr("198.18.0.77")) || s2.allowed(netip.MustParseAddr("198.18.1.1")) || s2.allowed(netip.MustParseAddr("127.0.0.1")) {
		t.Error("allow list not applied")
	}
	if n := testutil.ToFloat64(s.metrics.ignored.WithLabelValues(ignoredNotAllowed)); n != 1 {
		t.Errorf("not allowed count %v, want 1", n)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{Listen: []string{"udp:127.0.0.1:2223", "tcp:[::1]:2223", "http:127.0.0.1:2225"}}, true},
		{Config{}, false},
		{Config{Listen: []string{"udp:0.0.0.0:2223"}}, false},
		{Config{Listen: []string{"udp:198.18.0.1:2223"}, Allow: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}}, true},
		{Config{Listen: []string{"sctp:127.0.0.1:2223"}}, false},
		{Config{Listen: []string{"udp:localhost:2223"}}, false},
		{Config{Listen: []string{"127.0.0.1:2223"}}, false},
		{Config{Listen: []string{"udp:127.0.0.1:2223"}, Workers: -1}, false},
	} {
		_, err := New(tc.cfg, &fakeEngine{}, nil)
		if (err == nil) != tc.ok {
			t.Errorf("%+v: err %v", tc.cfg, err)
		}
	}
	if _, err := New(Config{Listen: []string{"udp:127.0.0.1:0"}}, nil, nil); err == nil {
		t.Error("nil engine accepted")
	}
}

// The encoded query reply of a typed CallStats has the layout of
// rtpengine 10.5's (keys and nesting; values differ).
func TestQueryReplyLayout(t *testing.T) {
	now := time.Unix(1796017321, 499683000)
	// callWith builds a call like the captured ones: with media seen
	// (codec, SSRC) or not, with a via-branch or not.
	callWith := func(mediaSeen bool, via string) *CallStats {
		stream := func(rtcp bool, port uint16) StreamStats {
			st := StreamStats{
				Local:      netip.AddrPortFrom(netip.MustParseAddr("198.18.1.1"), port),
				Endpoint:   netip.MustParseAddrPort("198.18.0.2:4000"),
				Advertised: netip.MustParseAddrPort("198.18.0.2:4000"),
				LastPacket: now,
				Flags:      []string{"RTP", "filled"},
				Stats:      Counters{Packets: 3, Bytes: 516},
			}
			if mediaSeen {
				st.SSRC = 1
			}
			if rtcp {
				st.Flags = []string{"RTCP", "filled"}
				st.SSRC = 0
			}
			return st
		}
		media := MediaStats{Index: 1, Type: "audio", Protocol: "RTP/AVP",
			Streams: []StreamStats{stream(false, 30000), stream(true, 30001)}, Flags: []string{"initialized", "send", "recv"}}
		if mediaSeen {
			media.Codec = "PCMU/8000"
		}
		return &CallStats{Created: now, LastSignal: now, Tags: []TagStats{
			{Tag: "a", ViaBranch: via, Created: now, Subscriptions: []Subscription{{Tag: "b"}}, Subscribers: []Subscription{{Tag: "b"}}, Medias: []MediaStats{media}},
			{Tag: "b", Created: now, Subscriptions: []Subscription{{Tag: "a"}}, Subscribers: []Subscription{{Tag: "a"}}, Medias: []MediaStats{media}},
		}}
	}
	var call *CallStats
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) { return &Reply{Call: call}, nil }}
	s := newTestServer(t, e, nil)
	wild := func(p string) bool { return p == "/tags" || p == "/SSRC" }
	for i, tc := range []struct {
		file      string
		command   string
		mediaSeen bool
		via       string
	}{
		{"testdata/rtpengine-10.5-query-reply.bencode", "query", true, ""},
		{"testdata/rtpengine-10.5-query-answered-reply.bencode", "query", false, "z9hG4bK1"},
		{"testdata/rtpengine-10.5-delete-reply.bencode", "delete", false, "z9hG4bK1"},
	} {
		call = callWith(tc.mediaSeen, tc.via)
		got := decodeReply(t, exchange(t, s, loopbackClient, append([]byte(fmt.Sprintf("q%d ", i)), kdict("command", tc.command, "call-id", "c")...)))
		want := capturedFile(t, tc.file)
		if diff := cmp.Diff(shape(want, wild), shape(got, wild)); diff != "" {
			t.Errorf("layout against %s (-rtpengine +relayd):\n%s", tc.file, diff)
		}
		totals, _ := got.Get("totals")
		rtp, _ := totals.Get("RTP")
		if n, _ := rtp.GetInt("packets"); n != 6 {
			t.Errorf("totals RTP packets %d, want 6 (summed over streams)", n)
		}
		if us, _ := got.GetInt("created_us"); us != 499683 {
			t.Errorf("created_us %d", us)
		}
	}
}

// The SSRC section (what Kamailio's mos variables read) has
// ng_stats_ssrc's layout.
func TestSSRCLayout(t *testing.T) {
	mos := MOS{MOS: 43, RoundTrip: 1200, Jitter: 2, PacketLoss: 1, ReportedAt: time.Unix(1796017321, 0)}
	c := &CallStats{SSRC: []SSRCStats{{SSRC: 1234, Average: mos, Lowest: mos, Highest: mos, Samples: 3, Progression: []MOS{mos}}}}
	v := callStatsEntries(c).value()
	got := shape(v, func(p string) bool { return p == "/tags" })
	want := []string{}
	for _, p := range []string{"average MOS", "lowest MOS", "highest MOS", "MOS progression/entries/[]"} {
		for _, k := range []string{"MOS", "round-trip time", "round-trip time leg", "jitter", "packet loss"} {
			want = append(want, "/SSRC/1234/"+p+"/"+k)
		}
		if p == "average MOS" {
			want = append(want, "/SSRC/1234/"+p+"/samples")
		} else {
			want = append(want, "/SSRC/1234/"+p+"/reported at")
		}
	}
	want = append(want, "/SSRC", "/SSRC/1234", "/SSRC/1234/cumulative loss", "/SSRC/1234/average MOS", "/SSRC/1234/lowest MOS",
		"/SSRC/1234/highest MOS", "/SSRC/1234/MOS progression", "/SSRC/1234/MOS progression/interval",
		"/SSRC/1234/MOS progression/entries", "/SSRC/1234/MOS progression/entries/[]")
	for _, p := range want {
		if !contains(got, p) {
			t.Errorf("missing %s", p)
		}
	}
}

func contains(l []string, s string) bool {
	for _, e := range l {
		if e == s {
			return true
		}
	}
	return false
}

func TestListAndStatisticsLayout(t *testing.T) {
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) {
		if r.Command == CmdList {
			return &Reply{Calls: []string{"cap-call-1"}}, nil
		}
		return &Reply{Statistics: &Statistics{Interfaces: []InterfaceStats{{Name: "default", Address: netip.MustParseAddr("198.18.7.1"), PortMin: 30000, PortMax: 30100}}}}, nil
	}}
	s := newTestServer(t, e, nil)
	exchange(t, s, loopbackClient, append([]byte("p "), kdict("command", "ping")...))
	got := decodeReply(t, exchange(t, s, loopbackClient, append([]byte("l "), kdict("command", "list")...)))
	if want := captured(t, "list-reply"); !got.Equal(want) {
		t.Errorf("list %v, rtpengine %v", got, want)
	}
	got = decodeReply(t, exchange(t, s, loopbackClient, append([]byte("s "), kdict("command", "statistics")...)))
	want := captured(t, "statistics-reply")
	// relayd leaves out intervalstatistics and transcoders.
	keep := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			if !strings.HasPrefix(p, "/statistics/intervalstatistics") && !strings.HasPrefix(p, "/statistics/transcoders") {
				out = append(out, p)
			}
		}
		return out
	}
	if diff := cmp.Diff(keep(shape(want, nil)), shape(got, nil)); diff != "" {
		t.Errorf("statistics layout (-rtpengine +relayd):\n%s", diff)
	}
}

// offer and answer replies carry sdp and result only, as rtpengine's.
func TestOfferAnswerReplyLayout(t *testing.T) {
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) { return &Reply{SDP: "v=0\r\n"}, nil }}
	s := newTestServer(t, e, nil)
	for i, tc := range []struct {
		name string
		msg  []byte
	}{
		{"offer-kamailio-reply", kamailioOffer("c1")},
		{"answer-reply", kdict("command", "answer", "call-id", "c1", "from-tag", "f", "to-tag", "t", "sdp", "v=0")},
	} {
		got := decodeReply(t, exchange(t, s, loopbackClient, append([]byte(fmt.Sprintf("oa%d ", i)), tc.msg...)))
		if diff := cmp.Diff(shape(captured(t, tc.name), nil), shape(got, nil)); diff != "" {
			t.Errorf("%s layout (-rtpengine +relayd):\n%s", tc.name, diff)
		}
	}
}
