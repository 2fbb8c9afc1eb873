package fastpath

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relayd/relayd/dataplane"
)

// TestFlowAPI exercises Install, Update, Remove, List and Sweep on the real
// maps, with packets through BPF_PROG_TEST_RUN in between.
func TestFlowAPI(t *testing.T) {
	e := newTestEnv(t)
	now := time.Now()
	e.fp.cfg.now = func() time.Time { return now }
	a := dataplane.Flow{ID: 7, Match: ap(relay4, 30000), ExpectSource: ap(caller4, 0), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000}
	b := dataplane.Flow{ID: 8, Match: ap(relay6, 30000), SendFrom: ap(relay6, 30002), SendTo: ap(callee6, 5000), ClockRate: 48000, Owner: dataplane.OwnerCall}
	for _, fl := range []dataplane.Flow{a, b} {
		if err := e.fp.Install(fl); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.fp.Install(a); !errors.Is(err, dataplane.ErrExists) {
		t.Errorf("second install: %v, want ErrExists", err)
	}
	bad := a
	bad.Match = ap(relay4, 0)
	if err := e.fp.Install(bad); err == nil {
		t.Error("install of a flow without port succeeded")
	}

	frame := buildFrame(ap(caller4, 4000), a.Match, rtpPacket(5, 10, 1600, 160), frameOpts{})
	for range 3 {
		if v, _ := e.run(t, frame); v != xdpRedirect {
			t.Fatalf("verdict %s", verdictName[v])
		}
	}

	list, err := e.fp.List()
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]dataplane.FlowStats{}
	for _, fs := range list {
		got[fs.Flow.ID] = fs
	}
	if len(got) != 2 {
		t.Fatalf("listed %d flows, want 2", len(list))
	}
	for _, want := range []dataplane.Flow{a, b} {
		if g := got[want.ID].Flow; g != want {
			t.Errorf("flow %d read back as %+v, want %+v", want.ID, g, want)
		}
	}
	if st := got[7].Stats; st.Packets != 3 || st.SSRC != 5 || st.Received != 3 {
		t.Errorf("listed stats %+v, want 3 packets of ssrc 5", st)
	}
	// EachStats reads the same statistics without the flows.
	each := map[netip.AddrPort]dataplane.Stats{}
	if err := e.fp.EachStats(func(m netip.AddrPort, st dataplane.Stats) { each[m] = st }); err != nil {
		t.Fatal(err)
	}
	if len(each) != 2 {
		t.Errorf("EachStats gave %d flows, want 2", len(each))
	}
	for _, fs := range list {
		// last_seen is the packet's age subtracted from the (fixed)
		// clock: it moves with the moment of the read.
		st, want := each[fs.Flow.Match], fs.Stats
		if d := st.LastSeen.Sub(want.LastSeen); d < -time.Second || d > time.Second || st.LastSeen.IsZero() != want.LastSeen.IsZero() {
			t.Errorf("EachStats of %s: last seen %v, List's %v", fs.Flow.Match, st.LastSeen, want.LastSeen)
		}
		st.LastSeen, want.LastSeen = time.Time{}, time.Time{}
		if d := cmp.Diff(want, st); d != "" {
			t.Errorf("EachStats of %s differs from List's (-List +EachStats):\n%s", fs.Flow.Match, d)
		}
	}

	// Update keeps the statistics and changes where packets go.
	a2 := a
	a2.SendTo = ap(near4, 7000)
	if err := e.fp.Update(a2); err != nil {
		t.Fatal(err)
	}
	if v, out := e.run(t, frame); v != xdpTx {
		t.Fatalf("after update: verdict %s, want TX", verdictName[v])
	} else if p, err := parseFrame(out); err != nil || p.dst != a2.SendTo {
		t.Fatalf("after update: sent to %s (%v), want %s", p.dst, err, a2.SendTo)
	}
	if st, _ := e.fp.Stats(a.Match); st.Packets != 4 {
		t.Errorf("after update: %d packets, want 4", st.Packets)
	}
	missing := a
	missing.Match = ap(relay4, 39998)
	if err := e.fp.Update(missing); !errors.Is(err, dataplane.ErrNotFound) {
		t.Errorf("update of a missing flow: %v", err)
	}

	// Sweep a minute later: b never saw a packet since it was installed a
	// minute ago; a saw one a moment ago (last_seen is the packet's age
	// subtracted from the clock).
	now = now.Add(time.Minute)
	idle, err := e.fp.Sweep(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, fs := range idle {
		ids = append(ids, fs.Flow.ID)
	}
	if d := cmp.Diff([]uint64{8}, sortIDs(ids)); d != "" {
		t.Errorf("idle flows (-want +got):\n%s", d)
	}
	if idle, _ := e.fp.Sweep(2 * time.Minute); len(idle) != 0 {
		t.Errorf("%d flows idle for 2 minutes, want none", len(idle))
	}
	if st, _ := e.fp.Stats(a.Match); now.Sub(st.LastSeen) > 10*time.Second || now.Sub(st.LastSeen) < 0 {
		t.Errorf("last_seen %v is not a moment before %v", st.LastSeen, now)
	}

	// Remove returns the last statistics and frees the slot for reuse with
	// zeroed statistics.
	st, err := e.fp.Remove(a.Match)
	if err != nil || st.Packets != 4 {
		t.Fatalf("remove: %+v, %v; want 4 packets", st, err)
	}
	if _, err := e.fp.Remove(a.Match); !errors.Is(err, dataplane.ErrNotFound) {
		t.Errorf("second remove: %v", err)
	}
	if v, _ := e.run(t, frame); v != xdpPass {
		t.Errorf("packet after remove: verdict %s, want PASS", verdictName[v])
	}
	c := dataplane.Flow{ID: 9, Match: ap(relay4, 30010), SendFrom: ap(relay4, 30012), SendTo: ap(callee4, 5010), ClockRate: 8000}
	if err := e.fp.Install(c); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.fp.Stats(c.Match); st != (dataplane.Stats{}) {
		t.Errorf("reused slot not reset: %+v", st)
	}
}

func TestFlowTableFull(t *testing.T) {
	e := newTestEnv(t)
	e.fp.slots = newSlotAlloc(3, 0, 3) // the limit; the maps are larger
	for i := range 4 {
		fl := dataplane.Flow{Match: ap(relay4, uint16(30000+2*i)), SendFrom: ap(relay4, 31000), SendTo: ap(callee4, 5000)}
		err := e.fp.Install(fl)
		if i < 3 && err != nil {
			t.Fatalf("flow %d: %v", i, err)
		}
		if i == 3 && !errors.Is(err, dataplane.ErrFull) {
			t.Fatalf("flow %d: %v, want ErrFull", i, err)
		}
	}
}

func sortIDs(ids []uint64) []uint64 {
	for i := range ids {
		for j := i + 1; j < len(ids); j++ {
			if ids[j] < ids[i] {
				ids[i], ids[j] = ids[j], ids[i]
			}
		}
	}
	return ids
}
