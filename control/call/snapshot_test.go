package call

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
	"github.com/relayd/relayd/sdes"
)

// TestSnapshotRestore: a call with a plain stream (XDP) and an SRTP
// stream (userspace) goes through JSON and a new table over the same XDP
// data plane and a fresh userspace one, as across a restart.
func TestSnapshotRestore(t *testing.T) {
	xdp, us := dataplanetest.New(dataplane.PathXDP), dataplanetest.New(dataplane.PathUserspace)
	tb := newTable(t, xdp, us)
	c := tb.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:a@x", "sip:b@y")
	c.SetLeg(A, Leg{CallID: "a-call", FromTag: "fa", ToTag: "ta"})
	c.SetLeg(B, Leg{CallID: "b-call", FromTag: "fb", ToTag: "tb"})
	c.SetRoute("r")
	c.AddAttempt(Attempt{Destination: "sip:198.18.2.2", Code: 200, Result: "answered"})
	c.SetState(StateAnswered)
	callerKey, _ := sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80)
	relayKey, _ := sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80)
	for i := range 2 {
		if err := c.Media.Ensure(i, relay4, relay4); err != nil {
			t.Fatal(err)
		}
		c.Media.Edit(i, func(st *Stream) {
			st.Ends[A].RTP = netip.AddrPortFrom(callerIP, uint16(4000+10*i))
			st.Ends[A].RTCP = netip.AddrPortFrom(callerIP, uint16(4001+10*i))
			st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, uint16(6000+10*i))
			st.Ends[B].RTCP = netip.AddrPortFrom(calleeIP, uint16(6001+10*i))
			if i == 1 {
				st.Ends[A].Recv, st.Ends[A].Send = callerKey, relayKey
			}
		})
	}
	if err := c.Media.Sync(); err != nil {
		t.Fatal(err)
	}
	if xdp.Len() != 4 || us.Len() != 4 {
		t.Fatalf("%d xdp, %d userspace flows", xdp.Len(), us.Len())
	}
	streams := c.Media.Streams()
	aRTP := netip.AddrPortFrom(relay4, streams[0].Ends[A].Port)
	srtpIn := netip.AddrPortFrom(relay4, streams[1].Ends[A].Port)
	if err := c.Media.latched(aRTP, netip.MustParseAddrPort("198.18.0.2:4444"), true); err != nil {
		t.Fatal(err)
	}
	// The SRTP stream from the caller passed two rollovers; the XDP flow
	// counted 300 packets (pinned counters: they survive).
	us.SetStats(srtpIn, dataplane.Stats{Packets: 500, Bytes: 100000, SSRC: 0xabc, Received: 500, ExtHighestSeq: 2<<16 | 7})
	xdp.SetStats(aRTP, dataplane.Stats{Packets: 300, Bytes: 60000})
	before := map[netip.AddrPort]dataplane.Flow{}
	for _, d := range []*dataplanetest.DataPlane{xdp, us} {
		l, _ := d.List()
		for _, fs := range l {
			before[fs.Flow.Match] = fs.Flow
		}
	}
	snap := c.Snapshot()
	data, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	var back Snapshot
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}

	// The restart: a new table, the XDP flows still there, the
	// userspace ones gone.
	us2 := dataplanetest.New(dataplane.PathUserspace)
	tb2 := newTable(t, xdp, us2)
	installs := xdp.Calls("Install")
	c2, err := tb2.Restore(back)
	if err != nil {
		t.Fatal(err)
	}
	if c2.ID != c.ID || c2.State() != StateAnswered || c2.Leg(B) != c.Leg(B) || tb2.Len() != 1 {
		t.Errorf("restored call %+v", c2.Info())
	}
	if xdp.Calls("Install") != installs || xdp.Len() != 4 || us2.Len() != 4 {
		t.Errorf("after restore: %d XDP installs, %d xdp and %d userspace flows; want XDP flows adopted, userspace ones back",
			xdp.Calls("Install")-installs, xdp.Len(), us2.Len())
	}
	l, _ := us2.List()
	for _, fs := range l {
		b := before[fs.Flow.Match]
		if b.ID != fs.Flow.ID || !b.Decrypt.Equal(fs.Flow.Decrypt) || !b.Encrypt.Equal(fs.Flow.Encrypt) {
			t.Errorf("userspace flow %s restored as %+v, was %+v", fs.Flow.Match, fs.Flow, b)
		}
		if fs.Flow.Match == srtpIn && (fs.Flow.Decrypt.SSRC != 0xabc || fs.Flow.Decrypt.ROC != 2) {
			t.Errorf("SRTP flow restored with SSRC %#x ROC %d, want 0xabc and 2", fs.Flow.Decrypt.SSRC, fs.Flow.Decrypt.ROC)
		}
	}
	xl, _ := xdp.List()
	for _, fs := range xl {
		if fs.Flow.Match == aRTP && fs.Flow.ExpectSource != netip.MustParseAddrPort("198.18.0.2:4444") {
			t.Errorf("latched flow after restore: %+v", fs.Flow)
		}
	}
	if got := tb2.Matches(); len(got) != 8 {
		t.Errorf("the restored call owns %d flows, want 8", len(got))
	}
	// Its ports are taken: a new call gets others.
	n := tb2.New(netip.AddrPort{}, "", "")
	n.Media.Ensure(0, relay4, relay4)
	for _, st := range streams {
		for _, e := range st.Ends {
			if e.Port == n.Media.Streams()[0].Ends[A].Port || e.Port == n.Media.Streams()[0].Ends[B].Port {
				t.Errorf("port %d of the restored call given to a new one", e.Port)
			}
		}
	}
	n.End(Failed, 0, "")
	// Counters the restart reset come back in the final statistics.
	c2.End(Answered, 200, "")
	info := c2.Info()
	for _, f := range info.Flows {
		switch f.Match {
		case srtpIn.String():
			if f.Packets != 500 {
				t.Errorf("SRTP flow %d packets at the end, want the 500 of before the restart", f.Packets)
			}
		case aRTP.String():
			if f.Packets != 300 {
				t.Errorf("XDP flow %d packets at the end, want 300", f.Packets)
			}
		}
	}
	if xdp.Len() != 0 || us2.Len() != 0 {
		t.Errorf("%d xdp, %d userspace flows left after the end", xdp.Len(), us2.Len())
	}
}

func TestDetachLeavesFlows(t *testing.T) {
	xdp := dataplanetest.New(dataplane.PathXDP)
	tb := newTable(t, xdp)
	c := tb.New(netip.AddrPort{}, "", "")
	c.Media.Ensure(0, relay4, relay4)
	c.Media.Edit(0, func(st *Stream) {
		st.Ends[A].RTP = netip.AddrPortFrom(callerIP, 4000)
		st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 6000)
	})
	c.Media.Sync()
	if !c.Detach() {
		t.Fatal("Detach of a live call")
	}
	if c.End(Answered, 200, "") {
		t.Error("End after Detach ended the call")
	}
	if xdp.Len() != 2 || len(tb.Matches()) != 0 {
		t.Errorf("after Detach: %d flows in the data plane (want 2), %d owned (want 0)", xdp.Len(), len(tb.Matches()))
	}
}

func TestNewAfterRestoreGetsFreshID(t *testing.T) {
	tb := newTable(t, dataplanetest.New(dataplane.PathXDP))
	probe := tb.New(netip.AddrPort{}, "", "") // the ID the next run's first call would get
	id := probe.ID
	tb2 := newTable(t, dataplanetest.New(dataplane.PathXDP))
	if _, err := tb2.Restore(Snapshot{ID: id, Created: probe.Created, State: StateAnswered}); err != nil {
		t.Fatal(err)
	}
	if c := tb2.New(netip.AddrPort{}, "", ""); c.ID == id || tb2.Len() != 2 {
		t.Errorf("new call got the restored call's id %s (%d calls)", c.ID, tb2.Len())
	}
	if _, err := tb2.Restore(Snapshot{ID: id}); err == nil {
		t.Error("a call restored twice")
	}
}

// TestResumeAt: a restored transcoding flow's output continues from its
// last position, moved on by the time since: timestamps at 8 kHz, the
// sequence by the packets its ptime allows plus the margin, the cycles
// carried.
func TestResumeAt(t *testing.T) {
	at := time.Unix(1000, 0)
	f := FlowSnapshot{OutSeq: 2<<16 | 0xfff0, OutTS: 0xffffff00, OutAt: at.UnixNano()}
	r := resumeAt(f, 20, at.Add(3*time.Second))
	const wantTS = 24000 - 0x100 // wrapped
	if !r.Valid || r.Seq != f.OutSeq+150+resumeMargin || r.Timestamp != wantTS {
		t.Errorf("after 3 s at 20 ms: %+v; want seq %#x, ts %#x", r, f.OutSeq+150+resumeMargin, wantTS)
	}
	if r.Seq>>16 != 3 {
		t.Errorf("cycles %d, want 3 (the rollover carried)", r.Seq>>16)
	}
	// A clock that went back does not move the stream back.
	if r := resumeAt(f, 30, at.Add(-time.Second)); r.Seq != f.OutSeq+resumeMargin || r.Timestamp != f.OutTS {
		t.Errorf("clock went back: %+v, want the position plus the margin", r)
	}
}

// Compact leaves a call's attempts as they were, in an array of their
// own length.
func TestCallCompact(t *testing.T) {
	tb := newTable(t, dataplanetest.New(dataplane.PathXDP))
	c := tb.New(netip.MustParseAddrPort("198.18.0.2:5060"), "sip:a@x", "sip:b@y")
	t.Cleanup(func() { c.End(Hangup, 0, "") })
	var want []Attempt
	for i, code := range []int{503, 503, 200} {
		a := Attempt{Destination: fmt.Sprintf("sip:198.18.2.2:%d", 5060+2*i), Code: code, Result: "failed"}
		c.AddAttempt(a)
		want = append(want, a)
	}
	before := c.attempts
	c.Compact()
	if !slices.Equal(c.Snapshot().Attempts, want) {
		t.Errorf("attempts after Compact: %+v, want %+v", c.Snapshot().Attempts, want)
	}
	if cap(c.attempts) != len(want) || &c.attempts[0] == &before[0] {
		t.Errorf("after Compact: capacity %d (want %d), the same array: %v", cap(c.attempts), len(want), &c.attempts[0] == &before[0])
	}
}
