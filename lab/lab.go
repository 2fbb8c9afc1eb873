// Package lab builds network-namespace topologies for tests, the demo and
// benchmarks.
//
// The standard topology (see New) has three named network namespaces,
// caller, relay and callee, created like `ip netns add` so that
// `ip netns exec NAME cmd` works on them:
//
//	caller                    relay                        callee
//	c0 198.18.0.2/24  <--> r0 198.18.0.1/24
//	   2001:2::2/64           2001:2::1/64
//	                          lo 198.18.1.1/32 (media)
//	                             2001:2:0:1::1/128
//	                          r1 198.18.2.1/24     <--> e0 198.18.2.2/24
//	                             2001:2:0:2::1/64          2001:2:0:2::2/64
//
// The caller and the callee route everything through the relay, which
// forwards IPv4 and IPv6 in the kernel (forwarding is on for r0 and r1 too,
// as bpf_fib_lookup needs). GRO is on and tx checksum offload is off on all
// four veths (see docs/architecture.md, "Lab and measurement"). IPv6 runs without duplicate address
// detection, so addresses and neighbour discovery work at once, and keeps
// its addresses while a link is down. Only addresses from 198.18.0.0/15 and
// 2001:2::/48 are used.
//
// Everything needs root; NewT skips a test when the lab cannot be built.
package lab

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Interface names of the standard topology. Each lives in its own
// namespace, so the names are the same in every Lab.
const (
	CallerIfName      = "c0" // in caller, towards the relay
	RelayCallerIfName = "r0" // in relay, towards the caller
	RelayCalleeIfName = "r1" // in relay, towards the callee
	CalleeIfName      = "e0" // in callee, towards the relay
)

// Addresses of the standard topology.
var (
	callerAddr4      = netip.MustParseAddr("198.18.0.2")
	callerAddr6      = netip.MustParseAddr("2001:2::2")
	relayCallerAddr4 = netip.MustParseAddr("198.18.0.1")
	relayCallerAddr6 = netip.MustParseAddr("2001:2::1")
	relayMedia4      = netip.MustParseAddr("198.18.1.1")
	relayMedia6      = netip.MustParseAddr("2001:2:0:1::1")
	relayCalleeAddr4 = netip.MustParseAddr("198.18.2.1")
	relayCalleeAddr6 = netip.MustParseAddr("2001:2:0:2::1")
	calleeAddr4      = netip.MustParseAddr("198.18.2.2")
	calleeAddr6      = netip.MustParseAddr("2001:2:0:2::2")
)

// Config configures a Lab. The zero value is valid.
type Config struct {
	// Prefix starts the name of every namespace of the lab, for example
	// "rl1234-" gives rl1234-caller, rl1234-relay and rl1234-callee. Labs
	// that exist at the same time need different prefixes. The default,
	// "rl<pid>-<n>-", is unique within the process, and New removes
	// namespaces with a default prefix left behind by processes that no
	// longer run. Allowed characters: letters, digits, '.', '_' and '-'.
	Prefix string
}

func (c *Config) validate() error {
	if len(c.Prefix) > 200 {
		return fmt.Errorf("prefix %q: too long", c.Prefix)
	}
	for _, r := range c.Prefix {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-", r)) {
			return fmt.Errorf("prefix %q: character %q not allowed", c.Prefix, r)
		}
	}
	return nil
}

var labSeq atomic.Uint64

// defaultPrefix returns a prefix unique within this process; see
// Config.Prefix and removeStale.
func defaultPrefix() string {
	return fmt.Sprintf("rl%d-%d-", os.Getpid(), labSeq.Add(1))
}

// Iface describes a network interface of a lab namespace.
type Iface struct {
	Name         string
	Index        int // in its namespace
	HardwareAddr net.HardwareAddr
}

// Lab is a built topology; see the package documentation. Its exported
// fields are set by New and must not be changed. A Lab is safe for
// concurrent use; Close tears it down.
type Lab struct {
	Caller, Relay, Callee *NS
	// Attacker is a fourth host behind the relay's r2, made by AddAttacker:
	// 198.18.4.2/24 and 2001:2:0:4::2/64 on a0. Nil until then.
	Attacker                     *NS
	AttackerAddr4, AttackerAddr6 netip.Addr
	// Relay2 is a second media relay host behind the relay's r3, made by
	// AddRelay2; see there. Nil until then.
	Relay2                     *NS
	Relay2Addr4, Relay2Addr6   netip.Addr // on b0: its control address
	Relay2Media4, Relay2Media6 netip.Addr // on its lo: its media address

	CallerIf      Iface // c0, in Caller
	RelayCallerIf Iface // r0, in Relay
	RelayCalleeIf Iface // r1, in Relay
	CalleeIf      Iface // e0, in Callee

	CallerAddr4, CallerAddr6           netip.Addr // on c0
	RelayCallerAddr4, RelayCallerAddr6 netip.Addr // on r0: the caller's gateway
	RelayMedia4, RelayMedia6           netip.Addr // on the relay's lo: where callers send RTP
	RelayCalleeAddr4, RelayCalleeAddr6 netip.Addr // on r1: the callee's gateway
	CalleeAddr4, CalleeAddr6           netip.Addr // on e0

	prefix string

	mu     sync.Mutex // guards the following
	closed bool
}

func newLab(prefix string) *Lab {
	return &Lab{
		CallerAddr4:      callerAddr4,
		CallerAddr6:      callerAddr6,
		RelayCallerAddr4: relayCallerAddr4,
		RelayCallerAddr6: relayCallerAddr6,
		RelayMedia4:      relayMedia4,
		RelayMedia6:      relayMedia6,
		RelayCalleeAddr4: relayCalleeAddr4,
		RelayCalleeAddr6: relayCalleeAddr6,
		CalleeAddr4:      calleeAddr4,
		CalleeAddr6:      calleeAddr6,
		prefix:           prefix,
	}
}

// Prefix returns the prefix of the lab's namespace names.
func (l *Lab) Prefix() string { return l.prefix }

// NewT builds the standard topology with a default Config for a test and
// tears it down in t.Cleanup, also when the test fails or panics. It skips
// the test, saying why, when not running as root or when network
// namespaces are unavailable; any other error fails the test.
func NewT(t testing.TB) *Lab {
	t.Helper()
	return NewConfigT(t, Config{})
}

// NewConfigT is NewT with a Config.
func NewConfigT(t testing.TB, cfg Config) *Lab {
	t.Helper()
	if err := available(); err != nil {
		SkipOrFail(t, "lab: "+err.Error())
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("lab: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab: close: %v", err)
		}
	})
	return l
}

// SkipOrFail skips t, saying why, when a test's capability (root, a kernel
// feature, a tool) is missing on a developer's machine. Under CI (CI set in
// the environment) it fails t instead: there every privileged test must run.
func SkipOrFail(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set: a test that cannot run here is a failure)", reason)
	}
	t.Skip(reason)
}
