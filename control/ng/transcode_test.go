package ng

import (
	"strings"
	"testing"
)

// TestEngineTranscode: codec-transcode-G729 on an offer of G.711 adds
// G.729 toward the answerer; once it answers G.729 alone, the caller gets
// PCMU back and the userspace data plane carries transcoding flows.
func TestEngineTranscode(t *testing.T) {
	r := newEngineRig(t, nil)
	r.calls.SetCodecsAvailable(true)
	off := r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "flags", []string{"codec-transcode-G729"},
		"call-id", "tc-1", "from-tag", "alice", "command", "offer")
	wantOK(t, off)
	out := off.GetString("sdp")
	if !strings.Contains(out, " RTP/AVP 0 8 18 101\r\n") || !strings.Contains(out, "a=rtpmap:18 G729/8000\r\n") ||
		!strings.Contains(out, "a=fmtp:18 annexb=no\r\n") {
		t.Fatalf("offer toward the answerer lacks G.729 after the caller's codecs:\n%s", out)
	}
	g729 := "v=0\r\no=- 8 8 IN IP4 198.18.2.2\r\ns=-\r\nc=IN IP4 198.18.2.2\r\nt=0 0\r\nm=audio 6000 RTP/AVP 18 101\r\n" +
		"a=rtpmap:18 G729/8000\r\na=fmtp:18 annexb=no\r\na=rtpmap:101 telephone-event/8000\r\na=ptime:40\r\na=sendrecv\r\n"
	ans := r.do(t, "sdp", g729, "call-id", "tc-1", "from-tag", "alice", "to-tag", "bob", "command", "answer")
	wantOK(t, ans)
	back := ans.GetString("sdp")
	if !strings.Contains(back, " RTP/AVP 0 101\r\n") || strings.Contains(back, "G729") || strings.Contains(back, "ptime") {
		t.Errorf("answer toward the caller, want PCMU and telephone-event:\n%s", back)
	}
	if r.xdp.Len() != 0 || r.us.Len() != 4 {
		t.Fatalf("%d XDP, %d userspace flows; want 0 and 4", r.xdp.Len(), r.us.Len())
	}
	l, _ := r.us.List()
	var transcoding, sinks int
	for _, fs := range l {
		if tc := fs.Flow.Transcode; tc != nil {
			transcoding++
			if tc.Out.Name == "G729" && (tc.Out.Ptime != 40 || tc.In.Name != "PCMU" || tc.In.Ptime != 20) {
				t.Errorf("flow toward the answerer: %+v", tc)
			}
		}
		if fs.Flow.SinkRTCP {
			sinks++
		}
	}
	if transcoding != 2 || sinks != 2 {
		t.Errorf("%d transcoding flows, %d RTCP sinks; want 2 and 2", transcoding, sinks)
	}
	// A new offer/answer where the answerer takes PCMU: transcoding off,
	// the flows back in XDP.
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "flags", []string{"codec-transcode-G729"},
		"call-id", "tc-1", "from-tag", "alice", "command", "offer"))
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.2.2", "6000"), "call-id", "tc-1", "from-tag", "alice", "to-tag", "bob", "command", "answer"))
	if r.xdp.Len() != 4 || r.us.Len() != 0 {
		t.Errorf("after a PCMU answer: %d XDP, %d userspace flows; want 4 and 0", r.xdp.Len(), r.us.Len())
	}
}
