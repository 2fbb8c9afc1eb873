package sip

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/state"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

// The restart tests stop the B2BUA as SIGTERM does (Serve's context
// canceled, Shutdown) and start a new one, with a new call table, on the
// same address, store and XDP data plane (pinned maps survive a restart);
// the userspace data plane starts empty, as a new process's workers do.

func openStore(t *testing.T) *state.Store {
	t.Helper()
	st, err := state.Open(state.Config{Path: filepath.Join(t.TempDir(), "state.db")}, testLogger(t, zap.DebugLevel))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func (h *harness) restart() {
	h.t.Helper()
	h.stop()
	if h.us != nil {
		h.us = dataplanetest.New(dataplane.PathUserspace)
	}
	h.start()
}

func (h *harness) noCDR(what string) {
	h.t.Helper()
	select {
	case i := <-h.ended:
		h.t.Fatalf("%s: CDR %+v", what, i)
	default:
	}
}

func flowsOf(t *testing.T, d *dataplanetest.DataPlane) []dataplane.Flow {
	t.Helper()
	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	var out []dataplane.Flow
	for _, fs := range list {
		out = append(out, fs.Flow)
	}
	slices.SortFunc(out, func(a, b dataplane.Flow) int { return a.Match.Compare(b.Match) })
	return out
}

func (ce *callee) byeCount() int {
	ce.mu.Lock()
	defer ce.mu.Unlock()
	return ce.byes
}

func TestRestartKeepsCallByeFromCaller(t *testing.T) {
	st := openStore(t)
	ce, h, ctx, d := storedCall(t, st)
	// Persisted before the 200 left relayd.
	if n, _ := st.Len("sip"); n != 1 {
		t.Fatalf("%d records when the caller got its 200, want 1", n)
	}
	d.Ack(ctx)
	waitFor(t, "4 flows", func() bool { return h.xdp.Len() == 4 })
	before := flowsOf(t, h.xdp)
	info := h.calls.List()[0].Info()

	h.restart()
	h.noCDR("SIGTERM with a store")
	if ce.byeCount() != 0 || d.LoadState() == sip.DialogStateEnded {
		t.Fatal("SIGTERM hung the call up")
	}
	if h.calls.Len() != 1 {
		t.Fatalf("%d calls after the restart, want 1", h.calls.Len())
	}
	if after := flowsOf(t, h.xdp); !reflect.DeepEqual(before, after) {
		t.Errorf("flows changed across the restart:\n before %+v\n after  %+v", before, after)
	}
	if c, ok := h.srv.LookupCall(info.Legs[call.B].CallID); !ok || c.ID != info.ID {
		t.Errorf("LookupCall by leg B's Call-ID: %v %v", c, ok)
	}

	// A re-INVITE (hold) from the caller after the restart goes through.
	hold := strings.Replace(string(offerSDP(4000)), "a=sendrecv", "a=sendonly", 1)
	var got *sip.Request
	ce.mu.Lock()
	ce.reinvite = func(req *sip.Request, tx sip.ServerTransaction) {
		ce.mu.Lock() // the test reads it under the lock: the network is no happens-before edge for the race detector
		got = req
		ce.mu.Unlock()
		res := sip.NewResponseFromRequest(req, 200, "OK", []byte(calleeSDP(strings.Replace(string(offerSDP(6000)), "a=sendrecv", "a=recvonly", 1))))
		res.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
		tx.Respond(res)
	}
	ce.mu.Unlock()
	re := sip.NewRequest(sip.INVITE, d.InviteResponse.Contact().Address)
	re.SetBody([]byte(hold))
	re.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	res, err := d.Do(ctx, re)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("re-INVITE after the restart: %v %v", res, err)
	}
	d.WriteRequest(sip.NewRequest(sip.ACK, d.InviteResponse.Contact().Address))
	ce.mu.Lock()
	reCSeq := got.CSeq().SeqNo
	firstCSeq := ce.invites[0].CSeq().SeqNo
	ce.mu.Unlock()
	if reCSeq <= firstCSeq {
		t.Errorf("re-INVITE to the callee has CSeq %d, not above the INVITE's %d", reCSeq, firstCSeq)
	}

	// A second restart, then BYE: a complete CDR.
	h.restart()
	if err := d.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	cdr := h.cdr()
	if cdr.ID != info.ID || cdr.Disposition != call.Answered || cdr.Reason != "caller hung up" || len(cdr.Attempts) != 1 ||
		cdr.Attempts[0].Code != 200 || cdr.Answer == nil || !cdr.Answer.Equal(*info.Answer) || !cdr.Start.Equal(info.Start) ||
		cdr.Legs != info.Legs || cdr.Route != "test" || len(cdr.Flows) != 4 {
		t.Errorf("CDR after restarts %+v\nbefore %+v", cdr, info)
	}
	waitFor(t, "callee BYE", func() bool { return ce.byeCount() == 1 })
	if h.xdp.Len() != 0 || h.calls.Len() != 0 {
		t.Errorf("%d flows, %d calls left", h.xdp.Len(), h.calls.Len())
	}
	if n, _ := st.Len("sip"); n != 0 {
		t.Errorf("%d records left after the call ended", n)
	}
}

func TestRestartKeepsCallByeFromCallee(t *testing.T) {
	ce := newCallee(t)
	st := openStore(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, store: st})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, calleeDialog := h.answered(ctx, ce)
	h.restart()
	h.noCDR("restart")
	if err := calleeDialog.Bye(ctx); err != nil {
		t.Fatalf("BYE from the callee after the restart: %v", err)
	}
	cdr := h.cdr()
	if cdr.Disposition != call.Answered || cdr.Reason != "callee hung up" || cdr.Answer == nil {
		t.Errorf("CDR %+v", cdr)
	}
	select {
	case <-d.Context().Done():
	case <-time.After(5 * time.Second):
		t.Error("caller got no BYE")
	}
}

// A call still being set up at SIGTERM gets 503 toward the caller, CANCEL
// toward the callee, and a CDR.
func TestShutdownDuringSetup(t *testing.T) {
	ce := newCallee(t)
	st := openStore(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, store: st})
	canceled := make(chan struct{})
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		d.Respond(180, "Ringing", nil)
		<-d.Context().Done()
		close(canceled)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.caller.Invite(ctx, h.uri("1"), offerSDP(4000), sip.NewHeader("Content-Type", "application/sdp"))
	if err != nil {
		t.Fatal(err)
	}
	ringing := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- d.WaitAnswer(ctx, sipgo.AnswerOptions{OnResponse: func(r *sip.Response) error {
			if r.StatusCode == 180 {
				close(ringing)
			}
			return nil
		}})
	}()
	<-ringing // relayd has the 180: it can CANCEL
	h.stop()
	err = <-errc
	var dr *sipgo.ErrDialogResponse
	if !asDialogResponse(err, &dr) || dr.Res.StatusCode != 503 || dr.Res.GetHeader("Retry-After") == nil {
		t.Errorf("caller got %v, want 503 with Retry-After", err)
	}
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Error("callee got no CANCEL")
	}
	if cdr := h.cdr(); cdr.Disposition != call.Shutdown || cdr.Code != 503 {
		t.Errorf("CDR %+v", cdr)
	}
	if n, _ := st.Len("sip"); n != 0 {
		t.Errorf("%d records for a call never answered", n)
	}
	h.start()
	if h.calls.Len() != 0 {
		t.Errorf("%d calls restored, want none", h.calls.Len())
	}
}

func asDialogResponse(err error, dr **sipgo.ErrDialogResponse) bool {
	if err == nil {
		return false
	}
	if e, ok := err.(*sipgo.ErrDialogResponse); ok {
		*dr = e
		return true
	}
	return false
}

// SRTP terminated by relayd runs in the userspace data plane, whose flows
// a restart loses: they come back with the same IDs and keys.
func TestRestartReinstallsSRTPFlows(t *testing.T) {
	ce := newCallee(t)
	st := openStore(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, userspace: true, store: st})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, savpOffer(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	waitFor(t, "userspace flows", func() bool { return h.us.Len() == 4 })
	// Until the ACK is handled the call is not answered, and a restart
	// may write it without the counters set below.
	negotiatedCall(t, h)
	m := flowsOf(t, h.us)[0].Match
	if err := h.us.SetStats(m, dataplane.Stats{Packets: 1000, Bytes: 200000}); err != nil {
		t.Fatal(err)
	}
	before := flowsOf(t, h.us)
	h.restart()
	after := flowsOf(t, h.us)
	if !reflect.DeepEqual(before, after) {
		t.Errorf("userspace flows after the restart:\n got  %+v\n want %+v", after, before)
	}
	d.Bye(ctx)
	cdr := h.cdr()
	var pkts uint64
	for _, f := range cdr.Flows {
		if f.Match == m.String() {
			pkts = f.Packets
		}
	}
	if pkts != 1000 || cdr.Media[call.A].SRTP != "AES_CM_128_HMAC_SHA1_80" {
		t.Errorf("CDR: flow %s carried %d packets (want 1000 from before the restart); media %+v", m, pkts, cdr.Media)
	}
}

func TestMaxDurationAcrossRestart(t *testing.T) {
	ce := newCallee(t)
	st := openStore(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, store: st, maxDuration: 1500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	start := time.Now()
	h.restart()
	if cdr := h.cdr(); cdr.Disposition != call.MaxDuration {
		t.Errorf("CDR %+v", cdr)
	}
	if el := time.Since(start); el > 2500*time.Millisecond {
		t.Errorf("maximum duration hit after %v: the restart reset the timer", el)
	}
}

func TestMediaTimeoutAfterRestart(t *testing.T) {
	ce := newCallee(t)
	st := openStore(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, store: st, mediaTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	h.restart()
	if cdr := h.cdr(); cdr.Disposition != call.MediaTimeout {
		t.Errorf("CDR %+v", cdr)
	}
	select {
	case <-d.Context().Done():
	case <-time.After(5 * time.Second):
		t.Error("caller got no BYE")
	}
}

func TestDrainAndHangup(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ds []*sipgo.DialogClientSession
	for range 2 {
		d, err := h.invite(ctx, offerSDP(4000))
		if err != nil {
			t.Fatal(err)
		}
		d.Ack(ctx)
		ds = append(ds, d)
	}
	if err := h.srv.Hangup("no-such-call"); !isNoCall(err) {
		t.Errorf("Hangup of an unknown id: %v", err)
	}
	// Hang up the first by the caller's SIP Call-ID.
	if err := h.srv.Hangup(ds[0].InviteRequest.CallID().Value()); err != nil {
		t.Fatal(err)
	}
	if cdr := h.cdr(); cdr.Disposition != call.Hangup || cdr.Legs[call.A].CallID != ds[0].InviteRequest.CallID().Value() {
		t.Errorf("CDR %+v", cdr)
	}
	select {
	case <-ds[0].Context().Done():
	case <-time.After(5 * time.Second):
		t.Error("caller got no BYE")
	}
	h.srv.Drain(700 * time.Millisecond)
	if draining, n := h.srv.DrainStatus(); !draining || n != 1 {
		t.Errorf("DrainStatus = %v, %d", draining, n)
	}
	_, err := h.invite(ctx, offerSDP(4000))
	var dr *sipgo.ErrDialogResponse
	if !asDialogResponse(err, &dr) || dr.Res.StatusCode != 503 || dr.Res.GetHeader("Retry-After") == nil {
		t.Errorf("INVITE while draining: %v, want 503 with Retry-After", err)
	}
	if cdr := h.cdr(); cdr.Disposition != call.Drained {
		t.Errorf("CDR %+v", cdr)
	}
	if _, n := h.srv.DrainStatus(); n != 0 {
		t.Errorf("%d calls after the drain timeout", n)
	}
}

func isNoCall(err error) bool { return err != nil && strings.Contains(err.Error(), ErrNoCall.Error()) }

// The fields restore sets by name exist in this sipgo.
func TestRestoreDialogFields(t *testing.T) {
	d := &sipgo.DialogClientSession{Dialog: sipgo.Dialog{InviteRequest: sip.NewRequest(sip.INVITE, sip.Uri{Host: "x"})}}
	d.InitWithState(sip.DialogStateConfirmed)
	if err := setCSeq(&d.Dialog, 7, 9); err != nil {
		t.Fatal(err)
	}
	if d.CSEQ() != 7 || remoteCSeq(&d.Dialog) != 9 {
		t.Errorf("CSeq %d/%d, want 7/9", d.CSEQ(), remoteCSeq(&d.Dialog))
	}
	if err := setField(d, "inviteTx", sip.ClientTransaction(endedTx{})); err != nil {
		t.Fatal(err)
	}
	if err := setField(d, "noSuchField", 1); err == nil {
		t.Error("a missing field was set")
	}
}

// SIP over TCP across a restart: the connections of the previous run are
// gone; the next in-dialog request in either direction opens a new one.
func TestRestartTCPLeg(t *testing.T) {
	ce := newCallee(t)
	ctx0, cancel0 := context.WithCancel(context.Background())
	defer cancel0()
	ready := make(chan struct{})
	//lint:ignore SA1029 sipgo's own key type
	go ce.srv.ListenAndServe(context.WithValue(ctx0, sipgo.ListenReadyCtxKey, sipgo.ListenReadyCtxValue(ready)), "tcp", ce.addr)
	<-ready
	st := openStore(t)
	h := newHarness(t, opts{destinations: []string{ce.addr + ";transport=tcp"}, store: st})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dialogs := make(chan *sipgo.DialogServerSession, 2)
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		if req.Transport() != "TCP" {
			t.Errorf("INVITE to the callee over %s", req.Transport())
		}
		answerSDP(d, req, 6000)
		dialogs <- d
		<-d.Context().Done()
	})
	// Call 1: the callee hangs up after the restart.
	d1, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d1.Ack(ctx)
	cd1 := <-dialogs
	// Call 2: the caller hangs up after the restart.
	d2, err := h.invite(ctx, offerSDP(4010))
	if err != nil {
		t.Fatal(err)
	}
	d2.Ack(ctx)
	<-dialogs
	h.restart()
	h.noCDR("restart")
	if err := cd1.Bye(ctx); err != nil {
		t.Fatalf("BYE from the TCP callee after the restart: %v", err)
	}
	if cdr := h.cdr(); cdr.Reason != "callee hung up" || cdr.Legs[call.B].Transport != "tcp" {
		t.Errorf("CDR %+v", cdr)
	}
	select {
	case <-d1.Context().Done():
	case <-time.After(5 * time.Second):
		t.Error("caller 1 got no BYE")
	}
	if err := d2.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	if cdr := h.cdr(); cdr.Reason != "caller hung up" {
		t.Errorf("CDR %+v", cdr)
	}
	waitFor(t, "BYE to the TCP callee on a new connection", func() bool { return ce.byeCount() == 1 })
	ce.mu.Lock()
	defer ce.mu.Unlock()
	if ce.byeVia[0] != "TCP" {
		t.Errorf("BYE to the callee over %s", ce.byeVia[0])
	}
}

// kill -9: no Shutdown, nothing written at exit; what was stored when the
// call was answered is enough.
func TestCrashKeepsAnsweredCall(t *testing.T) {
	st := openStore(t)
	ce, h, ctx, d := storedCall(t, st)
	d.Ack(ctx)
	waitFor(t, "4 flows", func() bool { return h.xdp.Len() == 4 })
	negotiatedCall(t, h)
	// The crash: the stack goes away at once, and (as a dead process would)
	// the old server runs no more code after its goroutines return.
	old := h.srv
	h.cancel()
	h.cancel = nil
	<-h.done
	old.ua.Close()
	old.wg.Wait()
	old.inflight.Wait()
	h.start()
	if h.calls.Len() != 1 || h.xdp.Len() != 4 {
		t.Fatalf("after the crash: %d calls, %d flows", h.calls.Len(), h.xdp.Len())
	}
	if err := d.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	if cdr := h.cdr(); cdr.Disposition != call.Answered || cdr.Answer == nil || len(cdr.Attempts) != 1 || len(cdr.Flows) != 4 {
		t.Errorf("CDR %+v", cdr)
	}
	waitFor(t, "callee BYE", func() bool { return ce.byeCount() == 1 })
}

// Records relayd cannot use: one of a newer record version stays for the
// relayd that wrote it, a damaged one is removed; neither stops the start.
func TestRestoreSkipsUnusableRecords(t *testing.T) {
	st := openStore(t)
	st.Put("sip", "future", []byte(`{"v": 99, "call": {"id": "future"}, "something": "new"}`))
	st.Put("sip", "broken", []byte(`{"v": 1, "call": {"id": "broken"}, "a": {"invite": "not SIP"}}`))
	st.Put("sip", "garbage", []byte(`not json`))
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, store: st})
	if h.calls.Len() != 0 {
		t.Errorf("%d calls restored from unusable records", h.calls.Len())
	}
	if _, ok, _ := st.Get("sip", "future"); !ok {
		t.Error("the record of a newer version was removed")
	}
	for _, k := range []string{"broken", "garbage"} {
		if _, ok, _ := st.Get("sip", k); ok {
			t.Errorf("unusable record %q left in the store", k)
		}
	}
	// The B2BUA works.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	d.Bye(ctx)
	if cdr := h.cdr(); cdr.Disposition != call.Answered {
		t.Errorf("CDR %+v", cdr)
	}
}

// storedCall places a call through a harness that keeps its calls in st,
// and returns the callee, the harness, a context that ends with the test
// (20 s at most) and the caller's dialog (answered, not yet ACKed).
func storedCall(t *testing.T, st Store) (*callee, *harness, context.Context, *sipgo.DialogClientSession) {
	t.Helper()
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, store: st})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	return ce, h, ctx, d
}

// negotiatedCall waits until the harness holds one call whose ACK relayd
// has handled, and returns it.
func negotiatedCall(t *testing.T, h *harness) *b2bCall {
	t.Helper()
	var bc *b2bCall
	waitFor(t, "the ACK handled", func() bool {
		calls := h.srv.calls()
		if len(calls) != 1 {
			return false
		}
		bc = calls[0]
		bc.mu.Lock()
		defer bc.mu.Unlock()
		return bc.negotiated
	})
	return bc
}

// countingStore counts the writes that reach a Store.
type countingStore struct {
	Store
	mu   sync.Mutex
	puts int
}

func (c *countingStore) Put(namespace, key string, value []byte) error {
	c.mu.Lock()
	c.puts++
	c.mu.Unlock()
	return c.Store.Put(namespace, key, value)
}

func (c *countingStore) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.puts
}

// TestPersistSkipsUnchangedRecord: the record is written before the 200,
// not again at an early offer's ACK, which changes nothing in it, nor by
// the periodic checks of a quiet call; a re-INVITE writes it again.
func TestPersistSkipsUnchangedRecord(t *testing.T) {
	st := &countingStore{Store: openStore(t)}
	ce, h, ctx, d := storedCall(t, st)
	if n := st.count(); n != 1 {
		t.Fatalf("%d writes when the caller got its 200, want 1", n)
	}
	d.Ack(ctx)
	waitFor(t, "4 flows", func() bool { return h.xdp.Len() == 4 })
	bc := negotiatedCall(t, h)
	if err := bc.persist(); err != nil {
		t.Fatal(err)
	}
	if n := st.count(); n != 1 {
		t.Errorf("%d writes after the ACK and a check of the unchanged call, want 1", n)
	}

	before := st.count()
	ce.mu.Lock()
	ce.reinvite = func(req *sip.Request, tx sip.ServerTransaction) {
		res := sip.NewResponseFromRequest(req, 200, "OK", []byte(calleeSDP(strings.Replace(string(offerSDP(6000)), "a=sendrecv", "a=recvonly", 1))))
		res.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
		tx.Respond(res)
	}
	ce.mu.Unlock()
	hold := strings.Replace(string(offerSDP(4000)), "a=sendrecv", "a=sendonly", 1)
	re := sip.NewRequest(sip.INVITE, d.InviteResponse.Contact().Address)
	re.SetBody([]byte(hold))
	re.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	res, err := d.Do(ctx, re)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("re-INVITE: %v %v", res, err)
	}
	d.WriteRequest(sip.NewRequest(sip.ACK, d.InviteResponse.Contact().Address))
	waitFor(t, "the re-INVITE's record", func() bool { return st.count() > before })
	// What is stored is the call as it is now: its CSeq numbers. The
	// periodic check may have written the record first, when the flows
	// had moved and the dialog not yet taken the re-INVITE: the record
	// the re-INVITE's own write leaves is the one to read.
	var rec record
	waitFor(t, "the re-INVITE's CSeq in the record", func() bool {
		data, ok, err := st.Get(storeNamespace, h.calls.List()[0].ID)
		if err != nil || !ok {
			t.Fatalf("record: %v %v", ok, err)
		}
		if err := json.Unmarshal(data, &rec); err != nil {
			t.Fatal(err)
		}
		return rec.A.RemoteCSeq == re.CSeq().SeqNo
	})
	if err := d.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	h.cdr()
}

func TestRecordDigestLeavesOutSaved(t *testing.T) {
	a := record{V: recordVersion, Route: routeRecord{Name: "r"}, Saved: time.Unix(1, 0)}
	b := a
	b.Saved = time.Unix(2, 0)
	c := a
	c.Route.Name = "s"
	digest := func(r record) uint64 {
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(data, savedField) {
			t.Fatalf("no %s in %s", savedField, data)
		}
		return recordDigest(data)
	}
	if digest(a) != digest(b) {
		t.Error("records that differ only in Saved digest apart")
	}
	if digest(a) == digest(c) {
		t.Error("records that differ in their route digest alike")
	}
}
