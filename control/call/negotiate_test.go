package call

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
	"github.com/relayd/relayd/sdes"
)

// negCall is a call with a negotiation session on a fake XDP and
// userspace data plane, relay4 on both legs.
type negCall struct {
	xdp, us *dataplanetest.DataPlane
	c       *Call
	s       *Session
}

func newNegCall(t *testing.T) *negCall {
	t.Helper()
	n := &negCall{xdp: dataplanetest.New(dataplane.PathXDP), us: dataplanetest.New(dataplane.PathUserspace)}
	tb := newTable(t, n.xdp, n.us)
	n.c = tb.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:a@x", "sip:b@y")
	t.Cleanup(func() { n.c.End(Hangup, 0, "") })
	n.s = NewSession(n.c.Media, [2]Local{{Addr: relay4}, {Addr: relay4}})
	return n
}

// flows returns the installed flows by match.
func (n *negCall) flows() map[netip.AddrPort]FlowStat {
	out := make(map[netip.AddrPort]FlowStat)
	for _, f := range n.c.Media.Flows() {
		out[f.Flow.Match] = f
	}
	return out
}

// match returns the relay address a leg's RTP (rtcp: RTCP) of stream i
// arrives on.
func (n *negCall) match(t *testing.T, i int, s Side, rtcp bool) netip.AddrPort {
	t.Helper()
	st := n.c.Media.Streams()[i]
	p := st.Ends[s].Port
	if rtcp {
		p++
	}
	return netip.AddrPortFrom(st.Ends[s].Relay, p)
}

// peerSDP is a peer's SDP: one audio stream (PCMU, PCMA, G729,
// telephone-event) at addr:port, extra lines appended to its m= section.
type peerSDP struct {
	addr  string
	port  int
	keys  []*sdes.Crypto
	proto string // default RTP/SAVP with keys, else RTP/AVP
	mux   bool
	conn  string   // media-level c= address
	extra []string // media-level attribute lines
	more  []string // further m= sections, verbatim
}

func (p peerSDP) body(t *testing.T) []byte {
	t.Helper()
	proto := p.proto
	if proto == "" {
		proto = "RTP/AVP"
		if len(p.keys) > 0 {
			proto = "RTP/SAVP"
		}
	}
	l := []string{
		"v=0", "o=peer 42 42 IN IP4 " + p.addr, "s=-", "c=IN IP4 " + p.addr, "t=0 0",
		fmt.Sprintf("m=audio %d %s 0 8 18 101", p.port, proto),
	}
	if p.conn != "" {
		l = append(l, "c=IN IP4 "+p.conn)
	}
	l = append(l,
		"a=rtpmap:0 PCMU/8000", "a=rtpmap:8 PCMA/8000", "a=rtpmap:18 G729/8000", "a=rtpmap:101 telephone-event/8000",
		"a=fmtp:101 0-16",
	)
	if p.mux {
		l = append(l, "a=rtcp-mux")
	}
	for _, k := range p.keys {
		v, err := k.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		l = append(l, "a=crypto:"+v)
	}
	l = append(l, p.extra...)
	l = append(l, p.more...)
	return []byte(strings.Join(l, "\r\n") + "\r\n")
}

func (p peerSDP) parse(t *testing.T) *sdp.Description {
	t.Helper()
	return mustParse(t, p.body(t))
}

func mustParse(t *testing.T, body []byte) *sdp.Description {
	t.Helper()
	d, err := sdp.Parse(body)
	if err != nil {
		t.Fatalf("parse %q: %v", body, err)
	}
	return d
}

func newKey(t *testing.T, tag int) *sdes.Crypto {
	t.Helper()
	k, err := sdes.Generate(tag, sdes.AES_CM_128_HMAC_SHA1_80)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func first(st sdp.Stream) *sdes.Crypto {
	if len(st.Crypto) == 0 {
		return nil
	}
	return st.Crypto[0]
}

func keyText(k *sdes.Crypto) string {
	if k == nil {
		return "none"
	}
	v, _ := k.Marshal()
	return v
}

// crypto returns the only a=crypto of stream 0 of a rendered SDP,
// "none" without one.
func crypto(t *testing.T, d *sdp.Description) string {
	t.Helper()
	switch len(d.Streams[0].Crypto) {
	case 0:
		return "none"
	case 1:
		return keyText(d.Streams[0].Crypto[0])
	}
	t.Fatalf("%d a=crypto lines", len(d.Streams[0].Crypto))
	return ""
}

func TestNegotiateSRTP(t *testing.T) {
	type want struct {
		toB, toA string // proto, then the a=crypto: "none", "offer", "answer", "relay"
		// keys of the ends: "none", "offer", "answer", "relay" (the
		// key relayd put in the SDP toward that leg)
		aRecv, aSend, bRecv, bSend string
		path                       dataplane.Path // of the RTP flows
	}
	plain := want{"RTP/AVP none", "RTP/AVP none", "none", "none", "none", "none", dataplane.PathXDP}
	for _, tc := range []struct {
		name        string
		policy      Policy
		noTerm      bool   // no userspace SRTP
		offerKeys   bool   // a=crypto in A's offer
		answer      string // B's a=crypto: "none", "match" (relayd's or the offer's tag and suite), "other" (neither), "renumbered" (the suite under another tag)
		want        want
		offerErr    error
		answerErr   error
		answerProto string
	}{
		{name: "pass plain", policy: SRTPPass, answer: "none", want: plain},
		{name: "pass keys", policy: SRTPPass, offerKeys: true, answer: "match",
			want: want{"RTP/SAVP offer", "RTP/SAVP answer", "none", "none", "none", "none", dataplane.PathXDP}},
		{name: "pass keys, answer another key", policy: SRTPPass, offerKeys: true, answer: "other",
			want: want{"RTP/SAVP offer", "RTP/SAVP answer", "none", "none", "none", "none", dataplane.PathXDP}},
		{name: "off plain", policy: SRTPOff, answer: "none", want: plain},
		{name: "off keys: relayd terminates the caller's SRTP", policy: SRTPOff, offerKeys: true, answer: "none",
			want: want{"RTP/AVP none", "RTP/SAVP relay", "offer", "relay", "none", "none", dataplane.PathUserspace}},
		{name: "off keys without userspace", policy: SRTPOff, noTerm: true, offerKeys: true, offerErr: ErrSRTPUnsupported},
		{name: "offer plain, callee takes the key", policy: SRTPOffer, answer: "match",
			want: want{"RTP/AVP relay", "RTP/AVP none", "none", "none", "answer", "relay", dataplane.PathUserspace}},
		{name: "offer plain, callee stays plain", policy: SRTPOffer, answer: "none",
			want: want{"RTP/AVP relay", "RTP/AVP none", "none", "none", "none", "none", dataplane.PathXDP}},
		{name: "offer plain, callee answers another key", policy: SRTPOffer, answer: "other",
			want: want{"RTP/AVP relay", "RTP/AVP none", "none", "none", "none", "none", dataplane.PathXDP}},
		{name: "offer plain without userspace", policy: SRTPOffer, noTerm: true, answer: "none", want: plain},
		{name: "offer keys", policy: SRTPOffer, offerKeys: true, answer: "match",
			want: want{"RTP/SAVP offer", "RTP/SAVP answer", "none", "none", "none", "none", dataplane.PathXDP}},
		{name: "require plain, callee takes the key", policy: SRTPRequire, answer: "match",
			want: want{"RTP/SAVP relay", "RTP/AVP none", "none", "none", "answer", "relay", dataplane.PathUserspace}},
		{name: "require plain, callee plain", policy: SRTPRequire, answer: "none", answerErr: sdp.ErrNotAcceptable},
		{name: "require plain, callee answers another key", policy: SRTPRequire, answer: "other", answerErr: sdp.ErrNotAcceptable},
		// Like rtpengine: the offered suite under another tag is taken.
		{name: "require plain, callee renumbers the key", policy: SRTPRequire, answer: "renumbered",
			want: want{"RTP/SAVP relay", "RTP/AVP none", "none", "none", "answer", "relay", dataplane.PathUserspace}},
		{name: "require plain without userspace", policy: SRTPRequire, noTerm: true, offerErr: ErrSRTPUnsupported},
		{name: "require keys on RTP/AVP", policy: SRTPRequire, offerKeys: true, answer: "match", answerProto: "RTP/AVP",
			want: want{"RTP/SAVP offer", "RTP/AVP answer", "none", "none", "none", "none", dataplane.PathXDP}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNegCall(t)
			offer := peerSDP{addr: "198.18.0.2", port: 4000}
			if tc.offerKeys {
				offer.keys = []*sdes.Crypto{newKey(t, 3)}
				if tc.answerProto != "" {
					offer.proto = tc.answerProto
				}
			}
			body, err := n.s.Offer(A, offer.parse(t), OfferOptions{SRTP: tc.policy, SRTPTermination: !tc.noTerm})
			if !errors.Is(err, tc.offerErr) {
				t.Fatalf("offer: %v, want %v", err, tc.offerErr)
			}
			if err != nil {
				return
			}
			toB := mustParse(t, body)
			keys := map[string]string{"none": "none"}
			if tc.offerKeys {
				keys["offer"] = keyText(offer.keys[0])
			}
			if c := crypto(t, toB); c != "none" && c != keys["offer"] {
				keys["relay"] = c
			}
			ans := peerSDP{addr: "198.18.2.2", port: 6000}
			if len(toB.Streams[0].Crypto) > 0 {
				ref := toB.Streams[0].Crypto[0]
				switch tc.answer {
				case "match":
					k := newKey(t, ref.Tag)
					ans.keys = []*sdes.Crypto{k}
				case "other":
					k, err := sdes.Generate(ref.Tag+4, sdes.AES_CM_128_HMAC_SHA1_32)
					if err != nil {
						t.Fatal(err)
					}
					ans.keys = []*sdes.Crypto{k}
				case "renumbered":
					ans.keys = []*sdes.Crypto{newKey(t, ref.Tag+4)}
				}
				if tc.answerProto != "" {
					ans.proto = tc.answerProto
				}
			}
			if len(ans.keys) > 0 {
				keys["answer"] = keyText(ans.keys[0])
			}
			body, err = n.s.Answer(B, ans.parse(t), AnswerOptions{})
			if !errors.Is(err, tc.answerErr) {
				t.Fatalf("answer: %v, want %v", err, tc.answerErr)
			}
			if err != nil {
				return
			}
			toA := mustParse(t, body)
			if c := crypto(t, toA); c != "none" && c != keys["answer"] {
				if keys["relay"] != "" {
					t.Fatalf("relayd keyed both legs")
				}
				keys["relay"] = c
			}
			name := func(k *sdes.Crypto) string {
				for n, v := range keys {
					if v == keyText(k) {
						return n
					}
				}
				return "unknown " + keyText(k)
			}
			st := n.c.Media.Streams()[0]
			got := want{
				toB:   toB.Streams[0].Proto + " " + name(first(toB.Streams[0])),
				toA:   toA.Streams[0].Proto + " " + name(first(toA.Streams[0])),
				aRecv: name(st.Ends[A].Recv), aSend: name(st.Ends[A].Send),
				bRecv: name(st.Ends[B].Recv), bSend: name(st.Ends[B].Send),
			}
			flows := n.flows()
			if len(flows) != 4 {
				t.Fatalf("%d flows, want 4: %v", len(flows), flows)
			}
			ab, ba := flows[n.match(t, 0, A, false)], flows[n.match(t, 0, B, false)]
			got.path = ab.Path
			if ba.Path != ab.Path {
				t.Errorf("paths %s and %s differ", ab.Path, ba.Path)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("negotiation (-want +got):\n%s", diff)
			}
			// The flows carry the ends' keys: decrypt what a leg sends,
			// encrypt toward it.
			for _, f := range []struct {
				fs       FlowStat
				dec, enc *sdes.Crypto
			}{{ab, st.Ends[A].Recv, st.Ends[B].Send}, {ba, st.Ends[B].Recv, st.Ends[A].Send}} {
				if !f.fs.Flow.Decrypt.Equal(toSRTP(f.dec)) || !f.fs.Flow.Encrypt.Equal(toSRTP(f.enc)) {
					t.Errorf("flow %s: decrypt %v encrypt %v, want the ends' keys", f.fs.Flow.Match, f.fs.Flow.Decrypt != nil, f.fs.Flow.Encrypt != nil)
				}
			}
			// The address and port each side receives: relayd's.
			for s, d := range map[Side]*sdp.Description{B: toB, A: toA} {
				if d.Streams[0].Addr != relay4 || d.Streams[0].Port != int(st.Ends[s].Port) {
					t.Errorf("SDP to %s: %s port %d, want %s port %d", s, d.Streams[0].Addr, d.Streams[0].Port, relay4, st.Ends[s].Port)
				}
			}
		})
	}
}

func TestNegotiateReofferKeepsRelayKey(t *testing.T) {
	n := newNegCall(t)
	opts := OfferOptions{SRTP: SRTPOff, SRTPTermination: true}
	offer := peerSDP{addr: "198.18.0.2", port: 4000, keys: []*sdes.Crypto{newKey(t, 1)}}
	if _, err := n.s.Offer(A, offer.parse(t), opts); err != nil {
		t.Fatal(err)
	}
	ans := peerSDP{addr: "198.18.2.2", port: 6000}
	first, err := n.s.Answer(B, ans.parse(t), AnswerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.s.Complete()
	relayKey := keyText(n.c.Media.Streams()[0].Ends[A].Send)
	// The caller offers again, same SDP: same key, same answer (same o=
	// version).
	if _, err := n.s.Offer(A, offer.parse(t), opts); err != nil {
		t.Fatal(err)
	}
	again, err := n.s.Answer(B, ans.parse(t), AnswerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(first) {
		t.Errorf("answer to the same re-offer changed:\n%s\nwas\n%s", again, first)
	}
	if k := keyText(n.c.Media.Streams()[0].Ends[A].Send); k != relayKey {
		t.Errorf("relayd's key toward A %s, was %s", k, relayKey)
	}
	// The plain callee re-offers (keys pass toward A): the caller keeps
	// relayd's key and must take it.
	body, err := n.s.Offer(B, ans.parse(t), OfferOptions{SRTPTermination: true})
	if err != nil {
		t.Fatal(err)
	}
	toA := mustParse(t, body)
	if toA.Streams[0].Proto != "RTP/SAVP" || crypto(t, toA) != relayKey {
		t.Errorf("re-offer to A: %s %s, want RTP/SAVP with %s", toA.Streams[0].Proto, crypto(t, toA), relayKey)
	}
	if _, err := n.s.Answer(A, (peerSDP{addr: "198.18.0.2", port: 4000}).parse(t), AnswerOptions{}); !errors.Is(err, sdp.ErrNotAcceptable) {
		t.Errorf("plain answer from A: %v, want ErrNotAcceptable", err)
	}
	newA := newKey(t, toA.Streams[0].Crypto[0].Tag)
	if _, err := n.s.Answer(A, (peerSDP{addr: "198.18.0.2", port: 4000, keys: []*sdes.Crypto{newA}}).parse(t), AnswerOptions{}); err != nil {
		t.Fatal(err)
	}
	st := n.c.Media.Streams()[0]
	if keyText(st.Ends[A].Recv) != keyText(newA) || keyText(st.Ends[A].Send) != relayKey {
		t.Errorf("A's keys recv %s send %s, want %s and %s", keyText(st.Ends[A].Recv), keyText(st.Ends[A].Send), keyText(newA), relayKey)
	}
}

func TestNegotiateCodecs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy CodecPolicy
		want   string // codecs toward B
		err    error
	}{
		{"all", CodecPolicy{}, "PCMU PCMA G729 telephone-event", nil},
		{"allowed", CodecPolicy{Allowed: []string{"pcma", "telephone-event"}}, "PCMA telephone-event", nil},
		{"strip", CodecPolicy{Strip: []string{"G729"}}, "PCMU PCMA telephone-event", nil},
		{"mask is strip", CodecPolicy{Mask: []string{"pcmu"}}, "PCMA G729 telephone-event", nil},
		{"strip all but offer", CodecPolicy{Strip: []string{"all"}, Offer: []string{"PCMA", "opus", "telephone-event/8000"}}, "PCMA telephone-event", nil},
		{"allowed over offer", CodecPolicy{Allowed: []string{"PCMU"}, Strip: []string{"all"}, Offer: []string{"PCMA", "PCMU"}}, "PCMU", nil},
		{"rate must match", CodecPolicy{Strip: []string{"PCMA/16000"}}, "PCMU PCMA G729 telephone-event", nil},
		{"transcode present", CodecPolicy{Mask: []string{"all"}, Transcode: []string{"G729"}}, "G729", nil},
		{"transcode absent, no transcoding", CodecPolicy{Transcode: []string{"opus"}}, "PCMU PCMA G729 telephone-event", nil},
		{"nothing left", CodecPolicy{Allowed: []string{"opus"}}, "", sdp.ErrNotAcceptable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNegCall(t)
			body, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000}).parse(t), OfferOptions{Codecs: tc.policy})
			if !errors.Is(err, tc.err) {
				t.Fatalf("offer: %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			d := mustParse(t, body)
			if got := strings.Join(d.Streams[0].CodecNames(), " "); got != tc.want {
				t.Errorf("codecs %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNegotiateRTCPMux(t *testing.T) {
	caller := netip.MustParseAddrPort("198.18.0.2:4000")
	callee := netip.MustParseAddrPort("198.18.2.2:6000")
	for _, tc := range []struct {
		name                string
		policy              MuxPolicy
		offerMux, answerMux bool
		toB, toA            bool    // a=rtcp-mux in the SDP relayd sends
		ends                [2]bool // End.Mux after the answer
		flows               int
	}{
		{"default both", MuxPolicy{}, true, true, true, true, [2]bool{true, true}, 2},
		{"default callee declines", MuxPolicy{}, true, false, true, false, [2]bool{false, false}, 4},
		{"default none", MuxPolicy{}, false, false, false, false, [2]bool{false, false}, 4},
		{"offer, callee takes it", MuxPolicy{Offer: true}, false, true, true, false, [2]bool{false, true}, 3},
		{"offer, callee declines", MuxPolicy{Offer: true}, false, false, true, false, [2]bool{false, false}, 4},
		{"require, callee silent", MuxPolicy{Require: true}, false, false, true, false, [2]bool{false, true}, 3},
		{"require, caller muxes", MuxPolicy{Require: true}, true, false, true, true, [2]bool{true, true}, 2},
		{"demux", MuxPolicy{Demux: true}, true, true, false, false, [2]bool{false, false}, 4},
		{"accept, callee declines", MuxPolicy{Accept: true}, true, false, true, false, [2]bool{false, false}, 4},
		{"accept, callee takes it", MuxPolicy{Accept: true}, true, true, true, true, [2]bool{true, true}, 2},
		{"reject", MuxPolicy{Reject: true}, true, true, false, false, [2]bool{false, false}, 4},
		{"reject and offer", MuxPolicy{Reject: true, Offer: true}, true, true, true, false, [2]bool{false, true}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNegCall(t)
			body, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000, mux: tc.offerMux}).parse(t), OfferOptions{RTCPMux: tc.policy})
			if err != nil {
				t.Fatal(err)
			}
			if got := mustParse(t, body).Streams[0].RTCPMux; got != tc.toB {
				t.Errorf("rtcp-mux toward B %v, want %v", got, tc.toB)
			}
			body, err = n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000, mux: tc.answerMux}).parse(t), AnswerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := mustParse(t, body).Streams[0].RTCPMux; got != tc.toA {
				t.Errorf("rtcp-mux toward A %v, want %v", got, tc.toA)
			}
			st := n.c.Media.Streams()[0]
			if got := [2]bool{st.Ends[A].Mux, st.Ends[B].Mux}; got != tc.ends {
				t.Errorf("ends mux %v, want %v", got, tc.ends)
			}
			flows := n.flows()
			if len(flows) != tc.flows {
				t.Fatalf("%d flows, want %d", len(flows), tc.flows)
			}
			rtcp, ok := flows[n.match(t, 0, A, true)]
			switch {
			case tc.ends[A] && ok:
				t.Errorf("RTCP flow from a muxed caller")
			case !tc.ends[A] && !ok:
				t.Fatalf("no RTCP flow from the caller")
			case !tc.ends[A] && tc.ends[B]:
				// Onto the muxed callee's RTP address, from relayd's RTP port.
				if rtcp.Flow.SendTo != callee || rtcp.Flow.SendFrom != n.match(t, 0, B, false) {
					t.Errorf("RTCP toward the muxed callee: %s -> %s", rtcp.Flow.SendFrom, rtcp.Flow.SendTo)
				}
			case !tc.ends[A]:
				if rtcp.Flow.SendTo != netip.AddrPortFrom(callee.Addr(), 6001) || rtcp.Flow.SendFrom != n.match(t, 0, B, true) {
					t.Errorf("RTCP toward the callee: %s -> %s", rtcp.Flow.SendFrom, rtcp.Flow.SendTo)
				}
			}
			if _, ok := flows[n.match(t, 0, B, true)]; ok == tc.ends[B] {
				t.Errorf("RTCP flow from the callee: %v, callee muxed %v", ok, tc.ends[B])
			}
			if f := flows[n.match(t, 0, B, false)]; f.Flow.SendTo != caller {
				t.Errorf("B->A RTP to %s", f.Flow.SendTo)
			}
		})
	}
}

func TestNegotiateLatch(t *testing.T) {
	caller := netip.MustParseAddrPort("198.18.0.2:4000")
	callee := netip.MustParseAddrPort("198.18.2.2:6000")
	natted := netip.MustParseAddrPort("198.18.0.9:50000")
	type flowWant struct {
		Expect  netip.AddrPort
		Latch   bool
		Reverse bool
		SendTo  netip.AddrPort
	}
	for _, tc := range []struct {
		name   string
		a, b   LatchPolicy
		latch  bool // the A->B RTP flow reports the caller's source natted, locked
		ab, ba flowWant
	}{
		{"symmetric", LatchSymmetric, LatchSymmetric, false,
			flowWant{caller, true, true, callee},
			flowWant{callee, true, true, caller}},
		{"symmetric, caller latched", LatchSymmetric, LatchSymmetric, true,
			flowWant{natted, false, false, callee},
			flowWant{callee, true, true, natted}},
		{"asymmetric caller", LatchAsymmetric, LatchSymmetric, false,
			flowWant{netip.AddrPort{}, false, false, callee},
			flowWant{callee, true, true, caller}},
		{"asymmetric caller ignores a learned source", LatchAsymmetric, LatchSymmetric, true,
			flowWant{netip.AddrPort{}, false, false, callee},
			flowWant{callee, true, true, caller}},
		{"strict callee", LatchSymmetric, LatchStrict, false,
			flowWant{caller, true, true, callee},
			flowWant{callee, false, false, caller}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNegCall(t)
			if _, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000}).parse(t), OfferOptions{Latch: tc.a}); err != nil {
				t.Fatal(err)
			}
			if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000}).parse(t), AnswerOptions{Latch: tc.b}); err != nil {
				t.Fatal(err)
			}
			if tc.latch {
				if err := n.c.Media.latched(n.match(t, 0, A, false), natted, true); err != nil {
					t.Fatal(err)
				}
			}
			flows := n.flows()
			got := func(s Side) flowWant {
				f := flows[n.match(t, 0, s, false)].Flow
				return flowWant{f.ExpectSource, f.Latch, f.Reverse.IsValid(), f.SendTo}
			}
			if diff := cmp.Diff([2]flowWant{tc.ab, tc.ba}, [2]flowWant{got(A), got(B)}, cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
				t.Errorf("flows A->B, B->A (-want +got):\n%s", diff)
			}
		})
	}
	n := newNegCall(t)
	if _, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000}).parse(t), OfferOptions{Latch: "sideways"}); err == nil {
		t.Error("unknown latch policy accepted")
	}
}

func TestNegotiateHold(t *testing.T) {
	for _, tc := range []struct {
		name, dir, answerDir string
		hold                 bool // c=0.0.0.0
	}{
		{"sendonly", "a=sendonly", "a=recvonly", false},
		{"inactive", "a=inactive", "a=inactive", false},
		{"c=0.0.0.0", "a=sendonly", "a=recvonly", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNegCall(t)
			if _, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000}).parse(t), OfferOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000}).parse(t), AnswerOptions{}); err != nil {
				t.Fatal(err)
			}
			n.s.Complete()
			hold := peerSDP{addr: "198.18.0.2", port: 4000, extra: []string{tc.dir}}
			if tc.hold {
				hold.conn = "0.0.0.0"
			}
			body, err := n.s.Offer(A, hold.parse(t), OfferOptions{})
			if err != nil {
				t.Fatal(err)
			}
			toB := mustParse(t, body)
			if toB.Streams[0].Direction != strings.TrimPrefix(tc.dir, "a=") {
				t.Errorf("direction toward B %s, want %s", toB.Streams[0].Direction, tc.dir)
			}
			if tc.hold != toB.Streams[0].Addr.IsUnspecified() {
				t.Errorf("address toward B %s, hold %v", toB.Streams[0].Addr, tc.hold)
			}
			if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000, extra: []string{tc.answerDir}}).parse(t), AnswerOptions{}); err != nil {
				t.Fatal(err)
			}
			flows := n.flows()
			_, toA := flows[n.match(t, 0, B, false)]
			if toA == tc.hold {
				t.Errorf("flow toward the caller on hold: %v; want it only without c=0.0.0.0", toA)
			}
			if _, ok := flows[n.match(t, 0, A, false)]; !ok {
				t.Error("no flow from the caller toward the callee")
			}
		})
	}
}

func TestNegotiateStreams(t *testing.T) {
	video := func(port int) []string {
		return []string{fmt.Sprintf("m=video %d RTP/AVP 96", port), "a=rtpmap:96 H264/90000"}
	}
	t.Run("offer disables a stream", func(t *testing.T) {
		n := newNegCall(t)
		body, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000, more: video(0)}).parse(t), OfferOptions{})
		if err != nil {
			t.Fatal(err)
		}
		toB := mustParse(t, body)
		if len(toB.Streams) != 2 || toB.Streams[1].Port != 0 || toB.Streams[0].Port == 0 {
			t.Fatalf("streams toward B %+v", toB.Streams)
		}
		if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000, more: video(0)}).parse(t), AnswerOptions{}); err != nil {
			t.Fatal(err)
		}
		if got := len(n.flows()); got != 4 {
			t.Errorf("%d flows, want audio's 4", got)
		}
	})
	for _, tc := range []struct {
		name   string
		answer []string
	}{
		{"answer rejects a stream", video(0)},
		{"answer lacks a stream", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNegCall(t)
			if _, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000, more: video(4010)}).parse(t), OfferOptions{}); err != nil {
				t.Fatal(err)
			}
			body, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000, more: tc.answer}).parse(t), AnswerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			toA := mustParse(t, body)
			if len(tc.answer) > 0 && (len(toA.Streams) != 2 || toA.Streams[1].Port != 0) {
				t.Errorf("streams toward A %+v", toA.Streams)
			}
			st := n.c.Media.Streams()
			if len(st) != 2 || !st[1].Disabled || st[0].Disabled {
				t.Fatalf("streams %+v", st)
			}
			flows := n.flows()
			if len(flows) != 4 {
				t.Errorf("%d flows, want audio's 4", len(flows))
			}
			if _, ok := flows[n.match(t, 1, A, false)]; ok {
				t.Error("flow for the rejected video")
			}
		})
	}
}

func TestNegotiateLateOffer(t *testing.T) {
	// The callee offers in its 2xx (the caller's INVITE had no SDP); keys
	// pass toward the caller, who answers in the ACK.
	n := newNegCall(t)
	kb, ka := newKey(t, 1), newKey(t, 1)
	body, err := n.s.Offer(B, (peerSDP{addr: "198.18.2.2", port: 6000, keys: []*sdes.Crypto{kb}}).parse(t), OfferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	toA := mustParse(t, body)
	if crypto(t, toA) != keyText(kb) || toA.Streams[0].Port != int(n.c.Media.Streams()[0].Ends[A].Port) {
		t.Errorf("offer toward A: %s port %d", crypto(t, toA), toA.Streams[0].Port)
	}
	if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000}).parse(t), AnswerOptions{}); err == nil {
		t.Error("the offerer answered its own offer")
	}
	body, err = n.s.Answer(A, (peerSDP{addr: "198.18.0.2", port: 4000, keys: []*sdes.Crypto{ka}}).parse(t), AnswerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if toB := mustParse(t, body); crypto(t, toB) != keyText(ka) || toB.Streams[0].Port != int(n.c.Media.Streams()[0].Ends[B].Port) {
		t.Errorf("answer toward B: %s", body)
	}
	flows := n.flows()
	if len(flows) != 4 || flows[n.match(t, 0, B, false)].Flow.SendTo != netip.MustParseAddrPort("198.18.0.2:4000") {
		t.Errorf("flows %v", flows)
	}
	n.s.Complete()
	if _, err := n.s.Answer(A, (peerSDP{addr: "198.18.0.2", port: 4000}).parse(t), AnswerOptions{}); err == nil {
		t.Error("answer after Complete accepted")
	}
}

func TestNegotiateRender(t *testing.T) {
	public := netip.MustParseAddr("198.19.7.7")
	offer := peerSDP{addr: "198.18.0.2", port: 4000, extra: []string{"a=ice-ufrag:abcd", "a=candidate:1 1 UDP 2130706431 198.18.0.2 4000 typ host"}}
	t.Run("b2bua", func(t *testing.T) {
		n := newNegCall(t)
		body, err := n.s.Offer(A, offer.parse(t), OfferOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s := string(body)
		for _, want := range []string{"o=relayd ", "\r\nc=IN IP4 198.18.1.1\r\n"} {
			if !strings.Contains(s, want) {
				t.Errorf("no %q in\n%s", want, s)
			}
		}
		for _, bad := range []string{"candidate", "ice-ufrag", "198.18.0.2"} {
			if strings.Contains(s, bad) {
				t.Errorf("%q left in\n%s", bad, s)
			}
		}
	})
	t.Run("ng", func(t *testing.T) {
		n := newNegCall(t)
		n.s.SetLocal(B, Local{Interface: "pub", Addr: relay4, Advertise: public})
		body, err := n.s.Offer(A, offer.parse(t), OfferOptions{Render: Render{KeepOrigin: true, KeepSessionConnection: true}})
		if err != nil {
			t.Fatal(err)
		}
		s := string(body)
		for _, want := range []string{"o=peer 42 42 IN IP4 198.18.0.2\r\n", "\r\nc=IN IP4 198.18.0.2\r\nt=", "a=rtcp:"} {
			if !strings.Contains(s, want) {
				t.Errorf("no %q in\n%s", want, s)
			}
		}
		d := mustParse(t, body)
		if d.Streams[0].Addr != public || !strings.Contains(s, "IN IP4 198.19.7.7\r\n") {
			t.Errorf("stream address %s, want the advertised %s:\n%s", d.Streams[0].Addr, public, s)
		}
		if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000}).parse(t), AnswerOptions{}); err != nil {
			t.Fatal(err)
		}
		// The flows stay on the relay address.
		if f, ok := n.flows()[n.match(t, 0, B, false)]; !ok || f.Flow.Match.Addr() != relay4 {
			t.Errorf("callee's flow %+v", f.Flow)
		}
	})
	t.Run("ICE force", func(t *testing.T) {
		n := newNegCall(t)
		if _, err := n.s.Offer(A, offer.parse(t), OfferOptions{Render: Render{ICE: ICEForce}}); !errors.Is(err, ErrICEUnsupported) {
			t.Errorf("ICE force: %v, want ErrICEUnsupported", err)
		}
	})
}

func TestSessionSnapshot(t *testing.T) {
	n := newNegCall(t)
	offer := peerSDP{addr: "198.18.0.2", port: 4000}
	sent, err := n.s.Offer(A, offer.parse(t), OfferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000}).parse(t), AnswerOptions{}); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(n.s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var snap SessionSnapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		t.Fatal(err)
	}
	r := RestoreSession(n.c.Media, [2]Local{{Addr: relay4}, {Addr: relay4}}, snap)
	if string(r.LastSent(B)) != string(sent) || r.Pending() {
		t.Errorf("restored: last sent to B %q, pending %v", r.LastSent(B), r.Pending())
	}
	// The same offer renders the same SDP: same o= line.
	again, err := r.Offer(A, offer.parse(t), OfferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(sent) {
		t.Errorf("after restore:\n%s\nbefore:\n%s", again, sent)
	}
}

// Each leg's last SDP is a copy of its own (in the call's room while it
// fits): it reads back as sent, a re-offer to one leg leaves the
// other's, and the o= version logic sees the same bodies (the same offer
// keeps its version, a changed one bumps it).
func TestSessionLastSent(t *testing.T) {
	n := newNegCall(t)
	offer := peerSDP{addr: "198.18.0.2", port: 4000}
	sent, err := n.s.Offer(A, offer.parse(t), OfferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.s.LastSent(A) != nil {
		t.Errorf("leg A got nothing yet, LastSent %q", n.s.LastSent(A))
	}
	answered, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000}).parse(t), AnswerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	toB, toA := n.s.LastSent(B), n.s.LastSent(A)
	if string(toB) != string(sent) || string(toA) != string(answered) {
		t.Fatalf("last sent: to B %q, to A %q; want %q, %q", toB, toA, sent, answered)
	}
	if &toA[0] == &answered[0] || &toB[0] == &sent[0] || len(toA) != cap(toA) {
		t.Error("the last SDPs are the bodies sent, not the session's own array")
	}
	again, err := n.s.Offer(A, offer.parse(t), OfferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(sent) {
		t.Errorf("the same offer again:\n%s\nbefore:\n%s", again, sent)
	}
	if string(n.s.LastSent(A)) != string(answered) {
		t.Errorf("an offer to B changed the last SDP to A: %q", n.s.LastSent(A))
	}
	if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000}).parse(t), AnswerOptions{}); err != nil {
		t.Fatal(err)
	}
	moved, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000, extra: []string{"a=sendonly"}}).parse(t), OfferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if version(t, moved) != version(t, sent)+1 || string(n.s.LastSent(B)) != string(moved) {
		t.Errorf("a changed offer: o= version %d, want %d; last sent to B %q", version(t, moved), version(t, sent)+1, n.s.LastSent(B))
	}
}

// version is the o= line's session version of an SDP body.
func version(t *testing.T, body []byte) uint64 {
	t.Helper()
	for l := range strings.SplitSeq(string(body), "\r\n") {
		if o, ok := strings.CutPrefix(l, "o="); ok {
			var v uint64
			if f := strings.Fields(o); len(f) == 6 {
				if _, err := fmt.Sscan(f[2], &v); err == nil {
					return v
				}
			}
		}
	}
	t.Fatalf("no o= line in %q", body)
	return 0
}

func TestEndSnapshot(t *testing.T) {
	n := newNegCall(t)
	if _, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000}).parse(t), OfferOptions{RTCPMux: MuxPolicy{Offer: true}, Latch: LatchStrict}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000, mux: true}).parse(t), AnswerOptions{Latch: LatchAsymmetric}); err != nil {
		t.Fatal(err)
	}
	before := n.c.Media.Streams()
	snap := n.c.Snapshot()
	tb := newTable(t, dataplanetest.New(dataplane.PathXDP))
	c, err := tb.Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, c.Media.Streams(), cmp.Comparer(func(a, b *sdes.Crypto) bool { return keyText(a) == keyText(b) }),
		cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{})); diff != "" {
		t.Errorf("restored streams (-before +after):\n%s", diff)
	}
}

// TestNegotiateSuites: relayd keying the answerer's leg offers one key
// per suite; the answer's pick (tag and suite) becomes the leg's key, the
// others are dropped; a re-offer offers only the key in use.
func TestNegotiateSuites(t *testing.T) {
	n := newNegCall(t)
	opts := OfferOptions{SRTP: SRTPRequire, SRTPTermination: true, Suites: []sdes.Suite{sdes.AEAD_AES_256_GCM, sdes.AES_CM_128_HMAC_SHA1_80}}
	body, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000}).parse(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	off := mustParse(t, body)
	if len(off.Streams[0].Crypto) != 2 || off.Streams[0].Crypto[0].Suite != sdes.AEAD_AES_256_GCM || off.Streams[0].Crypto[1].Tag != 2 {
		t.Fatalf("offered keys %v", off.Streams[0].Crypto)
	}
	picked := off.Streams[0].Crypto[1]
	own, err := sdes.Generate(2, sdes.AES_CM_128_HMAC_SHA1_80)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000, keys: []*sdes.Crypto{own}}).parse(t), AnswerOptions{}); err != nil {
		t.Fatal(err)
	}
	n.s.Complete()
	e := n.c.Media.Streams()[0].Ends[B]
	if keyText(e.Send) != keyText(picked) || keyText(e.Recv) != keyText(own) {
		t.Errorf("B's keys send %s recv %s, want %s and %s", keyText(e.Send), keyText(e.Recv), keyText(picked), keyText(own))
	}
	body, err = n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000}).parse(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	if again := mustParse(t, body); len(again.Streams[0].Crypto) != 1 || keyText(again.Streams[0].Crypto[0]) != keyText(picked) {
		t.Errorf("re-offer keys %v, want only %s", again.Streams[0].Crypto, keyText(picked))
	}
}

// TestHeldCallObjects: a call that is up (offer and answer done, both
// legs' identities set) keeps few heap objects of its own. Each small
// object a held call keeps, made while other calls were being set up,
// keeps a page of their garbage in use for as long as the call lasts
// (the SIP bench's heap per held call), so the count matters more than
// the bytes. It counts the objects left after a GC, per call, over calls
// set up one after another with the setup's garbage between them.
func TestHeldCallObjects(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	tb := newTableRange(t, 20000, 29999, xdp)
	offer := peerSDP{addr: "198.18.0.2", port: 4000}.body(t)
	answer := peerSDP{addr: "198.18.2.2", port: 6000}.body(t)
	type held struct {
		c *Call
		s *Session
	}
	setup := func(i int) held {
		c := tb.New(netip.AddrPortFrom(callerIP, 5060), fmt.Sprintf("sip:alice-%d@198.18.0.2", i), "sip:bob@198.18.2.2")
		s := NewSession(c.Media, [2]Local{{Addr: relay4}, {Addr: relay4}})
		if _, err := s.Offer(A, mustParse(t, offer), OfferOptions{SRTP: SRTPOff}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Answer(B, mustParse(t, answer), AnswerOptions{}); err != nil {
			t.Fatal(err)
		}
		s.Complete() // the ACK
		c.SetLeg(A, Leg{CallID: fmt.Sprintf("%d-caller@198.18.0.2", i), FromTag: fmt.Sprintf("tag-a-%d", i), Remote: "198.18.0.2:5060", Transport: "UDP"})
		c.SetLeg(B, Leg{CallID: fmt.Sprintf("%d-relayd@198.18.1.1", i), FromTag: fmt.Sprintf("tag-b-%d", i), ToTag: fmt.Sprintf("tag-c-%d", i), Remote: "198.18.2.2:5060", Transport: "udp"})
		return held{c, s}
	}
	const calls = 1000
	calls0 := make([]held, 0, calls)
	calls0 = append(calls0, setup(0)) // what the first call makes once
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 1; i <= calls; i++ {
		calls0 = append(calls0, setup(i))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(int64(after.HeapObjects)-int64(before.HeapObjects)) / calls
	if xdp.Len() != 4*(calls+1) {
		t.Fatalf("%d flows installed, want %d", xdp.Len(), 4*(calls+1))
	}
	// The call (1), its session (1), the registry's four records (4), and
	// the fake data plane's four (its map keeps each flow's FlowStats,
	// too large to sit in the map's slots); the maps' own share is under
	// one.
	const most = 11
	t.Logf("%.2f heap objects per held call", per)
	if per > most {
		t.Errorf("a held call keeps %.2f heap objects, want at most %d", per, most)
	}
	runtime.KeepAlive(calls0)
}
