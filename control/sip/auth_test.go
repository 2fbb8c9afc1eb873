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
	"github.com/icholy/digest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relayd/relayd/config"
)

var testUsers = config.NewCredentials(map[string]string{"alice": "secret", "bob": "hunter2"})

// answerChallenge computes the Authorization header value a UA sends for
// a WWW-Authenticate value.
func answerChallenge(t *testing.T, www, method, uri, user, password string) string {
	t.Helper()
	chal, err := digest.ParseChallenge(www)
	if err != nil {
		t.Fatal(err)
	}
	cred, err := digest.Digest(chal, digest.Options{Method: method, URI: uri, Username: user, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	return cred.String()
}

func inviteTo(uri string, authorization ...string) *sip.Request {
	var u sip.Uri
	if err := sip.ParseUri(uri, &u); err != nil {
		panic(err)
	}
	req := sip.NewRequest(sip.INVITE, u)
	for _, a := range authorization {
		req.AppendHeader(sip.NewHeader("Authorization", a))
	}
	return req
}

// TestDigestVerify: the challenge offers the configured algorithms in
// order on one nonce with qop=auth; the right password is accepted once
// for either algorithm, with or without qop; a nonce answered twice,
// from another address, expired or not relayd's gets stale (a new
// challenge), a wrong password, an unknown user or an algorithm not
// offered gets bad, a digest uri that is not the Request-URI badURI.
func TestDigestVerify(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	d := newDigestAuth(Auth{Credentials: testUsers})
	d.now = func() time.Time { return now }
	src := netip.MustParseAddr("198.18.0.2")
	const uri = "sip:+15551234@198.18.1.1:5060"
	hs := d.challenge(src, false)
	if len(hs) != 2 || !strings.Contains(hs[0].Value(), "algorithm=SHA-256") || !strings.Contains(hs[1].Value(), "algorithm=MD5") {
		t.Fatalf("challenge %v: want SHA-256, then MD5", hs)
	}
	var nonces []string
	for _, h := range hs {
		c, err := digest.ParseChallenge(h.Value())
		if err != nil {
			t.Fatal(err)
		}
		if c.Realm != "relayd" || !c.SupportsQOP("auth") || c.Stale || len(c.QOP) != 1 {
			t.Errorf("challenge %q", h.Value())
		}
		nonces = append(nonces, c.Nonce)
	}
	if nonces[0] != nonces[1] {
		t.Errorf("one challenge, two nonces: %q", nonces)
	}
	if !strings.Contains(d.challenge(src, true)[0].Value(), "stale=true") {
		t.Error("stale challenge without stale=true")
	}

	check := func(name string, req *sip.Request, from netip.Addr, want authState, user string) {
		t.Helper()
		r := d.verify(req, from)
		if r.state != want || (want == authOK && r.user != user) {
			t.Errorf("%s: state %d user %q (%s), want %d %q", name, r.state, r.user, r.why, want, user)
		}
	}
	fresh := func(alg string) string {
		for _, h := range d.challenge(src, false) {
			if strings.Contains(h.Value(), "algorithm="+alg) {
				return h.Value()
			}
		}
		t.Fatalf("no %s challenge", alg)
		return ""
	}
	check("no credentials", inviteTo(uri), src, authNone, "")
	other := strings.Replace(answerChallenge(t, fresh("MD5"), "INVITE", uri, "alice", "secret"), `realm="relayd"`, `realm="proxy.example"`, 1)
	check("another realm's credentials", inviteTo(uri, other), src, authNone, "")

	for _, alg := range []string{"SHA-256", "MD5"} {
		a := answerChallenge(t, fresh(alg), "INVITE", uri, "alice", "secret")
		check(alg, inviteTo(uri, a), src, authOK, "alice")
		check(alg+" again (replay)", inviteTo(uri, a), src, authStale, "")
	}
	check("upper-case hex", inviteTo(uri, upperResponse(answerChallenge(t, fresh("MD5"), "INVITE", uri, "alice", "secret"))), src, authOK, "alice")
	noQOP := strings.Replace(fresh("MD5"), `, qop="auth"`, "", 1)
	check("without qop (RFC 2069)", inviteTo(uri, answerChallenge(t, noQOP, "INVITE", uri, "alice", "secret")), src, authOK, "alice")

	check("wrong password", inviteTo(uri, answerChallenge(t, fresh("MD5"), "INVITE", uri, "alice", "guess")), src, authBad, "")
	check("unknown user", inviteTo(uri, answerChallenge(t, fresh("MD5"), "INVITE", uri, "mallory", "secret")), src, authBad, "")
	check("method", inviteTo(uri, answerChallenge(t, fresh("MD5"), "REGISTER", uri, "alice", "secret")), src, authBad, "")
	intQOP := strings.Replace(fresh("MD5"), `qop="auth"`, `qop="auth-int"`, 1)
	check("qop auth-int", inviteTo(uri, answerChallenge(t, intQOP, "INVITE", uri, "alice", "secret")), src, authBad, "")
	check("malformed", inviteTo(uri, `Digest username="alice", realm="relayd", nonce=`), src, authBad, "")
	check("another number", inviteTo(uri, answerChallenge(t, fresh("MD5"), "INVITE", "sip:+900123@198.18.1.1:5060", "alice", "secret")), src, authBadURI, "")
	check("default port", inviteTo("sip:+15551234@198.18.1.1", answerChallenge(t, fresh("MD5"), "INVITE", uri, "alice", "secret")), src, authOK, "alice")

	check("another address", inviteTo(uri, answerChallenge(t, fresh("MD5"), "INVITE", uri, "alice", "secret")), netip.MustParseAddr("198.18.4.2"), authStale, "")
	forged := strings.Replace(fresh("MD5"), nonces[0][:10], "AAAAAAAAAA", 1)
	forged = strings.Replace(forged, `nonce="`, `nonce="x`, 1)
	check("nonce not relayd's", inviteTo(uri, answerChallenge(t, forged, "INVITE", uri, "alice", "secret")), src, authStale, "")
	old := fresh("MD5")
	now = now.Add(nonceLifetime)
	check("expired", inviteTo(uri, answerChallenge(t, old, "INVITE", uri, "alice", "secret")), src, authStale, "")
	check("after expiry, a new nonce", inviteTo(uri, answerChallenge(t, fresh("SHA-256"), "INVITE", uri, "alice", "secret")), src, authOK, "alice")

	md5 := newDigestAuth(Auth{Credentials: testUsers, Algorithms: []string{"MD5"}, Realm: "pbx"})
	hs = md5.challenge(src, false)
	if len(hs) != 1 || !strings.Contains(hs[0].Value(), "algorithm=MD5") || !strings.Contains(hs[0].Value(), `realm="pbx"`) {
		t.Errorf("MD5-only challenge %v", hs)
	}
	sha := strings.Replace(hs[0].Value(), "algorithm=MD5", "algorithm=SHA-256", 1)
	if r := md5.verify(inviteTo(uri, answerChallenge(t, sha, "INVITE", uri, "alice", "secret")), src); r.state != authBad {
		t.Errorf("SHA-256 credentials when only MD5 is offered: %d (%s), want bad", r.state, r.why)
	}
}

// upperResponse upper-cases the hex of an Authorization's response.
func upperResponse(a string) string {
	head, resp, _ := strings.Cut(a, `response="`)
	return head + `response="` + strings.ToUpper(resp)
}

// TestDigestAuthCalls: a route with auth_users challenges a caller
// without credentials (401, SHA-256 then MD5) and routes the call once
// the caller answers with the right password; credentials never reach
// the callee. A wrong password gets 403 (no new challenge), so does a
// user the route does not list; none of these reach the callee. The
// Authorization of a call replayed in a new INVITE gets a new challenge
// with stale=true.
func TestDigestAuthCalls(t *testing.T) {
	for _, algs := range [][]string{nil, {"MD5"}} {
		t.Run(strings.Join(append([]string{"algorithms"}, algs...), "-"), func(t *testing.T) {
			ce := newCallee(t)
			h := newHarness(t, opts{destinations: []string{ce.addr}, auth: Auth{Credentials: testUsers, Algorithms: algs},
				routeExtra: "auth_users = [\"alice\"]\n[sip]\nauth_file = \"/etc/relayd/sip-users\"\n"})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			res, err := h.request(sip.INVITE, offerSDP(4000), nil)
			if err != nil {
				t.Fatal(err)
			}
			www := res.GetHeaders("WWW-Authenticate")
			wantAlgs := algs
			if wantAlgs == nil {
				wantAlgs = []string{"SHA-256", "MD5"}
			}
			if res.StatusCode != sip.StatusUnauthorized || len(www) != len(wantAlgs) {
				t.Fatalf("INVITE without credentials: %s with %d challenges, want 401 with %d", res.StartLine(), len(www), len(wantAlgs))
			}
			for i, alg := range wantAlgs {
				if v := www[i].Value(); !strings.Contains(v, "algorithm="+alg) || !strings.Contains(v, `realm="relayd"`) {
					t.Errorf("challenge %d %q, want %s", i, v, alg)
				}
			}

			call := func(user, password string, hdrs ...sip.Header) (*sipgo.DialogClientSession, error) {
				d, err := h.caller.Invite(ctx, h.uri("+15551234"), offerSDP(4000), append(hdrs, sip.NewHeader("Content-Type", "application/sdp"))...)
				if err != nil {
					return nil, err
				}
				return d, d.WaitAnswer(ctx, sipgo.AnswerOptions{Username: user, Password: password})
			}
			for _, tc := range []struct{ user, password string }{{"alice", "guess"}, {"bob", "hunter2"}, {"mallory", "x"}} {
				_, err := call(tc.user, tc.password)
				var dr *sipgo.ErrDialogResponse
				if !errors.As(err, &dr) || dr.Res.StatusCode != sip.StatusForbidden {
					t.Errorf("%s with password %q: %v, want 403", tc.user, tc.password, err)
				}
			}
			if inv := ce.lastInvite(); inv != nil {
				t.Fatalf("a refused INVITE reached the callee:\n%s", inv)
			}

			d, err := call("alice", "secret")
			if err != nil {
				t.Fatalf("alice with her password: %v", err)
			}
			d.Ack(ctx)
			inv := ce.lastInvite()
			if inv == nil {
				t.Fatal("the authenticated call did not reach the callee")
			}
			if inv.GetHeader("Authorization") != nil {
				t.Errorf("the caller's credentials went on to the callee:\n%s", inv)
			}
			authz := d.InviteRequest.GetHeader("Authorization").Value()
			d.Bye(ctx)
			if cdr := h.cdr(); cdr.Route != "test" || cdr.Disposition != "answered" {
				t.Errorf("CDR %+v", cdr)
			}

			// The same credentials in a new INVITE: a new challenge, stale.
			res, err = h.request(sip.INVITE, offerSDP(4000), func(r *sip.Request) { r.AppendHeader(sip.NewHeader("Authorization", authz)) })
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != sip.StatusUnauthorized || !strings.Contains(res.GetHeader("WWW-Authenticate").Value(), "stale=true") {
				t.Errorf("replayed credentials: %s %v, want 401 with stale=true", res.StartLine(), res.GetHeader("WWW-Authenticate"))
			}
			ce.mu.Lock()
			n := len(ce.invites)
			ce.mu.Unlock()
			if n != 1 {
				t.Errorf("callee got %d INVITEs, want the authenticated one only", n)
			}

			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(h.srv.Metrics())
			// Challenged: the first INVITE, the first try of each of the
			// four calls, the replay.
			want := "# HELP relayd_sip_refused_total " + refusedHelp + "\n# TYPE relayd_sip_refused_total counter\n" + `relayd_sip_refused_total{reason="challenged"} 6
relayd_sip_refused_total{reason="credentials"} 2
relayd_sip_refused_total{reason="source"} 0
relayd_sip_refused_total{reason="user"} 1
`
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "relayd_sip_refused_total"); err != nil {
				t.Error(err)
			}
		})
	}
}
