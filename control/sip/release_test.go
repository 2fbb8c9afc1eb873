package sip

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"

	"github.com/relayd/relayd/control/call"
)

// TestReleaseTxs: an answered call lets go of its INVITE transactions
// only once both have ended, and then is hung up as before: by the
// caller's BYE (relayd sends the callee one), or by relayd (Hangup: BYE
// on both legs).
func TestReleaseTxs(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, hangup := range []string{"caller", "relayd"} {
		d, _ := h.answered(ctx, ce)
		calls := h.srv.calls()
		if len(calls) != 1 {
			t.Fatalf("%d calls, want 1", len(calls))
		}
		bc := calls[0]
		waitFor(t, "negotiated", func() bool { bc.mu.Lock(); defer bc.mu.Unlock(); return bc.negotiated })
		if bc.releaseTxs() {
			t.Fatal("released the transactions while they run (64*T1 after the answer)")
		}
		// End both as their timers would.
		bc.aTx.Terminate()
		bTx, err := field(bc.b, "inviteTx")
		if err != nil {
			t.Fatal(err)
		}
		bTx.Interface().(sip.ClientTransaction).Terminate()
		waitFor(t, "transactions released", bc.releaseTxs)
		if bc.releaseTxs() {
			t.Error("released twice")
		}
		if _, ok := bc.aTx.(endedTx); !ok {
			t.Errorf("the call still holds its INVITE transaction %T", bc.aTx)
		}
		if f, err := field(&bc.a.Dialog, "onStatePointer"); err != nil {
			t.Fatal(err)
		} else if p := f.Addr().Interface().(*atomic.Pointer[sipgo.DialogStateFn]); p.Load() != nil {
			t.Error("the caller's dialog keeps the state callbacks of its setup")
		}
		// The setup returns just after the negotiation.
		waitFor(t, "the setup's context let go", func() bool { bc.mu.Lock(); defer bc.mu.Unlock(); return bc.setupCancel == nil })
		switch hangup {
		case "caller":
			if err := d.Bye(ctx); err != nil {
				t.Fatal(err)
			}
		case "relayd":
			if err := h.srv.Hangup(bc.c.ID); err != nil {
				t.Fatal(err)
			}
		}
		want := call.Answered
		if hangup == "relayd" {
			want = call.Hangup
		}
		if cdr := h.cdr(); cdr.Disposition != want {
			t.Errorf("hung up by the %s: CDR disposition %s, want %s", hangup, cdr.Disposition, want)
		}
		waitFor(t, "callee BYE", func() bool { ce.mu.Lock(); defer ce.mu.Unlock(); return ce.byes == i+1 })
		waitFor(t, "flows removed", func() bool { return h.xdp.Len() == 0 })
		if hangup == "relayd" {
			waitFor(t, "caller's dialog ended", func() bool { return d.LoadState() == sip.DialogStateEnded })
		}
	}
}
