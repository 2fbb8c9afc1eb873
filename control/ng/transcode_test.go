package ng

import (
	"slices"
	"strings"
	"testing"

	"github.com/relayd/relayd/control/ng/bencode"
	"github.com/relayd/relayd/dataplane"
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
	// A plain call beside it counts for nothing.
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.11", "4100"), "call-id", "plain-1", "from-tag", "carol", "command", "offer"))
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.2.3", "6100"), "call-id", "plain-1", "from-tag", "carol", "to-tag", "dave", "command", "answer"))
	// As rtpengine 10.5: both parties' media flagged "transcoding" (what
	// relayd receives from each is transcoded), 2 transcoded media in
	// statistics, and once frames were decoded, each party's codec.
	wantMedia(t, r.do(t, "call-id", "tc-1", "command", "query"), map[string]string{"alice": "", "bob": ""}, true)
	wantMedia(t, r.do(t, "call-id", "plain-1", "command", "query"), map[string]string{"carol": "", "dave": ""}, false)
	if n := statTranscodedMedia(t, r); n != 2 {
		t.Errorf("statistics: transcodedmedia %d, want 2", n)
	}
	for _, fs := range l {
		if fs.Flow.Transcode != nil {
			r.us.SetStats(fs.Flow.Match, dataplane.Stats{Packets: 50, Bytes: 10000, FramesIn: 100, FramesOut: 100})
		}
	}
	wantMedia(t, r.do(t, "call-id", "tc-1", "command", "query"), map[string]string{"alice": "PCMU/8000", "bob": "G729/8000"}, true)
	// A new offer/answer where the answerer takes PCMU: transcoding off,
	// the flows back in XDP.
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "flags", []string{"codec-transcode-G729"},
		"call-id", "tc-1", "from-tag", "alice", "command", "offer"))
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.2.2", "6000"), "call-id", "tc-1", "from-tag", "alice", "to-tag", "bob", "command", "answer"))
	if r.xdp.Len() != 8 || r.us.Len() != 0 {
		t.Errorf("after a PCMU answer: %d XDP, %d userspace flows; want 8 (both calls) and 0", r.xdp.Len(), r.us.Len())
	}
	wantMedia(t, r.do(t, "call-id", "tc-1", "command", "query"), map[string]string{"alice": "", "bob": ""}, false)
	if n := statTranscodedMedia(t, r); n != 0 {
		t.Errorf("statistics after the PCMU answer: transcodedmedia %d, want 0", n)
	}
	// The reply to delete carries the same media as query.
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "flags", []string{"codec-transcode-G729"},
		"call-id", "tc-1", "from-tag", "alice", "command", "offer"))
	wantOK(t, r.do(t, "sdp", g729, "call-id", "tc-1", "from-tag", "alice", "to-tag", "bob", "command", "answer"))
	if n := statTranscodedMedia(t, r); n != 2 {
		t.Errorf("statistics after a G.729 answer again: transcodedmedia %d, want 2", n)
	}
	wantMedia(t, r.do(t, "call-id", "tc-1", "command", "delete"), map[string]string{"alice": "", "bob": ""}, true)
	if n := statTranscodedMedia(t, r); n != 0 {
		t.Errorf("statistics after delete: transcodedmedia %d, want 0", n)
	}
}

// wantMedia checks the first media of each tag of a query or delete
// reply: its codec ("" for none) and whether it is flagged
// "transcoding", last of its flags as rtpengine lists it.
func wantMedia(t *testing.T, reply bencode.Value, codecs map[string]string, transcoding bool) {
	t.Helper()
	wantOK(t, reply)
	tags, _ := reply.Get("tags")
	for tag, codec := range codecs {
		td, _ := tags.Get(tag)
		medias, _ := td.Get("medias")
		l, _ := medias.AsList()
		if len(l) != 1 {
			t.Errorf("tag %s: %d medias, want 1: %s", tag, len(l), reply)
			continue
		}
		fl, _ := l[0].Get("flags")
		flags, _ := fl.AsList()
		var names []string
		for _, f := range flags {
			s, _ := f.AsString()
			names = append(names, s)
		}
		has := slices.Contains(names, "transcoding")
		if has != transcoding || (has && names[len(names)-1] != "transcoding") || l[0].GetString("codec") != codec {
			t.Errorf("tag %s: codec %q, flags %q; want codec %q, transcoding %v (last)", tag, l[0].GetString("codec"), names, codec, transcoding)
		}
	}
}

// statTranscodedMedia is statistics' currentstatistics/transcodedmedia.
func statTranscodedMedia(t *testing.T, r *engineRig) int64 {
	t.Helper()
	v := r.do(t, "command", "statistics")
	wantOK(t, v)
	st, _ := v.Get("statistics")
	cur, _ := st.Get("currentstatistics")
	n, ok := cur.GetInt("transcodedmedia")
	if !ok {
		t.Fatalf("statistics without currentstatistics/transcodedmedia: %s", v)
	}
	return n
}
