package call

import (
	"net/netip"

	"github.com/relayd/relayd/dataplane"
)

// FlowCounts returns the number of call flows installed, by the data path
// that carries them (both paths always present), for relayd_flows and
// /healthz.
func (t *Table) FlowCounts() map[dataplane.Path]int {
	out := map[dataplane.Path]int{dataplane.PathXDP: 0, dataplane.PathUserspace: 0}
	t.mu.Lock()
	owners := make(map[netip.AddrPort]*Media, len(t.owners))
	for match, m := range t.owners {
		owners[match] = m
	}
	t.mu.Unlock()
	// Media locks are taken after the table's is released: Media.Sync
	// holds its own while it records owners.
	for match, m := range owners {
		m.mu.Lock()
		if rec, ok := m.flows[match]; ok {
			out[rec.plane.Path()]++
		}
		m.mu.Unlock()
	}
	return out
}
