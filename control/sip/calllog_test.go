package sip

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestCallLogsCarrySIPCallID: every info line about a call names relayd's
// call id and the caller's SIP Call-ID, so that the journal can be
// searched by either.
func TestCallLogsCarrySIPCallID(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, log: zap.New(core)})
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
	}
}
