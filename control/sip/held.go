package sip

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
)

// A call that is up and quiet keeps its two dialogs as text: sipgo's
// dialogs hold the INVITE and its 2xx of each leg parsed (every header a
// structure of its own, the URIs, the parameters), allocated during the
// setup among its transactions' garbage, whose spans they keep in use for
// as long as the call lasts. The sweep compacts the calls whose INVITE
// transactions have ended (releaseTxs) and that nothing is using: the
// four messages' text without the bodies (requestText), about 2 KiB. The
// next in-dialog request, a BYE of relayd's or a re-offer rebuilds the
// dialogs from the text, as a restart does from the store (restoreCall),
// and the sweep compacts them again once that is over.

// heldDialogs are a compacted call's dialogs.
type heldDialogs struct {
	a, b dialogRecord
}

// dialogs returns the call's dialogs, rebuilt first if the call was
// compacted, and counts a user of them until done is called: a call is
// not compacted while it has one. err is set (and the dialogs nil) only
// when a compacted call's text no longer parses, which cannot happen to
// text sipgo wrote; done must be called then too.
func (bc *b2bCall) dialogs() (a *sipgo.DialogServerSession, b *sipgo.DialogClientSession, done func(), err error) {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	bc.users++
	if h := bc.held; h != nil {
		a, aRes, b, err := bc.s.rebuildDialogs(&h.a, &h.b)
		if err != nil {
			return nil, nil, bc.doneDialogs, fmt.Errorf("rebuild the dialogs of a held call: %w", err)
		}
		bc.a, bc.aRes, bc.b, bc.held = a, aRes, b, nil
	}
	return bc.a, bc.b, bc.doneDialogs, nil
}

func (bc *b2bCall) doneDialogs() {
	bc.mu.Lock()
	bc.users--
	bc.mu.Unlock()
}

// compact replaces the dialogs of a quiet call that is up by their text.
// It reports whether it did.
func (bc *b2bCall) compact() bool {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	if bc.held != nil || bc.users > 0 || !bc.released || !bc.negotiated || bc.detached || bc.b == nil || bc.aRes == nil ||
		bc.a.LoadState() != sip.DialogStateConfirmed || bc.b.LoadState() != sip.DialogStateConfirmed {
		return false
	}
	if !bc.reoffer.TryLock() {
		return false // a re-offer between the legs
	}
	defer bc.reoffer.Unlock()
	a, b := bc.a, bc.b
	bc.held = &heldDialogs{
		a: dialogRecord{
			Invite: requestText(a.InviteRequest), Response: responseText(bc.aRes),
			Transport: a.InviteRequest.Transport(), Source: a.InviteRequest.Source(),
			LocalCSeq: a.CSEQ(), RemoteCSeq: remoteCSeq(&a.Dialog),
		},
		b: dialogRecord{
			Invite: requestText(b.InviteRequest), Response: responseText(b.InviteResponse),
			Transport: b.InviteRequest.Transport(), Source: b.InviteResponse.Source(), Dest: b.InviteRequest.Destination(),
			LocalCSeq: b.CSEQ(), RemoteCSeq: remoteCSeq(&b.Dialog),
		},
	}
	bc.a, bc.aRes, bc.b = nil, nil, nil
	return true
}

// requestText and responseText are a dialog's message as text without
// its body: the dialog builds its requests from the headers alone, the
// SDP relayd last sent each leg is the session's (call.Session.LastSent)
// and the peers' SDP is of no use once negotiated. The text is copied to
// a string of its own length (String's builder leaves up to twice it).
func requestText(r *sip.Request) string {
	if len(r.Body()) > 0 {
		r = r.Clone()
		r.SetBody(nil)
	}
	return strings.Clone(r.String())
}

func responseText(r *sip.Response) string {
	if len(r.Body()) > 0 {
		r = r.Clone()
		r.SetBody(nil)
	}
	return strings.Clone(r.String())
}

// compact compacts the quiet calls that are up (b2bCall.compact).
func (s *Server) compact() {
	for _, bc := range s.calls() {
		bc.compact()
	}
}

// rebuildDialogs makes both dialogs of a call that is up from their
// text, in state confirmed with their CSeq numbers and no INVITE
// transaction (it ended): leg A's dialog, the 2xx relayd sent on it, and
// leg B's.
func (s *Server) rebuildDialogs(ra, rb *dialogRecord) (*sipgo.DialogServerSession, *sip.Response, *sipgo.DialogClientSession, error) {
	aInv, err := parseRequest(ra.Invite, "leg A INVITE")
	if err != nil {
		return nil, nil, nil, err
	}
	aRes, err := parseResponse(ra.Response, "leg A 2xx")
	if err != nil {
		return nil, nil, nil, err
	}
	bInv, err := parseRequest(rb.Invite, "leg B INVITE")
	if err != nil {
		return nil, nil, nil, err
	}
	bRes, err := parseResponse(rb.Response, "leg B 2xx")
	if err != nil {
		return nil, nil, nil, err
	}
	if aInv.CallID() == nil || aInv.To() == nil || aInv.From() == nil || aInv.CSeq() == nil || aInv.Contact() == nil {
		return nil, nil, nil, errors.New("leg A INVITE lacks a dialog header")
	}
	aInv.SetTransport(ra.Transport)
	aInv.SetSource(ra.Source)
	aUA := s.dialogUA(ra.Transport, sourceOf(aInv).Addr())
	if aUA == nil {
		return nil, nil, nil, errors.New("no SIP listener for leg A")
	}
	tag, _ := aInv.To().Params.Get("tag")
	if tag == "" {
		return nil, nil, nil, errors.New("leg A INVITE without relayd's To tag")
	}
	a, err := aUA.ReadInvite(aInv, endedTx{})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("leg A dialog: %w", err)
	}
	a.InviteRequest.To().Params.Add("tag", tag) // ReadInvite made a new one
	if a.ID, err = sip.DialogIDFromRequestUAS(a.InviteRequest); err != nil {
		return nil, nil, nil, fmt.Errorf("leg A dialog: %w", err)
	}
	a.InviteResponse = aRes
	a.InitWithState(sip.DialogStateConfirmed)
	if err := setCSeq(&a.Dialog, ra.LocalCSeq, ra.RemoteCSeq); err != nil {
		return nil, nil, nil, err
	}

	bInv.SetTransport(rb.Transport)
	bInv.SetDestination(rb.Dest)
	bRes.SetSource(rb.Source)
	bRes.SetTransport(rb.Transport)
	dst, _ := netip.ParseAddrPort(rb.Dest)
	bUA := s.dialogUA(rb.Transport, dst.Addr())
	b := &sipgo.DialogClientSession{Dialog: sipgo.Dialog{InviteRequest: bInv, InviteResponse: bRes}, UA: bUA}
	if b.ID, err = sip.DialogIDFromResponse(bRes); err != nil {
		return nil, nil, nil, fmt.Errorf("leg B dialog: %w", err)
	}
	b.InitWithState(sip.DialogStateConfirmed)
	if err := setCSeq(&b.Dialog, rb.LocalCSeq, rb.RemoteCSeq); err != nil {
		return nil, nil, nil, err
	}
	if err := setField(b, "inviteTx", sip.ClientTransaction(endedTx{})); err != nil {
		return nil, nil, nil, err
	}
	return a, aRes, b, nil
}
