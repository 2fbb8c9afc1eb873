package fastpath

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/rtp"
)

type rtpStep struct {
	ssrc uint32
	seq  uint16
}

func seqRun(ssrc uint32, from, n int) []rtpStep {
	var s []rtpStep
	for i := 0; i < n; i++ {
		s = append(s, rtpStep{ssrc, uint16(from + i)})
	}
	return s
}

func concat(parts ...[]rtpStep) []rtpStep {
	var s []rtpStep
	for _, p := range parts {
		s = append(s, p...)
	}
	return s
}

// TestXDPRTPStatistics feeds crafted sequences through the program packet
// by packet and compares its per-flow RFC 3550 state, after every packet,
// with rtp.ReceiverStats fed the same packets at the same arrival times:
// for a flow open to any source, whose slot the program writes under its
// spin lock, and for one that takes a single source, written without.
func TestXDPRTPStatistics(t *testing.T) {
	bothStatsPaths(t, func(t *testing.T, j int, expect netip.AddrPort) {
		testXDPRTPStatistics(t, uint16(34000+2000*j), expect)
	})
}

// bothStatsPaths runs f, as subtests, for a flow open to any source (the
// program writes its statistics under the slot's spin lock) and for one
// that takes the test packets' one source, caller4:4000 (written
// without); j numbers them.
func bothStatsPaths(t *testing.T, f func(t *testing.T, j int, expect netip.AddrPort)) {
	for j, src := range []struct {
		name   string
		expect netip.AddrPort
	}{{"open", netip.AddrPort{}}, {"one source", ap(caller4, 4000)}} {
		t.Run(src.name, func(t *testing.T) { f(t, j, src.expect) })
	}
}

// checkStatsPath fails t when the flags of a flow installed with source
// expect do not name the statistics path bothStatsPaths meant.
func checkStatsPath(t *testing.T, flags uint8, expect netip.AddrPort) {
	t.Helper()
	oneSource := uint8(relayFlowFlagsFLOW_F_EXPECT_ADDR | relayFlowFlagsFLOW_F_EXPECT_PORT)
	if got := flags&oneSource == oneSource; got != expect.IsValid() {
		t.Fatalf("flags %#x: one source %v, want %v", flags, got, expect.IsValid())
	}
}

func testXDPRTPStatistics(t *testing.T, port0 uint16, expect netip.AddrPort) {
	e := newTestEnv(t)
	for i, tc := range []struct {
		name  string
		clock uint32
		steps []rtpStep
	}{
		{"in order", 8000, seqRun(1, 1000, 60)},
		{"loss", 8000, concat(seqRun(1, 1, 10), seqRun(1, 15, 10), seqRun(1, 40, 5))},
		{"reordering", 8000, []rtpStep{{1, 10}, {1, 12}, {1, 11}, {1, 13}, {1, 16}, {1, 14}, {1, 15}, {1, 17}}},
		{"duplicates", 8000, []rtpStep{{1, 20}, {1, 20}, {1, 21}, {1, 22}, {1, 22}, {1, 22}, {1, 23}}},
		{"wrap at 65535", 8000, concat(seqRun(1, 65525, 11), seqRun(1, 0, 10), []rtpStep{{1, 65534}}, seqRun(1, 10, 3))},
		{"large jump and resync", 8000, concat(seqRun(1, 100, 5), []rtpStep{{1, 9000}}, seqRun(1, 105, 2), []rtpStep{{1, 20000}, {1, 20001}}, seqRun(1, 20002, 5))},
		{"ssrc change", 48000, concat(seqRun(1, 500, 8), seqRun(2, 7, 8), seqRun(1, 508, 3))},
		{"jump back beyond misorder", 8000, concat(seqRun(1, 5000, 5), []rtpStep{{1, 4000}}, seqRun(1, 5005, 3))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fl := dataplane.Flow{
				Match: ap(relay4, port0+uint16(4*i)), SendFrom: ap(relay4, port0+uint16(4*i+2)),
				SendTo: ap(callee4, 5000), ClockRate: tc.clock, ExpectSource: expect,
				// A cap that takes the bucket's code path and refuses
				// nothing: the statistics must be as without it.
				RateCap: dataplane.RateCap{PPS: 1000, Burst: 1000},
			}
			if err := e.fp.Install(fl); err != nil {
				t.Fatal(err)
			}
			var val relayFlowValue
			if err := e.fp.objs.Flows.Lookup(keyOf(fl.Match), &val); err != nil {
				t.Fatal(err)
			}
			checkStatsPath(t, val.Flags, expect)
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			var ref rtp.ReceiverStats
			for n, s := range tc.steps {
				// Timestamps with irregular offsets so jitter is not zero.
				ts := uint32(s.seq)*160 + uint32(rng.IntN(400))
				frame := buildFrame(ap(caller4, 4000), fl.Match, rtpPacket(s.ssrc, s.seq, ts, 160), frameOpts{})
				if v, _ := e.run(t, frame); v != xdpRedirect {
					t.Fatalf("packet %d: verdict %s", n, verdictName[v])
				}
				var raw relayFlowStats
				if err := e.fp.objs.Stats.LookupWithFlags(val.StatsIdx, &raw, ebpf.LookupLock); err != nil {
					t.Fatal(err)
				}
				arrival := dataplane.ArrivalTicks(raw.LastSeenNs-raw.RtpBaseNs, dataplane.TicksMult(tc.clock))
				ref.Update(s.ssrc, s.seq, ts, arrival)
				got := rtp.ReceiverStats{
					SSRC: raw.Ssrc, BaseSeq: raw.BaseSeq, MaxSeq: raw.MaxSeq, Cycles: raw.Cycles,
					BadSeq: raw.BadSeq, Received: raw.Received, Jitter16: raw.Jitter16,
					LastTransit: raw.LastTransit, HaveTransit: raw.HaveTransit != 0,
					SSRCChanges: raw.SsrcChanges, Initialized: raw.Initialized != 0,
				}
				if got != ref {
					t.Fatalf("after packet %d (ssrc %d seq %d):\n XDP %+v\n ref %+v", n, s.ssrc, s.seq, got, ref)
				}
			}
			st, err := e.fp.Stats(fl.Match)
			if err != nil {
				t.Fatal(err)
			}
			if st.Lost != ref.Lost() || st.Jitter != ref.Jitter() || st.ExtHighestSeq != ref.ExtendedMax() || st.Packets != uint64(len(tc.steps)) {
				t.Errorf("stats %+v; reference lost %d jitter %d ext max %d", st, ref.Lost(), ref.Jitter(), ref.ExtendedMax())
			}
			t.Logf("packets %d received %d lost %d jitter %d (%.3f ms) ext max %d ssrc changes %d",
				st.Packets, st.Received, st.Lost, st.Jitter, st.JitterMillis(tc.clock), st.ExtHighestSeq, st.SSRCChanges)
		})
	}
}
