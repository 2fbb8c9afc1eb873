package ng

import (
	"net/netip"
	"sync"
	"time"
)

// cacheKey tells requests apart: the cookie, scoped to the client's
// address (not its port: a SIP proxy may resend from another socket of
// the same host). rtpengine scopes cookies to nothing at all.
type cacheKey struct {
	client netip.Addr
	cookie string
}

// cacheEntry is a request being answered (reply nil) or answered.
type cacheEntry struct {
	reply   []byte // the whole reply, cookie included
	waiters []func([]byte)
	expires time.Time // set when answered
}

// cookieCache remembers the replies of recent requests so that a resent
// request is answered without running the command again, and a resend
// arriving while the first is still running gets the same reply when it
// is ready. Entries expire ttl after their reply; at most max entries are
// kept, the oldest answered ones evicted first. Safe for concurrent use;
// the zero value is not usable (newCookieCache).
type cookieCache struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu      sync.Mutex // guards the following
	entries map[cacheKey]*cacheEntry
	order   []cacheKey // answered keys, oldest first (may hold stale keys)
}

func newCookieCache(ttl time.Duration, max int, now func() time.Time) *cookieCache {
	return &cookieCache{ttl: ttl, max: max, now: now, entries: make(map[cacheKey]*cacheEntry)}
}

// begin looks key up. If a reply is cached it returns it. If the request
// is in progress it queues send for its reply and returns inProgress. Else
// it marks key in progress and returns neither: the caller must call
// finish with key.
func (c *cookieCache) begin(key cacheKey, send func([]byte)) (reply []byte, inProgress bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked()
	if e, ok := c.entries[key]; ok {
		if e.reply != nil {
			return e.reply, false
		}
		e.waiters = append(e.waiters, send)
		return nil, true
	}
	if len(c.entries) >= c.max {
		c.evictLocked()
	}
	c.entries[key] = &cacheEntry{}
	return nil, false
}

// finish stores the reply of key and sends it to the requests that waited
// for it (outside the lock).
func (c *cookieCache) finish(key cacheKey, reply []byte) {
	c.mu.Lock()
	e, ok := c.entries[key]
	if !ok { // evicted while running: keep it anyway
		e = &cacheEntry{}
		c.entries[key] = e
	}
	e.reply = reply
	e.expires = c.now().Add(c.ttl)
	waiters := e.waiters
	e.waiters = nil
	c.order = append(c.order, key)
	c.mu.Unlock()
	for _, w := range waiters {
		w(reply)
	}
}

// len returns the number of entries, for tests.
func (c *cookieCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

func (c *cookieCache) expireLocked() {
	now := c.now()
	i := 0
	for ; i < len(c.order); i++ {
		k := c.order[i]
		e, ok := c.entries[k]
		if ok && e.reply != nil && now.Before(e.expires) {
			break
		}
		if ok && e.reply != nil {
			delete(c.entries, k)
		}
	}
	c.order = c.order[i:]
}

// evictLocked drops the oldest answered entry, or, when every entry is
// in progress, nothing (the map then grows past max by the requests in
// flight, which the worker queue bounds).
func (c *cookieCache) evictLocked() {
	for len(c.order) > 0 {
		k := c.order[0]
		c.order = c.order[1:]
		if e, ok := c.entries[k]; ok && e.reply != nil {
			delete(c.entries, k)
			return
		}
	}
}
