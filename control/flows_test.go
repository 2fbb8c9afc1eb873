package control

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

var testCfg = registry.Config{Interfaces: []registry.Interface{{
	Addr:    netip.MustParseAddr("198.18.1.1"),
	Addr6:   netip.MustParseAddr("2001:2::1"),
	PortMin: 30000,
	PortMax: 39999,
}}}

var relayAddr = testCfg.Interfaces[0].Addr

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func goodSpec() FlowSpec {
	return FlowSpec{
		Match:        ap("198.18.1.1:30000"),
		ExpectSource: ap("198.18.0.2:4000"),
		SendFrom:     ap("198.18.1.1:30002"),
		SendTo:       ap("198.18.2.2:5000"),
		ClockRate:    8000,
	}
}

func newTestManager(t *testing.T, planes ...dataplane.DataPlane) *Manager {
	t.Helper()
	m, err := newManager(testCfg, zaptest.NewLogger(t), planes...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newManager(cfg registry.Config, log *zap.Logger, planes ...dataplane.DataPlane) (*Manager, error) {
	reg, err := registry.New(cfg, log, planes...)
	if err != nil {
		return nil, err
	}
	return NewManager(reg, log), nil
}

// setNow sets the clock of the manager and of its registry.
func setNow(m *Manager, now func() time.Time) {
	m.now = now
	m.reg.SetClock(now)
}

func TestManagerAddGetListRemove(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	m := newTestManager(t, xdp)

	f1, err := m.Add(goodSpec())
	if err != nil {
		t.Fatal(err)
	}
	if f1.Flow.ID != 1 || f1.Path != dataplane.PathXDP {
		t.Errorf("first flow = %+v", f1)
	}
	spec := goodSpec()
	spec.Match = ap("[2001:2::1]:30004")
	spec.ExpectSource = netip.AddrPort{}
	spec.SendFrom = ap("[2001:2::1]:30006")
	spec.SendTo = ap("[2001:2::9]:5000")
	f2, err := m.Add(spec)
	if err != nil {
		t.Fatal(err)
	}
	if f2.Flow.ID != 2 {
		t.Errorf("second id = %d, want 2", f2.Flow.ID)
	}
	if xdp.Len() != 2 {
		t.Errorf("data plane has %d flows, want 2", xdp.Len())
	}

	seen := time.Now().Truncate(time.Millisecond)
	if err := xdp.SetStats(f1.Flow.Match, dataplane.Stats{Packets: 10, Bytes: 2000, LastSeen: seen}); err != nil {
		t.Fatal(err)
	}
	got, err := m.Get(1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Stats.Packets != 10 || !got.Stats.LastSeen.Equal(seen) || got.Flow.SendTo != ap("198.18.2.2:5000") {
		t.Errorf("Get(1) = %+v", got)
	}
	list, err := m.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Flow.ID != 1 || list[1].Flow.ID != 2 || list[0].Stats.Bytes != 2000 {
		t.Errorf("List = %+v", list)
	}
	if c := m.Counts(); c[dataplane.PathXDP] != 2 || c[dataplane.PathUserspace] != 0 {
		t.Errorf("Counts = %v", c)
	}

	rm, err := m.Remove(1)
	if err != nil {
		t.Fatal(err)
	}
	if rm.Stats.Packets != 10 {
		t.Errorf("Remove returned stats %+v", rm.Stats)
	}
	if _, err := m.Get(1); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Remove: %v, want ErrNotFound", err)
	}
	if _, err := m.Remove(1); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove: %v, want ErrNotFound", err)
	}
	// The match is free again; IDs keep increasing.
	f3, err := m.Add(goodSpec())
	if err != nil {
		t.Fatal(err)
	}
	if f3.Flow.ID != 3 {
		t.Errorf("id after remove = %d, want 3", f3.Flow.ID)
	}
}

func TestManagerAddErrors(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*FlowSpec)
		want   error
		msg    string
	}{
		{"match not relay addr", func(s *FlowSpec) { s.Match = ap("198.18.1.2:30000") }, ErrNotRelayAddress, "match 198.18.1.2:30000"},
		{"match port below range", func(s *FlowSpec) { s.Match = ap("198.18.1.1:29998") }, ErrNotRelayAddress, "ports 30000-39999"},
		{"match port above range", func(s *FlowSpec) { s.Match = ap("198.18.1.1:40000") }, ErrNotRelayAddress, "match"},
		{"send_from not relay", func(s *FlowSpec) { s.SendFrom = ap("198.18.2.1:30002") }, ErrNotRelayAddress, "send_from"},
		{"send_from port out of range", func(s *FlowSpec) { s.SendFrom = ap("198.18.1.1:5000") }, ErrNotRelayAddress, "send_from"},
		{"no match", func(s *FlowSpec) { s.Match = netip.AddrPort{} }, ErrInvalid, "match"},
		{"no send_to", func(s *FlowSpec) { s.SendTo = netip.AddrPort{} }, ErrInvalid, "send_to"},
		{"multicast send_to", func(s *FlowSpec) { s.SendTo = ap("224.0.0.1:5000") }, ErrInvalid, "unicast"},
		{"family mix", func(s *FlowSpec) { s.SendFrom = ap("[2001:2::1]:30002"); s.SendTo = ap("[2001:2::2]:5000") }, ErrInvalid, "family"},
		{"expect_source family", func(s *FlowSpec) { s.ExpectSource = ap("[2001:2::5]:1") }, ErrInvalid, "expect_source"},
		{"action userspace", func(s *FlowSpec) { s.Action = dataplane.Userspace }, ErrInvalid, "action"},
		{"bad mode", func(s *FlowSpec) { s.Mode = "dpdk" }, ErrInvalid, "mode"},
		{"userspace mode without plane", func(s *FlowSpec) { s.Mode = dataplane.PathUserspace }, ErrNotImplemented, "userspace"},
		{"decrypt without userspace plane", func(s *FlowSpec) {
			s.Decrypt = &Crypto{Suite: "AES_CM_128_HMAC_SHA1_80", Key: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd"}
		}, ErrNotImplemented, "userspace"},
		{"decrypt short key", func(s *FlowSpec) { s.Decrypt = &Crypto{Suite: "AES_CM_128_HMAC_SHA1_80", Key: "AAAA"} }, ErrInvalid, "30"},
		{"decrypt unknown suite", func(s *FlowSpec) { s.Decrypt = &Crypto{Suite: "NULL", Key: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd"} }, ErrInvalid, "suite"},
		{"srtp on a drop flow", func(s *FlowSpec) {
			s.Action = dataplane.Drop
			s.Decrypt = &Crypto{Suite: "AES_CM_128_HMAC_SHA1_80", Key: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd"}
		}, ErrInvalid, "forwarded"},
		{"encrypt with xdp", func(s *FlowSpec) {
			s.Mode = "xdp"
			s.Encrypt = &Crypto{Suite: "AEAD_AES_128_GCM", Key: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGw=="}
		}, ErrNotImplemented, "userspace"},
		{"crypto bad key", func(s *FlowSpec) { s.Encrypt = &Crypto{Suite: "AEAD_AES_128_GCM", Key: "!!"} }, ErrInvalid, "base64"},
		{"crypto no suite", func(s *FlowSpec) { s.Decrypt = &Crypto{Key: "AAAA"} }, ErrInvalid, "suite"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			xdp := dataplanetest.New(dataplane.PathXDP)
			m := newTestManager(t, xdp)
			spec := goodSpec()
			tt.modify(&spec)
			_, err := m.Add(spec)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Add error = %v, want %v containing %q", err, tt.want, tt.msg)
			}
			if xdp.Len() != 0 {
				t.Errorf("data plane has %d flows after a failed Add", xdp.Len())
			}
		})
	}
}

func TestManagerDropReflectNeedNoSend(t *testing.T) {
	m := newTestManager(t, dataplanetest.New(dataplane.PathXDP))
	for i, a := range []dataplane.Action{dataplane.Drop, dataplane.Reflect} {
		f, err := m.Add(FlowSpec{Match: netip.AddrPortFrom(relayAddr, uint16(30010+2*i)), Action: a})
		if err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		if f.Flow.Action != a {
			t.Errorf("action = %s, want %s", f.Flow.Action, a)
		}
	}
}

func TestManagerConflict(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	user := dataplanetest.New(dataplane.PathUserspace)
	m := newTestManager(t, xdp, user)
	if _, err := m.Add(goodSpec()); err != nil {
		t.Fatal(err)
	}
	spec := goodSpec()
	spec.Mode = dataplane.PathUserspace // same match in another data plane
	if _, err := m.Add(spec); !errors.Is(err, ErrConflict) {
		t.Errorf("second Add: %v, want ErrConflict", err)
	}
	// A flow in the data plane the manager does not know about.
	xdp.Preload(dataplane.FlowStats{Flow: dataplane.Flow{ID: 99, Match: ap("198.18.1.1:30100"), Action: dataplane.Drop}})
	spec = goodSpec()
	spec.Match = ap("198.18.1.1:30100")
	if _, err := m.Add(spec); !errors.Is(err, ErrConflict) {
		t.Errorf("Add over unknown data plane flow: %v, want ErrConflict", err)
	}
}

func TestManagerUserspacePlane(t *testing.T) {
	user := dataplanetest.New(dataplane.PathUserspace)
	m := newTestManager(t, user)
	spec := goodSpec()
	spec.Mode = dataplane.PathUserspace
	f, err := m.Add(spec)
	if err != nil {
		t.Fatal(err)
	}
	if f.Path != dataplane.PathUserspace || user.Len() != 1 {
		t.Errorf("flow %+v, userspace plane has %d flows", f, user.Len())
	}
	// No xdp plane (dataplane.mode = "userspace"): the default mode is
	// userspace, an explicit xdp is not implemented.
	spec.Mode = ""
	spec.Match = ap("198.18.1.1:30020")
	if f, err := m.Add(spec); err != nil || f.Path != dataplane.PathUserspace {
		t.Errorf("Add without mode: %+v, %v; want a userspace flow", f, err)
	}
	spec.Mode = dataplane.PathXDP
	spec.Match = ap("198.18.1.1:30040")
	if _, err := m.Add(spec); !errors.Is(err, ErrNotImplemented) {
		t.Errorf("Add mode xdp without xdp plane: %v, want ErrNotImplemented", err)
	}
}

func TestManagerNoPlanes(t *testing.T) {
	m := newTestManager(t)
	if _, err := m.Add(goodSpec()); !errors.Is(err, ErrNotImplemented) {
		t.Errorf("Add: %v, want ErrNotImplemented", err)
	}
	list, err := m.List()
	if err != nil || len(list) != 0 {
		t.Errorf("List = %v, %v", list, err)
	}
}

func TestManagerDataPlaneErrors(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	m := newTestManager(t, xdp)
	xdp.SetCapacity(1)
	if _, err := m.Add(goodSpec()); err != nil {
		t.Fatal(err)
	}
	spec := goodSpec()
	spec.Match = ap("198.18.1.1:30100")
	if _, err := m.Add(spec); !errors.Is(err, dataplane.ErrFull) {
		t.Errorf("Add to full table: %v, want ErrFull", err)
	}
	boom := errors.New("boom")
	xdp.FailWith(boom)
	if _, err := m.Get(1); !errors.Is(err, boom) {
		t.Errorf("Get: %v, want boom", err)
	}
	if _, err := m.List(); !errors.Is(err, boom) {
		t.Errorf("List: %v, want boom", err)
	}
	if _, err := m.Remove(1); !errors.Is(err, boom) {
		t.Errorf("Remove: %v, want boom", err)
	}
	xdp.FailWith(nil)
	if _, err := m.Get(1); err != nil {
		t.Errorf("flow lost after failed Remove: %v", err)
	}
	if _, err := newManager(testCfg, zaptest.NewLogger(t), failing(boom)); !errors.Is(err, boom) {
		t.Errorf("NewManager with failing List: %v, want boom", err)
	}
}

func failing(err error) *dataplanetest.DataPlane {
	d := dataplanetest.New(dataplane.PathXDP)
	d.FailWith(err)
	return d
}

func TestManagerAdopt(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	seen := time.Now()
	xdp.Preload(
		dataplane.FlowStats{Flow: dataplane.Flow{ID: 7, Match: ap("198.18.1.1:30000"), Action: dataplane.Drop},
			Stats: dataplane.Stats{Packets: 5, LastSeen: seen}},
		dataplane.FlowStats{Flow: dataplane.Flow{ID: 41, Match: ap("198.18.1.1:30002"), Action: dataplane.Reflect}},
		// ID 0 and a duplicate ID get new IDs after the highest.
		dataplane.FlowStats{Flow: dataplane.Flow{ID: 0, Match: ap("198.18.1.1:30004"), Action: dataplane.Drop}},
		dataplane.FlowStats{Flow: dataplane.Flow{ID: 7, Match: ap("198.18.1.1:30006"), Action: dataplane.Drop}},
	)
	m := newTestManager(t, xdp)
	list, err := m.List()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[netip.AddrPort]uint64{}
	for _, f := range list {
		ids[f.Flow.Match] = f.Flow.ID
	}
	if ids[ap("198.18.1.1:30000")] != 7 || ids[ap("198.18.1.1:30002")] != 41 {
		t.Errorf("adopted ids = %v", ids)
	}
	if a, b := ids[ap("198.18.1.1:30004")], ids[ap("198.18.1.1:30006")]; a < 42 || b < 42 || a == b {
		t.Errorf("renumbered ids = %d, %d; want distinct and > 41", a, b)
	}
	// Renumbered IDs were written back to the data plane.
	dl, _ := xdp.List()
	for _, fs := range dl {
		if fs.Flow.ID != ids[fs.Flow.Match] {
			t.Errorf("data plane has id %d for %s, manager %d", fs.Flow.ID, fs.Flow.Match, ids[fs.Flow.Match])
		}
	}
	got, err := m.Get(7)
	if err != nil || got.Stats.Packets != 5 {
		t.Errorf("Get(7) = %+v, %v", got, err)
	}
	f, err := m.Add(FlowSpec{Match: ap("198.18.1.1:30008"), Action: dataplane.Drop})
	if err != nil {
		t.Fatal(err)
	}
	if f.Flow.ID != 44 {
		t.Errorf("new id = %d, want 44 (after 41, 42, 43)", f.Flow.ID)
	}
	// Conflict with an adopted flow.
	if _, err := m.Add(FlowSpec{Match: ap("198.18.1.1:30002"), Action: dataplane.Drop}); !errors.Is(err, ErrConflict) {
		t.Errorf("Add over adopted flow: %v, want ErrConflict", err)
	}
}

func TestManagerSweepIdle(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	core, logs := observer.New(zap.InfoLevel)
	m, err := newManager(testCfg, zap.New(core), xdp)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	setNow(m, func() time.Time { return now })
	a, _ := m.Add(FlowSpec{Match: ap("198.18.1.1:30000"), Action: dataplane.Drop})
	b, _ := m.Add(FlowSpec{Match: ap("198.18.1.1:30002"), Action: dataplane.Drop})
	_ = xdp.SetStats(a.Flow.Match, dataplane.Stats{Packets: 1, LastSeen: now.Add(-time.Minute)})
	_ = xdp.SetStats(b.Flow.Match, dataplane.Stats{Packets: 1, LastSeen: now.Add(-time.Second)})

	idle, err := m.SweepIdle(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(idle) != 1 || idle[0].Flow.ID != a.Flow.ID {
		t.Fatalf("idle = %+v, want flow %d", idle, a.Flow.ID)
	}
	if n := logs.FilterMessage("flow idle").Len(); n != 1 {
		t.Errorf("%d 'flow idle' logs, want 1", n)
	}
	// Reported once, not on every sweep; static flows stay.
	if _, err := m.SweepIdle(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := logs.FilterMessage("flow idle").Len(); n != 1 {
		t.Errorf("%d 'flow idle' logs after second sweep, want 1", n)
	}
	if xdp.Len() != 2 {
		t.Errorf("sweep removed flows: %d left", xdp.Len())
	}
	// Active again, then idle again: logged again.
	_ = xdp.SetStats(a.Flow.Match, dataplane.Stats{Packets: 2, LastSeen: now})
	if idle, _ := m.SweepIdle(30 * time.Second); len(idle) != 0 {
		t.Errorf("idle after activity = %+v", idle)
	}
	_ = xdp.SetStats(a.Flow.Match, dataplane.Stats{Packets: 2, LastSeen: now.Add(-time.Hour)})
	_, _ = m.SweepIdle(30 * time.Second)
	if n := logs.FilterMessage("flow idle").Len(); n != 2 {
		t.Errorf("%d 'flow idle' logs, want 2", n)
	}
}

func TestManagerIdleNeverSeen(t *testing.T) {
	// A plane without Sweep: the manager decides from creation time.
	user := struct{ dataplane.DataPlane }{dataplanetest.New(dataplane.PathUserspace)}
	m := newTestManager(t, user)
	now := time.Now()
	setNow(m, func() time.Time { return now })
	if _, err := m.Add(FlowSpec{Match: ap("198.18.1.1:30000"), Mode: dataplane.PathUserspace, Action: dataplane.Drop}); err != nil {
		t.Fatal(err)
	}
	if idle, _ := m.Idle(time.Minute); len(idle) != 0 {
		t.Errorf("new flow idle: %+v", idle)
	}
	setNow(m, func() time.Time { return now.Add(2 * time.Minute) })
	if idle, _ := m.Idle(time.Minute); len(idle) != 1 {
		t.Errorf("never-seen flow created 2m ago not idle: %+v", idle)
	}
}

func TestNewManagerConfig(t *testing.T) {
	log := zaptest.NewLogger(t)
	if _, err := newManager(registry.Config{Interfaces: []registry.Interface{{PortMin: 30000, PortMax: 30001}}}, log); err == nil {
		t.Error("no media address accepted")
	}
	if _, err := newManager(testCfg, log, dataplanetest.New(dataplane.PathXDP), dataplanetest.New(dataplane.PathXDP)); err == nil {
		t.Error("two xdp planes accepted")
	}
}

func TestManagerLatched(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	m := newTestManager(t, xdp)
	up := goodSpec()
	up.Latch = true
	up.ExpectSource = ap("198.18.0.2:9000")
	up.Reverse = up.SendFrom
	f, err := m.Add(up)
	if err != nil {
		t.Fatal(err)
	}
	down := goodSpec()
	down.Match, down.SendFrom = up.SendFrom, up.Match
	down.SendTo = up.ExpectSource
	g, err := m.Add(down)
	if err != nil {
		t.Fatal(err)
	}
	real := ap("198.18.0.2:4000")
	m.Latched(f.Flow.Match, real, false)
	if got, _ := m.Get(g.Flow.ID); got.Flow.SendTo != real {
		t.Errorf("after learning: reverse sends to %s, want %s", got.Flow.SendTo, real)
	}
	if got, _ := m.Get(f.Flow.ID); !got.Flow.Latch {
		t.Error("learning ended the latch")
	}
	m.Latched(f.Flow.Match, real, true)
	got, _ := m.Get(f.Flow.ID)
	if got.Flow.Latch || got.Flow.ExpectSource != real {
		t.Errorf("after locking: %+v, want latch off and expect_source %s", got.Flow, real)
	}
	// The data plane has the same view as the manager.
	list, _ := xdp.List()
	for _, fs := range list {
		if fs.Flow.Match == f.Flow.Match && (fs.Flow.Latch || fs.Flow.ExpectSource != real) {
			t.Errorf("data plane still has %+v", fs.Flow)
		}
	}
	m.Latched(ap("198.18.1.1:39000"), real, true) // unknown flow: ignored
}

// A source learned from packets that came from relayd itself (a flow of
// another call pointing here) is not where the reverse flow may send:
// it keeps its destination.
func TestManagerLatchedOwnAddress(t *testing.T) {
	m := newTestManager(t, dataplanetest.New(dataplane.PathXDP))
	up := goodSpec()
	up.Latch = true
	up.ExpectSource = netip.AddrPort{}
	up.Reverse = up.SendFrom
	f, err := m.Add(up)
	if err != nil {
		t.Fatal(err)
	}
	down := goodSpec()
	down.Match, down.SendFrom = up.SendFrom, up.Match
	down.SendTo = ap("198.18.0.2:4000")
	g, err := m.Add(down)
	if err != nil {
		t.Fatal(err)
	}
	m.Latched(f.Flow.Match, ap("198.18.1.1:30100"), false)
	if got, _ := m.Get(g.Flow.ID); got.Flow.SendTo != down.SendTo {
		t.Errorf("reverse flow sends to %s after learning a relay address, want %s", got.Flow.SendTo, down.SendTo)
	}
}

// TestManagerOrphanCallFlows: call flows of a previous run are not adopted
// as static flows; they stay until idle, then are removed. Both the flows
// that record their owner and those of a relayd from before (ids from
// 1<<40) count as call flows.
func TestManagerOrphanCallFlows(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	static := dataplane.Flow{ID: 3, Match: ap("198.18.1.1:30000"), SendFrom: ap("198.18.1.1:30002"), SendTo: ap("198.18.2.2:5000")}
	legacy := dataplane.Flow{ID: 1<<40 + 5, Match: ap("198.18.1.1:30010"), SendFrom: ap("198.18.1.1:30012"), SendTo: ap("198.18.2.2:5002")}
	owned := dataplane.Flow{ID: 9, Match: ap("198.18.1.1:30020"), SendFrom: ap("198.18.1.1:30022"), SendTo: ap("198.18.2.2:5004"), Owner: dataplane.OwnerCall}
	for _, fl := range []dataplane.Flow{static, legacy, owned} {
		if err := xdp.Install(fl); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Unix(1000, 0)
	reg, err := registry.New(testCfg, zaptest.NewLogger(t), xdp)
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(reg, zaptest.NewLogger(t))
	list, _ := m.List()
	if len(list) != 1 || list[0].Flow.ID != 3 {
		t.Fatalf("static flows %+v, want only id 3", list)
	}
	if n := reg.Unclaimed(); n != 2 {
		t.Errorf("%d unclaimed call flows, want 2", n)
	}
	// The found flows' ports are taken: a new call or static flow cannot
	// have them.
	if err := reg.HoldStatic(legacy.Match); !errors.Is(err, registry.ErrPortInUse) {
		t.Errorf("static flow on an orphan's port: %v, want ErrPortInUse", err)
	}
	// Idle since adoption (the registry's clock at adoption was the real
	// one, an hour on is idle whatever it was).
	now = time.Now().Add(time.Hour)
	setNow(m, func() time.Time { return now })
	m.SweepIdle(30 * time.Second)
	if xdp.Len() != 1 {
		t.Errorf("data plane has %d flows after the sweep, want the static one only", xdp.Len())
	}
	if err := reg.HoldStatic(legacy.Match); err != nil {
		t.Errorf("port of a swept orphan not given back: %v", err)
	}
}

// TestStaticFlowTakesCallPort: a static flow added after start takes its
// port pair in the registry, so a call is never given it (a call's
// install would fail on the taken match), and a static flow cannot take
// a call's port.
func TestStaticFlowTakesCallPort(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	cfg := registry.Config{Interfaces: []registry.Interface{{Addr: relayAddr, PortMin: 30000, PortMax: 30005}}}
	reg, err := registry.New(cfg, zaptest.NewLogger(t), xdp)
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(reg, zaptest.NewLogger(t))
	calls := call.NewTable(reg, zaptest.NewLogger(t))
	// RTP and RTCP of one static stream share the pair 30000.
	for _, match := range []string{"198.18.1.1:30000", "198.18.1.1:30001"} {
		if _, err := m.Add(FlowSpec{Match: ap(match), Action: dataplane.Drop}); err != nil {
			t.Fatal(err)
		}
	}
	c := calls.New(netip.AddrPort{}, "", "")
	if err := c.Media.Ensure(0, relayAddr, relayAddr); err != nil {
		t.Fatal(err)
	}
	st := c.Media.Streams()[0]
	for s, e := range st.Ends {
		if e.Port == 30000 {
			t.Errorf("leg %d given the static flow's port %d", s, e.Port)
		}
	}
	// The third pair is the last one: a call's port is not the static API's.
	if _, err := m.Add(FlowSpec{Match: netip.AddrPortFrom(relayAddr, st.Ends[0].Port), Action: dataplane.Drop}); !errors.Is(err, ErrConflict) {
		t.Errorf("static flow on a call's port: %v, want ErrConflict", err)
	}
	c2 := calls.New(netip.AddrPort{}, "", "")
	if err := c2.Media.Ensure(0, relayAddr, relayAddr); !errors.Is(err, call.ErrNoPorts) {
		t.Errorf("a second call: %v, want ErrNoPorts (pairs: static, call a, call b)", err)
	}
	c2.End(call.Rejected, 503, "")
	// Removing both static flows gives the pair back.
	list, _ := m.List()
	for _, f := range list {
		if _, err := m.Remove(f.Flow.ID); err != nil {
			t.Fatal(err)
		}
	}
	if free := reg.Ports()[0].Free; free != 1 {
		t.Errorf("%d pairs free after removing the static flows, want 1", free)
	}
	c.End(call.Answered, 200, "")
}

// TestManagerRateCap: a static flow gets the default ceiling, or the cap
// its request names (0: none); a cap beyond what the data planes hold is
// invalid.
func TestManagerRateCap(t *testing.T) {
	cfg := testCfg
	cfg.Rates = registry.RatePolicy{Factor: 4, DefaultPPS: 2000, RTCPPPS: 100}
	m, err := newManager(cfg, zaptest.NewLogger(t), dataplanetest.New(dataplane.PathXDP))
	if err != nil {
		t.Fatal(err)
	}
	u := func(v uint32) *uint32 { return &v }
	for i, tc := range []struct {
		req  *uint32
		want dataplane.RateCap
	}{
		{nil, dataplane.RateCap{PPS: 2000, Burst: 2000}},
		{u(0), dataplane.RateCap{}},
		{u(300), dataplane.RateCap{PPS: 300, Burst: 300}},
		{u(1_000_000), dataplane.RateCap{PPS: 1_000_000, Burst: dataplane.MaxRateBurst}},
	} {
		spec := goodSpec()
		spec.Match = netip.AddrPortFrom(relayAddr, uint16(30100+4*i))
		spec.RateCap = tc.req
		fs, err := m.Add(spec)
		if err != nil {
			t.Fatal(err)
		}
		if fs.Flow.RateCap != tc.want {
			t.Errorf("rate_cap_pps %v: cap %+v, want %+v", tc.req, fs.Flow.RateCap, tc.want)
		}
	}
	spec := goodSpec()
	spec.RateCap = u(1_000_001)
	if _, err := m.Add(spec); !errors.Is(err, ErrInvalid) {
		t.Errorf("a cap over a million packets/s: %v, want ErrInvalid", err)
	}
}
