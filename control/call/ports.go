// Package call is relayd's call model: relay port allocation, the media of
// a call (streams, the flows that carry them, their statistics), the
// negotiation of that media and the table of calls that the front ends
// (the SIP B2BUA, the ng protocol), the admin API and CDRs share.
//
// A call has two legs, A (the caller, or the offerer of the first offer)
// and B. Each leg has media streams, one per m= line; each stream has a
// relay port pair per leg (RTP even, RTCP odd) and, per direction, an RTP
// flow and an RTCP flow (just the RTP flow when the sending leg uses
// rtcp-mux), keyed by the relay address and port the packets arrive on.
// Flows are installed as soon as both ends of a direction are known and
// removed when the call ends.
//
// Session owns the offer/answer (RFC 3264) of a call's media: relayd's
// media address (Local), o= line and last SDP per leg, and the pending
// offer with what relayd decided per stream. Its Offer and Answer apply
// the policy a front end derives from its own syntax (a route's SRTP and
// codecs, ng flags) as OfferOptions and AnswerOptions: SRTP pass-through,
// termination or keying (Policy), codec selection (CodecPolicy), rtcp-mux
// (MuxPolicy), latching per leg (LatchPolicy) and how the SDP is rendered
// (Render); they set the streams' ends and render the SDP with control/sdp.
//
// control/call never imports cilium/ebpf or x/sys/unix.
package call

import (
	"errors"
	"fmt"
	"sync"
)

// ErrNoPorts is returned when every relay port pair is in use; the SIP
// front-end answers 503 with Retry-After.
var ErrNoPorts = errors.New("relay ports exhausted")

// Ports allocates relay port pairs (RTP even, RTCP the odd port after it)
// from a range. Allocation goes round the range so that a pair just
// released is reused as late as possible (stray packets of an old call do
// not reach a new one). The zero value is not usable; use NewPorts. Safe
// for concurrent use.
type Ports struct {
	min, pairs int

	mu   sync.Mutex // guards the following
	used []bool     // by pair index
	next int        // pair index to try first
	free int
}

// NewPorts returns an allocator for [min, max]: min even, max odd.
func NewPorts(min, max uint16) (*Ports, error) {
	if min%2 != 0 || max%2 != 1 || min >= max {
		return nil, fmt.Errorf("port range %d-%d: want even first and odd last port", min, max)
	}
	n := (int(max) - int(min) + 1) / 2
	return &Ports{min: int(min), pairs: n, used: make([]bool, n), free: n}, nil
}

// Alloc returns the RTP port of a free pair.
func (p *Ports) Alloc() (uint16, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.free == 0 {
		return 0, ErrNoPorts
	}
	for i := 0; i < p.pairs; i++ {
		j := (p.next + i) % p.pairs
		if !p.used[j] {
			p.used[j] = true
			p.free--
			p.next = (j + 1) % p.pairs
			return uint16(p.min + 2*j), nil
		}
	}
	return 0, ErrNoPorts // unreachable while free is right
}

// Reserve marks the pair of port used (for ports found taken by flows
// that are not relayd's calls). It reports whether the pair was free.
func (p *Ports) Reserve(port uint16) bool {
	j, ok := p.index(port)
	if !ok {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used[j] {
		return false
	}
	p.used[j] = true
	p.free--
	return true
}

// Release frees the pair of port. Releasing a free pair or a port out of
// range does nothing.
func (p *Ports) Release(port uint16) {
	j, ok := p.index(port)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used[j] {
		p.used[j] = false
		p.free++
	}
}

// Free returns the number of free pairs.
func (p *Ports) Free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.free
}

// Pairs returns the number of pairs in the range.
func (p *Ports) Pairs() int { return p.pairs }

func (p *Ports) index(port uint16) (int, bool) {
	j := (int(port) - p.min) / 2
	if int(port) < p.min || j >= p.pairs {
		return 0, false
	}
	return j, true
}
