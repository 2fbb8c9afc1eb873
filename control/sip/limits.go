package sip

import (
	"errors"
	"hash/maphash"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

// limiter is a token bucket per source address. Safe for concurrent use.
type limiter struct {
	rate  float64 // tokens per second
	burst float64
	now   func() time.Time

	mu      sync.Mutex // guards the following
	buckets map[netip.Addr]*bucket
	swept   time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

// maxBuckets bounds the table: a flood from many sources cannot grow it
// without limit (over it, new sources share one bucket).
const maxBuckets = 1 << 16

func newLimiter(rate float64, burst int) *limiter {
	return &limiter{rate: rate, burst: float64(burst), now: time.Now, buckets: make(map[netip.Addr]*bucket)}
}

func (l *limiter) allow(src netip.Addr) bool {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > time.Minute {
		// Forget sources whose bucket is full again.
		for a, b := range l.buckets {
			if now.Sub(b.last).Seconds()*l.rate >= l.burst {
				delete(l.buckets, a)
			}
		}
		l.swept = now
	}
	b, ok := l.buckets[src]
	if !ok {
		if len(l.buckets) >= maxBuckets {
			src = netip.Addr{}
			b, ok = l.buckets[src]
		}
		if !ok {
			b = &bucket{tokens: l.burst, last: now}
			l.buckets[src] = b
		}
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// branchSet remembers the Via branches of the INVITEs relayd sent in the
// last few minutes: one coming back in an incoming INVITE is a loop. It
// keeps a 64-bit hash of each, not the string: the strings were the
// branches' own allocations, kept for minutes among the setups' garbage.
// Two branches that hash alike within the set's lifetime (one chance in
// about 2^64 / the branches kept) would make one INVITE a loop. Safe for
// concurrent use.
type branchSet struct {
	seed maphash.Seed

	mu   sync.Mutex // guards the following
	cur  map[uint64]struct{}
	prev map[uint64]struct{}
	at   time.Time
}

const branchTTL = 2 * time.Minute

func newBranchSet() *branchSet {
	return &branchSet{seed: maphash.MakeSeed(), cur: make(map[uint64]struct{}), prev: make(map[uint64]struct{}), at: time.Now()}
}

func (b *branchSet) rotate() {
	if time.Since(b.at) > branchTTL {
		b.prev, b.cur, b.at = b.cur, make(map[uint64]struct{}), time.Now()
	}
}

func (b *branchSet) add(branch string) {
	h := maphash.String(b.seed, branch)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rotate()
	b.cur[h] = struct{}{}
}

func (b *branchSet) has(branch string) bool {
	h := maphash.String(b.seed, branch)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rotate()
	_, ok := b.cur[h]
	if !ok {
		_, ok = b.prev[h]
	}
	return ok
}

// peerSet holds the addresses relayd may open TCP connections to: route
// destinations and peers SIP came from recently. Without it the stack
// would connect to whatever host a request's Via names when the
// connection it came on has closed: a reflection vector. Safe for
// concurrent use.
type peerSet struct {
	mu     sync.Mutex // guards the following
	static map[netip.Addr]bool
	recent map[netip.Addr]time.Time
	swept  time.Time
}

const (
	peerTTL  = time.Hour
	maxPeers = 1 << 16
)

var errDialRefused = errors.New("sip: not connecting to an address that is neither a destination nor a recent peer")

func newPeerSet() *peerSet {
	return &peerSet{static: make(map[netip.Addr]bool), recent: make(map[netip.Addr]time.Time), swept: time.Now()}
}

func (p *peerSet) allow(a netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.static[a.Unmap()] = true
}

func (p *peerSet) seen(addr net.Addr) {
	var ip netip.Addr
	switch a := addr.(type) {
	case *net.UDPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.swept) > time.Minute || len(p.recent) >= maxPeers {
		for a, t := range p.recent {
			if now.Sub(t) > peerTTL {
				delete(p.recent, a)
			}
		}
		p.swept = now
	}
	if len(p.recent) < maxPeers {
		p.recent[ip.Unmap()] = now
	}
}

func (p *peerSet) may(a netip.Addr) bool {
	a = a.Unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.static[a] {
		return true
	}
	t, ok := p.recent[a]
	return ok && time.Since(t) < peerTTL
}

// dialer is the TCP transport's dialer: it refuses addresses not in the set.
func (p *peerSet) dialer(laddr net.Addr) net.Dialer {
	return net.Dialer{
		Timeout:   10 * time.Second,
		LocalAddr: laddr,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !p.may(ap.Addr()) {
				return errDialRefused
			}
			return nil
		},
	}
}
