package fwpair

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// waitSingleMaster polls Master until fw holds both VIPs alone.
func waitSingleMaster(t *testing.T, p *Pair, fw int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m, err := p.Master()
		if err == nil && m == fw {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fw%d does not hold the VIPs alone after %v: master %d, %v", fw+1, timeout, m+1, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rxOn returns the packets fw's interface ifname has received.
func rxOn(t *testing.T, p *Pair, fw int, ifname string) uint64 {
	t.Helper()
	c, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c[fw][ifname].RxPackets
}

// TestFailoverConntrackd: with conntrackd, a WAN-to-LAN stream that lives
// on the state a LAN packet opened survives each failure of the master
// through fw2, and the recovery back to fw1.
func TestFailoverConntrackd(t *testing.T) {
	p := newPairT(t, Config{Conntrackd: true, VRRPVersion: 3, Advert: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	for i, tc := range []struct {
		kind   Failure
		maxGap time.Duration // of the failover
	}{
		{StopKeepalived, 100 * time.Millisecond},
		{CutLinks, 500 * time.Millisecond},
		{LowerPriority, 500 * time.Millisecond},
		{KillDaemons, 1000 * time.Millisecond},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			waitSingleMaster(t, p, 0, 3*time.Second)
			lan := netip.AddrPortFrom(p.LANAddrs[0], uint16(20000+2*i))
			wan := netip.AddrPortFrom(p.WANAddrs[0], uint16(30000+2*i))
			s := startStream(t, p.WAN, p.LAN, wan, lan, 1000, opened)
			time.Sleep(400 * time.Millisecond) // conntrackd replicates the flow
			if r := s.analyze(time.Now().Add(-200 * time.Millisecond)); r.received < 150 {
				t.Fatalf("before the failure: %d packets in 200 ms, want about 200", r.received)
			}
			fw2rx := rxOn(t, p, 1, WANIfName)
			at, err := p.Fail(ctx, tc.kind)
			if err != nil {
				t.Fatal(err)
			}
			mt, err := p.WaitMaster(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(800 * time.Millisecond)
			r := s.analyze(at)
			t.Logf("%v: fw2 master after %v; stream gap %v (from %v after the failure), %d of %d packets, recovered %t",
				tc.kind, mt.Sub(at).Round(time.Millisecond), r.gap.Round(time.Millisecond), r.gapStart.Sub(at).Round(time.Millisecond),
				r.received, int(time.Since(at)/time.Millisecond), r.recovered)
			if !r.recovered {
				t.Errorf("%v: the stream did not recover", tc.kind)
			} else if r.gap > tc.maxGap {
				t.Errorf("%v: gap %v, want under %v", tc.kind, r.gap, tc.maxGap)
			}
			if d := rxOn(t, p, 1, WANIfName) - fw2rx; d < 400 {
				t.Errorf("%v: fw2's wan received %d packets after the failure: the stream did not move to fw2", tc.kind, d)
			}

			rt, err := p.Recover(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mt, err = p.WaitMaster(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			waitSingleMaster(t, p, 0, 3*time.Second)
			time.Sleep(500 * time.Millisecond)
			r = s.analyze(rt)
			t.Logf("%v recovered: fw1 master again after %v; stream gap %v, recovered %t",
				tc.kind, mt.Sub(rt).Round(time.Millisecond), r.gap.Round(time.Millisecond), r.recovered)
			if !r.recovered {
				t.Errorf("%v: the stream did not survive the move back to fw1", tc.kind)
			} else if r.gap > 500*time.Millisecond {
				t.Errorf("%v: moving back to fw1: gap %v, want under 500ms", tc.kind, r.gap)
			}
			s.close()
		})
	}
}

// TestFailoverNoConntrackd: without state replication a stream that lives
// on state fw1 made does not survive the failover, while a stream both
// ways (the LAN keeps sending, so fw2 sees it as a new flow from the LAN)
// does.
func TestFailoverNoConntrackd(t *testing.T) {
	p := newPairT(t, Config{Advert: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	one := startStream(t, p.WAN, p.LAN, netip.AddrPortFrom(p.WANAddrs[0], 7000), netip.AddrPortFrom(p.LANAddrs[0], 7001), 1000, opened)
	both := startStream(t, p.WAN, p.LAN, netip.AddrPortFrom(p.WANAddrs[0], 7002), netip.AddrPortFrom(p.LANAddrs[0], 7003), 1000, bothWays)
	time.Sleep(300 * time.Millisecond)
	for name, s := range map[string]*stream{"one-way": one, "both ways": both} {
		if r := s.analyze(time.Now().Add(-200 * time.Millisecond)); r.received < 150 {
			t.Fatalf("%s before the failure: %d packets in 200 ms, want about 200", name, r.received)
		}
	}
	at, err := p.Fail(ctx, StopKeepalived)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitMaster(ctx, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	r1, r2 := one.analyze(at), both.analyze(at)
	t.Logf("one-way: gap %v, recovered %t; both ways: gap %v, recovered %t", r1.gap.Round(time.Millisecond), r1.recovered, r2.gap.Round(time.Millisecond), r2.recovered)
	if r1.recovered {
		t.Errorf("the one-way stream recovered without conntrackd (%d packets after the failure)", r1.received)
	}
	if !r2.recovered {
		t.Errorf("the stream both ways did not recover")
	}
}
