package fastpath

// Capacity returns the flows in the XDP flow table and its size
// (dataplane.max_flows), for relayd_flow_slots.
func (f *Fastpath) Capacity() (used, max int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.installed), f.cfg.MaxFlows
}

// PortTableFlows returns how many flows the program finds by their relay
// port, in one read of the port table (see portTable); the others are
// found in the flow map, for relayd_xdp_port_table_flows.
func (f *Fastpath) PortTableFlows() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ports.mapped() {
		return 0
	}
	return f.ports.held
}
