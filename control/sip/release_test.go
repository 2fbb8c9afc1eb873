package sip

import (
	"context"
	"encoding/json"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

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
		bc := h.negotiatedCall()
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
		// Held through dialogs: the sweep may compact the call from here
		// on (TestCompactedCall).
		a, _, used, err := bc.dialogs()
		if err != nil {
			t.Fatal(err)
		}
		if f, err := field(&a.Dialog, "onStatePointer"); err != nil {
			t.Fatal(err)
		} else if p := f.Addr().Interface().(*atomic.Pointer[sipgo.DialogStateFn]); p.Load() != nil {
			t.Error("the caller's dialog keeps the state callbacks of its setup")
		}
		used()
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

// negotiatedCall returns the harness's one call once its initial offer
// and answer are complete (both ACKs done).
func (h *harness) negotiatedCall() *b2bCall {
	h.t.Helper()
	calls := h.srv.calls()
	if len(calls) != 1 {
		h.t.Fatalf("%d calls, want 1", len(calls))
	}
	bc := calls[0]
	waitFor(h.t, "negotiated", func() bool { bc.mu.Lock(); defer bc.mu.Unlock(); return bc.negotiated })
	return bc
}

// endTxs ends the INVITE transactions of an answered call as their timers
// would (64*T1 after the answer) and waits until the call let go of them.
func endTxs(t *testing.T, bc *b2bCall) {
	t.Helper()
	waitFor(t, "negotiated", func() bool { bc.mu.Lock(); defer bc.mu.Unlock(); return bc.negotiated })
	bc.mu.Lock()
	aTx, b := bc.aTx, bc.b
	bc.mu.Unlock()
	aTx.Terminate()
	bTx, err := field(b, "inviteTx")
	if err != nil {
		t.Fatal(err)
	}
	bTx.Interface().(sip.ClientTransaction).Terminate()
	waitFor(t, "transactions released", func() bool {
		bc.releaseTxs()
		bc.mu.Lock()
		defer bc.mu.Unlock()
		return bc.released
	})
}

func compacted(bc *b2bCall) bool {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return bc.compacted && bc.a == nil && bc.b == nil && bc.aRes == nil
}

// stowed reports whether bc is compacted with its dialogs' text in the
// store only.
func stowed(bc *b2bCall) bool {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	h := &bc.held
	return bc.compacted && h.stored && h.a.Invite == "" && h.a.Response == "" && h.b.Invite == "" && h.b.Response == "" &&
		h.a.Transport != "" && h.b.Dest != ""
}

// TestCompactedCall: a call that is up and quiet keeps its dialogs as text
// (the sweep compacts it once its INVITE transactions ended), or with a
// store none: the store's record has it (stowed); a re-INVITE rebuilds
// them and the sweep compacts them again (and, with a store, writes the
// record again: the CSeq numbers moved); the call's record is the same
// text; and the call hangs up as any other, by the caller, the callee or
// relayd, with the CSeq numbers the dialogs had.
func TestCompactedCall(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testCompactedCall(t, nil) })
	t.Run("store", func(t *testing.T) { testCompactedCall(t, openStore(t)) })
}

func testCompactedCall(t *testing.T, st Store) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, store: st})
	quiet := compacted
	if st != nil {
		quiet = stowed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	calleeByes := 0 // BYEs relayd sent the callee
	for _, hangup := range []string{"caller", "callee", "relayd"} {
		var calleeDialog *sipgo.DialogServerSession
		got := make(chan struct{})
		ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
			calleeDialog = d
			answerSDP(d, req, 6000)
			close(got)
			<-d.Context().Done()
		})
		reinvites := make(chan *sip.Request, 1)
		ce.mu.Lock()
		ce.reinvite = func(req *sip.Request, tx sip.ServerTransaction) {
			calleeDialog.ReadRequest(req, tx)
			reinvites <- req
			body := []byte(strings.ReplaceAll(string(offerSDP(6100)), "a=sendrecv", "a=recvonly"))
			res := sip.NewResponseFromRequest(req, 200, "OK", body)
			res.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
			res.AppendHeader(&sip.ContactHeader{Address: sip.Uri{Scheme: "sip", Host: "127.0.0.1"}})
			tx.Respond(res)
		}
		ce.mu.Unlock()
		d, err := h.invite(ctx, offerSDP(4000))
		if err != nil {
			t.Fatal(err)
		}
		d.Ack(ctx)
		<-got
		calls := h.srv.calls()
		if len(calls) != 1 {
			t.Fatalf("%d calls, want 1", len(calls))
		}
		bc := calls[0]
		endTxs(t, bc)
		waitFor(t, "compacted", func() bool { return quiet(bc) })
		rec, ok := bc.record()
		if !ok || !strings.HasPrefix(rec.A.Invite, "INVITE ") || !strings.HasPrefix(rec.B.Response, "SIP/2.0 200") || rec.B.Dest != ce.addr {
			t.Fatalf("record of a compacted call: %v %+v", ok, rec)
		}
		for _, text := range []string{rec.A.Invite, rec.A.Response, rec.B.Invite, rec.B.Response} {
			if strings.Contains(text, "v=0") || !strings.HasSuffix(text, "\r\n\r\n") {
				t.Errorf("a compacted call keeps a body:\n%s", text)
			}
		}

		// A re-INVITE from the caller (hold): relayd's to the callee goes
		// on leg B's dialog, CSeq one above the INVITE's.
		hold := sip.NewRequest(sip.INVITE, d.InviteResponse.Contact().Address)
		hold.SetBody([]byte(strings.ReplaceAll(string(offerSDP(4000)), "a=sendrecv", "a=sendonly")))
		hold.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
		res, err := d.Do(ctx, hold)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 200 || !strings.Contains(string(res.Body()), "a=recvonly") {
			t.Fatalf("re-INVITE of a compacted call: %s\n%s", res.StartLine(), res.Body())
		}
		d.WriteRequest(sip.NewRequest(sip.ACK, d.InviteResponse.Contact().Address))
		re := <-reinvites
		if first := ce.lastInvite(); re.CallID().Value() != first.CallID().Value() || re.CSeq().SeqNo != first.CSeq().SeqNo+1 ||
			!strings.Contains(string(re.Body()), "a=sendonly") {
			t.Errorf("re-INVITE to the callee: Call-ID %s CSeq %d (INVITE's: %s, %d)\n%s", re.CallID().Value(), re.CSeq().SeqNo,
				first.CallID().Value(), first.CSeq().SeqNo, re.Body())
		}
		waitFor(t, "compacted again", func() bool { return quiet(bc) })
		if st != nil {
			// The record has the dialogs as they are now: relayd's
			// re-INVITE moved leg B's CSeq, the caller's leg A's.
			data, ok, err := st.Get(storeNamespace, bc.c.ID)
			var stored record
			if err == nil && ok {
				err = json.Unmarshal(data, &stored)
			}
			if err != nil || !ok || stored.B.LocalCSeq != re.CSeq().SeqNo || stored.A.RemoteCSeq != hold.CSeq().SeqNo {
				t.Fatalf("record after the re-INVITE (%v %v): leg B local CSeq %d, want %d; leg A remote %d, want %d", ok, err,
					stored.B.LocalCSeq, re.CSeq().SeqNo, stored.A.RemoteCSeq, hold.CSeq().SeqNo)
			}
		}

		switch hangup {
		case "caller":
			if err := d.Bye(ctx); err != nil {
				t.Fatal(err)
			}
		case "callee":
			if err := calleeDialog.Bye(ctx); err != nil {
				t.Fatal(err)
			}
		case "relayd":
			if err := h.srv.Hangup(bc.c.ID); err != nil {
				t.Fatal(err)
			}
		}
		want, reason := call.Answered, hangup+" hung up"
		if hangup == "relayd" {
			want, reason = call.Hangup, ""
		}
		if cdr := h.cdr(); cdr.Disposition != want || reason != "" && cdr.Reason != reason {
			t.Errorf("hung up by the %s: CDR %s %q, want %s %q", hangup, cdr.Disposition, cdr.Reason, want, reason)
		}
		if hangup != "callee" {
			calleeByes++
			waitFor(t, "callee BYE", func() bool { ce.mu.Lock(); defer ce.mu.Unlock(); return ce.byes == calleeByes })
		}
		if hangup != "caller" {
			waitFor(t, "caller's dialog ended", func() bool { return d.LoadState() == sip.DialogStateEnded })
		}
		waitFor(t, "flows removed", func() bool { return h.xdp.Len() == 0 })
	}
}

// TestRestartKeepsCompactedCall: the record of a compacted call (its
// dialogs' text without bodies) brings the call back after a restart;
// the restored call is compacted in turn and hangs up as before.
func TestRestartKeepsCompactedCall(t *testing.T) {
	ce := newCallee(t)
	st := openStore(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, store: st})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, calleeDialog := h.answered(ctx, ce)
	bc := h.srv.calls()[0]
	endTxs(t, bc)
	waitFor(t, "compacted", func() bool { return compacted(bc) })
	if err := bc.persist(); err != nil { // the record of the compacted call
		t.Fatal(err)
	}
	h.restart()
	h.noCDR("restart")
	calls := h.srv.calls()
	if len(calls) != 1 {
		t.Fatalf("%d calls after the restart, want 1", len(calls))
	}
	waitFor(t, "restored call compacted", func() bool { return compacted(calls[0]) })
	if err := calleeDialog.Bye(ctx); err != nil {
		t.Fatalf("BYE from the callee after the restart: %v", err)
	}
	if cdr := h.cdr(); cdr.Disposition != call.Answered || cdr.Reason != "callee hung up" || cdr.Answer == nil {
		t.Errorf("CDR %+v", cdr)
	}
	select {
	case <-d.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("caller got no BYE")
	}
}

// TestMessageText: a dialog's text is its message without the body, with
// Content-Length 0 and every other header as it was (compact names
// included), and parses back.
func TestMessageText(t *testing.T) {
	body := "v=0\r\no=- 1 1 IN IP4 198.18.0.1\r\ns=-\r\nc=IN IP4 198.18.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"
	in := "INVITE sip:bob@198.18.0.2 SIP/2.0\r\n" +
		"Via: SIP/2.0/UDP 198.18.0.1:5060;branch=z9hG4bK-1\r\n" +
		"f: <sip:alice@198.18.0.1>;tag=a1\r\n" +
		"To: <sip:bob@198.18.0.2>\r\n" +
		"Call-ID: c1@198.18.0.1\r\n" +
		"CSeq: 7 INVITE\r\n" +
		"Contact: <sip:alice@198.18.0.1:5060>\r\n" +
		"Record-Route: <sip:198.18.0.9;lr>\r\n" +
		"X-Custom: kept\r\n" +
		"Content-Type: application/sdp\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	req, err := parseRequest(in, "test")
	if err != nil {
		t.Fatal(err)
	}
	text := messageText(req)
	if strings.Contains(text, "v=0") || !strings.HasSuffix(text, "Content-Length: 0\r\n\r\n") {
		t.Fatalf("text keeps the body or its length:\n%s", text)
	}
	back, err := parseRequest(text, "text")
	if err != nil {
		t.Fatalf("text does not parse: %v\n%s", err, text)
	}
	if len(back.Body()) != 0 || back.ContentLength() == nil || back.ContentLength().Value() != "0" {
		t.Errorf("parsed back with a body of %d bytes, Content-Length %v", len(back.Body()), back.ContentLength())
	}
	var want, got []string
	for _, h := range req.Headers() {
		if h.Name() != "Content-Length" {
			want = append(want, h.String())
		}
	}
	for _, h := range back.Headers() {
		if h.Name() != "Content-Length" {
			got = append(got, h.String())
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") || back.StartLine() != req.StartLine() {
		t.Errorf("headers parsed back:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	res := sip.NewResponseFromRequest(req, 200, "OK", []byte(body))
	if rt := messageText(res); strings.Contains(rt, "v=0") || !strings.HasPrefix(rt, "SIP/2.0 200 OK\r\n") {
		t.Errorf("response text:\n%s", rt)
	}
}

// TestEndedCallLetGo: a call that ended is not kept by what outlives it:
// its INVITE transactions, which sipgo's BYEs end but whose last timer
// (RFC 6026's L and M, 64*T1 = 32 s over UDP after the answer) would
// still hold them, their messages and, through their callbacks, the
// dialogs and the call. At a sustained call rate each call would
// otherwise be kept whole for 32 s after its end.
func TestEndedCallLetGo(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refused int  // attempts refused before the answer
		relayd  bool // relayd hangs up, not the caller
	}{
		{"caller hangs up", 0, false},
		{"after two refused attempts", 2, false},
		{"relayd hangs up", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dests []string
			for range tc.refused {
				busy := newCallee(t)
				busy.set(func(d *sipgo.DialogServerSession, req *sip.Request) { d.Respond(503, "Service Unavailable", nil) })
				dests = append(dests, busy.addr)
			}
			ce := newCallee(t)
			h := newHarness(t, opts{destinations: append(dests, ce.addr)})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d, _ := h.answered(ctx, ce)
			bc := h.negotiatedCall()
			bc.mu.Lock()
			aTx, _ := bc.aTx.(*sip.ServerTx)
			bc.mu.Unlock()
			f, err := field(bc.b, "inviteTx")
			if err != nil {
				t.Fatal(err)
			}
			bTx, _ := f.Interface().(*sip.ClientTx)
			if aTx == nil || bTx == nil {
				t.Fatalf("INVITE transactions %T, %T", aTx, bTx)
			}
			if txTimer(t, aTx, "timer_l") == nil || txTimer(t, bTx, "timer_m") == nil {
				t.Fatal("the answered INVITE transactions have no Timer L and M: sipgo changed")
			}
			wc, wm, id := weak.Make(bc), weak.Make(bc.c), bc.c.ID
			bc = nil
			want := call.Answered
			if tc.relayd {
				want = call.Hangup
				if err := h.srv.Hangup(id); err != nil {
					t.Fatal(err)
				}
			} else if err := d.Bye(ctx); err != nil {
				t.Fatal(err)
			}
			cdr := h.cdr()
			if cdr.Disposition != want || len(cdr.Attempts) != tc.refused+1 {
				t.Fatalf("CDR disposition %s, %d attempts; want %s, %d", cdr.Disposition, len(cdr.Attempts), want, tc.refused+1)
			}
			waitFor(t, "flows removed", func() bool { return h.xdp.Len() == 0 })
			if !ended(aTx) || !ended(bTx) {
				t.Fatalf("INVITE transactions ended: caller's %v, callee's %v; want both", ended(aTx), ended(bTx))
			}
			if txTimer(t, aTx, "timer_l") != nil || txTimer(t, bTx, "timer_m") != nil {
				t.Error("the ended INVITE transactions' Timer L or M still runs, holding them for 64*T1")
			}
			waitFor(t, "the ended call collected", func() bool {
				runtime.GC()
				return wc.Value() == nil && wm.Value() == nil
			})
		})
	}
}

// txTimer returns the timer of sipgo transaction tx in its field name.
func txTimer(t *testing.T, tx any, name string) *time.Timer {
	t.Helper()
	mu, err := field(tx, "mu")
	if err != nil {
		t.Fatal(err)
	}
	f, err := field(tx, name)
	if err != nil {
		t.Fatal(err)
	}
	m := mu.Addr().Interface().(*sync.Mutex)
	m.Lock()
	defer m.Unlock()
	return f.Interface().(*time.Timer)
}
