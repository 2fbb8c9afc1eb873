package sip

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestAllowListRefusesStrangers: a route whose allow list does not
// contain the caller's address (127.0.0.1) refuses its INVITE with 403
// before anything is set up: the callee sees nothing, no call is made and
// no CDR written, and the refusal is counted. A later route that matches
// the same user and takes the caller's address routes the call.
func TestAllowListRefusesStrangers(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, routeExtra: `allow = ["198.18.0.0/24", "2001:2::/48"]
[[route]]
name = "trusted"
match = "^9"
allow = ["127.0.0.1"]
destinations = ["sip:` + ce.addr + `"]
`})
	res, err := h.request(sip.INVITE, offerSDP(4000), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != sip.StatusForbidden {
		t.Fatalf("INVITE from a source outside the allow list: %s, want 403", res.StartLine())
	}
	if ce.lastInvite() != nil {
		t.Error("the refused INVITE reached the callee")
	}
	if n := h.calls.Len(); n != 0 {
		t.Errorf("%d calls after a refused INVITE", n)
	}
	select {
	case i := <-h.ended:
		t.Errorf("CDR for a refused INVITE: %+v", i)
	case <-time.After(200 * time.Millisecond):
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(h.srv.Metrics())
	want := "# HELP relayd_sip_refused_total " + refusedHelp + "\n# TYPE relayd_sip_refused_total counter\n" + `relayd_sip_refused_total{reason="challenged"} 0
relayd_sip_refused_total{reason="credentials"} 0
relayd_sip_refused_total{reason="source"} 1
relayd_sip_refused_total{reason="user"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "relayd_sip_refused_total"); err != nil {
		t.Error(err)
	}

	// The second route matches 9..., takes 127.0.0.1: the call goes on.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.caller.Invite(ctx, h.uri("9123"), offerSDP(4000), sip.NewHeader("Content-Type", "application/sdp"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
		t.Fatalf("INVITE for a route that takes the caller: %v", err)
	}
	d.Ack(ctx)
	if inv := ce.lastInvite(); inv == nil || inv.Recipient.User != "9123" {
		t.Fatalf("callee got %v, want the INVITE for 9123", inv)
	}
	d.Bye(ctx)
	if cdr := h.cdr(); cdr.Route != "trusted" {
		t.Errorf("CDR route %q, want trusted", cdr.Route)
	}
}
