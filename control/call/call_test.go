package call

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
	"github.com/relayd/relayd/sdes"
)

var (
	relay4   = netip.MustParseAddr("198.18.1.1")
	relay6   = netip.MustParseAddr("2001:2:0:1::1")
	callerIP = netip.MustParseAddr("198.18.0.2")
	calleeIP = netip.MustParseAddr("198.18.2.2")
)

func newTable(t *testing.T, planes ...dataplane.DataPlane) *Table {
	t.Helper()
	return newTableRange(t, 30000, 30099, planes...)
}

func newTableRange(t *testing.T, lo, hi uint16, planes ...dataplane.DataPlane) *Table {
	t.Helper()
	reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{
		{Addr: relay4, Addr6: relay6, PortMin: lo, PortMax: hi},
	}}, zaptest.NewLogger(t), planes...)
	if err != nil {
		t.Fatal(err)
	}
	return NewTable(reg, zaptest.NewLogger(t))
}

// freePairs returns the free port pairs of the default interface.
func freePairs(tb *Table) int { return tb.Registry().Ports()[0].Free }

func TestMediaFlows(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	tb := newTable(t, xdp, dataplanetest.New(dataplane.PathUserspace))
	c := tb.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:a@x", "sip:b@y")
	m := c.Media
	if err := m.Ensure(0, relay4, relay4); err != nil {
		t.Fatal(err)
	}
	st := m.Streams()[0]
	pa, pb := st.Ends[A].Port, st.Ends[B].Port
	if pa%2 != 0 || pb%2 != 0 || pa == pb {
		t.Fatalf("ports %d %d", pa, pb)
	}
	// Offer known: nothing can be installed toward B, but B->A can.
	m.Edit(0, func(st *Stream) {
		st.Ends[A].RTP = netip.AddrPortFrom(callerIP, 4000)
		st.Ends[A].RTCP = netip.AddrPortFrom(callerIP, 4001)
	})
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if xdp.Len() != 2 {
		t.Fatalf("%d flows after the offer, want 2 (B->A RTP and RTCP)", xdp.Len())
	}
	m.Edit(0, func(st *Stream) {
		st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 6000)
		st.Ends[B].RTCP = netip.AddrPortFrom(calleeIP, 6001)
	})
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if xdp.Len() != 4 {
		t.Fatalf("%d flows after the answer, want 4", xdp.Len())
	}
	aToB := netip.AddrPortFrom(relay4, pa)
	fl, _ := xdp.List()
	var found bool
	for _, fs := range fl {
		if fs.Flow.Match == aToB {
			found = true
			if fs.Flow.SendTo != netip.AddrPortFrom(calleeIP, 6000) || fs.Flow.SendFrom != netip.AddrPortFrom(relay4, pb) ||
				fs.Flow.ExpectSource != netip.AddrPortFrom(callerIP, 4000) || fs.Flow.ClockRate != 8000 {
				t.Errorf("A->B flow %+v", fs.Flow)
			}
			if fs.Flow.ID == 0 || fs.Flow.Owner != dataplane.OwnerCall {
				t.Errorf("call flow id %d owner %s, want an id and owner call", fs.Flow.ID, fs.Flow.Owner)
			}
		}
	}
	if !found {
		t.Fatalf("no flow on %s", aToB)
	}
	// Statistics survive an update (re-INVITE to a new port).
	xdp.SetStats(aToB, dataplane.Stats{Packets: 10, Bytes: 2000})
	installs, updates := xdp.Calls("Install"), xdp.Calls("Update")
	m.Edit(0, func(st *Stream) { st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 7000) })
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	// Two updates: the flow toward the callee sends to the new port, the
	// one from the callee prefers it when latching (its signalled source).
	if xdp.Calls("Install") != installs || xdp.Calls("Update") != updates+2 {
		t.Errorf("re-target: %d installs, %d updates; want two updates only", xdp.Calls("Install")-installs, xdp.Calls("Update")-updates)
	}
	if s, _ := xdp.Stats(aToB); s.Packets != 10 {
		t.Errorf("stats after update %+v", s)
	}
	// rtcp-mux: the RTCP flows go.
	m.Edit(0, func(st *Stream) { st.Mux = true })
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if xdp.Len() != 2 {
		t.Errorf("%d flows with rtcp-mux, want 2", xdp.Len())
	}
	info := c.Info()
	if info.Media[A].Packets != 10 || info.Media[A].Path != "xdp" || len(info.Flows) != 2 {
		t.Errorf("info %+v", info)
	}
	free := freePairs(tb)
	if !c.End(Answered, 200, "") {
		t.Fatal("End returned false")
	}
	if c.End(Failed, 500, "") {
		t.Error("second End returned true")
	}
	if xdp.Len() != 0 {
		t.Errorf("%d flows left after the end", xdp.Len())
	}
	if freePairs(tb) != free+2 {
		t.Errorf("ports not released: %d free, want %d", freePairs(tb), free+2)
	}
	info = c.Info()
	if info.Disposition != Answered || info.Media[A].Packets != 10 || info.End == nil {
		t.Errorf("final info %+v", info)
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done not closed after End")
	}
}

// TestCallDone: Done is closed by the end or the let-go of a call, for a
// waiter from before and one from after, and not before.
func TestCallDone(t *testing.T) {
	tb := newTable(t, dataplanetest.New(dataplane.PathXDP))
	for _, end := range []struct {
		name string
		do   func(*Call) bool
	}{
		{"End", func(c *Call) bool { return c.End(Hangup, 0, "") }},
		{"Detach", (*Call).Detach},
	} {
		c := tb.New(netip.AddrPort{}, "", "")
		before := c.Done()
		select {
		case <-before:
			t.Fatalf("%s: Done closed before the call ended", end.name)
		default:
		}
		if !end.do(c) {
			t.Fatalf("%s returned false", end.name)
		}
		for i, ch := range []<-chan struct{}{before, c.Done()} {
			select {
			case <-ch:
			default:
				t.Errorf("%s: Done taken %s is not closed", end.name, [...]string{"before", "after"}[i])
			}
		}
		if end.do(c) {
			t.Errorf("%s: a second one returned true", end.name)
		}
	}
}

// TestLegStrings: a leg's strings come back as set (in the call's room),
// its transport in lower case.
func TestLegStrings(t *testing.T) {
	tb := newTable(t, dataplanetest.New(dataplane.PathXDP))
	c := tb.New(netip.AddrPort{}, "sip:alice@198.18.0.1", "sip:bob@198.18.0.2")
	if c.From != "sip:alice@198.18.0.1" || c.To != "sip:bob@198.18.0.2" || c.ID == "" {
		t.Errorf("call ID %q, From %q, To %q", c.ID, c.From, c.To)
	}
	for _, tc := range []struct{ in, want string }{{"UDP", "udp"}, {"tcp", "tcp"}, {"Tls", "tls"}, {"", ""}, {"FOO", "foo"}} {
		l := Leg{CallID: "abc@198.18.0.1", FromTag: "1234", ToTag: "", Remote: "198.18.0.1:5060", Transport: tc.in}
		c.SetLeg(B, l)
		got := c.Leg(B)
		l.Transport = tc.want
		if got != l {
			t.Errorf("SetLeg(%+v): Leg returns %+v", l, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		c.SetLeg(A, Leg{CallID: "abc@198.18.0.1", FromTag: "1234", Remote: "198.18.0.1:5060", Transport: "UDP"})
	}); n != 0 {
		t.Errorf("SetLeg allocates %.0f times, want none (the leg's strings in the call's room)", n)
	}
}

func TestMediaUserspaceOnly(t *testing.T) {
	us := dataplanetest.New(dataplane.PathUserspace)
	tb := newTable(t, us)
	c := tb.New(netip.AddrPort{}, "", "")
	c.Media.Ensure(0, relay4, relay6)
	c.Media.Edit(0, func(st *Stream) {
		st.Mux = true
		st.Ends[A].RTP = netip.AddrPortFrom(callerIP, 4000)
		st.Ends[B].RTP = netip.MustParseAddrPort("[2001:2:0:2::2]:6000")
	})
	if err := c.Media.Sync(); err != nil {
		t.Fatal(err)
	}
	l, _ := us.List()
	if len(l) != 2 {
		t.Fatalf("%d flows, want 2", len(l))
	}
	for _, fs := range l {
		if fs.Flow.Match.Addr().Is4() == fs.Flow.SendFrom.Addr().Is4() {
			t.Errorf("flow %+v does not cross families", fs.Flow)
		}
	}
	c.End(Answered, 200, "")
}

func TestMediaSRTPUnsupported(t *testing.T) {
	tb := newTable(t, dataplanetest.New(dataplane.PathXDP))
	c := tb.New(netip.AddrPort{}, "", "")
	c.Media.Ensure(0, relay4, relay4)
	key, _ := sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80)
	c.Media.Edit(0, func(st *Stream) {
		st.Mux = true
		st.Ends[A].RTP = netip.AddrPortFrom(callerIP, 4000)
		st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 6000)
		st.Ends[A].Recv = key
	})
	if err := c.Media.Sync(); !errors.Is(err, ErrSRTPUnsupported) {
		t.Errorf("Sync: %v, want ErrSRTPUnsupported", err)
	}
	c.End(Rejected, 488, "")
}

func TestMediaSRTPUserspace(t *testing.T) {
	xdp, us := dataplanetest.New(dataplane.PathXDP), dataplanetest.New(dataplane.PathUserspace)
	tb := newTable(t, xdp, us)
	c := tb.New(netip.AddrPort{}, "", "")
	c.Media.Ensure(0, relay4, relay4)
	callerKey, _ := sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80)
	relayKey, _ := sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80)
	c.Media.Edit(0, func(st *Stream) {
		st.Ends[A].RTP = netip.AddrPortFrom(callerIP, 4000)
		st.Ends[A].RTCP = netip.AddrPortFrom(callerIP, 4001)
		st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 6000)
		st.Ends[B].RTCP = netip.AddrPortFrom(calleeIP, 6001)
		st.Ends[A].Recv, st.Ends[A].Send = callerKey, relayKey
	})
	if err := c.Media.Sync(); err != nil {
		t.Fatal(err)
	}
	if xdp.Len() != 0 || us.Len() != 4 {
		t.Fatalf("%d xdp and %d userspace flows; SRTP flows belong in userspace", xdp.Len(), us.Len())
	}
	l, _ := us.List()
	for _, fs := range l {
		fromA := fs.Flow.SendTo.Addr() == calleeIP
		switch {
		case fromA && (fs.Flow.Decrypt == nil || fs.Flow.Encrypt != nil || string(fs.Flow.Decrypt.Key) != string(callerKey.Key)):
			t.Errorf("caller->callee flow %+v: want decrypt with the caller's key only", fs.Flow)
		case !fromA && (fs.Flow.Encrypt == nil || fs.Flow.Decrypt != nil || string(fs.Flow.Encrypt.Key) != string(relayKey.Key)):
			t.Errorf("callee->caller flow %+v: want encrypt with relayd's key only", fs.Flow)
		}
	}
	// Same keys again: no update.
	updates := us.Calls("Update")
	c.Media.Edit(0, func(st *Stream) {
		st.Ends[A].Recv = &sdes.Crypto{Tag: 1, Suite: callerKey.Suite, Key: callerKey.Key, Salt: callerKey.Salt}
	})
	if err := c.Media.Sync(); err != nil || us.Calls("Update") != updates {
		t.Errorf("equal keys re-synced: %v, %d updates", err, us.Calls("Update")-updates)
	}
	// SRTP off: the flows move to XDP.
	c.Media.Edit(0, func(st *Stream) { st.Ends[A].Recv, st.Ends[A].Send = nil, nil })
	if err := c.Media.Sync(); err != nil {
		t.Fatal(err)
	}
	if xdp.Len() != 4 || us.Len() != 0 {
		t.Errorf("after SRTP off: %d xdp, %d userspace flows", xdp.Len(), us.Len())
	}
	c.End(Answered, 200, "")
}

func TestPortExhaustion(t *testing.T) {
	tb := newTableRange(t, 30000, 30003, dataplanetest.New(dataplane.PathXDP))
	c1 := tb.New(netip.AddrPort{}, "", "")
	if err := c1.Media.Ensure(0, relay4, relay4); err != nil {
		t.Fatal(err)
	}
	c2 := tb.New(netip.AddrPort{}, "", "")
	if err := c2.Media.Ensure(0, relay4, relay4); !errors.Is(err, ErrNoPorts) {
		t.Fatalf("second call: %v, want ErrNoPorts", err)
	}
	c2.End(Rejected, 503, "")
	c1.End(Answered, 200, "")
	if freePairs(tb) != 2 {
		t.Errorf("%d pairs free, want 2: a failed allocation must give back what it took", freePairs(tb))
	}
}

func TestIdle(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	tb := newTable(t, xdp)
	now := time.Now()
	tb.now = func() time.Time { return now }
	mk := func() *Call {
		c := tb.New(netip.AddrPort{}, "", "")
		c.Media.Ensure(0, relay4, relay4)
		c.Media.Edit(0, func(st *Stream) {
			st.Mux = true
			st.Ends[A].RTP = netip.AddrPortFrom(callerIP, 4000)
			st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 6000)
		})
		if err := c.Media.Sync(); err != nil {
			t.Fatal(err)
		}
		c.SetState(StateAnswered)
		return c
	}
	quiet, busy := mk(), mk()
	tb.now = func() time.Time { return now.Add(time.Minute) }
	tb.Registry().SetClock(tb.now)
	for _, f := range busy.Media.Flows() {
		xdp.SetStats(f.Flow.Match, dataplane.Stats{Packets: 1, LastSeen: now.Add(50 * time.Second)})
	}
	idle, err := tb.Idle(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(idle) != 1 || idle[0] != quiet {
		t.Errorf("idle calls %v, want only the quiet one", idle)
	}
}

// TestMediaLatching: call flows latch (symmetric RTP). A caller behind NAT
// signals a private address; the relay learns where its packets really come
// from, sends the callee's media there, and when the window closes expects
// exactly that source.
func TestMediaLatching(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	tb := newTable(t, xdp)
	c := tb.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:a@x", "sip:b@y")
	m := c.Media
	if err := m.Ensure(0, relay4, relay4); err != nil {
		t.Fatal(err)
	}
	signalled := netip.MustParseAddrPort("192.168.1.10:4000") // the caller's SDP, behind NAT
	m.Edit(0, func(st *Stream) {
		st.Ends[A].RTP = signalled
		st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 6000)
		st.Mux = true
	})
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	st := m.Streams()[0]
	aIn, bIn := netip.AddrPortFrom(relay4, st.Ends[A].Port), netip.AddrPortFrom(relay4, st.Ends[B].Port)
	flow := func(match netip.AddrPort) dataplane.Flow {
		t.Helper()
		l, _ := xdp.List()
		for _, fs := range l {
			if fs.Flow.Match == match {
				return fs.Flow
			}
		}
		t.Fatalf("no flow %s", match)
		return dataplane.Flow{}
	}
	if f := flow(aIn); !f.Latch || f.Reverse != bIn || f.ExpectSource.Addr() != signalled.Addr() {
		t.Fatalf("caller's flow %+v, want latching with reverse %s", f, bIn)
	}
	if f := flow(bIn); f.SendTo != signalled {
		t.Fatalf("callee->caller flow sends to %s before learning, want the signalled %s", f.SendTo, signalled)
	}
	public := netip.MustParseAddrPort("198.18.0.2:61000") // the NAT's public side
	tb.Registry().Latched(aIn, public, false)
	if f := flow(bIn); f.SendTo != public {
		t.Errorf("after learning: callee->caller sends to %s, want %s", f.SendTo, public)
	}
	if f := flow(aIn); !f.Latch {
		t.Error("learning ended the latch window")
	}
	tb.Registry().Latched(aIn, public, true)
	if f := flow(aIn); f.Latch || f.ExpectSource != public {
		t.Errorf("after locking: %+v, want latch off and expect_source %s", f, public)
	}
	// A re-offer keeps what was learned.
	m.Edit(0, func(st *Stream) { st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 7000) })
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if f := flow(aIn); f.Latch || f.ExpectSource != public {
		t.Errorf("after a re-offer: %+v", f)
	}
	if f := flow(bIn); f.SendTo != public {
		t.Errorf("after a re-offer: callee->caller sends to %s", f.SendTo)
	}
	m.Close()
	tb.Registry().Latched(aIn, public, true) // after the call: ignored
}

// TestMediaRebind: RTCP learns only the address RTP learned, and a locked
// source that falls silent while packets come from elsewhere (a NAT that
// moved the peer) opens learning again: only then, and only once per
// silence.
func TestMediaRebind(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	tb := newTable(t, xdp)
	now := time.Unix(1_800_000_000, 0)
	tb.now = func() time.Time { return now }
	c := tb.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:a@x", "sip:b@y")
	m := c.Media
	if err := m.Ensure(0, relay4, relay4); err != nil {
		t.Fatal(err)
	}
	signalled := netip.MustParseAddrPort("192.168.1.10:4000") // behind NAT
	m.Edit(0, func(st *Stream) {
		st.Ends[A].RTP = signalled
		st.Ends[A].RTCP = netip.AddrPortFrom(signalled.Addr(), 4001)
		st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 6000)
		st.Ends[B].RTCP = netip.AddrPortFrom(calleeIP, 6001)
	})
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	st := m.Streams()[0]
	aIn, bIn := netip.AddrPortFrom(relay4, st.Ends[A].Port), netip.AddrPortFrom(relay4, st.Ends[B].Port)
	aRTCP, bRTCP := rtcpOf(aIn), rtcpOf(bIn)
	flow := func(match netip.AddrPort) dataplane.Flow {
		t.Helper()
		l, _ := xdp.List()
		for _, fs := range l {
			if fs.Flow.Match == match {
				return fs.Flow
			}
		}
		t.Fatalf("no flow %s", match)
		return dataplane.Flow{}
	}
	if f := flow(aRTCP); !f.Latch || f.LatchAddress || f.ExpectSource != st.Ends[A].RTCP {
		t.Fatalf("RTCP flow before RTP learned: %+v", f)
	}
	public := netip.MustParseAddrPort("198.18.0.2:61000")
	tb.Registry().Latched(aIn, public, false)
	// RTCP now latches on RTP's address only: the NAT's port + 1 first.
	if f := flow(aRTCP); !f.Latch || !f.LatchAddress || f.ExpectSource != netip.MustParseAddrPort("198.18.0.2:61001") {
		t.Errorf("RTCP flow after RTP learned %s: %+v", public, f)
	}
	// An RTCP source from another address is not used.
	tb.Registry().Latched(aRTCP, netip.MustParseAddrPort("198.18.9.9:61001"), false)
	if f := flow(bRTCP); f.SendTo != st.Ends[A].RTCP {
		t.Errorf("callee->caller RTCP follows a source RTP never came from: %s", f.SendTo)
	}
	tb.Registry().Latched(aRTCP, netip.MustParseAddrPort("198.18.0.2:61005"), false)
	if f := flow(bRTCP); f.SendTo != netip.MustParseAddrPort("198.18.0.2:61005") {
		t.Errorf("callee->caller RTCP sends to %s, want RTP's address", f.SendTo)
	}
	tb.Registry().Latched(aIn, public, true)
	if f := flow(aIn); f.Latch || f.ExpectSource != public {
		t.Fatalf("after locking: %+v", f)
	}

	const after = 5 * time.Second
	rebind := func(st dataplane.Stats) {
		t.Helper()
		if err := xdp.SetStats(aIn, st); err != nil {
			t.Fatal(err)
		}
		stats, err := tb.Registry().Activity()
		if err != nil {
			t.Fatal(err)
		}
		tb.Rebind(stats, after)
	}
	locked := func(what string) {
		t.Helper()
		if f := flow(aIn); f.Latch || f.ExpectSource != public {
			t.Fatalf("%s: the flow learns again: %+v", what, f)
		}
	}
	rebind(dataplane.Stats{Packets: 100, Dropped: 0, LastSeen: now}) // the first look
	now = now.Add(time.Second)
	rebind(dataplane.Stats{Packets: 150, Dropped: 40, LastSeen: now})
	locked("drops while the source is live (an attacker)")
	now = now.Add(10 * time.Second)
	rebind(dataplane.Stats{Packets: 150, Dropped: 40, LastSeen: now.Add(-10 * time.Second)})
	locked("silent, but nothing from elsewhere (on hold)")
	now = now.Add(time.Second)
	rebind(dataplane.Stats{Packets: 150, Dropped: 45, LastSeen: now.Add(-11 * time.Second)})
	f := flow(aIn)
	if !f.Latch || f.ExpectSource != signalled {
		t.Fatalf("silent with packets from elsewhere: %+v, want latching against the signalled %s", f, signalled)
	}
	if f := flow(bIn); f.SendTo != public {
		t.Errorf("while learning again the callee's media goes to %s, want the old source %s", f.SendTo, public)
	}
	moved := netip.MustParseAddrPort("198.18.0.2:62000")
	tb.Registry().Latched(aIn, moved, false)
	tb.Registry().Latched(aIn, moved, true)
	if f := flow(aIn); f.Latch || f.ExpectSource != moved {
		t.Errorf("after learning again: %+v, want locked on %s", f, moved)
	}
	if f := flow(bIn); f.SendTo != moved {
		t.Errorf("callee->caller sends to %s, want %s", f.SendTo, moved)
	}
	m.Close()
}

// TestWantSet: the flows Sync wants come sorted by match, one per match,
// the last one added for a match, as a map filled in order would hold.
func TestWantSet(t *testing.T) {
	flow := func(port uint16, side Side) wanted {
		return wanted{flow: dataplane.Flow{Match: netip.AddrPortFrom(relay4, port)}, side: side}
	}
	ws := wantSet{flow(30002, A), flow(30000, A), flow(30002, B), flow(30004, A)}.sorted()
	var got []string
	for _, w := range ws {
		got = append(got, fmt.Sprintf("%d%s", w.flow.Match.Port(), w.side))
	}
	if strings.Join(got, " ") != "30000a 30002b 30004a" {
		t.Errorf("sorted set %v, want 30000a 30002b 30004a", got)
	}
	if !ws.has(netip.AddrPortFrom(relay4, 30004)) || ws.has(netip.AddrPortFrom(relay4, 30006)) {
		t.Error("has: wrong membership")
	}
}

// TestMediaSharesFlows: a call keeps the registry's flows, not copies of
// them (a held call's memory), and an update replaces the flow rather
// than changing the one held.
func TestMediaSharesFlows(t *testing.T) {
	tb := newTable(t, dataplanetest.New(dataplane.PathXDP))
	c := tb.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:a@x", "sip:b@y")
	m := c.Media
	if err := m.Ensure(0, relay4, relay4); err != nil {
		t.Fatal(err)
	}
	m.Edit(0, func(st *Stream) {
		st.Ends[A].RTP = netip.AddrPortFrom(callerIP, 4000)
		st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 6000)
	})
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	held := func() map[netip.AddrPort]*dataplane.Flow {
		m.mu.Lock()
		defer m.mu.Unlock()
		out := make(map[netip.AddrPort]*dataplane.Flow)
		for _, r := range m.flows {
			out[r.flow.Match] = r.flow
		}
		return out
	}
	before := held()
	if len(before) == 0 {
		t.Fatal("no flows")
	}
	for match, p := range before {
		if reg, _, ok := tb.Registry().Shared(match); !ok || reg != p {
			t.Errorf("flow %s: the call holds a copy (%p), not the registry's (%p)", match, p, reg)
		}
	}
	aIn := netip.AddrPortFrom(relay4, m.Streams()[0].Ends[A].Port)
	old := *before[aIn]
	m.Edit(0, func(st *Stream) { st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 6100) })
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	after := held()[aIn]
	if reg, _, _ := tb.Registry().Shared(aIn); after != reg || after.SendTo.Port() != 6100 {
		t.Errorf("after the update the call holds %+v (registry's: %t), want send_to port 6100", after, after == reg)
	}
	if *before[aIn] != old {
		t.Errorf("the update changed the flow held before it in place: %+v, was %+v", *before[aIn], old)
	}
}

// TestCallSize: a Call, its media and its strings' room fill the size
// class the room was chosen for (mediaRoom), with less than a string's
// worth of slack.
func TestCallSize(t *testing.T) {
	const class = 2048 // a Go size class
	const header = 8   // the runtime's, before an object of over 512 bytes with pointers
	if n := unsafe.Sizeof(Call{}) + header; n > class || class-n >= 16 {
		t.Errorf("a Call is %d bytes with its header: set mediaRoom so that it is %d (at most 15 less)", n, class)
	}
	// What the runtime takes for one.
	keep := make([]*Call, 1000)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range keep {
		keep[i] = new(Call)
	}
	runtime.ReadMemStats(&after)
	// (Other goroutines may allocate a little meanwhile; the next size
	// class is 2,304.)
	if per := (after.TotalAlloc - before.TotalAlloc) / uint64(len(keep)); per < class || per >= class+64 {
		t.Errorf("a Call takes %d bytes of heap, want %d", per, class)
	}
	runtime.KeepAlive(keep)
}

// TestKeep: the call's strings are in its own allocation while there is
// room, the same bytes for a string it has, a copy of its own after.
func TestKeep(t *testing.T) {
	c := newTable(t, dataplanetest.New(dataplane.PathXDP)).New(netip.AddrPort{}, "sip:alice@198.18.0.1", "")
	inCall := func(s string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		base := uintptr(unsafe.Pointer(c))
		return p >= base && p < base+unsafe.Sizeof(*c)
	}
	if !inCall(c.ID) || !inCall(c.From) {
		t.Error("the call's ID and From are not in its allocation")
	}
	k := c.Keep(strings.Clone("198.18.0.1:5060"))
	if k != "198.18.0.1:5060" || !inCall(k) {
		t.Errorf("Keep returned %q (in the call: %v)", k, inCall(k))
	}
	used := c.media.roomUsed
	if k2 := c.Keep(strings.Clone("198.18.0.1")); !inCall(k2) || c.media.roomUsed != used {
		t.Errorf("a string the call has was kept again (%d bytes used, were %d)", c.media.roomUsed, used)
	}
	if c.Keep("") != "" {
		t.Error("Keep of an empty string")
	}
	sdp := c.media.keepBytes([]byte("v=0\r\no=- 1 1 IN IP4 198.18.1.1\r\n"))
	if in := inCall(unsafe.String(&sdp[0], len(sdp))); !in || cap(sdp) != len(sdp) {
		t.Errorf("kept bytes: in the call %v, cap %d for %d bytes (an append would write the room)", in, cap(sdp), len(sdp))
	}
	// What does not fit is a copy of its own, which cannot grow either.
	big := bytes.Repeat([]byte("x"), mediaRoom-c.media.roomUsed+1)
	if b := c.media.keepBytes(big); inCall(unsafe.String(&b[0], len(b))) || !bytes.Equal(b, big) || cap(b) != len(b) {
		t.Errorf("%d bytes over the room: in the call %v, cap %d", len(b), inCall(unsafe.String(&b[0], len(b))), cap(b))
	}
	var last string
	for i := 0; i < mediaRoom; i++ {
		last = c.Keep(fmt.Sprintf("tag-%04d", i))
		if last != fmt.Sprintf("tag-%04d", i) {
			t.Fatalf("Keep returned %q", last)
		}
	}
	if inCall(last) {
		t.Error("a string beyond the room is in the call")
	}
	if !inCall(c.ID) || c.From != "sip:alice@198.18.0.1" || k != "198.18.0.1:5060" {
		t.Error("the strings kept first changed")
	}
}
