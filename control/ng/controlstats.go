package ng

import (
	"net/netip"
	"sort"

	"sync"
	"time"

	"github.com/relayd/relayd/control/ng/bencode"
)

// shortNames are rtpengine's short command names of controlstatistics,
// in its order; relayd counts those it implements and reports 0 for the
// rest, so that the layout is rtpengine's.
var shortNames = []string{
	"ping", "offer", "answer", "delete", "query", "list", "startrec", "stoprec",
	"startfwd", "stopfwd", "blkdtmf", "unblkdtmf", "blkmedia", "unblkmedia",
	"playmedia", "stopmedia", "playdtmf", "stats", "slnmedia", "unslnmedia",
	"pub", "subreq", "subans", "unsub",
}

func shortName(command string) string {
	if command == CmdStatistics {
		return "stats"
	}
	return command
}

type proxyCounts struct {
	count    map[string]int64
	duration map[string]time.Duration
	errors   int64
}

// controlStats counts commands per client, for controlstatistics. Safe
// for concurrent use.
type controlStats struct {
	mu      sync.Mutex
	proxies map[netip.Addr]*proxyCounts
}

func newControlStats() *controlStats {
	return &controlStats{proxies: make(map[netip.Addr]*proxyCounts)}
}

func (c *controlStats) get(a netip.Addr) *proxyCounts {
	a = a.Unmap()
	p, ok := c.proxies[a]
	if !ok {
		if len(c.proxies) >= 1024 { // bounded: the allow list limits clients anyway
			return &proxyCounts{count: map[string]int64{}, duration: map[string]time.Duration{}}
		}
		p = &proxyCounts{count: map[string]int64{}, duration: map[string]time.Duration{}}
		c.proxies[a] = p
	}
	return p
}

func (c *controlStats) count(a netip.Addr, command string, took time.Duration, failed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.get(a)
	n := shortName(command)
	p.count[n]++
	p.duration[n] += took
	if failed {
		p.errors++
	}
}

func (c *controlStats) countError(a netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.get(a).errors++
}

// value returns the "controlstatistics" dictionary.
func (c *controlStats) value() bencode.Value {
	c.mu.Lock()
	defer c.mu.Unlock()
	addrs := make([]netip.Addr, 0, len(c.proxies))
	for a := range c.proxies {
		addrs = append(addrs, a)
	}
	sort.Slice(addrs, func(i, j int) bool { return addrs[i].Less(addrs[j]) })
	totals := map[string]int64{}
	proxies := make([]bencode.Value, len(addrs))
	for i, a := range addrs {
		p := c.proxies[a]
		var d dict
		d.str("proxy", a.String())
		for _, n := range shortNames {
			d.int(n+"count", p.count[n])
			d.add(n+"duration", seconds(p.duration[n]))
			totals[n] += p.count[n]
		}
		d.int("errorcount", p.errors)
		proxies[i] = d.value()
	}
	var d dict
	d.add("proxies", bencode.List(proxies...))
	for _, n := range shortNames {
		d.int("total"+n+"count", totals[n])
	}
	return d.value()
}
