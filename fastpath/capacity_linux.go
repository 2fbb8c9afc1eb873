package fastpath

// Capacity returns the flows in the XDP flow table and its size
// (dataplane.max_flows), for relayd_flow_slots.
func (f *Fastpath) Capacity() (used, max int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.installed), f.cfg.MaxFlows
}
