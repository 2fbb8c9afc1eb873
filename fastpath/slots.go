package fastpath

import "math/bits"

// slotAlloc hands out the program's statistics slots (the stats array of
// bpf/relay.c), n of them. The flow on relay port P takes slot
// P - base when it is free and below span: the program then starts
// loading the flow's statistics and route cache entry from the packet's
// port alone, before it has read the flow (see warm_slot in relay.c),
// so that their cache misses overlap the flow's own instead of
// following them. The others (a second flow on a port, as on the port's
// IPv4 and IPv6 addresses or on media interfaces whose ranges overlap; a
// port outside the range; flows adopted from a previous run) take the
// lowest free slot from span up, or below span once those are all
// taken: such a flow is only forwarded a little slower.
//
// The slots in use stay within the port range's span and the lowest
// slots above it (see readSlots for reading them).
// Not safe for concurrent use (the Fastpath's mu guards it).
type slotAlloc struct {
	used       []uint64 // bit s: slot s is taken
	n          uint32
	base, span uint32
	inUse      int
	// low[0] and low[1] are the lowest slots below and from span that
	// may be free: the searches start there.
	low [2]uint32
}

// newSlotAlloc returns an allocator of n slots, the first span of them
// (at most n) for ports base to base+span-1.
func newSlotAlloc(n, base, span uint32) *slotAlloc {
	span = min(span, n)
	return &slotAlloc{used: make([]uint64, (n+63)/64), n: n, base: base, span: span, low: [2]uint32{0, span}}
}

// portSlot returns the slot of flows on port: P - base, or a slot
// outside the array (which the program's lookup refuses) when P is
// below base.
func (a *slotAlloc) portSlot(port uint16) uint32 { return uint32(port) - a.base }

// alloc takes the slot of port when it is free, else the lowest free one
// from span, else the lowest free one below it. It reports false when
// every slot is taken.
func (a *slotAlloc) alloc(port uint16) (uint32, bool) {
	if s := a.portSlot(port); s < a.span && !a.isUsed(s) {
		a.take(s)
		return s, true
	}
	if s, ok := a.firstFree(1, a.span, a.n); ok {
		a.take(s)
		return s, true
	}
	if s, ok := a.firstFree(0, 0, a.span); ok {
		a.take(s)
		return s, true
	}
	return 0, false
}

// take marks slot s used (an adopted flow's, or one alloc chose). Slots
// past n are ignored: a flow adopted from a run with more slots keeps one
// (the maps' sizes are the same, or the load failed).
func (a *slotAlloc) take(s uint32) {
	if s >= a.n || a.isUsed(s) {
		return
	}
	a.used[s/64] |= 1 << (s % 64)
	a.inUse++
}

// release frees slot s.
func (a *slotAlloc) release(s uint32) {
	if s >= a.n || !a.isUsed(s) {
		return
	}
	a.used[s/64] &^= 1 << (s % 64)
	a.inUse--
	r := a.region(s)
	a.low[r] = min(a.low[r], s)
}

func (a *slotAlloc) isUsed(s uint32) bool { return a.used[s/64]&(1<<(s%64)) != 0 }

func (a *slotAlloc) region(s uint32) int {
	if s < a.span {
		return 0
	}
	return 1
}

// firstFree returns the lowest free slot of region r, [from, to), and
// moves the region's search start to it.
func (a *slotAlloc) firstFree(r int, from, to uint32) (uint32, bool) {
	s := max(from, a.low[r])
	for s < to {
		w := a.used[s/64] | (1<<(s%64) - 1) // the bits below s count as used
		if w == ^uint64(0) {
			s = (s/64 + 1) * 64
			continue
		}
		s = s/64*64 + uint32(bits.TrailingZeros64(^w))
		break
	}
	if s >= to {
		a.low[r] = to
		return 0, false
	}
	a.low[r] = s
	return s, true
}
