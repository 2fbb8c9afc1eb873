// Package dataplanetest provides an in-memory dataplane.DataPlane and
// dataplane.Observer for tests of the control plane.
//
// The fake keeps flows in a map keyed by match address, enforces the
// contract's errors (ErrExists, ErrNotFound, ErrFull, flow validation) and
// lets a test set a flow's statistics, the global counters and the
// attached interfaces, and inject an error into every call. It carries no
// packets.
package dataplanetest

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/relayd/relayd/dataplane"
)

// DataPlane is an in-memory data plane. Create it with New; it is safe for
// concurrent use.
type DataPlane struct {
	path dataplane.Path

	mu       sync.Mutex // guards the following
	flows    map[netip.AddrPort]dataplane.FlowStats
	capacity int // 0: unlimited
	err      error
	counters []dataplane.Counter
	ifaces   []dataplane.Interface
	calls    map[string]int
}

var (
	_ dataplane.DataPlane = (*DataPlane)(nil)
	_ dataplane.Observer  = (*DataPlane)(nil)
)

// New returns an empty data plane that reports path from Path.
func New(path dataplane.Path) *DataPlane {
	return &DataPlane{path: path, flows: make(map[netip.AddrPort]dataplane.FlowStats), calls: make(map[string]int)}
}

// SetCapacity makes Install fail with dataplane.ErrFull once n flows are
// installed. Zero means unlimited.
func (d *DataPlane) SetCapacity(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.capacity = n
}

// FailWith makes every DataPlane and Observer method return err (wrapped)
// until it is called again with nil.
func (d *DataPlane) FailWith(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.err = err
}

// SetStats sets the statistics of the flow with this match, as if packets
// had been carried.
func (d *DataPlane) SetStats(match netip.AddrPort, s dataplane.Stats) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	fs, ok := d.flows[match]
	if !ok {
		return fmt.Errorf("set stats of %s: %w", match, dataplane.ErrNotFound)
	}
	fs.Stats = s
	d.flows[match] = fs
	return nil
}

// Preload installs flows with their statistics as they are, IDs included,
// as a previous run of relayd would have left them in pinned maps. It does
// not validate.
func (d *DataPlane) Preload(flows ...dataplane.FlowStats) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, fs := range flows {
		d.flows[fs.Flow.Match] = fs
	}
}

// SetCounters sets what Counters returns.
func (d *DataPlane) SetCounters(c []dataplane.Counter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counters = slices.Clone(c)
}

// SetInterfaces sets what Interfaces returns.
func (d *DataPlane) SetInterfaces(ifs []dataplane.Interface) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ifaces = slices.Clone(ifs)
}

// Calls returns how often the named method ("Install", "List", ...) was called.
func (d *DataPlane) Calls(method string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[method]
}

// Len returns the number of flows.
func (d *DataPlane) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.flows)
}

// enter counts a call and returns the injected error; d.mu must be held.
func (d *DataPlane) enter(method string) error {
	d.calls[method]++
	if d.err != nil {
		return fmt.Errorf("dataplanetest %s: %w", method, d.err)
	}
	return nil
}

// Install implements dataplane.DataPlane.
func (d *DataPlane) Install(f dataplane.Flow) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter("Install"); err != nil {
		return err
	}
	if err := f.Validate(); err != nil {
		return fmt.Errorf("install flow: %w", err)
	}
	if _, ok := d.flows[f.Match]; ok {
		return fmt.Errorf("install %s: %w", f.Match, dataplane.ErrExists)
	}
	if d.capacity > 0 && len(d.flows) >= d.capacity {
		return fmt.Errorf("install %s: %w", f.Match, dataplane.ErrFull)
	}
	d.flows[f.Match] = dataplane.FlowStats{Flow: f}
	return nil
}

// Update implements dataplane.DataPlane.
func (d *DataPlane) Update(f dataplane.Flow) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter("Update"); err != nil {
		return err
	}
	if err := f.Validate(); err != nil {
		return fmt.Errorf("update flow: %w", err)
	}
	fs, ok := d.flows[f.Match]
	if !ok {
		return fmt.Errorf("update %s: %w", f.Match, dataplane.ErrNotFound)
	}
	fs.Flow = f
	d.flows[f.Match] = fs
	return nil
}

// Remove implements dataplane.DataPlane.
func (d *DataPlane) Remove(match netip.AddrPort) (dataplane.Stats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter("Remove"); err != nil {
		return dataplane.Stats{}, err
	}
	fs, ok := d.flows[match]
	if !ok {
		return dataplane.Stats{}, fmt.Errorf("remove %s: %w", match, dataplane.ErrNotFound)
	}
	delete(d.flows, match)
	return fs.Stats, nil
}

// Stats implements dataplane.DataPlane.
func (d *DataPlane) Stats(match netip.AddrPort) (dataplane.Stats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter("Stats"); err != nil {
		return dataplane.Stats{}, err
	}
	fs, ok := d.flows[match]
	if !ok {
		return dataplane.Stats{}, fmt.Errorf("stats of %s: %w", match, dataplane.ErrNotFound)
	}
	return fs.Stats, nil
}

// List implements dataplane.DataPlane. Flows come sorted by match.
func (d *DataPlane) List() ([]dataplane.FlowStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter("List"); err != nil {
		return nil, err
	}
	out := make([]dataplane.FlowStats, 0, len(d.flows))
	for _, fs := range d.flows {
		out = append(out, fs)
	}
	slices.SortFunc(out, func(a, b dataplane.FlowStats) int { return a.Flow.Match.Compare(b.Flow.Match) })
	return out, nil
}

// Path implements dataplane.DataPlane.
func (d *DataPlane) Path() dataplane.Path { return d.path }

// Counters implements dataplane.Observer.
func (d *DataPlane) Counters() ([]dataplane.Counter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enter("Counters"); err != nil {
		return nil, err
	}
	return slices.Clone(d.counters), nil
}

// Interfaces implements dataplane.Observer.
func (d *DataPlane) Interfaces() []dataplane.Interface {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls["Interfaces"]++
	return slices.Clone(d.ifaces)
}
