package sdp

import (
	"bytes"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/relayd/relayd/sdes"
)

func crlf(lines ...string) []byte { return []byte(strings.Join(lines, "\r\n") + "\r\n") }

// offer is a caller's offer with everything relayd rewrites.
var offer = crlf(
	"v=0",
	"o=alice 2890844526 2890844526 IN IP4 198.18.0.2",
	"s=-",
	"c=IN IP4 198.18.0.2",
	"t=0 0",
	"a=ice-lite",
	"m=audio 4000 RTP/SAVP 0 8 18 101",
	"a=rtpmap:0 PCMU/8000",
	"a=rtpmap:8 PCMA/8000",
	"a=rtpmap:18 G729/8000",
	"a=fmtp:18 annexb=no",
	"a=rtpmap:101 telephone-event/8000",
	"a=fmtp:101 0-16",
	"a=rtcp:4001 IN IP4 198.18.0.2",
	"a=rtcp-mux",
	"a=ice-ufrag:abcd",
	"a=ice-pwd:secretsecretsecretsecret",
	"a=candidate:1 1 UDP 2130706431 198.18.0.2 4000 typ host",
	"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz|2^20|1:4",
	"a=crypto:2 FOO_BAR inline:xyz",
	"a=sendrecv",
	"m=video 0 RTP/AVP 96",
	"a=rtpmap:96 H264/90000",
)

func TestParse(t *testing.T) {
	d, err := Parse(offer)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Streams) != 2 {
		t.Fatalf("%d streams, want 2", len(d.Streams))
	}
	st := d.Streams[0]
	if got, want := st.RTP(), netip.MustParseAddrPort("198.18.0.2:4000"); got != want {
		t.Errorf("RTP %v, want %v", got, want)
	}
	// The a=rtcp port, for when rtcp-mux is not agreed.
	if got, want := st.RTCP(), netip.MustParseAddrPort("198.18.0.2:4001"); got != want {
		t.Errorf("RTCP %v, want %v", got, want)
	}
	if !st.RTCPMux || !st.SRTP() || !st.Enabled() || st.Direction != "sendrecv" {
		t.Errorf("stream %+v", st)
	}
	if diff := cmp.Diff(st.CodecNames(), []string{"PCMU", "PCMA", "G729", "telephone-event"}); diff != "" {
		t.Errorf("codecs (-got +want):\n%s", diff)
	}
	if len(st.Crypto) != 1 || st.Crypto[0].Suite != sdes.AES_CM_128_HMAC_SHA1_80 {
		t.Errorf("crypto %v, want the one supported line", st.Crypto)
	}
	if d.Streams[1].Enabled() {
		t.Error("video with port 0 is enabled")
	}
	if st.ClockRate() != 8000 {
		t.Errorf("clock rate %d", st.ClockRate())
	}
}

func TestParseRTCPAttr(t *testing.T) {
	d, err := Parse(crlf("v=0", "o=- 1 1 IN IP6 2001:2::2", "s=-", "t=0 0",
		"m=audio 5000 RTP/AVP 0", "c=IN IP6 2001:2::2", "a=rtcp:5003 IN IP6 2001:2::9", "a=sendonly"))
	if err != nil {
		t.Fatal(err)
	}
	st := d.Streams[0]
	if got, want := st.RTCP(), netip.MustParseAddrPort("[2001:2::9]:5003"); got != want {
		t.Errorf("RTCP %v, want %v", got, want)
	}
	if st.Direction != "sendonly" {
		t.Errorf("direction %q", st.Direction)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"garbage", []byte("hello"), ErrMalformed},
		{"host name", crlf("v=0", "o=- 1 1 IN IP4 a", "s=-", "c=IN IP4 example.com", "t=0 0", "m=audio 1 RTP/AVP 0"), ErrMalformed},
		{"no c=", crlf("v=0", "o=- 1 1 IN IP4 a", "s=-", "t=0 0", "m=audio 1 RTP/AVP 0"), ErrMalformed},
		{"multicast", crlf("v=0", "o=- 1 1 IN IP4 a", "s=-", "c=IN IP4 224.2.1.1/127", "t=0 0", "m=audio 1 RTP/AVP 0"), ErrNotAcceptable},
		{"family mismatch", crlf("v=0", "o=- 1 1 IN IP4 a", "s=-", "c=IN IP6 198.18.0.2", "t=0 0", "m=audio 1 RTP/AVP 0"), ErrMalformed},
		{"bad pt", crlf("v=0", "o=- 1 1 IN IP4 a", "s=-", "c=IN IP4 198.18.0.2", "t=0 0", "m=audio 1 RTP/AVP x"), ErrMalformed},
		{"bad rtcp", crlf("v=0", "o=- 1 1 IN IP4 a", "s=-", "c=IN IP4 198.18.0.2", "t=0 0", "m=audio 1 RTP/AVP 0", "a=rtcp:0"), ErrMalformed},
		{"too big", make([]byte, MaxSize+1), ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.body)
			if !errors.Is(err, tc.want) {
				t.Errorf("Parse: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestFilterCodecs(t *testing.T) {
	d, err := Parse(offer)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.FilterCodecs([]string{"pcma", "telephone-event"}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(d.Streams[0].CodecNames(), []string{"PCMA", "telephone-event"}); diff != "" {
		t.Errorf("codecs (-got +want):\n%s", diff)
	}
	o := NewOrigin()
	out, err := d.Rewrite(Plan{Addr: netip.MustParseAddr("198.18.1.1"), Streams: []StreamPlan{{Port: 30000}}}, &o)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, gone := range []string{"rtpmap:0 ", "rtpmap:18", "fmtp:18", "RTP/SAVP 0"} {
		if strings.Contains(s, gone) {
			t.Errorf("output still has %q:\n%s", gone, s)
		}
	}
	if !strings.Contains(s, "m=audio 30000 RTP/SAVP 8 101\r\n") {
		t.Errorf("m= line not filtered:\n%s", s)
	}

	d, _ = Parse(offer)
	if err := d.FilterCodecs([]string{"opus"}); !errors.Is(err, ErrNotAcceptable) {
		t.Errorf("no common codec: %v, want ErrNotAcceptable", err)
	}
}

func TestRewrite(t *testing.T) {
	relay := netip.MustParseAddr("198.18.1.1")
	key := &sdes.Crypto{Tag: 1, Suite: sdes.AES_CM_128_HMAC_SHA1_80, Key: make([]byte, 16), Salt: make([]byte, 14)}
	for _, tc := range []struct {
		name string
		plan Plan
		want []byte
	}{{
		name: "plain, no mux",
		plan: Plan{Addr: relay, Streams: []StreamPlan{{Port: 30002, Proto: "RTP/AVP"}}},
		want: crlf(
			"v=0",
			"o=relayd 7 7 IN IP4 198.18.1.1",
			"s=-",
			"c=IN IP4 198.18.1.1",
			"t=0 0",
			"m=audio 30002 RTP/AVP 0 8 18 101",
			"a=rtpmap:0 PCMU/8000",
			"a=rtpmap:8 PCMA/8000",
			"a=rtpmap:18 G729/8000",
			"a=fmtp:18 annexb=no",
			"a=rtpmap:101 telephone-event/8000",
			"a=fmtp:101 0-16",
			"a=sendrecv",
			"a=rtcp:30003 IN IP4 198.18.1.1",
			"m=video 0 RTP/AVP 96",
			"a=rtpmap:96 H264/90000",
		),
	}, {
		name: "mux, own key",
		plan: Plan{Addr: relay, Streams: []StreamPlan{{Port: 30004, RTCPMux: true, Crypto: key}}},
		want: crlf(
			"v=0",
			"o=relayd 7 7 IN IP4 198.18.1.1",
			"s=-",
			"c=IN IP4 198.18.1.1",
			"t=0 0",
			"m=audio 30004 RTP/SAVP 0 8 18 101",
			"a=rtpmap:0 PCMU/8000",
			"a=rtpmap:8 PCMA/8000",
			"a=rtpmap:18 G729/8000",
			"a=fmtp:18 annexb=no",
			"a=rtpmap:101 telephone-event/8000",
			"a=fmtp:101 0-16",
			"a=sendrecv",
			"a=rtcp:30005 IN IP4 198.18.1.1",
			"a=rtcp-mux",
			"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
			"m=video 0 RTP/AVP 96",
			"a=rtpmap:96 H264/90000",
		),
	}, {
		name: "keys passed through",
		plan: Plan{Addr: netip.MustParseAddr("2001:2:0:1::1"), Streams: []StreamPlan{{Port: 30006, KeepCrypto: true}}},
		want: crlf(
			"v=0",
			"o=relayd 7 7 IN IP6 2001:2:0:1::1",
			"s=-",
			"c=IN IP6 2001:2:0:1::1",
			"t=0 0",
			"m=audio 30006 RTP/SAVP 0 8 18 101",
			"a=rtpmap:0 PCMU/8000",
			"a=rtpmap:8 PCMA/8000",
			"a=rtpmap:18 G729/8000",
			"a=fmtp:18 annexb=no",
			"a=rtpmap:101 telephone-event/8000",
			"a=fmtp:101 0-16",
			"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz|2^20|1:4",
			"a=crypto:2 FOO_BAR inline:xyz",
			"a=sendrecv",
			"a=rtcp:30007 IN IP6 2001:2:0:1::1",
			"m=video 0 RTP/AVP 96",
			"a=rtpmap:96 H264/90000",
		),
	}, {
		name: "stream disabled",
		plan: Plan{Addr: relay},
		want: crlf(
			"v=0",
			"o=relayd 7 7 IN IP4 198.18.1.1",
			"s=-",
			"c=IN IP4 198.18.1.1",
			"t=0 0",
			"m=audio 0 RTP/SAVP 0 8 18 101",
			"a=rtpmap:0 PCMU/8000",
			"a=rtpmap:8 PCMA/8000",
			"a=rtpmap:18 G729/8000",
			"a=fmtp:18 annexb=no",
			"a=rtpmap:101 telephone-event/8000",
			"a=fmtp:101 0-16",
			"a=sendrecv",
			"m=video 0 RTP/AVP 96",
			"a=rtpmap:96 H264/90000",
		),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Parse(offer)
			if err != nil {
				t.Fatal(err)
			}
			o := Origin{SessionID: 7, Version: 7}
			got, err := d.Rewrite(tc.plan, &o)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(got), string(tc.want)); diff != "" {
				t.Errorf("(-got +want):\n%s", diff)
			}
			if _, err := Parse(got); err != nil {
				t.Errorf("output does not parse: %v", err)
			}
		})
	}
}

func TestOriginVersion(t *testing.T) {
	d, err := Parse(offer)
	if err != nil {
		t.Fatal(err)
	}
	relay := netip.MustParseAddr("198.18.1.1")
	o := Origin{SessionID: 1, Version: 5}
	version := func(b []byte) uint64 {
		t.Helper()
		p, err := Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		return p.sd.Origin.SessionVersion
	}
	plan := Plan{Addr: relay, Streams: []StreamPlan{{Port: 30000}}}
	b1, _ := d.Rewrite(plan, &o)
	b2, _ := d.Rewrite(plan, &o)
	plan.Streams[0].Port = 30010
	b3, _ := d.Rewrite(plan, &o)
	b4, _ := d.Rewrite(plan, &o)
	if got := []uint64{version(b1), version(b2), version(b3), version(b4)}; !cmp.Equal(got, []uint64{5, 5, 6, 6}) {
		t.Errorf("versions %v, want [5 5 6 6]: same SDP keeps the version, a change bumps it once", got)
	}
}

// ShareLast takes a copy of the last body in place of it, and nothing
// else: the version logic sees the same bytes.
func TestOriginShareLast(t *testing.T) {
	d, err := Parse(offer)
	if err != nil {
		t.Fatal(err)
	}
	o := Origin{SessionID: 1, Version: 5}
	plan := Plan{Addr: netip.MustParseAddr("198.18.1.1"), Streams: []StreamPlan{{Port: 30000}}}
	b1, _ := d.Rewrite(plan, &o)
	c := bytes.Clone(b1)
	o.ShareLast(c)
	if &o.last[0] != &c[0] {
		t.Error("the origin kept its own body, not the copy")
	}
	other := bytes.Clone(b1)
	other[0] = 'x'
	o.ShareLast(other)
	if &o.last[0] != &c[0] {
		t.Error("the origin took a body that differs from its last")
	}
	b2, _ := d.Rewrite(plan, &o)
	if !bytes.Equal(b1, b2) {
		t.Errorf("the same SDP after ShareLast changed:\n%s\nbefore:\n%s", b2, b1)
	}
}

func TestHoldZeroAddress(t *testing.T) {
	d, err := Parse(crlf("v=0", "o=- 1 2 IN IP4 198.18.0.2", "s=-", "c=IN IP4 0.0.0.0", "t=0 0", "m=audio 4000 RTP/AVP 0"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Streams[0].RTP().IsValid() {
		t.Error("c=0.0.0.0 gives a media address")
	}
	o := NewOrigin()
	out, err := d.Rewrite(Plan{Addr: netip.MustParseAddr("198.18.1.1"), Streams: []StreamPlan{{Port: 30000}}}, &o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "m=audio 30000 RTP/AVP 0\r\nc=IN IP4 0.0.0.0\r\n") {
		t.Errorf("hold not kept:\n%s", out)
	}
}

// An ng front end keeps the peer's o= line and session-level c= line; the
// stream gets relayd's address at media level, the advertised one.
func TestRewriteKeepPeerLines(t *testing.T) {
	d, err := Parse(offer)
	if err != nil {
		t.Fatal(err)
	}
	plan := Plan{Addr: netip.MustParseAddr("198.19.7.7"), KeepSessionConnection: true, Streams: []StreamPlan{{Port: 30002, Proto: "RTP/AVP"}}}
	got, err := d.Rewrite(plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := crlf(
		"v=0",
		"o=alice 2890844526 2890844526 IN IP4 198.18.0.2",
		"s=-",
		"c=IN IP4 198.18.0.2",
		"t=0 0",
		"m=audio 30002 RTP/AVP 0 8 18 101",
		"c=IN IP4 198.19.7.7",
		"a=rtpmap:0 PCMU/8000",
		"a=rtpmap:8 PCMA/8000",
		"a=rtpmap:18 G729/8000",
		"a=fmtp:18 annexb=no",
		"a=rtpmap:101 telephone-event/8000",
		"a=fmtp:101 0-16",
		"a=sendrecv",
		"a=rtcp:30003 IN IP4 198.19.7.7",
		"m=video 0 RTP/AVP 96",
		"a=rtpmap:96 H264/90000",
	)
	if diff := cmp.Diff(string(got), string(want)); diff != "" {
		t.Errorf("(-got +want):\n%s", diff)
	}
	again, err := d.Rewrite(plan, nil)
	if err != nil || string(again) != string(got) {
		t.Errorf("second rendering differs (%v):\n%s", err, again)
	}
}

func TestFilterCodecsFunc(t *testing.T) {
	d, err := Parse(offer)
	if err != nil {
		t.Fatal(err)
	}
	var seen []int
	err = d.FilterCodecsFunc(func(i int, c Codec) bool {
		seen = append(seen, i)
		return c.PT%2 == 0 // PCMU, PCMA, G729
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(d.Streams[0].CodecNames(), " "); got != "PCMU PCMA G729" {
		t.Errorf("codecs %q", got)
	}
	if slices.Contains(seen, 1) {
		t.Error("the disabled video stream was filtered")
	}
	if err := d.FilterCodecsFunc(func(int, Codec) bool { return false }); !errors.Is(err, ErrNotAcceptable) {
		t.Errorf("nothing kept: %v, want ErrNotAcceptable", err)
	}
}

func TestCodecParametersAndEdits(t *testing.T) {
	body := strings.Join([]string{"v=0", "o=- 1 1 IN IP4 198.18.0.2", "s=-", "c=IN IP4 198.18.0.2", "t=0 0",
		"m=audio 4000 RTP/AVP 0 101", "a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-16", "a=ptime:20.0",
		"a=maxptime:40", "a=sendrecv"}, "\r\n") + "\r\n"
	d, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	st := d.Streams[0]
	want := []Codec{{PT: 0, Name: "PCMU", ClockRate: 8000}, {PT: 101, Name: "telephone-event", ClockRate: 8000, Fmtp: "0-16"}}
	if diff := cmp.Diff(want, st.Codecs); diff != "" || st.Ptime != 20 || st.MaxPtime != 40 {
		t.Errorf("codecs (-want +got):\n%s ptime %d maxptime %d", diff, st.Ptime, st.MaxPtime)
	}
	d.AddCodecs(0, []Codec{{PT: 18, Name: "G729", ClockRate: 8000, Fmtp: "annexb=no"}})
	out, err := d.Rewrite(Plan{Addr: netip.MustParseAddr("198.18.1.1"), Streams: []StreamPlan{{Port: 30000}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"m=audio 30000 RTP/AVP 0 18 101\r\n", "a=fmtp:101 0-16\r\na=rtpmap:18 G729/8000\r\na=fmtp:18 annexb=no\r\n"} {
		if !strings.Contains(string(out), l) {
			t.Errorf("after AddCodecs: no %q in\n%s", l, out)
		}
	}
	d.SetCodecs(0, []Codec{{PT: 8, Name: "PCMA", ClockRate: 8000}}, 30)
	out, err = d.Rewrite(Plan{Addr: netip.MustParseAddr("198.18.1.1"), Streams: []StreamPlan{{Port: 30000}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(out); !strings.Contains(s, "m=audio 30000 RTP/AVP 8\r\na=rtpmap:8 PCMA/8000\r\na=ptime:30\r\na=sendrecv\r\n") ||
		strings.Contains(s, "101") || strings.Contains(s, "maxptime") {
		t.Errorf("after SetCodecs:\n%s", s)
	}
	back, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Streams[0]; len(got.Codecs) != 1 || got.Codecs[0].Name != "PCMA" || got.Ptime != 30 {
		t.Errorf("parsed back: %+v", got)
	}
}

// TestNotAcceptableReasons: what relayd cannot relay is a
// *NotAcceptableError whose reason a front end can send back (a SIP
// Warning): the transport it does not relay, a media type it does not
// know, no codec left after filtering.
func TestNotAcceptableReasons(t *testing.T) {
	head := []string{"v=0", "o=a 1 1 IN IP4 198.18.0.2", "s=-", "c=IN IP4 198.18.0.2", "t=0 0"}
	for _, tc := range []struct {
		name   string
		media  []string
		filter []string
		reason string
	}{
		{"DTLS-SRTP", []string{"m=audio 4000 UDP/TLS/RTP/SAVPF 0", "a=fingerprint:sha-256 00:11", "a=setup:actpass"}, nil, "transport UDP/TLS/RTP/SAVPF is not supported"},
		{"RTP over TCP", []string{"m=audio 4000 TCP/RTP/AVP 0"}, nil, "transport TCP/RTP/AVP is not supported"},
		{"T.38", []string{"m=image 4000 udptl t38"}, nil, "media image is not supported"},
		{"T.38 beside audio", []string{"m=audio 4000 RTP/AVP 0", "m=image 4002 udptl t38"}, nil, "media image is not supported"},
		{"all rejected", []string{"m=audio 0 RTP/AVP 0"}, nil, "no media stream"},
		{"no codec left", []string{"m=audio 4000 RTP/AVP 0 8"}, []string{"G729"}, "no codec left to relay"},
	} {
		d, err := Parse(crlf(append(slices.Clone(head), tc.media...)...))
		if err == nil {
			err = d.FilterCodecs(tc.filter)
		}
		if !errors.Is(err, ErrNotAcceptable) || Reason(err) != tc.reason {
			t.Errorf("%s: %v (reason %q), want not acceptable: %q", tc.name, err, Reason(err), tc.reason)
		}
	}
	// A malformed m= line stays malformed.
	if _, err := Parse(crlf(append(slices.Clone(head), "m=au\x01dio 4000 RTP/AVP 0")...)); !errors.Is(err, ErrMalformed) {
		t.Errorf("control character in the media: %v, want malformed", err)
	}
	if Reason(ErrMalformed) != "" {
		t.Error("Reason of a malformed SDP error")
	}
}
