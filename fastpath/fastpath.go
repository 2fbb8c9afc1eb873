package fastpath

import (
	"time"

	"github.com/cilium/ebpf"

	"github.com/relayd/relayd/dataplane"
)

// LayoutVersion is the version of the pinned map layout; it must match
// RELAY_LAYOUT_VERSION in bpf/relay.c. State pinned by a different layout is
// not taken over: `relayd -detach` removes it.
const LayoutVersion = 1

// DefaultPinPath is where program, maps and links are pinned.
const DefaultPinPath = "/sys/fs/bpf/relayd"

// Config configures the fast path.
type Config struct {
	Interfaces       []string // where the XDP program attaches
	XDPMode          string   // "native" (falls back to generic) or "generic"
	PinPath          string   // bpffs directory; default DefaultPinPath
	MaxFlows         int      // flow table size; default 65536
	EnableForwarding bool     // turn IP forwarding on for the interfaces when off

	// Punt, when set, relays in userspace the packets of XDP flows that
	// the program passes to the kernel: each flow gets a shadow there.
	Punt dataplane.PuntRelay

	// XSK, when set, redirects into the userspace workers' AF_XDP sockets,
	// instead of passing them to the kernel's receive path, the packets of
	// the flows the workers hold (which have no XDP flow) and of XDP flows
	// of action Userspace (latching).
	XSK *XSKTarget

	// PortMin and PortMax bound the relay ports of the flows to come (of
	// every media interface): the flow on port P takes statistics slot
	// P - PortMin when it is free, which the program then starts loading
	// from the packet's port alone, before it has read the flow. Flows on
	// other ports are forwarded all the same, a little slower. 0, 0:
	// every port, slot P (as far as MaxFlows goes).
	PortMin, PortMax uint16

	// NeighbourWait is how long Install waits for the next hop of a new
	// flow to be resolved; 0 means 100ms, negative disables resolution.
	NeighbourWait time.Duration

	now func() time.Time // test knob
}

// XSKTarget is where the program redirects the packets of the flows
// userspace carries: the userspace data plane's maps (slowpath's
// Pool.XSKMaps; bpf/relay.c's xsk_steer, xsks and xsk_devs) and how many
// devices its workers have sockets on.
type XSKTarget struct {
	Steer, Sockets, Devices *ebpf.Map
	NumDevices              int
	// ReceiveTime: put each packet's receive time in front of it, as the
	// workers expect (slowpath's Pool.XSKReceiveTime).
	ReceiveTime bool
}

func (c *Config) setDefaults() {
	if c.XDPMode == "" {
		c.XDPMode = "native"
	}
	if c.PinPath == "" {
		c.PinPath = DefaultPinPath
	}
	if c.MaxFlows == 0 {
		c.MaxFlows = 65536
	}
	if c.NeighbourWait == 0 {
		c.NeighbourWait = 100 * time.Millisecond
	}
	if c.now == nil {
		c.now = time.Now
	}
}

// slotAlloc returns the statistics slots' allocator for c.
func (c *Config) slotAlloc() *slotAlloc {
	span := uint32(1) << 16
	if c.PortMin != 0 || c.PortMax != 0 {
		span = uint32(c.PortMax) - uint32(c.PortMin) + 1
	}
	return newSlotAlloc(uint32(c.MaxFlows), uint32(c.PortMin), span)
}

// counterInfo names the global counters of enum relay_counter, in order.
// TestCounterNames checks it against the C enum.
var counterInfo = [...]struct{ Verdict, Reason string }{
	{"forward", "tx"},
	{"forward", "redirect"},
	{"forward", "reflect"},
	{"pass", "not_ip"},
	{"pass", "not_udp"},
	{"pass", "malformed"},
	{"pass", "no_flow"},
	{"punt", "userspace"},
	{"punt", "vlan"},
	{"punt", "ip_options"},
	{"punt", "ipv6_ext"},
	{"punt", "fragment"},
	{"punt", "not_rtp"},
	{"punt", "ttl"},
	{"punt", "over_mtu"},
	{"punt", "fib_no_neigh"},
	{"punt", "fib_fwd_disabled"},
	{"punt", "fib_other"},
	{"punt", "no_egress"},
	{"punt", "family"},
	{"drop", "wrong_source"},
	{"drop", "flow"},
	{"drop", "loop"},
	{"drop", "rate"},
	{"punt", "userspace_afxdp"},
}
