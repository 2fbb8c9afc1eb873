package sip

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
)

// g729Answer is a callee's SDP with G.729 (no Annex B) and
// telephone-event only.
func g729Answer(port int) []byte {
	lines := []string{"v=0", "o=callee 1 1 IN IP4 " + calleeIP, "s=-", "c=IN IP4 " + calleeIP, "t=0 0",
		"m=audio " + itoa(port) + " RTP/AVP 18 101", "a=rtpmap:18 G729/8000", "a=fmtp:18 annexb=no",
		"a=rtpmap:101 telephone-event/8000", "a=sendrecv"}
	return []byte(strings.Join(lines, "\r\n") + "\r\n")
}

func itoa(n int) string {
	var b []byte
	for ; n > 0 || len(b) == 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// mLine returns the m=audio line of an SDP body.
func mLine(body []byte) string {
	for _, l := range strings.Split(string(body), "\r\n") {
		if strings.HasPrefix(l, "m=audio ") {
			return l
		}
	}
	return ""
}

// TestTranscodeToG729Callee: the route offers G.729 to the callee besides
// the caller's G.711; the callee answers G.729 alone. The caller gets
// PCMU, and the userspace data plane holds transcoding flows both ways
// and sinks for the RTCP ports.
func TestTranscodeToG729Callee(t *testing.T) {
	ce := newCallee(t)
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		d.Respond(200, "OK", g729Answer(6000), sip.NewHeader("Content-Type", "application/sdp"))
		<-d.Context().Done()
	})
	h := newHarness(t, opts{destinations: []string{ce.addr}, userspace: true, routeExtra: "transcode = [\"G729\"]\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	toCallee := ce.lastInvite().Body()
	if m := mLine(toCallee); !strings.HasSuffix(m, " RTP/AVP 0 8 18 101") ||
		!strings.Contains(string(toCallee), "a=rtpmap:18 G729/8000\r\na=fmtp:18 annexb=no\r\n") {
		t.Errorf("offer to the callee (%s) lacks G.729 after the caller's codecs:\n%s", m, toCallee)
	}
	ans := d.InviteResponse.Body()
	if m := mLine(ans); !strings.HasSuffix(m, " RTP/AVP 0 101") || strings.Contains(string(ans), "G729") {
		t.Errorf("answer to the caller (%s), want PCMU and telephone-event:\n%s", m, ans)
	}
	waitFor(t, "userspace flows", func() bool { return h.us.Len() == 4 })
	if h.xdp.Len() != 0 {
		t.Errorf("%d XDP flows for a transcoded call", h.xdp.Len())
	}
	l, _ := h.us.List()
	var rtp, sinks int
	for _, f := range l {
		switch tc := f.Flow.Transcode; {
		case tc != nil:
			rtp++
			if (tc.In.Name != "PCMU" || tc.Out.Name != "G729") && (tc.In.Name != "G729" || tc.Out.Name != "PCMU") ||
				tc.In.Event != 101 || tc.Out.Event != 101 || tc.SSRC == 0 || !tc.RTCPTo.IsValid() {
				t.Errorf("transcoding flow %+v", tc)
			}
			if tc.Out.Name == "G729" && (tc.Out.VAD || tc.Out.PT != 18 || f.Flow.SendTo.Port() != 6000) {
				t.Errorf("flow toward the callee: %+v to %s", tc.Out, f.Flow.SendTo)
			}
		case f.Flow.SinkRTCP:
			sinks++
		}
		if err := f.Flow.Validate(); err != nil {
			t.Errorf("flow %s: %v", f.Flow.Match, err)
		}
	}
	if rtp != 2 || sinks != 2 {
		t.Errorf("%d transcoding flows, %d RTCP sinks; want 2 and 2", rtp, sinks)
	}
	if err := d.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	h.cdr()
	if h.us.Len() != 0 {
		t.Errorf("%d flows left", h.us.Len())
	}
}

// TestTranscodeUnavailable: the route's codecs leave none of the caller's
// and relayd cannot transcode: 488 with a Warning that says why, and the
// callee never hears of the call.
func TestTranscodeUnavailable(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, userspace: true, noCodecs: true,
		routeExtra: "codecs = [\"G729\"]\ntranscode = [\"G729\"]\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.invite(ctx, offerSDP(4000))
	var dr *sipgo.ErrDialogResponse
	if !errors.As(err, &dr) || dr.Res.StatusCode != sip.StatusNotAcceptableHere {
		t.Fatalf("INVITE: %v, want 488", err)
	}
	if w := dr.Res.GetHeader("Warning"); w == nil || !strings.Contains(w.Value(), "transcoding is not available") {
		t.Errorf("Warning %v, want one saying transcoding is not available", w)
	}
	if ce.lastInvite() != nil {
		t.Error("the callee got an INVITE")
	}
	if h.us.Len() != 0 || h.xdp.Len() != 0 {
		t.Errorf("%d flows", h.us.Len()+h.xdp.Len())
	}
}
