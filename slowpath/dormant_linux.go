package slowpath

import (
	"net/netip"

	"github.com/relayd/relayd/dataplane"
)

// A dormant shadow is a shadow of an XDP flow that XDP has not punted a
// packet to yet: its worker keeps the flow alone (worker.dormant), not
// a flowState, and learns of its install, updates and removal without
// being woken. Most XDP flows never see a punted packet (next hop not
// resolved, fragments, STUN, latching), so a call's shadows cost a map
// entry each, the flow being the one the control plane keeps (shared,
// never changed in place), and no round trip to a worker's locked thread;
// the first packet XDP hands over makes the flowState (awaken).

// canSleep reports whether the flow of c may wait dormant: no SRTP
// contexts and no transcoding (never for a shadow of what XDP carries).
func canSleep(c *ctrl) bool {
	return c.dec == nil && c.enc == nil && c.flow.Transcode == nil
}

// sleep adds a dormant shadow of fl, which it keeps.
func (w *worker) sleep(fl *dataplane.Flow) {
	w.dormantMu.Lock()
	defer w.dormantMu.Unlock()
	if w.dormant == nil {
		w.dormant = make(map[netip.AddrPort]*dataplane.Flow)
	}
	if _, ok := w.dormant[fl.Match]; !ok {
		w.dormantN.Add(1)
	}
	w.dormant[fl.Match] = fl
}

// resleep replaces the flow of a dormant shadow and reports whether
// there was one (a shadow awoken already is the worker's to update).
func (w *worker) resleep(fl *dataplane.Flow) bool {
	w.dormantMu.Lock()
	defer w.dormantMu.Unlock()
	if _, ok := w.dormant[fl.Match]; !ok {
		return false
	}
	w.dormant[fl.Match] = fl
	return true
}

// unsleep removes a dormant shadow and reports whether there was one.
func (w *worker) unsleep(match netip.AddrPort) bool {
	w.dormantMu.Lock()
	defer w.dormantMu.Unlock()
	if _, ok := w.dormant[match]; !ok {
		return false
	}
	delete(w.dormant, match)
	w.dormantN.Add(-1)
	return true
}

// dormantHas reports whether the shadow of match is dormant.
func (w *worker) dormantHas(match netip.AddrPort) bool {
	if w.dormantN.Load() == 0 {
		return false
	}
	w.dormantMu.Lock()
	defer w.dormantMu.Unlock()
	_, ok := w.dormant[match]
	return ok
}

// awaken makes the flowState of the dormant shadow of match, at the
// first packet XDP punts to it, and returns it; nil when there is no
// such shadow. Worker goroutine only.
func (w *worker) awaken(match netip.AddrPort) *flowState {
	if w.dormantN.Load() == 0 {
		return nil
	}
	w.dormantMu.Lock()
	fl, ok := w.dormant[match]
	if ok {
		delete(w.dormant, match)
		w.dormantN.Add(-1)
	}
	w.dormantMu.Unlock()
	if !ok {
		return nil
	}
	f := &flowState{flow: *fl, shadow: true}
	w.flows[match] = f
	return f
}

// dormantSendTo points a dormant shadow at to (its reverse flow latched
// to to, in this worker), as an awake one's flow is changed in place: a
// copy of the shared flow, changed, replaces it.
func (w *worker) dormantSendTo(match, to netip.AddrPort) {
	if w.dormantN.Load() == 0 {
		return
	}
	w.dormantMu.Lock()
	defer w.dormantMu.Unlock()
	if fl, ok := w.dormant[match]; ok && fl.SendTo != to {
		c := *fl
		c.SendTo = to
		w.dormant[match] = &c
	}
}
