package sip

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestCallLogsCarrySIPCallID: every info line about a call names relayd's
// call id and the caller's SIP Call-ID first, so that the journal can be
// searched by either, and the line of the B2BUA's code that wrote it.
func TestCallLogsCarrySIPCallID(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, log: zap.New(core, zap.AddCaller())})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	// A BYE right after the ACK can end the call before it logs its
	// answer.
	waitFor(t, "call answered", func() bool { return logs.FilterMessage("call answered").Len() == 1 })
	if err := d.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	h.cdr()
	callID := d.InviteRequest.CallID().Value()
	for _, msg := range []string{"call answered", "call ended"} {
		entries := logs.FilterMessage(msg).All()
		if len(entries) != 1 {
			t.Errorf("%d %q lines, want 1", len(entries), msg)
			continue
		}
		fields := entries[0].ContextMap()
		if fields["sip_call_id"] != callID || fields["call"] == "" || fields["call"] == nil {
			t.Errorf("%q fields %v, want sip_call_id %q and call", msg, fields, callID)
		}
		if ctx := entries[0].Context; len(ctx) < 2 || ctx[0].Key != "call" || ctx[1].Key != "sip_call_id" {
			t.Errorf("%q fields %v, want call and sip_call_id first", msg, ctx)
		}
		if c := entries[0].Caller; !c.Defined || !strings.HasSuffix(c.File, "control/sip/call.go") {
			t.Errorf("%q logged from %s, want control/sip/call.go", msg, c.FullPath())
		}
	}
}
