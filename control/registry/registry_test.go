package registry

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/relayd/relayd/control/destpolicy"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

var (
	internal = Interface{Name: "internal", Addr: netip.MustParseAddr("198.18.1.1"), Addr6: netip.MustParseAddr("2001:2:0:1::1"), PortMin: 30000, PortMax: 30009}
	external = Interface{Name: "external", Addr: netip.MustParseAddr("198.18.3.1"), Advertise: netip.MustParseAddr("198.19.0.1"), PortMin: 30000, PortMax: 30003}
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

type holder struct{ events []string }

func (h *holder) Latched(match, source netip.AddrPort, locked bool) {
	h.events = append(h.events, match.String()+" "+source.String())
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []Interface
	}{
		{"none", nil},
		{"no address", []Interface{{Name: "x", PortMin: 30000, PortMax: 30001}}},
		{"odd first port", []Interface{{Addr: internal.Addr, PortMin: 30001, PortMax: 30003}}},
		{"twice", []Interface{internal, internal}},
		{"shared address", []Interface{internal, {Name: "other", Addr: internal.Addr, PortMin: 40000, PortMax: 40001}}},
		{"v6 as v4", []Interface{{Addr: internal.Addr6, PortMin: 30000, PortMax: 30001}}},
	} {
		if _, err := New(Config{Interfaces: tc.in}, zaptest.NewLogger(t)); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

func TestInterfaces(t *testing.T) {
	r, err := New(Config{Interfaces: []Interface{internal, external}}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	def, _ := r.Interface("")
	if def.Name != "internal" {
		t.Errorf("default %q, want the first", def.Name)
	}
	if _, err := r.Interface("dmz"); !errors.Is(err, ErrUnknownInterface) {
		t.Errorf("unknown interface: %v", err)
	}
	ext, _ := r.Interface("external")
	if a, adv := ext.Address(netip.MustParseAddr("2001:2::9")); a != external.Addr || adv != external.Advertise {
		t.Errorf("IPv6 peer on an IPv4-only interface: %s %s", a, adv)
	}
	if _, _, err := ext.Family(true); !errors.Is(err, ErrNoAddress) {
		t.Errorf("IPv6 of an IPv4-only interface: %v", err)
	}
	if a, adv := def.Address(netip.MustParseAddr("2001:2::9")); a != internal.Addr6 || adv != internal.Addr6 {
		t.Errorf("IPv6 peer: %s %s", a, adv)
	}
	// Each interface has its own ports: the same numbers on other
	// addresses. external has two pairs: both are handed out.
	pi, _ := r.AllocPort("internal")
	pe, _ := r.AllocPort("external")
	pe2, _ := r.AllocPort("external")
	if pi < internal.PortMin || pi > internal.PortMax || min(pe, pe2) != 30000 || max(pe, pe2) != 30002 {
		t.Errorf("ports %d (internal), %d %d (external); want 30000 and 30002 on external", pi, pe, pe2)
	}
	if _, err := r.AllocPort("external"); !errors.Is(err, ErrNoPorts) {
		t.Errorf("external exhausted: %v, want ErrNoPorts", err)
	}
	if !r.IsRelay(ap("198.18.3.1:30002")) || r.IsRelay(ap("198.18.3.1:30004")) || r.IsRelay(ap("198.18.9.9:30000")) {
		t.Error("IsRelay wrong")
	}
	if name, ok := r.InterfaceOf(internal.Addr6); !ok || name != "internal" {
		t.Errorf("InterfaceOf %q %v", name, ok)
	}
}

// TestOneIDSpace: every holder's flows take IDs from one counter, after
// the highest found in the data planes.
func TestOneIDSpace(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	xdp.Preload(dataplane.FlowStats{Flow: dataplane.Flow{ID: 7, Match: ap("198.18.1.1:30000"), Action: dataplane.Drop}})
	r, err := New(Config{Interfaces: []Interface{internal}}, zaptest.NewLogger(t), xdp)
	if err != nil {
		t.Fatal(err)
	}
	var h holder
	a, _, err := r.Install(dataplane.Flow{Match: ap("198.18.1.1:30002"), Action: dataplane.Drop}, "", &h)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := r.Install(dataplane.Flow{Match: ap("198.18.1.1:30004"), Action: dataplane.Drop, Owner: dataplane.OwnerCall}, "", &h)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != 8 || b.ID != 9 {
		t.Errorf("ids %d %d, want 8 9", a.ID, b.ID)
	}
	if _, _, err := r.Install(dataplane.Flow{Match: ap("198.18.1.1:30002"), Action: dataplane.Drop}, "", &h); !errors.Is(err, dataplane.ErrExists) {
		t.Errorf("same match twice: %v", err)
	}
	r.Latched(ap("198.18.1.1:30004"), ap("198.18.0.2:4000"), false)
	r.Latched(ap("198.18.1.1:30000"), ap("198.18.0.2:4000"), false) // adopted static flow: nobody holds it
	if len(h.events) != 1 {
		t.Errorf("latch events %v, want one for the held flow", h.events)
	}
}

// TestUpdateMoves: a flow that gains SRTP moves to the userspace data plane
// and the XDP flow's last statistics are handed back.
func TestUpdateMoves(t *testing.T) {
	xdp, us := dataplanetest.New(dataplane.PathXDP), dataplanetest.New(dataplane.PathUserspace)
	r, err := New(Config{Interfaces: []Interface{internal}}, zaptest.NewLogger(t), xdp, us)
	if err != nil {
		t.Fatal(err)
	}
	f := dataplane.Flow{Match: ap("198.18.1.1:30000"), SendFrom: ap("198.18.1.1:30002"), SendTo: ap("198.18.2.2:5000")}
	f, path, err := r.Install(f, "", nil)
	if err != nil || path != dataplane.PathXDP {
		t.Fatalf("install: %v on %s", err, path)
	}
	xdp.SetStats(f.Match, dataplane.Stats{Packets: 5})
	f.Decrypt = &dataplane.SRTP{Suite: "AES_CM_128_HMAC_SHA1_80", Key: make([]byte, 16), Salt: make([]byte, 14)}
	moved, err := r.Update(f)
	if err != nil {
		t.Fatal(err)
	}
	if moved == nil || moved.From != dataplane.PathXDP || moved.Stats.Packets != 5 {
		t.Errorf("moved %+v, want from xdp with 5 packets", moved)
	}
	if _, path, _ := r.Get(f.Match); path != dataplane.PathUserspace || us.Len() != 1 || xdp.Len() != 0 {
		t.Errorf("after the move: on %s, %d userspace, %d xdp flows", path, us.Len(), xdp.Len())
	}
}

// TestClaim: a restored call claims its flows found at start; those
// nobody claims are removed once idle and their ports go back.
func TestClaim(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	kept := dataplane.Flow{ID: 11, Match: ap("198.18.1.1:30002"), SendFrom: ap("198.18.1.1:30004"), SendTo: ap("198.18.2.2:5002"), Owner: dataplane.OwnerCall}
	gone := dataplane.Flow{ID: 12, Match: ap("198.18.1.1:30006"), SendFrom: ap("198.18.1.1:30008"), SendTo: ap("198.18.2.2:5004"), Owner: dataplane.OwnerCall}
	for _, fl := range []dataplane.Flow{kept, gone} {
		if err := xdp.Install(fl); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New(Config{Interfaces: []Interface{internal}}, zaptest.NewLogger(t), xdp)
	if err != nil {
		t.Fatal(err)
	}
	if free := r.Ports()[0].Free; free != 3 {
		t.Errorf("%d pairs free, want 3 (two taken by found flows)", free)
	}
	var h holder
	if _, path, ok := r.Claim(kept.Match, &h); !ok || path != dataplane.PathXDP {
		t.Fatalf("claim: %v %s", ok, path)
	}
	if _, _, ok := r.Claim(ap("198.18.1.1:30000"), &h); ok {
		t.Error("claimed a flow nobody found")
	}
	now := time.Now().Add(time.Hour)
	r.SetClock(func() time.Time { return now })
	r.SweepUnclaimed(30 * time.Second)
	if _, err := xdp.Stats(kept.Match); err != nil {
		t.Errorf("claimed flow swept: %v", err)
	}
	if _, err := xdp.Stats(gone.Match); err == nil {
		t.Error("unclaimed idle flow of a previous run kept")
	}
	if free := r.Ports()[0].Free; free != 4 {
		t.Errorf("%d pairs free after the sweep, want 4", free)
	}
	r.Latched(kept.Match, ap("198.18.0.2:4000"), true)
	if len(h.events) != 1 {
		t.Errorf("claimed flow's latch events %v", h.events)
	}
}

// Every flow goes through the destination policy: no flow installed or
// updated toward relayd's own addresses (an interface's, its advertised
// one, a listener's), special addresses or the operator's denied
// networks, whichever front end asked.
func TestDestinationPolicy(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	us := dataplanetest.New(dataplane.PathUserspace)
	r, err := New(Config{Interfaces: []Interface{internal, external},
		Own:  []netip.Addr{netip.MustParseAddr("198.18.9.1")},
		Deny: []netip.Prefix{netip.MustParsePrefix("198.18.200.0/24")}}, zaptest.NewLogger(t), xdp, us)
	if err != nil {
		t.Fatal(err)
	}
	good := dataplane.Flow{Match: ap("198.18.1.1:30000"), SendFrom: ap("198.18.3.1:30000"), SendTo: ap("198.18.2.2:5000")}
	for _, dst := range []string{
		"198.18.1.1:30000",    // the flow's own match: a loop
		"198.18.1.1:30002",    // another relay port
		"198.18.3.1:30000",    // the other interface
		"198.19.0.1:30000",    // its advertised address (through the NAT and back)
		"198.18.9.1:5060",     // a listener's address
		"127.0.0.1:5000",      // loopback
		"255.255.255.255:9",   // broadcast
		"224.0.0.251:5353",    // multicast
		"169.254.169.254:80",  // link-local
		"198.18.200.7:5000",   // denied by the operator
		"[2001:2:0:1::1]:500", // the interface's IPv6 address
	} {
		f := good
		f.SendTo = ap(dst)
		if f.SendTo.Addr().Is6() {
			f.Match, f.SendFrom = ap("[2001:2:0:1::1]:30000"), ap("[2001:2:0:1::1]:30002")
		}
		if _, _, err := r.Install(f, "", nil); !errors.Is(err, destpolicy.ErrDenied) {
			t.Errorf("Install toward %s: %v, want ErrDenied", dst, err)
		}
		if err := r.CheckDestination(f.SendTo); !errors.Is(err, destpolicy.ErrDenied) {
			t.Errorf("CheckDestination(%s) = %v", dst, err)
		}
	}
	if xdp.Len() != 0 {
		t.Fatalf("%d flows installed", xdp.Len())
	}
	if _, _, err := r.Install(good, "", nil); err != nil {
		t.Fatal(err)
	}
	bad := good
	bad.SendTo = ap("198.18.1.1:30000")
	if _, err := r.Update(bad); !errors.Is(err, destpolicy.ErrDenied) {
		t.Errorf("Update toward its own match: %v", err)
	}
	if fl, _, _ := r.Get(good.Match); fl.SendTo != good.SendTo {
		t.Errorf("refused update changed the flow: %+v", fl)
	}
	// relayd's own RTCP of a transcoding flow.
	tc := good
	tc.Match = ap("198.18.1.1:30004")
	tc.Transcode = &dataplane.Transcode{In: dataplane.Codec{Name: "PCMU", PT: 0, Ptime: 20}, Out: dataplane.Codec{Name: "PCMA", PT: 8, Ptime: 20},
		RTCPFrom: ap("198.18.3.1:30001"), RTCPTo: ap("127.0.0.1:5001")}
	if _, _, err := r.Install(tc, "", nil); !errors.Is(err, destpolicy.ErrDenied) || !strings.Contains(err.Error(), "rtcp_to") {
		t.Errorf("Install with rtcp_to on loopback: %v", err)
	}
	// Drop and reflect send nowhere the control plane knows.
	for i, a := range []dataplane.Action{dataplane.Drop, dataplane.Reflect} {
		if _, _, err := r.Install(dataplane.Flow{Match: netip.AddrPortFrom(internal.Addr, uint16(30006+i)), Action: a}, "", nil); err != nil {
			t.Errorf("%s: %v", a, err)
		}
	}
}

// A flow a previous run left toward a destination the policy now denies
// is adopted (a restored call may own it) with a warning: the data planes
// drop what it would loop.
func TestAdoptDeniedWarns(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	loopFlow := dataplane.Flow{ID: 7, Owner: dataplane.OwnerStatic, Match: ap("198.18.1.1:30000"), SendFrom: ap("198.18.1.1:30002"), SendTo: ap("198.18.1.1:30000")}
	if err := xdp.Install(loopFlow); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	r, err := New(Config{Interfaces: []Interface{internal}}, zap.New(core), xdp)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := r.Get(loopFlow.Match); !ok {
		t.Error("flow not adopted")
	}
	if n := logs.FilterMessageSnippet("destination policy denies").Len(); n != 1 {
		t.Errorf("%d warnings, want 1: %v", n, logs.All())
	}
}

// statsReading is a fake data plane that reads statistics without List
// (dataplane.StatsReader), from its own table.
type statsReading struct {
	*dataplanetest.DataPlane
	stats map[netip.AddrPort]dataplane.Stats
}

func (s statsReading) EachStats(fn func(netip.AddrPort, dataplane.Stats)) error {
	for m, st := range s.stats {
		fn(m, st)
	}
	return nil
}

// TestStatsReads: the sweeps' reads of every flow (LastSeen, Activity,
// List of one owner) go through a data plane's EachStats when it has one,
// never its List, and merge the planes: the latest packet, the sum of
// drops. Flows never seen are absent from LastSeen.
func TestStatsReads(t *testing.T) {
	t0 := time.Now()
	both, onlyUS, silent := ap("198.18.1.1:30000"), ap("198.18.1.1:30002"), ap("198.18.1.1:30004")
	xdp := statsReading{dataplanetest.New(dataplane.PathXDP), map[netip.AddrPort]dataplane.Stats{
		both:   {Packets: 5, Dropped: 1, LastSeen: t0},
		silent: {},
	}}
	us := dataplanetest.New(dataplane.PathUserspace)
	r, err := New(Config{Interfaces: []Interface{internal}}, zaptest.NewLogger(t), xdp, us)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []netip.AddrPort{both, onlyUS} {
		if _, _, err := r.Install(dataplane.Flow{Match: m, Action: dataplane.Drop}, dataplane.PathUserspace, nil); err != nil {
			t.Fatal(err)
		}
	}
	xdpLists, usLists := xdp.Calls("List"), us.Calls("List") // adopting the planes' flows
	us.SetStats(both, dataplane.Stats{Packets: 2, Dropped: 2, LastSeen: t0.Add(time.Second)})
	us.SetStats(onlyUS, dataplane.Stats{Packets: 1, LastSeen: t0.Add(-time.Second)})

	seen, err := r.LastSeen()
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || !seen[both].Equal(t0.Add(time.Second)) || !seen[onlyUS].Equal(t0.Add(-time.Second)) {
		t.Errorf("LastSeen = %v, want %s and %s seen, %s absent", seen, both, onlyUS, silent)
	}
	all, err := r.Activity()
	if err != nil {
		t.Fatal(err)
	}
	if st := all[both]; st.Dropped != 3 || !st.LastSeen.Equal(t0.Add(time.Second)) {
		t.Errorf("Activity[%s] = %+v, want 3 dropped, the later last seen", both, st)
	}
	if _, ok := all[silent]; !ok || len(all) != 3 {
		t.Errorf("Activity = %v, want the 3 flows", all)
	}
	static, err := r.List(dataplane.OwnerStatic)
	if err != nil {
		t.Fatal(err)
	}
	if len(static) != 2 || static[1].Flow.Match != onlyUS || static[1].Stats.Packets != 1 {
		t.Errorf("List(static) = %+v, want the two flows with their statistics", static)
	}
	if n := xdp.Calls("List") - xdpLists; n != 0 {
		t.Errorf("%d List calls on the data plane with EachStats, want none", n)
	}
	if n := us.Calls("List") - usLists; n != 3 {
		t.Errorf("%d List calls on the data plane without EachStats, want 3 (one per read)", n)
	}
	if calls, err := r.List(dataplane.OwnerCall); err != nil || len(calls) != 0 || us.Calls("List")-usLists != 3 {
		t.Errorf("List(call) = %v, %v with %d data plane Lists: want none, without reading any statistics", calls, err, us.Calls("List")-usLists)
	}
}

// sharingPlane is a data plane that keeps the flows it is handed
// (dataplane.SharedInstaller).
type sharingPlane struct {
	*dataplanetest.DataPlane
	kept map[netip.AddrPort]*dataplane.Flow
}

func (p *sharingPlane) InstallShared(f *dataplane.Flow) error {
	if err := p.Install(*f); err != nil {
		return err
	}
	p.kept[f.Match] = f
	return nil
}

func (p *sharingPlane) UpdateShared(f *dataplane.Flow) error {
	if err := p.Update(*f); err != nil {
		return err
	}
	p.kept[f.Match] = f
	return nil
}

// TestSharedFlows: a data plane that can keep the caller's flow is handed
// the registry's own, on install and on update; the registry never
// changes it in place (an update hands over another).
func TestSharedFlows(t *testing.T) {
	xdp := &sharingPlane{DataPlane: dataplanetest.New(dataplane.PathXDP), kept: map[netip.AddrPort]*dataplane.Flow{}}
	r, err := New(Config{Interfaces: []Interface{internal}}, zaptest.NewLogger(t), xdp)
	if err != nil {
		t.Fatal(err)
	}
	var h holder
	m := ap("198.18.1.1:30002")
	if _, _, err := r.Install(dataplane.Flow{Match: m, Action: dataplane.Forward, SendFrom: ap("198.18.1.1:30004"),
		SendTo: ap("198.18.0.2:4000")}, "", &h); err != nil {
		t.Fatal(err)
	}
	first := xdp.kept[m]
	if p, _, ok := r.Shared(m); !ok || p != first {
		t.Fatalf("the plane keeps %p, the registry %p", first, p)
	}
	up := *first
	up.SendTo = ap("198.18.0.2:4002")
	if _, err := r.Update(up); err != nil {
		t.Fatal(err)
	}
	if p, _, ok := r.Shared(m); !ok || p != xdp.kept[m] || p == first || p.SendTo != up.SendTo {
		t.Errorf("after the update the plane keeps %p, the registry %p (before: %p)", xdp.kept[m], p, first)
	}
	if first.SendTo != ap("198.18.0.2:4000") {
		t.Errorf("the first flow was changed in place: send_to %s", first.SendTo)
	}
}
