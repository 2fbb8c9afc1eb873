package call

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/relayd/relayd/control/destpolicy"
	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/sdes"
)

// TestOfferRefusals: Offer refuses what relayd cannot honour as it is
// before it takes a port or installs a flow, with a Reason for the peer:
// media toward an address the destination policy denies (relayd's own
// media address with a guessed port, its a=rtcp, loopback), a family the
// leg has no media address of, a secure profile without a usable key.
func TestOfferRefusals(t *testing.T) {
	v6 := func(media ...string) []byte {
		return []byte(strings.Join(append([]string{"v=0", "o=peer 1 1 IN IP6 2001:2::10", "s=-", "c=IN IP6 2001:2::10", "t=0 0"}, media...), "\r\n") + "\r\n")
	}
	for _, tc := range []struct {
		name   string
		body   []byte
		deny   bool   // wraps destpolicy.ErrDenied
		reason string // substring of Reason
	}{
		{"own address", peerSDP{addr: relay4.String(), port: 30002}.body(t), true, "relayd itself"},
		{"own address in a=rtcp", peerSDP{addr: "198.18.0.2", port: 4000, extra: []string{"a=rtcp:30001 IN IP4 " + relay4.String()}}.body(t), true, "relayd itself"},
		{"media-level c= on loopback", peerSDP{addr: "198.18.0.2", port: 4000, conn: "127.0.0.1"}.body(t), true, "loopback"},
		{"IPv6 media on an IPv4 leg", v6("m=audio 4000 RTP/AVP 0"), false, "no IPv6 media address"},
		{"SAVP without a=crypto", peerSDP{addr: "198.18.0.2", port: 4000, proto: "RTP/SAVP"}.body(t), false, "RTP/SAVP without a usable a=crypto"},
		{"SAVP with an unknown suite only", peerSDP{addr: "198.18.0.2", port: 4000, proto: "RTP/SAVP",
			extra: []string{"a=crypto:1 AES_192_CM_HMAC_SHA1_80 inline:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygp"}}.body(t), false, "a=crypto"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNegCall(t)
			free := freePairs(n.c.Media.t)
			_, err := n.s.Offer(A, mustParse(t, tc.body), OfferOptions{Install: true, SRTPTermination: true})
			if err == nil {
				t.Fatal("offer accepted")
			}
			if errors.Is(err, destpolicy.ErrDenied) != tc.deny || !strings.Contains(Reason(err), tc.reason) {
				t.Errorf("error %v (reason %q), want denied %v, reason with %q", err, Reason(err), tc.deny, tc.reason)
			}
			if !tc.deny && !errors.Is(err, sdp.ErrNotAcceptable) {
				t.Errorf("error %v does not wrap sdp.ErrNotAcceptable", err)
			}
			if got := freePairs(n.c.Media.t); got != free {
				t.Errorf("%d free port pairs after the refusal, %d before", got, free)
			}
			if n.xdp.Len()+n.us.Len() != 0 || n.s.Pending() {
				t.Errorf("%d flows, pending %v after the refusal", n.xdp.Len()+n.us.Len(), n.s.Pending())
			}
		})
	}
}

// TestAnswerRefusals: an answer toward relayd's own address, or on
// RTP/SAVP without a key to an offer whose keys pass end to end, is
// refused; the flows the offer installed toward the offerer stay.
func TestAnswerRefusals(t *testing.T) {
	key := func() *sdes.Crypto {
		k, err := sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	for _, tc := range []struct {
		name       string
		offer, ans peerSDP
		reason     string
	}{
		{"answer toward the relay", peerSDP{addr: "198.18.0.2", port: 4000}, peerSDP{addr: relay4.String(), port: 30000}, "relayd itself"},
		{"SAVP answer without a key", peerSDP{addr: "198.18.0.2", port: 4000, keys: []*sdes.Crypto{key()}},
			peerSDP{addr: "198.18.2.2", port: 6000, proto: "RTP/SAVP"}, "a=crypto"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNegCall(t)
			if _, err := n.s.Offer(A, tc.offer.parse(t), OfferOptions{Install: true}); err != nil {
				t.Fatal(err)
			}
			_, err := n.s.Answer(B, tc.ans.parse(t), AnswerOptions{})
			if !strings.Contains(Reason(err), tc.reason) {
				t.Errorf("Answer: %v (reason %q), want a refusal saying %q", err, Reason(err), tc.reason)
			}
			for _, f := range n.c.Media.Flows() {
				if f.Flow.SendTo.Addr() == relay4 {
					t.Errorf("flow %s sends to the relay", f.Flow.Match)
				}
			}
		})
	}
}

// A latching flow that learns a source the policy denies (packets from
// relayd itself) does not make its reverse flow send there.
func TestLatchedOwnAddressIgnored(t *testing.T) {
	n := newNegCall(t)
	if _, err := n.s.Offer(A, (peerSDP{addr: "198.18.0.2", port: 4000}).parse(t), OfferOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.Answer(B, (peerSDP{addr: "198.18.2.2", port: 6000}).parse(t), AnswerOptions{}); err != nil {
		t.Fatal(err)
	}
	fromA := n.match(t, 0, A, false)
	n.c.Media.Latched(fromA, netip.AddrPortFrom(relay4, 30050), false)
	for _, f := range n.c.Media.Flows() {
		if f.Flow.SendTo.Addr() == relay4 {
			t.Errorf("flow %s sends to the relay after latching it", f.Flow.Match)
		}
	}
}
