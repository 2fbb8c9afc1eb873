package sip

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/route"
	"github.com/relayd/relayd/control/state"
)

// Store keeps call records across restarts (control/state implements it).
// Put returns once the record is durable.
type Store = state.Records

// storeNamespace is the B2BUA's namespace in the store.
const storeNamespace = "sip"

// recordVersion is the layout of record. A record of a newer version is
// left in the store, untouched, and reported.
const recordVersion = 1

// record is an answered call as persisted: what relayd needs to take the
// call back after a restart. Both dialogs are kept as the wire text of the
// INVITE and its 2xx (re-parsed on restore) plus what the text does not
// carry: transport, addresses and both CSeq numbers.
type record struct {
	V        int             `json:"v"`
	Call     call.Snapshot   `json:"call"`
	A        dialogRecord    `json:"a"` // relayd is UAS
	B        dialogRecord    `json:"b"` // relayd is UAC
	Relay    [2]netip.Addr   `json:"relay"`
	Origin   [2]originRecord `json:"origin"`
	LastSent [2][]byte       `json:"last_sent"`
	Route    routeRecord     `json:"route"`
	// Saved is the last field: recordDigest leaves it out.
	Saved time.Time `json:"saved"`
}

type dialogRecord struct {
	Invite     string `json:"invite"`
	Response   string `json:"response"`
	Transport  string `json:"transport"`
	Source     string `json:"source,omitempty"`      // of the INVITE (leg A) or of the 2xx (leg B)
	Dest       string `json:"destination,omitempty"` // where the INVITE went (leg B)
	LocalCSeq  uint32 `json:"local_cseq"`
	RemoteCSeq uint32 `json:"remote_cseq"`
}

type originRecord struct {
	SessionID uint64 `json:"session_id"`
	Version   uint64 `json:"version"`
}

// routeRecord is what re-offers need of the route.
type routeRecord struct {
	Name   string       `json:"name"`
	SRTP   route.Policy `json:"srtp"`
	Codecs []string     `json:"codecs,omitempty"`
	// Transcode is the route's transcode list.
	Transcode []string `json:"transcode,omitempty"`
	// SDESTLSOnly is the route's sdes_tls_only.
	SDESTLSOnly bool `json:"sdes_tls_only,omitempty"`
}

// persist writes the call's record. It is a no-op without a store or
// before the answer; an error is logged: the call goes on, it just would
// not survive a restart.
func (bc *b2bCall) persist() error {
	st := bc.s.cfg.Store
	if st == nil {
		return nil
	}
	bc.persistMu.Lock()
	defer bc.persistMu.Unlock()
	rev := bc.c.Media.Revision()
	rec, ok := bc.record()
	if !ok {
		return nil
	}
	data, err := json.Marshal(rec)
	sum := recordDigest(data)
	bc.mu.Lock()
	same := bc.savedSum == sum
	bc.mu.Unlock()
	// A record that says what the stored one says is not written again:
	// an early offer's ACK, or a quiet call's periodic check, changes
	// nothing but the time of writing.
	if err == nil && !same {
		err = st.Put(storeNamespace, bc.c.ID, data)
	}
	if err != nil {
		bc.log.Error("persist call: it will not survive a restart", zap.Error(err))
		return err
	}
	bc.mu.Lock()
	bc.savedRev, bc.savedAt, bc.savedSum = rev, rec.Saved, sum
	bc.savedDialogs = dialogsDigest(&rec.A, &rec.B)
	bc.mu.Unlock()
	return nil
}

// savedField is how a record's JSON names its last field, the time it was
// written (record.Saved).
var savedField = []byte(`,"saved":`)

// recordDigest digests a record's JSON without the time it was written.
func recordDigest(data []byte) uint64 {
	if i := bytes.LastIndex(data, savedField); i >= 0 {
		data = data[:i]
	}
	return maphash.Bytes(digestSeed, data)
}

// forget removes the call's record.
func (bc *b2bCall) forget() {
	if st := bc.s.cfg.Store; st != nil {
		if err := st.Delete(storeNamespace, bc.c.ID); err != nil {
			bc.log.Warn("remove call record", zap.Error(err))
		}
	}
}

func (bc *b2bCall) record() (record, bool) {
	bc.mu.Lock()
	a, b, aRes, rt, compacted, held := bc.a, bc.b, bc.aRes, bc.rt, bc.compacted, bc.held
	rec := record{
		V:     recordVersion,
		Relay: bc.relay,
		Route: routeRecord{Name: rt.Name, SRTP: rt.SRTP, Codecs: rt.Codecs, Transcode: rt.Transcode,
			SDESTLSOnly: rt.SDESTLSOnly},
		Saved: time.Now(),
	}
	bc.mu.Unlock()
	neg := bc.neg.Snapshot()
	rec.LastSent = neg.LastSent
	for i, o := range neg.Origin {
		rec.Origin[i] = originRecord(o)
	}
	if compacted {
		// The dialogs are this text already, or the store's.
		rec.Call = bc.c.Snapshot()
		rec.A, rec.B = held.a, held.b
		if held.stored {
			var err error
			if rec.A, rec.B, err = bc.storedDialogs(&held); err != nil {
				bc.log.Error("persist call", zap.Error(err))
				return record{}, false
			}
		}
		return rec, true
	}
	if b == nil || aRes == nil || b.InviteResponse == nil {
		return record{}, false
	}
	rec.Call = bc.c.Snapshot()
	// Without the bodies, as compact keeps them (held.go): the stored
	// and the held text are the same, so that a held call can stow its.
	rec.A, rec.B = dialogRecords(a, aRes, b)
	return rec, true
}

// restore takes back the calls of the store; it returns how many.
// Records it cannot use are reported and removed, except those of a newer
// record version, which stay for the relayd that wrote them.
func (s *Server) restore() int {
	st := s.cfg.Store
	if st == nil {
		return 0
	}
	type raw struct {
		key  string
		data []byte
	}
	var all []raw
	if err := st.ForEach(storeNamespace, func(k string, v []byte) error {
		all = append(all, raw{k, append([]byte(nil), v...)})
		return nil
	}); err != nil {
		s.log.Error("read stored calls", zap.Error(err))
		return 0
	}
	n := 0
	for _, r := range all {
		var rec record
		err := json.Unmarshal(r.data, &rec)
		switch {
		case err == nil && rec.V > recordVersion:
			s.log.Error("stored call of a newer record version: left in the store", zap.String("call", r.key),
				zap.Int("version", rec.V), zap.Int("known", recordVersion))
			continue
		case err == nil && rec.Call.ID != r.key:
			err = fmt.Errorf("record of call %q under key %q", rec.Call.ID, r.key)
		}
		if err == nil {
			err = s.restoreCall(&rec)
		}
		if err != nil {
			s.log.Error("stored call not restored: removed", zap.String("call", r.key), zap.Error(err))
			if derr := st.Delete(storeNamespace, r.key); derr != nil {
				s.log.Warn("remove stored call", zap.String("call", r.key), zap.Error(derr))
			}
			continue
		}
		n++
	}
	if len(all) > 0 {
		s.log.Info("calls restored", zap.Int("calls", n), zap.Int("records", len(all)))
	}
	return n
}

func parseRequest(text, what string) (*sip.Request, error) {
	m, err := sip.ParseMessage([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	req, ok := m.(*sip.Request)
	if !ok {
		return nil, fmt.Errorf("%s: not a request", what)
	}
	return req, nil
}

func parseResponse(text, what string) (*sip.Response, error) {
	m, err := sip.ParseMessage([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	res, ok := m.(*sip.Response)
	if !ok {
		return nil, fmt.Errorf("%s: not a response", what)
	}
	return res, nil
}

// restoreCall rebuilds one call: both sipgo dialogs in state confirmed
// with their CSeq numbers, the call and its flows in the table, the
// dialog IDs registered, the maximum duration timer running.
func (s *Server) restoreCall(rec *record) error {
	a, aRes, b, err := s.rebuildDialogs(&rec.A, &rec.B)
	if err != nil {
		return err
	}
	src := sourceOf(a.InviteRequest)
	aUA := s.dialogUA(rec.A.Transport, src.Addr())

	c, err := s.cfg.Calls.Restore(rec.Call)
	if c == nil {
		return err
	}
	if err != nil {
		// The call is back; some flow is not: media may be cut, the
		// signalling is not. Say so and go on.
		s.log.Warn("restored call has flows missing", zap.String("call", c.ID), zap.Error(err))
	}
	bc := &b2bCall{
		s:          s,
		c:          c,
		log:        s.newCallLog(c.ID, ""),
		start:      c.Created,
		a:          a,
		aUA:        aUA,
		aTx:        endedTx{},
		aRes:       aRes,
		relay:      rec.Relay,
		b:          b,
		rt:         &route.Route{Name: rec.Route.Name, SRTP: rec.Route.SRTP, Codecs: rec.Route.Codecs, Transcode: rec.Route.Transcode, SDESTLSOnly: rec.Route.SDESTLSOnly},
		answered:   true,
		negotiated: true,
		restored:   true,
		released:   true, // the dialogs have no INVITE transaction
	}
	neg := call.SessionSnapshot{LastSent: rec.LastSent}
	for i, o := range rec.Origin {
		neg.Origin[i] = call.OriginSnap(o)
	}
	bc.neg = call.RestoreSession(c.Media, [2]call.Local{s.cfg.Calls.LocalOf(rec.Relay[call.A]), s.cfg.Calls.LocalOf(rec.Relay[call.B])}, neg)
	// The TCP connections of the previous run are gone: relayd may open
	// new ones to both peers (see peerSet): the caller's source address
	// (its Contact is where the requests go; a Contact elsewhere is not
	// trusted more than before the restart) and the callee.
	s.peers.allow(src.Addr())
	if ap, err := netip.ParseAddrPort(rec.B.Dest); err == nil {
		s.peers.allow(ap.Addr())
	}
	s.setDialog(bc, call.A, a.ID)
	s.setDialog(bc, call.B, b.ID)
	if limit := s.cfg.MaxDuration; limit > 0 {
		// Past due: once the listeners are up.
		left := max(limit-time.Since(rec.Call.Answered), time.Second)
		bc.mu.Lock()
		bc.maxTimer = time.AfterFunc(left, func() { bc.terminate(call.MaxDuration, 0, "maximum call duration") })
		bc.mu.Unlock()
	}
	// The record again at once: counters the data planes lost in the
	// restart (an XDP flow's shadow) are now carried by the call, and a
	// crash before the next write must not lose them.
	bc.persist()
	bc.log.Info("call restored", zap.String("call_id", c.Leg(call.A).CallID), zap.String("call_id_b", c.Leg(call.B).CallID),
		zap.Int("flows", len(c.Media.Flows())), zap.Duration("age", time.Since(rec.Call.Answered)))
	return nil
}

// endedTx stands for the INVITE transaction of a dialog restored from the
// store: it ended with the previous run.
type endedTx struct{}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (endedTx) Terminate()                             {}
func (endedTx) OnTerminate(sip.FnTxTerminate) bool     { return true }
func (endedTx) Done() <-chan struct{}                  { return closedChan }
func (endedTx) Err() error                             { return nil }
func (endedTx) Respond(*sip.Response) error            { return errTxEnded }
func (endedTx) Acks() <-chan *sip.Request              { return nil }
func (endedTx) OnCancel(sip.FnTxCancel) bool           { return true }
func (endedTx) Responses() <-chan *sip.Response        { return nil }
func (endedTx) OnRetransmission(sip.FnTxResponse) bool { return true }

var errTxEnded = errors.New("the INVITE transaction ended with the previous run")

// sipgo (v1.7) has no API to rebuild a dialog: its CSeq counters and a
// client dialog's INVITE transaction are unexported. These set them by
// name; a sipgo that renames them makes restore fail with an error (and
// TestRestoreDialogFields), never silently.

func setCSeq(d *sipgo.Dialog, local, remote uint32) error {
	for name, v := range map[string]uint32{"lastCSeqNo": local, "remoteCSeqNo": remote} {
		f, err := field(d, name)
		if err != nil {
			return err
		}
		p, ok := f.Addr().Interface().(*atomic.Uint32)
		if !ok {
			return fmt.Errorf("sipgo.Dialog.%s is not an atomic.Uint32", name)
		}
		p.Store(v)
	}
	return nil
}

func remoteCSeq(d *sipgo.Dialog) uint32 {
	f, err := field(d, "remoteCSeqNo")
	if err != nil {
		return 0
	}
	if p, ok := f.Addr().Interface().(*atomic.Uint32); ok {
		return p.Load()
	}
	return 0
}

func setField(ptr any, name string, v any) error {
	f, err := field(ptr, name)
	if err != nil {
		return err
	}
	val := reflect.ValueOf(v)
	if !val.Type().AssignableTo(f.Type()) {
		return fmt.Errorf("sipgo field %s: %s is not assignable to %s", name, val.Type(), f.Type())
	}
	f.Set(val)
	return nil
}

// field returns a settable view of an unexported field of *ptr.
func field(ptr any, name string) (reflect.Value, error) {
	v := reflect.ValueOf(ptr).Elem()
	f := v.FieldByName(name)
	if !f.IsValid() {
		return reflect.Value{}, fmt.Errorf("restore dialog: sipgo %s has no field %s (sipgo changed: check control/sip/persist.go)", v.Type(), name)
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem(), nil
}

func (bc *b2bCall) isDetached() bool {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return bc.detached
}

func (bc *b2bCall) isAnswered() bool {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return bc.answered
}

// detach lets go of an answered call at shutdown, leaving it up: its
// record written a last time (with the userspace flows' counters), its
// flows and ports left in place, no BYE, no CDR. It reports false if the
// call was not answered or had ended.
func (bc *b2bCall) detach() bool {
	if !bc.isAnswered() || bc.c.State() == call.StateEnded {
		return false
	}
	if err := bc.persist(); err != nil {
		return false
	}
	bc.mu.Lock()
	if bc.maxTimer != nil {
		bc.maxTimer.Stop()
	}
	bc.detached = true
	negotiated := bc.negotiated
	bc.mu.Unlock()
	if !bc.c.Detach() {
		return false
	}
	if !negotiated {
		// The answer's goroutine waits for the caller's ACK: let it go.
		bc.aTx.Terminate()
	}
	bc.s.unregister(bc)
	bc.s.cfg.Calls.Remove(bc.c)
	return true
}

// releaseTxs lets go of the INVITE transactions of an answered call once
// both have ended (64*T1 after the answer over UDP): the dialogs get an
// endedTx in their place, as a restored call's have. The transactions
// hold what the call no longer needs for as long as it lasts: the
// caller's INVITE as parsed (the dialog has its own copy), the ACK
// template for the callee's retransmitted 2xx, their timers and
// channels. It reports whether it released them; a call busy with a BYE
// is left for the next try.
func (bc *b2bCall) releaseTxs() bool {
	bc.mu.Lock()
	ready := bc.negotiated && !bc.released && !bc.detached && bc.b != nil
	aTx, b := bc.aTx, bc.b
	bc.mu.Unlock()
	if !ready || !ended(aTx) {
		return false
	}
	bTx, err := field(b, "inviteTx")
	if err != nil {
		return false
	}
	if tx, ok := bTx.Interface().(sip.ClientTransaction); !ok || !ended(tx) {
		return false
	}
	if !bc.dlgMu.TryLock() {
		return false
	}
	defer bc.dlgMu.Unlock()
	if err := setField(bc.a, "inviteTx", sip.ServerTransaction(endedTx{})); err != nil {
		return false
	}
	if err := setField(b, "inviteTx", sip.ClientTransaction(endedTx{})); err != nil {
		return false
	}
	// The caller's dialog's state callbacks served the setup and the
	// wait for the ACK (sipgo's channel for it, the setup's cancel):
	// both are over.
	dropStateCallbacks(&bc.a.Dialog)
	bc.mu.Lock()
	bc.aTx, bc.released = endedTx{}, true
	bc.mu.Unlock()
	return true
}

// dropDialogs lets go, as the call ends, of what the dialogs would keep
// of it, and of it of their INVITE transactions: the caller's dialog's
// state callback (dropStateCallbacks), and the ended transactions' last
// timers (stopEndedTx; the caller's is aTx, which the dialog holds too).
// Neither serves an ended call.
func (bc *b2bCall) dropDialogs() {
	bc.mu.Lock()
	a, b, aTx := bc.a, bc.b, bc.aTx
	bc.mu.Unlock()
	stopEndedTx(aTx)
	if a != nil {
		dropStateCallbacks(&a.Dialog)
	}
	if b != nil {
		if f, err := field(b, "inviteTx"); err == nil {
			stopEndedTx(f.Interface())
		}
	}
}

// stopEndedTx stops the last timer of an INVITE transaction that has
// ended: RFC 6026's Timer L (server) or M (client), 64*T1 after the 2xx.
// sipgo's Terminate (which its BYEs call) stops the transaction's other
// timers but not these, whose function holds the transaction, its
// messages and its callbacks until it fires, and then finds it ended:
// stopping it changes nothing else.
func stopEndedTx(tx any) {
	var name string
	switch tx.(type) {
	case *sip.ServerTx:
		name = "timer_l"
	case *sip.ClientTx:
		name = "timer_m"
	default:
		return
	}
	if !ended(tx.(interface{ Done() <-chan struct{} })) {
		return
	}
	mu, err := field(tx, "mu")
	if err != nil {
		return
	}
	t, err := field(tx, name)
	if err != nil {
		return
	}
	m, ok := mu.Addr().Interface().(*sync.Mutex)
	if !ok {
		return
	}
	m.Lock()
	defer m.Unlock()
	if tm, ok := t.Interface().(*time.Timer); ok && tm != nil {
		tm.Stop()
		t.Set(reflect.Zero(t.Type()))
	}
}

// dropStateCallbacks lets go of the state callbacks of dialog d, where
// sipgo has no call for it. The caller's dialog's callback holds the
// whole call (it cancels the setup), and the dialog is held by its INVITE
// transaction's callbacks until the transaction's timer lets go of it,
// 64*T1 (32 s over UDP) after the answer, even when a BYE has ended the
// transaction before.
func dropStateCallbacks(d *sipgo.Dialog) {
	if f, err := field(d, "onStatePointer"); err == nil {
		if p, ok := f.Addr().Interface().(*atomic.Pointer[sipgo.DialogStateFn]); ok {
			p.Store(nil)
		}
	}
}

// ended reports whether a transaction has terminated.
func ended(tx interface{ Done() <-chan struct{} }) bool {
	select {
	case <-tx.Done():
		return true
	default:
		return false
	}
}

// releaseTxs releases the ended INVITE transactions of the calls that
// are up (b2bCall.releaseTxs).
func (s *Server) releaseTxs() {
	for _, bc := range s.calls() {
		bc.releaseTxs()
	}
}
