// Package fwpair builds a redundant pair of stateful firewalls in network
// namespaces, for measuring what a VoIP media stream sees through them: the
// highest loss-free packet rate and the glitch when the master fails.
//
// Topology (six namespaces, all named Config.Prefix + role; nothing is
// created in the namespace of the process):
//
//	lan host           lansw (bridge)        fw1, fw2              wansw (bridge)     wan host
//	eth0 198.18.10.10+ -- host  br0  fw1 -- lan  (.2, .3)   wan -- fw1  br0  host -- eth0 198.18.20.10+
//	                              fw2 -- lan  sync ---- sync  wan -- fw2
//	                                     198.18.30.1 <-> .2
//
// The LAN is 198.18.10.0/24 and the WAN 198.18.20.0/24; on each the virtual
// address (VIP, .1) is held by the master firewall and is the hosts' default
// route. fw1 has .2, fw2 .3, the hosts .10 onwards (Config.HostAddrs). The
// firewalls have a dedicated sync link, 198.18.30.0/24.
//
// Each firewall runs keepalived (VRRP version 2 or 3, one sync group with a
// LAN and a WAN instance, fw1 at priority 150 and fw2 at 100, preemption on,
// so that the VIPs move back to fw1 when it recovers) and, with
// Config.Conntrackd, conntrackd in FTFW mode over the sync link, driven by
// keepalived's notify script in the primary-backup way: on MASTER the
// external cache is committed to the kernel, both caches flushed, the
// internal one resynchronised with the kernel and sent to the peer in bulk;
// on BACKUP a resynchronisation from the master is requested. The script
// logs each step with a nanosecond timestamp (see Events).
//
// nftables in each firewall (table inet fwpair) is stateful by default:
// forwarding drops unless the packet belongs to a tracked connection or
// opens one from the LAN interface, so the WAN side cannot open a flow; the
// firewall itself accepts VRRP, the sync link and its own connections. With
// Config.Stateless forwarding accepts UDP both ways and UDP from lan and wan
// is not tracked at all (notrack), for comparison.
//
// With Config.Forwarder "xdp" the minimal XDP forwarder of lab/minfwd is
// attached to the lan and wan interfaces of both firewalls. It forwards by
// FIB lookup and redirect before the kernel's stack, so it bypasses nftables
// and conntrack altogether: state synchronisation is meaningless with it and
// the rules do not apply (use it with Stateless to compare forwarding
// costs).
//
// Failover glitches, measured with this package's tests on a shared
// 2-core machine (kernel 6.18, keepalived 2.2.7, conntrackd 1.4.7): the
// largest inter-arrival gap of a 1,000 pps UDP stream WAN to LAN that lives
// on conntrack state (one LAN packet opened it), conntrackd on, three runs:
//
//	failure          VRRPv3 0.1 s adverts     VRRPv2/v3 1 s adverts
//	StopKeepalived   32, 36, 38 ms            31, 33, 41 ms (v2); 27, 34, 44 ms (v3)
//	CutLinks         325, 329, 339 ms         3.18, 3.18, 3.18 s (v2); 3.17, 3.18, 3.20 s (v3)
//	LowerPriority    19, 38, 41 ms            15, 42, 55 ms (v2); 40, 48, 50 ms (v3)
//	KillDaemons      17, 29, 32 ms            -
//
// A crash (CutLinks) costs the master-down interval, 3 adverts plus the
// skew; the other failures leave the old master's kernel forwarding on its
// own state until the new master's gratuitous ARP moves the hosts, so the
// gap is that of the ARP update. Moving back to fw1 on Recover cost 6 to
// 44 ms. Without conntrackd the same stream never recovers (the new master
// drops it as a new flow from the WAN), while a stream the LAN keeps
// sending on recovers within 25 to 34 ms.
//
// Everything needs root; the package's tests skip without it (and fail
// under CI=true, see internal/testenv).
package fwpair

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"
)

// Interface names. Each lives in its own namespace, so the names are the
// same in every Pair.
const (
	HostIfName   = "eth0" // in the lan and wan hosts
	LANIfName    = "lan"  // in fw1 and fw2, towards lansw
	WANIfName    = "wan"  // in fw1 and fw2, towards wansw
	SyncIfName   = "sync" // in fw1 and fw2, the link between them
	BridgeIfName = "br0"  // in lansw and wansw
)

// Forwarders (Config.Forwarder).
const (
	ForwarderKernel = "kernel"
	ForwarderXDP    = "xdp"
)

// Config configures a Pair. The zero value is valid: a stateful pair with
// VRRPv3, 1 s adverts, no conntrackd and one address per host.
type Config struct {
	// Prefix starts every namespace name, e.g. "fw1234-" gives fw1234-lan,
	// fw1234-fw1 and so on. Pairs that exist at once need different
	// prefixes. The default, "fp<pid>-<n>-", is unique in the process; New
	// removes namespaces with a default prefix whose process is gone, and
	// always those of its own prefix. Letters, digits, '.', '_' and '-',
	// at most 40 characters.
	Prefix string
	// HostAddrs is the number of addresses on each host (default 1, at
	// most 200): 198.18.10.10 onwards on the LAN host, 198.18.20.10 onwards
	// on the WAN host, so a generator can use several sources.
	HostAddrs int
	// VRRPVersion is 2 or 3 (default 3).
	VRRPVersion int
	// Advert is the VRRP advertisement interval (default 1 s): whole
	// seconds with VRRPv2, multiples of 10 ms up to 40.95 s with VRRPv3. A
	// backup declares the master down after about 3 adverts.
	Advert time.Duration
	// Conntrackd runs conntrackd on both firewalls to replicate the
	// connection tracking state.
	Conntrackd bool
	// Stateless replaces the stateful rules by ones that forward UDP both
	// ways without tracking it.
	Stateless bool
	// Forwarder is ForwarderKernel (default, also "") or ForwarderXDP.
	Forwarder string
	// Log, when set, receives the daemons' output, one line per line with
	// the firewall and daemon in front. Writes are serialised.
	Log io.Writer
}

func (c *Config) setDefaults() {
	if c.HostAddrs == 0 {
		c.HostAddrs = 1
	}
	if c.VRRPVersion == 0 {
		c.VRRPVersion = 3
	}
	if c.Advert == 0 {
		c.Advert = time.Second
	}
	if c.Forwarder == "" {
		c.Forwarder = ForwarderKernel
	}
}

func (c *Config) validate() error {
	if len(c.Prefix) > 40 {
		return fmt.Errorf("prefix %q: too long", c.Prefix)
	}
	for _, r := range c.Prefix {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-", r)) {
			return fmt.Errorf("prefix %q: character %q not allowed", c.Prefix, r)
		}
	}
	if c.HostAddrs < 1 || c.HostAddrs > 200 {
		return fmt.Errorf("host addresses %d: want 1 to 200", c.HostAddrs)
	}
	switch c.VRRPVersion {
	case 2:
		if c.Advert < time.Second || c.Advert > 255*time.Second || c.Advert%time.Second != 0 {
			return fmt.Errorf("advert %v: VRRPv2 wants whole seconds from 1 to 255", c.Advert)
		}
	case 3:
		if c.Advert < 10*time.Millisecond || c.Advert > 40950*time.Millisecond || c.Advert%(10*time.Millisecond) != 0 {
			return fmt.Errorf("advert %v: VRRPv3 wants multiples of 10ms up to 40.95s", c.Advert)
		}
	default:
		return fmt.Errorf("vrrp version %d: want 2 or 3", c.VRRPVersion)
	}
	switch c.Forwarder {
	case ForwarderKernel, ForwarderXDP:
	default:
		return fmt.Errorf("forwarder %q: want %q or %q", c.Forwarder, ForwarderKernel, ForwarderXDP)
	}
	return nil
}

// Addresses of the topology.
var (
	lanVIP   = netip.MustParseAddr("198.18.10.1")
	wanVIP   = netip.MustParseAddr("198.18.20.1")
	lanFW    = [2]netip.Addr{netip.MustParseAddr("198.18.10.2"), netip.MustParseAddr("198.18.10.3")}
	wanFW    = [2]netip.Addr{netip.MustParseAddr("198.18.20.2"), netip.MustParseAddr("198.18.20.3")}
	syncAddr = [2]netip.Addr{netip.MustParseAddr("198.18.30.1"), netip.MustParseAddr("198.18.30.2")}
	lanHost0 = netip.MustParseAddr("198.18.10.10")
	wanHost0 = netip.MustParseAddr("198.18.20.10")
)

const subnetBits = 24

// Failure is a way to make the master firewall fail (Pair.Fail). The
// zero value is no failure and is rejected by Fail.
type Failure int

// Failures.
const (
	// StopKeepalived stops keepalived on the master cleanly (SIGTERM): it
	// sends a priority 0 advert, so the backup takes over at once.
	StopKeepalived Failure = iota + 1
	// LowerPriority lowers the master's priority below the backup's at run
	// time (through keepalived's track file), an administrative handover.
	LowerPriority
	// CutLinks takes the master's lan, wan and sync links down at once, as
	// a crash or power loss would: no farewell advert, the backup waits out
	// the master-down interval.
	CutLinks
	// KillDaemons kills keepalived and conntrackd in the master (SIGKILL):
	// no farewell advert, and the master keeps its VIPs until Recover.
	KillDaemons
)

func (f Failure) String() string {
	switch f {
	case StopKeepalived:
		return "stop-keepalived"
	case LowerPriority:
		return "lower-priority"
	case CutLinks:
		return "cut-links"
	case KillDaemons:
		return "kill-daemons"
	}
	return fmt.Sprintf("Failure(%d)", int(f))
}

// Event sources.
const (
	SourceKeepalived = "keepalived"
	SourceConntrackd = "conntrackd"
	SourceNotify     = "notify" // the notify script's steps
	SourceLab        = "lab"    // failures and recoveries Pair injected
)

// Event is one line a daemon or the notify script wrote, or a failure the
// lab injected. The zero value is an empty event.
type Event struct {
	Time   time.Time // when the line arrived (the script's own clock for notify)
	FW     int       // 0 for fw1, 1 for fw2
	Source string    // SourceKeepalived, SourceConntrackd, SourceNotify or SourceLab
	Text   string
}

func (e Event) String() string {
	return fmt.Sprintf("%s fw%d %s: %s", e.Time.Format("15:04:05.000000"), e.FW+1, e.Source, e.Text)
}

// Counters are an interface's statistics as netlink reports them. The
// zero value is all zero.
type Counters struct {
	RxPackets, TxPackets uint64
	RxDropped, TxDropped uint64
}
