package fastpath

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"
)

// The XDP program drops the packets of a forwarded flow whose destination
// is itself a flow's match (bpf/relay.c, FLOW_F_LOOP): one such packet
// would otherwise circle through relayd at the data plane's full speed.
// A forwarded flow's destination is fixed, so relayd tells the program
// with the flag, which costs a packet nothing, rather than the program
// looking each packet's destination up: a flow carries FLOW_F_LOOP exactly
// while its destination is installed as a match (its own or another
// flow's). The flag is set before the match it loops to is installed,
// and cleared after that is removed, so the program never forwards a
// looping packet in between.

const loopFlag = uint8(relayFlowFlagsFLOW_F_LOOP)

// loopIndex knows which flows send to which flow keys.
type loopIndex struct {
	dest map[flowKey]flowKey   // a flow's destination, as a flow key
	to   map[flowKey]senderSet // the flows that send to a key
}

// senderSet is the flows that send to one key: nearly always one (each
// flow of a call sends to a peer's address of its own), kept in the map
// entry, where a set of its own would be a map per flow.
type senderSet struct {
	one  flowKey
	more []flowKey // the others, rare
}

// destKey is the flow key that flow k's packets go to: its destination
// in the family the program checks it in, false when the program forwards
// none of its packets (no destination, or another family: punted).
func destKey(k flowKey, v *relayFlowValue) (flowKey, bool) {
	if v.Family == 0 || v.Family != k.Family {
		return flowKey{}, false
	}
	return flowKey{Family: v.Family, Port: v.DstPort, Addr: v.DstAddr}, true
}

// set records flow k's destination, replacing what it had.
func (x *loopIndex) set(k flowKey, v *relayFlowValue) {
	x.remove(k)
	d, ok := destKey(k, v)
	if !ok {
		return
	}
	if x.dest == nil {
		x.dest = make(map[flowKey]flowKey)
		x.to = make(map[flowKey]senderSet)
	}
	x.dest[k] = d
	if s, ok := x.to[d]; ok {
		s.more = append(s.more, k)
		x.to[d] = s
	} else {
		x.to[d] = senderSet{one: k}
	}
}

// remove forgets flow k's destination.
func (x *loopIndex) remove(k flowKey) {
	d, ok := x.dest[k]
	if !ok {
		return
	}
	delete(x.dest, k)
	s := x.to[d]
	if s.one == k {
		if len(s.more) == 0 {
			delete(x.to, d)
			return
		}
		s.one = s.more[len(s.more)-1]
		s.more = s.more[:len(s.more)-1]
	} else if i := slices.Index(s.more, k); i >= 0 {
		s.more = slices.Delete(s.more, i, i+1)
	}
	if len(s.more) == 0 {
		s.more = nil
	}
	x.to[d] = s
}

// senders returns the flows other than k that send to k.
func (x *loopIndex) senders(k flowKey) []flowKey {
	s, ok := x.to[k]
	if !ok {
		return nil
	}
	var out []flowKey
	if s.one != k {
		out = append(out, s.one)
	}
	for _, a := range s.more {
		if a != k {
			out = append(out, a)
		}
	}
	return out
}

// markLoop sets or clears v's loop flag for flow k: set when its
// destination is k itself or an installed flow's match. Called with f.mu
// held.
func (f *Fastpath) markLoop(k flowKey, v *relayFlowValue) {
	v.Flags &^= loopFlag
	if d, ok := destKey(k, v); ok {
		if _, installed := f.installed[d]; installed || d == k {
			v.Flags |= loopFlag
		}
	}
}

// setLoop sets or clears the loop flag of the installed flow k. Called
// with f.mu held.
func (f *Fastpath) setLoop(k flowKey, on bool) error {
	var v relayFlowValue
	if err := f.objs.Flows.Lookup(&k, &v); err != nil {
		return fmt.Errorf("look up flow %s: %w", addrPortOf(k.Family, k.Addr, k.Port), err)
	}
	if (v.Flags&loopFlag != 0) == on {
		return nil
	}
	v.Flags ^= loopFlag
	if err := f.objs.Flows.Update(&k, &v, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("flag flow %s: %w", addrPortOf(k.Family, k.Addr, k.Port), err)
	}
	f.ports.update(&k, &v)
	return nil
}

// loopsTo sets or clears the loop flag of every flow that sends to k,
// as k is installed or removed. Called with f.mu held.
func (f *Fastpath) loopsTo(k flowKey, on bool) error {
	var errs []error
	for _, a := range f.loops.senders(k) {
		errs = append(errs, f.setLoop(a, on))
	}
	return errors.Join(errs...)
}

// adoptLoops indexes the adopted flows and gives each the loop flag it
// should carry: an older relayd, which looked destinations up in the
// program, did not set it. Called before the flows are used.
func (f *Fastpath) adoptLoops(flows []flowEntry) {
	for i := range flows {
		f.loops.set(flows[i].k, &flows[i].v)
	}
	for i := range flows {
		e := &flows[i]
		want := e.v
		f.markLoop(e.k, &want)
		if want.Flags == e.v.Flags {
			continue
		}
		if err := f.objs.Flows.Update(&e.k, &want, ebpf.UpdateExist); err != nil {
			f.log.Warn("adopted flow: loop flag not updated", zap.Stringer("match", addrPortOf(e.k.Family, e.k.Addr, e.k.Port)), zap.Error(err))
			continue
		}
		e.v = want
	}
}
