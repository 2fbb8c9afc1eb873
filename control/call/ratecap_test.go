package call

import (
	"net/netip"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

// TestFlowRateCaps: a call's flows get the rate policy's caps: the audio
// RTP flows a multiple of the packet rate the SDP gives (the smaller
// a=ptime of offer and answer, 10 ms when neither has one), RTCP ports
// their own ceiling, a video stream the default; and a snapshot restores
// what the caps were computed from.
func TestFlowRateCaps(t *testing.T) {
	policy := registry.RatePolicy{Factor: 4, DefaultPPS: 2000, RTCPPPS: 100}
	video := []string{"m=video 4002 RTP/AVP 96", "a=rtpmap:96 VP8/90000"}
	for _, tc := range []struct {
		name                 string
		offerPtime, ansPtime string
		more                 []string
		rtp                  uint32
	}{
		{"20 ms", "a=ptime:20", "a=ptime:20", nil, 200},
		{"10 ms answer", "a=ptime:20", "a=ptime:10", nil, 400},
		{"30 ms counts as 20", "a=ptime:30", "", nil, 200},
		{"no ptime", "", "", nil, 400},
		{"with video", "a=ptime:20", "", video, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			xdp, us := dataplanetest.New(dataplane.PathXDP), dataplanetest.New(dataplane.PathUserspace)
			reg, err := registry.New(registry.Config{
				Interfaces: []registry.Interface{{Addr: relay4, Addr6: relay6, PortMin: 30000, PortMax: 30099}},
				Rates:      policy,
			}, zaptest.NewLogger(t), xdp, us)
			if err != nil {
				t.Fatal(err)
			}
			tb := NewTable(reg, zaptest.NewLogger(t))
			c := tb.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:a@x", "sip:b@y")
			defer c.End(Hangup, 0, "")
			s := NewSession(c.Media, [2]Local{{Addr: relay4}, {Addr: relay4}})
			offer := peerSDP{addr: "198.18.0.2", port: 4000, more: tc.more}
			answer := peerSDP{addr: "198.18.2.2", port: 6000}
			if tc.offerPtime != "" {
				offer.extra = []string{tc.offerPtime}
			}
			if tc.ansPtime != "" {
				answer.extra = []string{tc.ansPtime}
			}
			if tc.more != nil {
				answer.more = []string{"m=video 6002 RTP/AVP 96", "a=rtpmap:96 VP8/90000"}
			}
			if _, err := s.Offer(A, offer.parse(t), OfferOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Answer(B, answer.parse(t), AnswerOptions{}); err != nil {
				t.Fatal(err)
			}
			want := map[bool]dataplane.RateCap{
				false: {PPS: tc.rtp, Burst: tc.rtp},
				true:  {PPS: 100, Burst: 100},
			}
			n := 0
			for _, f := range c.Media.Flows() {
				st := c.Media.Streams()[0]
				rtcp := f.Flow.ClockRate == 0
				w := want[rtcp]
				if f.Flow.Match.Port() != st.Ends[A].Port && f.Flow.Match.Port() != st.Ends[A].Port+1 &&
					f.Flow.Match.Port() != st.Ends[B].Port && f.Flow.Match.Port() != st.Ends[B].Port+1 {
					// the video stream's
					if !rtcp {
						w = dataplane.RateCap{PPS: 2000, Burst: 2000}
					}
				}
				if f.Flow.RateCap != w {
					t.Errorf("flow %s (rtcp %v): cap %+v, want %+v", f.Flow.Match, rtcp, f.Flow.RateCap, w)
				}
				n++
			}
			if want := 4 * len(c.Media.Streams()); n != want {
				t.Errorf("%d flows, want %d", n, want)
			}
			snap := c.Snapshot()
			for i, ss := range snap.Media.Streams {
				st := c.Media.Streams()[i]
				if ss.Kind != st.Kind || ss.Ptime != st.Ptime {
					t.Errorf("stream %d snapshot: kind %q ptime %d, stream %q %d", i, ss.Kind, ss.Ptime, st.Kind, st.Ptime)
				}
			}
		})
	}
}

func TestRatePolicy(t *testing.T) {
	p := registry.RatePolicy{Factor: 4, DefaultPPS: 2000, RTCPPPS: 100}
	for _, tc := range []struct {
		kind  string
		ptime int
		pps   uint32
	}{
		{"audio", 20, 200}, {"audio", 10, 400}, {"audio", 0, 400}, {"audio", 40, 200},
		{"audio", 5, 800}, {"audio", 1, 800}, {"audio", 30, 200}, {"video", 20, 2000}, {"", 20, 2000},
	} {
		if got := p.MediaCap(tc.kind, tc.ptime); got != (dataplane.RateCap{PPS: tc.pps, Burst: tc.pps}) {
			t.Errorf("%s ptime %d: %+v, want %d", tc.kind, tc.ptime, got, tc.pps)
		}
	}
	if got := (registry.RatePolicy{Factor: 4, DefaultPPS: 1_000_000}).DefaultCap(); got.PPS != 1_000_000 || got.Burst != dataplane.MaxRateBurst {
		t.Errorf("a million packets/s: %+v", got)
	}
	off := registry.RatePolicy{DefaultPPS: 2000, RTCPPPS: 100}
	if off.MediaCap("audio", 20) != (dataplane.RateCap{}) || off.RTCPCap() != (dataplane.RateCap{}) || off.DefaultCap() != (dataplane.RateCap{}) {
		t.Error("factor 0 still caps")
	}
}
