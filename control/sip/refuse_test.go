package sip

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
)

// sdpLines is an offer from the caller's address with these media lines.
func sdpLines(conn string, media ...string) []byte {
	lines := append([]string{"v=0", "o=caller 1 1 IN IP4 " + callerIP, "s=-", conn, "t=0 0"}, media...)
	return []byte(strings.Join(lines, "\r\n") + "\r\n")
}

// TestRefusedOffers: an INVITE whose offer relayd cannot honour gets 488
// with a Warning (399 relayd "why"), never a 500 and never a downgraded
// offer to the callee: media toward relayd's own address (one guessed
// port is enough to make the relay send to itself), loopback, broadcast,
// link-local; a family the relay has no media address of; SRTP without a
// key relayd can use; a transport relayd does not relay.
func TestRefusedOffers(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, userspace: true})
	audio := func(port, proto string, extra ...string) []string {
		return append([]string{"m=audio " + port + " " + proto + " 0", "a=rtpmap:0 PCMU/8000"}, extra...)
	}
	for _, tc := range []struct {
		name, why string
		body      []byte
	}{
		{"relay media address", "relayd itself", sdpLines("c=IN IP4 198.18.1.1", audio("30002", "RTP/AVP")...)},
		{"relay address in a=rtcp", "relayd itself", sdpLines("c=IN IP4 "+callerIP, audio("4000", "RTP/AVP", "a=rtcp:30003 IN IP4 198.18.1.1")...)},
		{"loopback", "loopback", sdpLines("c=IN IP4 127.0.0.1", audio("4000", "RTP/AVP")...)},
		{"broadcast", "broadcast", sdpLines("c=IN IP4 255.255.255.255", audio("4000", "RTP/AVP")...)},
		{"link-local", "link-local", sdpLines("c=IN IP4 169.254.10.1", audio("4000", "RTP/AVP")...)},
		{"IPv6 without an IPv6 media address", "no IPv6 media address", sdpLines("c=IN IP6 2001:2::2", audio("4000", "RTP/AVP")...)},
		{"SAVP without a=crypto", "a=crypto", sdpLines("c=IN IP4 "+callerIP, audio("4000", "RTP/SAVP")...)},
		{"SAVP with an unknown suite", "a=crypto", sdpLines("c=IN IP4 "+callerIP, audio("4000", "RTP/SAVP", "a=crypto:1 AES_192_CM_HMAC_SHA1_80 inline:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygp")...)},
		{"SAVP with a bad key", "a=crypto", sdpLines("c=IN IP4 "+callerIP, audio("4000", "RTP/SAVP", "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:!!notbase64!!")...)},
		{"SAVPF with a short key", "a=crypto", sdpLines("c=IN IP4 "+callerIP, audio("4000", "RTP/SAVPF", "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:AAEC")...)},
		{"DTLS-SRTP", "transport", sdpLines("c=IN IP4 "+callerIP, audio("4000", "UDP/TLS/RTP/SAVPF", "a=fingerprint:sha-256 00:11", "a=setup:actpass")...)},
		{"T.38 alone", "media image", sdpLines("c=IN IP4 "+callerIP, "m=image 4000 udptl t38")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d, err := h.invite(ctx, tc.body)
			var dr *sipgo.ErrDialogResponse
			switch {
			case err == nil:
				t.Errorf("answered %d, want 488; the callee got:\n%s", d.InviteResponse.StatusCode, ce.lastInvite().Body())
				d.Ack(ctx)
				d.Bye(ctx)
			case !errors.As(err, &dr):
				t.Fatalf("INVITE: %v", err)
			case dr.Res.StatusCode != sip.StatusNotAcceptableHere:
				t.Errorf("INVITE: %s, want 488", dr.Res.StartLine())
			default:
				w := dr.Res.GetHeader("Warning")
				if w == nil || !strings.HasPrefix(w.Value(), `399 relayd "`) || !strings.Contains(w.Value(), tc.why) {
					t.Errorf("Warning %v, want 399 relayd saying %q", w, tc.why)
				}
			}
			if ce.lastInvite() != nil {
				t.Errorf("the callee got an INVITE:\n%s", ce.lastInvite().Body())
			}
			if n := h.xdp.Len() + h.us.Len(); n != 0 {
				t.Errorf("%d flows installed", n)
			}
			// Refusals before the call exists write no CDR; the others do.
			select {
			case <-h.ended:
			case <-time.After(100 * time.Millisecond):
			}
			ce.mu.Lock()
			ce.invites = nil
			ce.mu.Unlock()
		})
	}
}

// TestRefusedReinvite: a re-INVITE that moves the caller's media onto
// relayd's own address gets 488 with a Warning, never reaches the
// callee, and the call's flows stay as they were.
func TestRefusedReinvite(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, _ := h.answered(ctx, ce)
	before, _ := h.xdp.List()
	re := sip.NewRequest(sip.INVITE, d.InviteResponse.Contact().Address)
	re.SetBody(sdpLines("c=IN IP4 198.18.1.1", "m=audio 30002 RTP/AVP 0", "a=rtpmap:0 PCMU/8000"))
	re.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	res, err := d.Do(ctx, re)
	if err != nil {
		t.Fatal(err)
	}
	if w := res.GetHeader("Warning"); res.StatusCode != sip.StatusNotAcceptableHere || w == nil || !strings.Contains(w.Value(), "relayd itself") {
		t.Errorf("re-INVITE toward the relay: %s, Warning %v; want 488 saying why", res.StartLine(), w)
	}
	after, _ := h.xdp.List()
	if len(after) != len(before) {
		t.Fatalf("%d flows after the refused re-INVITE, %d before", len(after), len(before))
	}
	for i := range after {
		if after[i].Flow.SendTo != before[i].Flow.SendTo {
			t.Errorf("flow %s now sends to %s, was %s", after[i].Flow.Match, after[i].Flow.SendTo, before[i].Flow.SendTo)
		}
	}
	d.Bye(ctx)
	h.cdr()
}

// TestCalleeAnswerTowardRelay: a callee whose answer puts its media on
// relayd's own address is hung up, and the caller gets 488 with the
// Warning; no flow toward the relay is left.
func TestCalleeAnswerTowardRelay(t *testing.T) {
	ce := newCallee(t)
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		d.Respond(200, "OK", sdpLines("c=IN IP4 198.18.1.1", "m=audio 30000 RTP/AVP 0", "a=rtpmap:0 PCMU/8000"),
			sip.NewHeader("Content-Type", "application/sdp"))
		<-d.Context().Done()
	})
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.invite(ctx, offerSDP(4000))
	var dr *sipgo.ErrDialogResponse
	if !errors.As(err, &dr) || dr.Res.StatusCode != sip.StatusNotAcceptableHere {
		t.Fatalf("INVITE: %v, want 488", err)
	}
	if w := dr.Res.GetHeader("Warning"); w == nil || !strings.Contains(w.Value(), "relayd itself") {
		t.Errorf("Warning %v, want one saying the media goes to relayd itself", w)
	}
	h.cdr()
	waitFor(t, "the callee's BYE", func() bool { ce.mu.Lock(); defer ce.mu.Unlock(); return ce.byes == 1 })
	list, _ := h.xdp.List()
	for _, fs := range list {
		if fs.Flow.SendTo.Addr() == relayIP {
			t.Errorf("flow %s sends to the relay", fs.Flow.Match)
		}
	}
}

// TestIPv6MediaOverIPv4Signalling: the caller signals over IPv4 and
// offers IPv6 media; a relay with an IPv6 media address anchors the
// caller's leg there (the family of the media, not of the signalling).
func TestIPv6MediaOverIPv4Signalling(t *testing.T) {
	ce := newCallee(t)
	relay6 := netip.MustParseAddr("2001:2:0:1::1")
	h := newHarness(t, opts{destinations: []string{ce.addr}, relay6: relay6})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, sdpLines("c=IN IP6 2001:2::10", "m=audio 4000 RTP/AVP 0", "a=rtpmap:0 PCMU/8000"))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	if ans := string(d.InviteResponse.Body()); !strings.Contains(ans, "c=IN IP6 "+relay6.String()) {
		t.Errorf("answer to the caller not on the relay's IPv6 address:\n%s", ans)
	}
	if out := string(ce.lastInvite().Body()); !strings.Contains(out, "c=IN IP4 "+relayIP.String()) {
		t.Errorf("offer to the (IPv4) callee not on the relay's IPv4 address:\n%s", out)
	}
	waitFor(t, "4 flows", func() bool { return h.xdp.Len() == 4 })
	list, _ := h.xdp.List()
	for _, fs := range list {
		f := fs.Flow
		if f.SendTo.Addr().Is6() != f.SendFrom.Addr().Is6() {
			t.Errorf("flow %+v mixes families", f)
		}
	}
	d.Bye(ctx)
	h.cdr()
}
