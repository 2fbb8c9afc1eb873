package sip

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/route"
	"github.com/relayd/relayd/internal/testcert"
)

// tlsCaller is a caller that reaches the B2BUA's tls listener, trusting
// roots.
func (h *harness) tlsCaller(roots *x509.CertPool) *sipgo.DialogClientCache {
	h.t.Helper()
	ua, err := sipgo.NewUA(sipgo.WithUserAgent("tls-caller"), sipgo.WithUserAgenTLSConfig(&tls.Config{RootCAs: roots}))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { ua.Close() })
	cli, err := sipgo.NewClient(ua, sipgo.WithClientHostname("127.0.0.1"))
	if err != nil {
		h.t.Fatal(err)
	}
	contact := sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "caller", Host: "127.0.0.1", Port: h.cport,
		UriParams: sip.HeaderParams{{K: "transport", V: "tls"}}}}
	return sipgo.NewDialogClientCache(cli, contact)
}

// waitNegotiated waits until every call has seen the caller's ACK: over
// a stream, an ACK and a BYE sent at once are handled concurrently.
func (h *harness) waitNegotiated() {
	h.t.Helper()
	waitFor(h.t, "ACK", func() bool {
		for _, bc := range h.srv.calls() {
			bc.mu.Lock()
			n := bc.negotiated
			bc.mu.Unlock()
			if !n {
				return false
			}
		}
		return true
	})
}

// tlsURI is the B2BUA's tls listener, calling user.
func (h *harness) tlsURI(user string) sip.Uri {
	host, port, _ := sip.ParseAddr(h.tlsAddr)
	return sip.Uri{Scheme: "sip", User: user, Host: host, Port: port, UriParams: sip.HeaderParams{{K: "transport", V: "tls"}}}
}

func tlsInvite(ctx context.Context, c *sipgo.DialogClientCache, uri sip.Uri, body []byte) (*sipgo.DialogClientSession, error) {
	d, err := c.Invite(ctx, uri, body, sip.NewHeader("Content-Type", "application/sdp"))
	if err != nil {
		return nil, err
	}
	return d, d.WaitAnswer(ctx, sipgo.AnswerOptions{})
}

// TestTLSBothLegs: a caller over TLS, a route toward a callee over TLS
// (transport=tls) with srtp = "offer" and sdes_tls_only: the keys go end
// to end, over TLS on both legs, and the call works. A callee whose
// certificate relayd's CAs did not sign never gets the INVITE.
func TestTLSBothLegs(t *testing.T) {
	ca := testcert.NewCA(t)
	relay := ca.Issue(t, "127.0.0.1")
	ce := newCalleeTLS(t, &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "127.0.0.1").TLS}})
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		body := strings.Replace(string(offerSDP(6000, "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkw")), "RTP/AVP", "RTP/SAVP", 1)
		d.Respond(200, "OK", []byte(body), sip.NewHeader("Content-Type", "application/sdp"))
		<-d.Context().Done()
	})
	h := newHarness(t, opts{destinations: []string{ce.addr + ";transport=tls"}, userspace: true,
		routeExtra: "srtp = \"offer\"\nsdes_tls_only = true\n",
		tls:        &tls.Config{Certificates: []tls.Certificate{relay.TLS}}, tlsClient: &tls.Config{RootCAs: ca.Pool()}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	caller := h.tlsCaller(ca.Pool())
	d, err := tlsInvite(ctx, caller, h.tlsURI("+15551234"), savpOffer(4000))
	if err != nil {
		t.Fatalf("call over TLS: %v", err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	h.waitNegotiated()
	inv := ce.lastInvite()
	if inv == nil || inv.Transport() != "TLS" || !strings.Contains(string(inv.Body()), callerKey) {
		t.Fatalf("the callee must get the caller's key over TLS:\n%v", inv)
	}
	if !strings.Contains(string(d.InviteResponse.Body()), "MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkw") {
		t.Errorf("callee's key not passed to the caller:\n%s", d.InviteResponse.Body())
	}
	if err := d.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	cdr := h.cdr()
	if cdr.Disposition != call.Answered || cdr.Legs[call.A].Transport != "tls" || cdr.Legs[call.B].Transport != "tls" {
		t.Errorf("CDR %s, legs %+v", cdr.Disposition, cdr.Legs)
	}
	waitFor(t, "callee BYE", func() bool { ce.mu.Lock(); defer ce.mu.Unlock(); return ce.byes == 1 })
	if via := ce.byeVia; len(via) != 1 || via[0] != "TLS" {
		t.Errorf("BYE to the callee over %v, want TLS", via)
	}

	// A callee with a certificate of another CA.
	stranger := newCalleeTLS(t, &tls.Config{Certificates: []tls.Certificate{testcert.NewCA(t).Issue(t, "127.0.0.1").TLS}})
	h2 := newHarness(t, opts{destinations: []string{stranger.addr + ";transport=tls"}, userspace: true,
		tls: &tls.Config{Certificates: []tls.Certificate{relay.TLS}}, tlsClient: &tls.Config{RootCAs: ca.Pool()}})
	_, err = tlsInvite(ctx, h2.tlsCaller(ca.Pool()), h2.tlsURI("+15551234"), offerSDP(4000))
	var dr *sipgo.ErrDialogResponse
	if !errors.As(err, &dr) || dr.Res.StatusCode != sip.StatusRequestTimeout {
		t.Errorf("call to a callee with an unknown certificate: %v, want 408", err)
	}
	if stranger.lastInvite() != nil {
		t.Error("relayd sent the INVITE to a callee whose certificate it cannot verify")
	}
	if cdr := h2.cdr(); len(cdr.Attempts) != 1 || cdr.Attempts[0].Result != "error" {
		t.Errorf("attempts %+v, want one error", cdr.Attempts)
	}
}

// TestSDESTLSOnly: with sdes_tls_only, relayd refuses with 488 and a
// Warning naming the leg whatever would put SDES keys on a plain
// transport: an SDES offer from a caller over UDP; an offer relayd would
// make with keys (srtp = "offer", from the route server) toward a callee
// over UDP; a re-INVITE with keys from a callee over UDP. Keys over TLS
// toward relayd, which terminates them (srtp = "off") before a plain
// callee, are fine.
func TestSDESTLSOnly(t *testing.T) {
	ca := testcert.NewCA(t)
	ce := newCallee(t)
	rs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var f route.Facts
		json.NewDecoder(r.Body).Decode(&f)
		ans := route.ServerResponse{Destinations: []string{"sip:" + ce.addr}}
		if f.User == "900" {
			ans.SRTP = "offer"
		}
		json.NewEncoder(w).Encode(ans)
	}))
	defer rs.Close()
	h := newHarness(t, opts{destinations: []string{ce.addr}, userspace: true,
		routeExtra: "sdes_tls_only = true\n[route_server]\nurl = \"" + rs.URL + "\"\n",
		tls:        &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "127.0.0.1").TLS}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	refused := func(what string, err error, leg string) {
		t.Helper()
		var dr *sipgo.ErrDialogResponse
		if !errors.As(err, &dr) || dr.Res.StatusCode != sip.StatusNotAcceptableHere {
			t.Errorf("%s: %v, want 488", what, err)
			return
		}
		if w := dr.Res.GetHeader("Warning"); w == nil || !strings.HasPrefix(w.Value(), `399 relayd "SDES keys would cross the `+leg) {
			t.Errorf("%s: Warning %v, want one naming the %s", what, w, leg)
		}
		if ce.lastInvite() != nil {
			t.Errorf("%s: the callee got an INVITE", what)
		}
		if cdr := h.cdr(); cdr.Disposition != call.Rejected || cdr.Code != sip.StatusNotAcceptableHere {
			t.Errorf("%s: CDR %s %d", what, cdr.Disposition, cdr.Code)
		}
	}

	_, err := h.invite(ctx, savpOffer(4000))
	refused("SDES offer over UDP", err, "caller's leg over udp")

	caller := h.tlsCaller(ca.Pool())
	_, err = tlsInvite(ctx, caller, h.tlsURI("900"), offerSDP(4000))
	refused("keys relayd would offer toward a callee over UDP", err, "callee's leg over udp")

	var calleeDialog *sipgo.DialogServerSession
	got := make(chan struct{})
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		calleeDialog = d
		answerSDP(d, req, 6000)
		close(got)
		<-d.Context().Done()
	})
	d, err := tlsInvite(ctx, caller, h.tlsURI("+15551234"), savpOffer(4000))
	if err != nil {
		t.Fatalf("SDES offer over TLS, terminated by relayd: %v", err)
	}
	d.Ack(ctx)
	<-got
	h.waitNegotiated()
	if b := string(ce.lastInvite().Body()); strings.Contains(b, "a=crypto") {
		t.Errorf("keys toward the plain callee:\n%s", b)
	}
	if !sdesIn(d.InviteResponse.Body()) {
		t.Errorf("no key for the caller over TLS:\n%s", d.InviteResponse.Body())
	}

	waitFor(t, "callee dialog confirmed", func() bool { return calleeDialog.LoadState() == sip.DialogStateConfirmed })
	re := sip.NewRequest(sip.INVITE, calleeDialog.InviteRequest.Contact().Address)
	re.SetBody(savpOffer(6000))
	re.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	var res *sip.Response
	for try := 0; ; try++ {
		if res, err = calleeDialog.Do(ctx, re.Clone()); err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != sip.StatusRequestPending || try == 20 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if w := res.GetHeader("Warning"); res.StatusCode != sip.StatusNotAcceptableHere || w == nil || !strings.Contains(w.Value(), "callee's leg over udp") {
		t.Errorf("re-INVITE with keys from the callee over UDP: %s, Warning %v; want 488 naming the callee's leg", res.StartLine(), w)
	}
	h.mu.Lock()
	n := len(h.reinvites)
	h.mu.Unlock()
	if n != 0 {
		t.Errorf("the refused re-offer went on to the caller")
	}
	if err := d.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	if cdr := h.cdr(); cdr.Disposition != call.Answered {
		t.Errorf("CDR %s", cdr.Disposition)
	}
}
