package ng

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/state"
)

// Store keeps answered ng calls across a restart of relayd (control/state
// implements it). The engine writes a call when it is answered and when its
// media changes (latched sources), and deletes it when the call ends.
type Store = state.Records

// storeNamespace is the ng engine's namespace in the store; keys are ng
// call-ids.
const storeNamespace = "ng"

// recordVersion is the layout of record. A record of a newer version is
// left in the store, untouched, and reported.
const recordVersion = 1

// record is an answered ng call as persisted.
type record struct {
	V          int                  `json:"v"`
	CallID     string               `json:"call_id"`
	Call       call.Snapshot        `json:"call"`
	Session    call.SessionSnapshot `json:"session"`
	Relay      [2]netip.Addr        `json:"relay"`
	Tags       [2]string            `json:"tags"`
	Labels     [2]string            `json:"labels,omitempty"`
	Via        [2]string            `json:"via,omitempty"`
	Created    [2]time.Time         `json:"created"`
	LastSignal time.Time            `json:"last_signal"`
	Answers    [2]string            `json:"answers,omitempty"`
	Interfaces [2]string            `json:"interfaces,omitempty"`
	Saved      time.Time            `json:"saved"`
}

// persist writes an answered call to the store; nc.mu held.
func (e *CallEngine) persist(nc *ngCall) {
	st := e.cfg.Store
	if st == nil || nc.c.State() != call.StateAnswered {
		return
	}
	rec := record{
		V: recordVersion, CallID: nc.id, Call: nc.c.Snapshot(), Session: nc.sess.Snapshot(),
		Relay: [2]netip.Addr{nc.sess.Local(call.A).Addr, nc.sess.Local(call.B).Addr},
		Tags:  nc.tags, Labels: nc.labels, Via: nc.via, Created: nc.created, LastSignal: nc.lastSignal,
		Answers: nc.answers, Interfaces: nc.ifaces, Saved: e.now(),
	}
	rev := nc.c.Media.Revision()
	b, err := json.Marshal(rec)
	if err == nil {
		err = st.Put(storeNamespace, nc.id, b)
	}
	if err != nil {
		e.log.Warn("persist ng call", zap.String("call_id", nc.id), zap.Error(err))
		return
	}
	nc.savedRev = rev
}

// unpersist removes an ended call's record.
func (e *CallEngine) unpersist(nc *ngCall) {
	if e.cfg.Store == nil {
		return
	}
	if err := e.cfg.Store.Delete(storeNamespace, nc.id); err != nil {
		e.log.Warn("remove stored ng call", zap.String("call_id", nc.id), zap.Error(err))
	}
}

// persistChanged writes the calls whose media changed since their last
// record (latched sources).
func (e *CallEngine) persistChanged() {
	if e.cfg.Store == nil {
		return
	}
	for _, nc := range e.snapshot() {
		nc.mu.Lock()
		if nc.c.Media.Revision() != nc.savedRev && nc.c.State() == call.StateAnswered {
			e.persist(nc)
		}
		nc.mu.Unlock()
	}
}

// Restore takes back the answered calls a previous run kept in the
// store: their flows, still carrying media in XDP, are claimed from the
// registry, and the proxy can query and delete them as before. It returns
// how many it restored; records it cannot use are reported and removed.
func (e *CallEngine) Restore() int {
	st := e.cfg.Store
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
		e.log.Error("read stored ng calls", zap.Error(err))
		return 0
	}
	n := 0
	for _, r := range all {
		var rec record
		err := json.Unmarshal(r.data, &rec)
		switch {
		case err == nil && rec.V > recordVersion:
			e.log.Error("stored ng call of a newer record version: left in the store", zap.String("call_id", r.key),
				zap.Int("version", rec.V), zap.Int("known", recordVersion))
			continue
		case err == nil && rec.CallID != r.key:
			err = fmt.Errorf("record of call-id %q under key %q", rec.CallID, r.key)
		}
		if err == nil {
			err = e.restoreCall(&rec)
		}
		if err != nil {
			e.log.Error("stored ng call not restored: removed", zap.String("call_id", r.key), zap.Error(err))
			if derr := st.Delete(storeNamespace, r.key); derr != nil {
				e.log.Warn("remove stored ng call", zap.String("call_id", r.key), zap.Error(derr))
			}
			continue
		}
		n++
	}
	if n > 0 {
		e.log.Info("ng calls of the previous run restored", zap.Int("calls", n))
	}
	return n
}

func (e *CallEngine) restoreCall(rec *record) error {
	c, err := e.cfg.Calls.Restore(rec.Call)
	if c == nil {
		return err
	}
	if err != nil {
		// The call is back but some flow could not be installed again:
		// it carries what it can, as a SIP call restored would.
		e.log.Warn("ng call restored with errors", zap.String("call_id", rec.CallID), zap.Error(err))
	}
	local := [2]call.Local{e.cfg.Calls.LocalOf(rec.Relay[call.A]), e.cfg.Calls.LocalOf(rec.Relay[call.B])}
	nc := &ngCall{
		id: rec.CallID, c: c, sess: call.RestoreSession(c.Media, local, rec.Session),
		tags: rec.Tags, labels: rec.Labels, via: rec.Via, created: rec.Created, lastSignal: rec.LastSignal,
		answers: rec.Answers, ifaces: rec.Interfaces, savedRev: c.Media.Revision(),
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dup := e.calls[rec.CallID]; dup {
		c.End(call.Failed, 0, "duplicate")
		e.cfg.Calls.Remove(c)
		return fmt.Errorf("call-id %q restored twice", rec.CallID)
	}
	e.calls[rec.CallID] = nc
	e.stats.managed++
	return nil
}

// Detach lets go of every answered ng call without ending it (relayd is
// stopping with a store): each is written a last time and its flows keep
// carrying media for the next run; calls not answered yet are ended. It
// returns how many it kept.
func (e *CallEngine) Detach() int {
	n := 0
	for _, nc := range e.snapshot() {
		nc.mu.Lock()
		keep := e.cfg.Store != nil && nc.c.State() == call.StateAnswered
		if keep {
			e.persist(nc)
			keep = nc.c.Detach()
		}
		nc.mu.Unlock()
		if !keep {
			e.end(nc, call.Shutdown, "relayd stopped")
			continue
		}
		e.mu.Lock()
		delete(e.calls, nc.id)
		e.mu.Unlock()
		e.cfg.Calls.Remove(nc.c)
		n++
	}
	return n
}

// snapshot returns the engine's calls.
func (e *CallEngine) snapshot() []*ngCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	all := make([]*ngCall, 0, len(e.calls))
	for _, nc := range e.calls {
		all = append(all, nc)
	}
	return all
}
