package call

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

// sdpBody is a peer's SDP with one audio stream: its m= formats and
// attribute lines.
func sdpBody(addr string, port int, formats string, attrs ...string) []byte {
	l := []string{"v=0", "o=peer 42 42 IN IP4 " + addr, "s=-", "c=IN IP4 " + addr, "t=0 0",
		"m=audio " + itoa(port) + " RTP/AVP " + formats}
	l = append(l, attrs...)
	return []byte(strings.Join(l, "\r\n") + "\r\n")
}

func itoa(n int) string {
	return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(n)).String()[len("0.0.0.0:"):]
}

// callerG711 offers PCMU, PCMA, telephone-event and CN at 20 ms.
var callerG711 = sdpBody("198.18.0.2", 4000, "0 8 101 13",
	"a=rtpmap:0 PCMU/8000", "a=rtpmap:8 PCMA/8000", "a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-16",
	"a=rtpmap:13 CN/8000", "a=ptime:20")

// calleeG729 answers G.729 without Annex B and telephone-event on its
// own payload type, at 30 ms.
var calleeG729 = sdpBody("198.18.2.2", 6000, "18 100",
	"a=rtpmap:18 G729/8000", "a=fmtp:18 annexb=no", "a=rtpmap:100 telephone-event/8000", "a=fmtp:100 0-16", "a=ptime:30")

func newTranscodeCall(t *testing.T) *negCall {
	t.Helper()
	n := newNegCall(t)
	n.c.Media.t.SetCodecsAvailable(true)
	if !n.c.Media.t.CanTranscode() {
		t.Fatal("CanTranscode false with a userspace plane and codecs")
	}
	return n
}

var toG729 = OfferOptions{Transcoding: true, Codecs: CodecPolicy{Transcode: []string{"G729"}}}

func codecs(d *sdp.Description) string {
	var out []string
	for _, c := range d.Streams[0].Codecs {
		out = append(out, itoa(int(c.PT))+"/"+c.Name)
	}
	return strings.Join(out, " ")
}

func TestTranscodeOffer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		offer   []byte
		opts    OfferOptions
		want    string // codecs toward B
		lines   []string
		err     []error
		noCodec bool // CanTranscode false
	}{
		{name: "adds G729 after the offer's codecs", offer: callerG711, opts: toG729,
			want: "0/PCMU 8/PCMA 18/G729 101/telephone-event 13/CN", lines: []string{"a=rtpmap:18 G729/8000", "a=fmtp:18 annexb=no", " RTP/AVP 0 8 18 101 13"}},
		{name: "annexb by policy", offer: callerG711,
			opts: OfferOptions{Transcoding: true, Codecs: CodecPolicy{Transcode: []string{"g729"}, G729AnnexB: true}},
			want: "0/PCMU 8/PCMA 18/G729 101/telephone-event 13/CN", lines: []string{"a=fmtp:18 annexb=yes"}},
		{name: "present: nothing added", offer: (peerSDP{addr: "198.18.0.2", port: 4000}).body(t), opts: toG729,
			want: "0/PCMU 8/PCMA 18/G729 101/telephone-event"},
		{name: "forced with telephone-event", offer: callerG711,
			opts: OfferOptions{Transcoding: true, Codecs: CodecPolicy{Allowed: []string{"G729"}, Transcode: []string{"G729"}}},
			want: "18/G729 101/telephone-event"},
		{name: "G729 offer gets PCMU and PCMA", offer: calleeG729,
			opts: OfferOptions{Transcoding: true, Codecs: CodecPolicy{Transcode: []string{"PCMU", "PCMA"}}},
			want: "18/G729 0/PCMU 8/PCMA 100/telephone-event"},
		{name: "static type taken", offer: sdpBody("198.18.0.2", 4000, "0 18", "a=rtpmap:18 opus/48000/2"), opts: toG729,
			want: "0/PCMU 18/opus 96/G729", lines: []string{"a=rtpmap:96 G729/8000", "a=fmtp:96 annexb=no"}},
		{name: "nothing to make it from", offer: sdpBody("198.18.0.2", 4000, "9"), opts: toG729, want: "9/G722"},
		{name: "not a transcodable codec", offer: callerG711,
			opts: OfferOptions{Transcoding: true, Codecs: CodecPolicy{Transcode: []string{"opus"}}},
			want: "0/PCMU 8/PCMA 101/telephone-event 13/CN"},
		{name: "mask keeps the offerer's codec", offer: sdpBody("198.18.0.2", 4000, "0"),
			opts: OfferOptions{Transcoding: true, Codecs: CodecPolicy{Mask: []string{"PCMU"}, Transcode: []string{"G729"}}},
			want: "18/G729"},
		{name: "unavailable: not added", offer: callerG711, opts: toG729, noCodec: true,
			want: "0/PCMU 8/PCMA 101/telephone-event 13/CN"},
		{name: "unavailable and nothing left", offer: sdpBody("198.18.0.2", 4000, "0"), noCodec: true,
			opts: OfferOptions{Codecs: CodecPolicy{Allowed: []string{"G729"}, Transcode: []string{"G729"}}},
			err:  []error{ErrTranscodeUnsupported, sdp.ErrNotAcceptable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTranscodeCall(t)
			if tc.noCodec {
				n.c.Media.t.SetCodecsAvailable(false)
				tc.opts.Transcoding = n.c.Media.t.CanTranscode()
			}
			in := mustParse(t, tc.offer)
			orig := codecs(in)
			body, err := n.s.Offer(A, in, tc.opts)
			for _, e := range tc.err {
				if !errors.Is(err, e) {
					t.Errorf("offer: %v, want %v", err, e)
				}
			}
			if tc.err != nil {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := codecs(mustParse(t, body)); got != tc.want {
				t.Errorf("codecs toward B %q, want %q", got, tc.want)
			}
			for _, l := range tc.lines {
				if !strings.Contains(string(body), l+"\r\n") {
					t.Errorf("offer toward B lacks %q:\n%s", l, body)
				}
			}
			// Codecs added: the offer the caller sent stays as it was
			// (a B2BUA offers it to each destination in turn).
			if added := strings.Contains(tc.want, "G729") && !strings.Contains(orig, "G729") ||
				strings.Contains(tc.want, "PCMU") && !strings.Contains(orig, "PCMU"); added && codecs(in) != orig {
				t.Errorf("the caller's offer changed: %s, was %s", codecs(in), orig)
			}
		})
	}
}

// answerG729 runs the caller's G.711 offer with G.729 added and the
// callee's G.729 answer; it returns the answer toward the caller.
func answerG729(t *testing.T, n *negCall, opts OfferOptions, answer []byte) *sdp.Description {
	t.Helper()
	if _, err := n.s.Offer(A, mustParse(t, callerG711), opts); err != nil {
		t.Fatal(err)
	}
	body, err := n.s.Answer(B, mustParse(t, answer), AnswerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.s.Complete()
	return mustParse(t, body)
}

func TestTranscodeAnswer(t *testing.T) {
	n := newTranscodeCall(t)
	toA := answerG729(t, n, toG729, calleeG729)
	if got, want := codecs(toA), "0/PCMU 101/telephone-event 13/CN"; got != want {
		t.Errorf("answer toward A: %q, want %q", got, want)
	}
	if toA.Streams[0].Ptime != 20 {
		t.Errorf("answer toward A: ptime %d, want 20", toA.Streams[0].Ptime)
	}
	st := n.c.Media.Streams()[0]
	if st.Ends[A].SSRC == 0 || st.Ends[B].SSRC == 0 {
		t.Fatalf("SSRCs %d %d, want chosen", st.Ends[A].SSRC, st.Ends[B].SSRC)
	}
	pcmu := dataplane.Codec{Name: "PCMU", PT: 0, Ptime: 20, Event: 101, CN: 13}
	g729 := dataplane.Codec{Name: "G729", PT: 18, Ptime: 30, Event: 100}
	aRTP, bRTP := n.match(t, 0, A, false), n.match(t, 0, B, false)
	caller, callee := netip.MustParseAddrPort("198.18.0.2:4000"), netip.MustParseAddrPort("198.18.2.2:6000")
	want := map[netip.AddrPort]*dataplane.Transcode{
		aRTP: {In: pcmu, Out: g729, SSRC: st.Ends[B].SSRC, RTCPFrom: n.match(t, 0, B, true), RTCPTo: netip.MustParseAddrPort("198.18.2.2:6001")},
		bRTP: {In: g729, Out: pcmu, SSRC: st.Ends[A].SSRC, RTCPFrom: n.match(t, 0, A, true), RTCPTo: netip.MustParseAddrPort("198.18.0.2:4001")},
	}
	flows := n.flows()
	if len(flows) != 4 {
		t.Fatalf("%d flows, want 4", len(flows))
	}
	for match, f := range flows {
		if f.Path != dataplane.PathUserspace {
			t.Errorf("flow %s on %s, want userspace", match, f.Path)
		}
		if err := f.Flow.Validate(); err != nil {
			t.Errorf("flow %s: %v", match, err)
		}
		if tc, ok := want[match]; ok {
			if diff := cmp.Diff(tc, f.Flow.Transcode, cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
				t.Errorf("flow %s transcode (-want +got):\n%s", match, diff)
			}
			if f.Flow.SinkRTCP {
				t.Errorf("RTP flow %s is a sink", match)
			}
			continue
		}
		if !f.Flow.SinkRTCP || f.Flow.Transcode != nil {
			t.Errorf("RTCP flow %s: sink %v transcode %v, want a sink", match, f.Flow.SinkRTCP, f.Flow.Transcode)
		}
	}
	if f := flows[aRTP].Flow; f.SendTo != callee || f.ExpectSource.Addr() != caller.Addr() {
		t.Errorf("flow from A: send to %s expect %s", f.SendTo, f.ExpectSource)
	}
	if us := n.us.Len(); us != 4 || n.xdp.Len() != 0 {
		t.Errorf("%d userspace, %d XDP flows in the data planes", us, n.xdp.Len())
	}
}

func TestTranscodeAnswerVAD(t *testing.T) {
	n := newTranscodeCall(t)
	opts := OfferOptions{Transcoding: true, Codecs: CodecPolicy{Transcode: []string{"G729"}, G729AnnexB: true}}
	// annexb absent in the answer means yes (RFC 4749); no
	// telephone-event on the callee's side: none on either.
	answerG729(t, n, opts, sdpBody("198.18.2.2", 6000, "18 13", "a=rtpmap:18 G729/8000", "a=rtpmap:13 CN/8000", "a=maxptime:10"))
	tc := n.c.Media.Streams()[0].Transcode
	if tc == nil {
		t.Fatal("not transcoded")
	}
	want := [2]dataplane.Codec{
		{Name: "PCMU", PT: 0, Ptime: 20, CN: 13},
		{Name: "G729", PT: 18, Ptime: 10, CN: 13, VAD: true},
	}
	if diff := cmp.Diff(want, *tc); diff != "" {
		t.Errorf("codecs (-want +got):\n%s", diff)
	}
}

func TestTranscodeAnswerShared(t *testing.T) {
	n := newTranscodeCall(t)
	// The callee takes PCMA, which the caller offered, and lists G729 too.
	toA := answerG729(t, n, toG729, sdpBody("198.18.2.2", 6000, "8 18 101", "a=rtpmap:8 PCMA/8000", "a=rtpmap:18 G729/8000", "a=rtpmap:101 telephone-event/8000"))
	if got, want := codecs(toA), "8/PCMA 101/telephone-event"; got != want {
		t.Errorf("answer toward A: %q, want %q", got, want)
	}
	if st := n.c.Media.Streams()[0]; st.Transcode != nil {
		t.Errorf("transcode %v, want plain relay", st.Transcode)
	}
	for match, f := range n.flows() {
		if f.Flow.Transcode != nil || f.Flow.SinkRTCP || f.Path != dataplane.PathXDP {
			t.Errorf("flow %s: transcode %v sink %v on %s, want plain XDP", match, f.Flow.Transcode, f.Flow.SinkRTCP, f.Path)
		}
	}
}

func TestTranscodeReoffer(t *testing.T) {
	n := newTranscodeCall(t)
	answerG729(t, n, toG729, calleeG729)
	ssrc := [2]uint32{n.c.Media.Streams()[0].Ends[A].SSRC, n.c.Media.Streams()[0].Ends[B].SSRC}
	aRTP := n.match(t, 0, A, false)
	transcoded := func() *dataplane.Transcode {
		t.Helper()
		return n.flows()[aRTP].Flow.Transcode
	}

	// Off: the callee takes PCMU on a re-offer.
	answerG729(t, n, toG729, sdpBody("198.18.2.2", 6000, "0", "a=rtpmap:0 PCMU/8000"))
	if tc := transcoded(); tc != nil || n.flows()[aRTP].Path != dataplane.PathXDP {
		t.Fatalf("after PCMU answer: transcode %v on %s", tc, n.flows()[aRTP].Path)
	}
	// On again, with the same SSRCs.
	answerG729(t, n, toG729, calleeG729)
	if tc := transcoded(); tc == nil || tc.Out.Name != "G729" || tc.SSRC != ssrc[B] {
		t.Fatalf("after G729 answer: %+v, want G729 with SSRC %d", tc, ssrc[B])
	}

	// The callee re-offers G.729 alone with no policy: relayd adds the
	// caller's PCMU toward the caller, who takes it.
	body, err := n.s.Offer(B, mustParse(t, calleeG729), OfferOptions{Transcoding: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := codecs(mustParse(t, body)), "18/G729 0/PCMU 100/telephone-event"; got != want {
		t.Fatalf("re-offer toward A: %q, want %q", got, want)
	}
	ans, err := n.s.Answer(A, mustParse(t, sdpBody("198.18.0.2", 4000, "0 100", "a=rtpmap:0 PCMU/8000", "a=rtpmap:100 telephone-event/8000")), AnswerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.s.Complete()
	if got, want := codecs(mustParse(t, ans)), "18/G729 100/telephone-event"; got != want {
		t.Errorf("answer toward B: %q, want %q", got, want)
	}
	want := &dataplane.Transcode{
		In:   dataplane.Codec{Name: "PCMU", PT: 0, Ptime: 20, Event: 100},
		Out:  dataplane.Codec{Name: "G729", PT: 18, Ptime: 30, Event: 100},
		SSRC: ssrc[B], RTCPFrom: n.match(t, 0, B, true), RTCPTo: netip.MustParseAddrPort("198.18.2.2:6001"),
	}
	if diff := cmp.Diff(want, transcoded(), cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("flow from A after B's re-offer (-want +got):\n%s", diff)
	}

	// Another pair: the caller re-offers PCMA alone, the callee keeps G729.
	if _, err := n.s.Offer(A, mustParse(t, sdpBody("198.18.0.2", 4000, "8", "a=rtpmap:8 PCMA/8000")), toG729); err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.Answer(B, mustParse(t, calleeG729), AnswerOptions{}); err != nil {
		t.Fatal(err)
	}
	if tc := transcoded(); tc == nil || tc.In.Name != "PCMA" || tc.In.PT != 8 || tc.In.Event != 0 || tc.Out.Event != 0 {
		t.Errorf("after PCMA re-offer: %+v, want PCMA/8 in, no events", tc)
	}
}

func TestTranscodeUnavailable(t *testing.T) {
	n := newTranscodeCall(t)
	answerG729(t, n, toG729, calleeG729)
	// The codecs went away (a daemon whose workers failed): flows that
	// transcode are refused, as SRTP is without userspace.
	n.c.Media.t.SetCodecsAvailable(false)
	n.c.Media.Edit(0, func(st *Stream) { st.Ends[B].RTP = netip.MustParseAddrPort("198.18.2.2:6100") })
	if err := n.c.Media.Sync(); !errors.Is(err, ErrTranscodeUnsupported) {
		t.Errorf("Sync: %v, want ErrTranscodeUnsupported", err)
	}
	// No userspace plane: no transcoding whatever the codecs.
	tb := newTable(t, dataplanetest.New(dataplane.PathXDP))
	tb.SetCodecsAvailable(true)
	if tb.CanTranscode() {
		t.Error("CanTranscode without a userspace plane")
	}
}

// TestTranscodeSnapshot: a transcoded call goes through JSON and a new
// table with fresh data planes; the same flows (codecs, SSRCs) come back.
func TestTranscodeSnapshot(t *testing.T) {
	n := newTranscodeCall(t)
	answerG729(t, n, toG729, calleeG729)
	n.c.SetState(StateAnswered)
	before := make(map[netip.AddrPort]dataplane.Flow)
	for m, f := range n.flows() {
		before[m] = f.Flow
	}
	data, err := json.Marshal(n.c.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var back Snapshot
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	n.c.Detach()
	us := dataplanetest.New(dataplane.PathUserspace)
	tb := newTable(t, dataplanetest.New(dataplane.PathXDP), us)
	tb.SetCodecsAvailable(true)
	c, err := tb.Restore(back)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.End(Hangup, 0, "") })
	after := make(map[netip.AddrPort]dataplane.Flow)
	for _, f := range c.Media.Flows() {
		after[f.Flow.Match] = f.Flow
	}
	if diff := cmp.Diff(before, after, cmpopts.EquateComparable(netip.AddrPort{}, netip.Addr{})); diff != "" {
		t.Errorf("flows after restore (-before +after):\n%s", diff)
	}
	if us.Len() != 4 {
		t.Errorf("%d userspace flows, want 4", us.Len())
	}
}
