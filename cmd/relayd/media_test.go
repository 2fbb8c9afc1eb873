package main

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/control/destpolicy"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

// TestMediaInterfaces: the config's media interfaces reach the registry
// as they are, the default first, and the registry accepts them: each
// interface allocates from its own range, and addresses map back to
// their interface.
func TestMediaInterfaces(t *testing.T) {
	cfg, err := config.Parse([]byte(`[dataplane]
mode = "userspace"
[media]
address = "198.18.1.1"
advertise = "198.19.1.1"
ports = "20000-20001"
[[media.interface]]
name = "internal"
address6 = "2001:2:0:10::1"
[[media.interface]]
name = "external"
address = "198.18.20.1"
advertise = "198.19.20.1"
address6 = "2001:2:0:20::1"
advertise6 = "2001:2:0:ff::1"
ports = "40000-40003"
`))
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	got := mediaInterfaces(cfg)
	want := []registry.Interface{
		{Addr: a("198.18.1.1"), Advertise: a("198.19.1.1"), PortMin: 20000, PortMax: 20001},
		{Name: "internal", Addr6: a("2001:2:0:10::1"), PortMin: 20000, PortMax: 20001},
		{Name: "external", Addr: a("198.18.20.1"), Addr6: a("2001:2:0:20::1"),
			Advertise: a("198.19.20.1"), Advertise6: a("2001:2:0:ff::1"), PortMin: 40000, PortMax: 40003},
	}
	if diff := cmp.Diff(got, want, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Fatalf("mediaInterfaces (-got +want):\n%s", diff)
	}

	if lo, hi := mediaPorts(cfg); lo != 20000 || hi != 40003 {
		t.Errorf("media ports %d-%d, want 20000-40003 (every interface's)", lo, hi)
	}

	reg, err := registry.New(registry.Config{Interfaces: got}, zaptest.NewLogger(t), dataplanetest.New(dataplane.PathUserspace))
	if err != nil {
		t.Fatalf("registry refuses the config's interfaces: %v", err)
	}
	def, err := reg.Interface("")
	if err != nil || def.Addr != a("198.18.1.1") {
		t.Errorf("default interface %+v, %v; want [media]'s", def, err)
	}
	for _, tc := range []struct {
		iface string
		ports []uint16 // every pair of the range, in ascending order
	}{
		{"", []uint16{20000}},
		{"internal", []uint16{20000}}, // the [media] range, its own allocator
		{"external", []uint16{40000, 40002}},
	} {
		var got []uint16 // in random order
		for range tc.ports {
			p, err := reg.AllocPort(tc.iface)
			if err != nil {
				t.Errorf("AllocPort(%q): %v", tc.iface, err)
			}
			got = append(got, p)
		}
		if slices.Sort(got); !slices.Equal(got, tc.ports) {
			t.Errorf("AllocPort(%q) gave %v; want %v", tc.iface, got, tc.ports)
		}
		if p, err := reg.AllocPort(tc.iface); !errors.Is(err, registry.ErrNoPorts) {
			t.Errorf("AllocPort(%q) past its range = %d, %v; want ErrNoPorts", tc.iface, p, err)
		}
	}
	for addr, name := range map[string]string{"198.18.1.1": "", "2001:2:0:10::1": "internal", "2001:2:0:20::1": "external"} {
		if got, ok := reg.InterfaceOf(a(addr)); !ok || got != name {
			t.Errorf("InterfaceOf(%s) = %q, %v; want %q", addr, got, ok, name)
		}
	}
}

// TestMediaInterfacesNoDefault: without a [media] address the first named
// interface is the registry's default.
func TestMediaInterfacesNoDefault(t *testing.T) {
	cfg, err := config.Parse([]byte(`[dataplane]
mode = "userspace"
[[media.interface]]
name = "internal"
address = "198.18.10.1"
[[media.interface]]
name = "external"
address = "198.18.20.1"
`))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(registry.Config{Interfaces: mediaInterfaces(cfg)}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := mediaPorts(cfg); lo != 30000 || hi != 39999 {
		t.Errorf("media ports %d-%d, want the default 30000-39999", lo, hi)
	}
	def, err := reg.Interface("")
	if err != nil || def.Name != "internal" || def.Addr != netip.MustParseAddr("198.18.10.1") {
		t.Errorf("default interface %+v, %v; want internal", def, err)
	}
	if _, err := reg.Interface("dmz"); !errors.Is(err, registry.ErrUnknownInterface) {
		t.Errorf("Interface(dmz) error %v, want ErrUnknownInterface", err)
	}
}

// TestRegistryPolicy: the registry relayd builds refuses media toward a
// listener's address and the networks of [media] deny_destinations.
func TestRegistryPolicy(t *testing.T) {
	cfg, err := config.Parse([]byte(`[dataplane]
mode = "userspace"
[media]
address = "198.18.1.1"
deny_destinations = ["198.18.200.0/24"]
[sip]
listen = ["udp:198.18.8.1:5060"]
[[route]]
name = "r"
match = "."
destinations = ["sip:198.18.2.2"]
`))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(registryConfig(cfg), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	for dst, denied := range map[string]bool{"198.18.200.9:5000": true, "198.18.8.1:5060": true, "198.18.1.1:30000": true, "198.18.2.2:5000": false} {
		if err := reg.CheckDestination(netip.MustParseAddrPort(dst)); errors.Is(err, destpolicy.ErrDenied) != denied {
			t.Errorf("CheckDestination(%s) = %v, want denied %v", dst, err, denied)
		}
	}
}
