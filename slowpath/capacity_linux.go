package slowpath

// Capacity returns the flows the userspace data plane carries (shadows of
// XDP flows included: each takes a steering entry) and its table size
// (dataplane.max_flows), for relayd_flow_slots.
func (p *Pool) Capacity() (used, max int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.owner), p.cfg.MaxFlows
}
