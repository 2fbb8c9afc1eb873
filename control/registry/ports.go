package registry

import (
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
)

// ErrNoPorts is returned when every relay port pair of an interface is in
// use; the SIP front end answers 503 with Retry-After, ng "Ran out of
// ports".
var ErrNoPorts = errors.New("relay ports exhausted")

// Ports allocates relay port pairs (RTP even, RTCP the odd port after it)
// from a range.
//
// Allocation is random, so that a stranger who makes one call cannot
// guess the ports of the next (and aim spoofed media at them within the
// latching window), and a pair just released is reused as late as
// possible, so that stray packets of an old call do not reach a new one.
// Both hold because the free pairs are kept in the order they became free
// and a pair is drawn at random from the older half only: a released pair
// waits behind at least half of the free pairs before it can be drawn.
// The first order is a random permutation of the range. The generator is
// ChaCha8 seeded from the system's entropy.
//
// The zero value is not usable; use NewPorts. Safe for concurrent use.
type Ports struct {
	min, pairs int

	mu    sync.Mutex // guards the following
	ring  []int32    // free pair indexes, oldest first from head
	head  int        // ring index of the oldest free pair
	free  int        // number of free pairs (in ring)
	where []int32    // pair index -> its ring index, or -1 when in use
	rng   *rand.Rand
}

// NewPorts returns an allocator for [min, max]: min even, max odd.
func NewPorts(min, max uint16) (*Ports, error) {
	if min%2 != 0 || max%2 != 1 || min >= max {
		return nil, fmt.Errorf("port range %d-%d: want even first and odd last port", min, max)
	}
	var seed [32]byte
	crand.Read(seed[:]) // never fails (crypto/rand panics rather than return an error)
	n := (int(max) - int(min) + 1) / 2
	p := &Ports{
		min: int(min), pairs: n, free: n,
		ring:  make([]int32, n),
		where: make([]int32, n),
		rng:   rand.New(rand.NewChaCha8(seed)),
	}
	for i := range p.ring {
		p.ring[i] = int32(i)
	}
	p.rng.Shuffle(n, func(i, j int) { p.ring[i], p.ring[j] = p.ring[j], p.ring[i] })
	for i, j := range p.ring {
		p.where[j] = int32(i)
	}
	return p, nil
}

// Alloc returns the RTP port of a free pair.
func (p *Ports) Alloc() (uint16, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.free == 0 {
		return 0, ErrNoPorts
	}
	k := p.rng.IntN(max(1, p.free/2))
	j := p.ring[(p.head+k)%p.pairs]
	p.take(j)
	return uint16(p.min + 2*int(j)), nil
}

// take removes the free pair j from the ring: the oldest free pair takes
// its place (moving it later, never earlier, in the order) and the head
// advances. p.mu is held.
func (p *Ports) take(j int32) {
	h := p.ring[p.head]
	at := p.where[j]
	p.ring[at], p.where[h] = h, at
	p.where[j] = -1
	p.head = (p.head + 1) % p.pairs
	p.free--
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
	if p.where[j] < 0 {
		return false
	}
	p.take(int32(j))
	return true
}

// Release frees the pair of port: it goes to the end of the order.
// Releasing a free pair or a port out of range does nothing.
func (p *Ports) Release(port uint16) {
	j, ok := p.index(port)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.where[j] >= 0 {
		return
	}
	at := (p.head + p.free) % p.pairs
	p.ring[at], p.where[j] = int32(j), int32(at)
	p.free++
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
