package sip

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
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
// four messages' text without the bodies (messageText), about 2 KiB. The
// next in-dialog request, a BYE of relayd's or a re-offer rebuilds the
// dialogs from the text, as a restart does from the store (restoreCall),
// and the sweep compacts them again once that is over.
//
// With a store (the appliance's [state]), the call's record holds the
// same text: the sweep then keeps none in memory (stow), and the
// rebuild reads it back from the store, whose pages are the state
// file's, not the heap's.

// heldDialogs are a compacted call's dialogs (b2bCall.held, guarded by
// its mu; record takes a copy).
type heldDialogs struct {
	a, b dialogRecord
	// stored: the four texts are the store's, in the call's record, and
	// a and b have none; digest (dialogsDigest) is of the dialogs whole.
	stored bool
	digest uint64
}

// digestSeed seeds dialogsDigest.
var digestSeed = maphash.MakeSeed()

// dialogsDigest identifies a call's two dialog records: the sweep stows a
// call's text only if the store has it, which persist says by keeping the
// digest of what it wrote (b2bCall.savedDialogs).
func dialogsDigest(a, b *dialogRecord) uint64 {
	return maphash.Comparable(digestSeed, [2]dialogRecord{*a, *b})
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
	if bc.compacted {
		h := &bc.held
		ra, rb := &h.a, &h.b
		if h.stored {
			sa, sb, err := bc.storedDialogs(h)
			if err != nil {
				return nil, nil, bc.doneDialogs, err
			}
			ra, rb = &sa, &sb
		}
		a, aRes, b, err := bc.s.rebuildDialogs(ra, rb)
		if err != nil {
			return nil, nil, bc.doneDialogs, fmt.Errorf("rebuild the dialogs of a held call: %w", err)
		}
		bc.a, bc.aRes, bc.b = a, aRes, b
		bc.compacted, bc.held = false, heldDialogs{}
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
	if bc.compacted || bc.users > 0 || !bc.released || !bc.negotiated || bc.detached || bc.b == nil || bc.aRes == nil ||
		bc.a.LoadState() != sip.DialogStateConfirmed || bc.b.LoadState() != sip.DialogStateConfirmed {
		return false
	}
	if !bc.reoffer.TryLock() {
		return false // a re-offer between the legs
	}
	defer bc.reoffer.Unlock()
	bc.held = heldDialogs{}
	bc.held.a, bc.held.b = dialogRecords(bc.a, bc.aRes, bc.b)
	// The addresses among the call's strings (the texts go when stowed).
	for _, a := range []*string{&bc.held.a.Source, &bc.held.b.Source, &bc.held.b.Dest} {
		*a = bc.c.Keep(*a)
	}
	bc.compacted = true
	bc.a, bc.aRes, bc.b = nil, nil, nil
	// The call's attempts last as long (call.Call.Compact).
	bc.c.Compact()
	return true
}

// dialogRecords are the records of a call's dialogs that are up, as
// compact keeps them and persist writes them.
func dialogRecords(a *sipgo.DialogServerSession, aRes *sip.Response, b *sipgo.DialogClientSession) (ra, rb dialogRecord) {
	ra = dialogRecord{
		Invite: messageText(a.InviteRequest), Response: messageText(aRes),
		Transport: a.InviteRequest.Transport(), Source: a.InviteRequest.Source(),
		LocalCSeq: a.CSEQ(), RemoteCSeq: remoteCSeq(&a.Dialog),
	}
	rb = dialogRecord{
		Invite: messageText(b.InviteRequest), Response: messageText(b.InviteResponse),
		Transport: b.InviteRequest.Transport(), Source: b.InviteResponse.Source(), Dest: b.InviteRequest.Destination(),
		LocalCSeq: b.CSEQ(), RemoteCSeq: remoteCSeq(&b.Dialog),
	}
	return ra, rb
}

// stow drops the text of a compacted call's dialogs when its record in
// the store holds the same dialogs, and reports whether it did.
func (bc *b2bCall) stow() bool {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	h := &bc.held
	if !bc.compacted || h.stored || bc.savedDialogs == 0 {
		return false
	}
	d := dialogsDigest(&h.a, &h.b)
	if d != bc.savedDialogs {
		return false
	}
	h.a.Invite, h.a.Response, h.b.Invite, h.b.Response = "", "", "", ""
	h.stored, h.digest = true, d
	return true
}

// storedDialogs reads the dialogs of a stowed call back from its record.
func (bc *b2bCall) storedDialogs(h *heldDialogs) (a, b dialogRecord, err error) {
	data, ok, err := bc.s.cfg.Store.Get(storeNamespace, bc.c.ID)
	if err == nil && !ok {
		err = errors.New("the call's record is gone")
	}
	var rec struct {
		A dialogRecord `json:"a"`
		B dialogRecord `json:"b"`
	}
	if err == nil {
		err = json.Unmarshal(data, &rec)
	}
	if err != nil {
		return a, b, fmt.Errorf("read the dialogs of a held call from the store: %w", err)
	}
	a, b = h.a, h.b
	a.Invite, a.Response, b.Invite, b.Response = rec.A.Invite, rec.A.Response, rec.B.Invite, rec.B.Response
	if dialogsDigest(&a, &b) != h.digest {
		return a, b, errors.New("the call's record in the store holds other dialogs than the call")
	}
	return a, b, nil
}

// messageText is a dialog's message (request or response) as text without
// its body (Content-Length 0): the dialog builds its requests from the
// headers alone, the SDP relayd last sent each leg is the session's
// (call.Session.LastSent) and the peers' SDP is of no use once
// negotiated. The text is written once and copied to a string of its own
// length (the builder leaves up to twice it): cloning the message to drop
// its body would copy every header, garbage made while calls are set up,
// and the heap it spreads over outlives it.
func messageText(m interface {
	StartLineWrite(io.StringWriter)
	Headers() []sip.Header
}) string {
	var b strings.Builder
	b.Grow(1024)
	m.StartLineWrite(&b)
	b.WriteString("\r\n")
	for _, h := range m.Headers() {
		if n := h.Name(); strings.EqualFold(n, "Content-Length") || n == "l" {
			continue
		}
		h.StringWrite(&b)
		b.WriteString("\r\n")
	}
	b.WriteString("Content-Length: 0\r\n\r\n")
	return strings.Clone(b.String())
}

// compact compacts the quiet calls that are up (b2bCall.compact).
// With a store, it stows the calls it compacted (stow); a call whose
// record has other dialogs (an in-dialog request since it was written) is
// written again first: its record was out of date for a restart too.
func (s *Server) compact() {
	for _, bc := range s.calls() {
		if !bc.compact() || s.cfg.Store == nil || bc.stow() {
			continue
		}
		if bc.persist() == nil {
			bc.stow()
		}
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
