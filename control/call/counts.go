package call

import (
	"github.com/relayd/relayd/dataplane"
)

// FlowCounts returns the number of call flows installed, by the data path
// that carries them (both paths always present), for relayd_flows and
// /healthz.
func (t *Table) FlowCounts() map[dataplane.Path]int {
	out := map[dataplane.Path]int{dataplane.PathXDP: 0, dataplane.PathUserspace: 0}
	for path, byOwner := range t.reg.Counts() {
		out[path] = byOwner[dataplane.OwnerCall]
	}
	return out
}
