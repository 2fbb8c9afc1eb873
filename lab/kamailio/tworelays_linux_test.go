package kamailio

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// Two relays behind one Kamailio: relay A in the relay namespace, ng over
// loopback, relay B in relay2, ng over the link between them. The module
// picks a node for a new call by a hash of the Call-ID over the enabled
// nodes' weights, and keeps the call on it (its hash table) for the answer
// and the delete.

// twoRelays starts A and B (with specs changed by mod) and Kamailio in
// front of them with weights wa and wb.
func twoRelays(t testing.TB, k relayKind, o Options, wa, wb int, mod func(a, b *relaySpec)) (p *proxy, a, b mediaRelay) {
	t.Helper()
	l := lab.NewT(t)
	sa, sb := relayA(l), relayB(t, l)
	if mod != nil {
		mod(&sa, &sb)
	}
	a, b = k.start(t, l, sa), k.start(t, l, sb)
	return newProxy(t, l, o, []mediaRelay{a, b}, wa, wb), a, b
}

// nodeOf returns the Call-IDs whose OFFER line in Kamailio's log names
// the node at the relay r, among those that start with tag.
func nodeOf(k *Kamailio, tag string) map[string]string {
	out := map[string]string{}
	for _, line := range k.Lines("OFFER ci=" + tag + "-") {
		f := strings.Fields(line[strings.Index(line, "OFFER ci="):])
		if len(f) >= 3 {
			out[strings.TrimPrefix(f[1], "ci=")] = strings.TrimPrefix(f[2], "node=")
		}
	}
	return out
}

func sockOf(r mediaRelay) string { return "udp:" + r.NGAddr().String() }

// whileUp places c's calls in the background and, after wait, lists each
// relay's calls once all of them are up (or 3 s later); done waits for the
// calls to end and checks they all completed.
func (p *proxy) whileUp(t testing.TB, c call, wait time.Duration, relays ...mediaRelay) (lists [][]string, done func() sippRun) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	uasWait := func() sippRun { return sippRun{Stats: map[string]string{"SuccessfulCall(C)": itoa(c.n)}} }
	if !c.noUAS {
		uasWait = p.runUAS(t, ctx, c.n, p.uasBody(c))
	}
	uacc := make(chan sippRun, 1)
	go func() { uacc <- p.runUAC(t, ctx, c) }()
	time.Sleep(wait)
	// Until every call is up on some relay, or 3 s more.
	for deadline := time.Now().Add(3 * time.Second); len(relays) > 0; time.Sleep(100 * time.Millisecond) {
		lists = lists[:0]
		total := 0
		for _, r := range relays {
			ids := calls(t, r)
			lists = append(lists, ids)
			total += len(ids)
		}
		if total >= c.n || time.Now().After(deadline) {
			break
		}
	}
	return lists, func() sippRun {
		defer cancel()
		uac, uas := <-uacc, uasWait()
		if ok, _ := uac.calls(); ok != itoa(c.n) {
			t.Errorf("caller: %s successful calls, want %d: %v", ok, c.n, uac)
		}
		if ok, _ := uas.calls(); ok != itoa(c.n) {
			t.Errorf("callee: %s successful calls, want %d: %v", ok, c.n, uas)
		}
		return uac
	}
}

// TestWeights: with weights 2 and 1, A anchors about twice as many calls
// as B; each caller sees the media address of the relay that lists its
// call.
func TestWeights(t *testing.T) {
	eachRelay(t, func(t *testing.T, k relayKind) {
		p, a, b := twoRelays(t, k, Options{}, 2, 1, nil)
		const n = 12
		lists, done := p.whileUp(t, call{n: n, hold: 2 * time.Second}, 1500*time.Millisecond, a, b)
		uac := done()
		onA, onB := lists[0], lists[1]
		t.Logf("A has %d calls, B %d", len(onA), len(onB))
		if len(onA)+len(onB) != n || len(onB) == 0 || len(onA) <= len(onB) {
			t.Errorf("calls on A %d, on B %d: want %d in all, more on A (weight 2) than on B (weight 1), some on B", len(onA), len(onB), n)
		}
		sdps := checkSDPs(t, "caller, 200", uac.sdps("200"), n, a.Media4(), b.Media4())
		for _, set := range []struct {
			ids []string
			r   mediaRelay
		}{{onA, a}, {onB, b}} {
			for _, id := range set.ids {
				if s, ok := sdps[id]; !ok || s.Conn != set.r.Media4().String() {
					t.Errorf("call %s on relay %s: the caller saw %+v", id, set.r.NGAddr(), s)
				}
			}
		}
		checkRTPStats(t, p.k, "kam", n, mediaPackets)
		checkFastPath(t, a, float64(len(onA)*mediaPackets))
		checkFastPath(t, b, float64(len(onB)*mediaPackets))
		waitNoCalls(t, a)
		waitNoCalls(t, b)
	})
}

// TestLoadLimit: A refuses every call with "load limit"; Kamailio tries B
// for each, and every call completes there.
func TestLoadLimit(t *testing.T) {
	eachRelay(t, func(t *testing.T, k relayKind) {
		p, a, b := twoRelays(t, k, Options{}, 5, 1, func(a, _ *relaySpec) { a.MaxSessions = -1 })
		const n = 4
		lists, done := p.whileUp(t, call{n: n, hold: 1500 * time.Millisecond}, 1000*time.Millisecond, a, b)
		done()
		if len(lists[0]) != 0 || len(lists[1]) != n {
			t.Errorf("calls on A %q, on B %q: want all %d on B", lists[0], lists[1], n)
		}
		for id, node := range nodeOf(p.k, "kam") {
			if node != sockOf(b) {
				t.Errorf("call %s offered to %s, want B %s", id, node, sockOf(b))
			}
		}
		if len(p.k.Lines("load limit")) == 0 {
			t.Errorf("Kamailio did not log A's load limit:\n%s", p.k.Log())
		}
		checkRTPStats(t, p.k, "kam", n, mediaPackets/2)
		checkFastPath(t, b, n*mediaPackets/2)
		waitNoCalls(t, a)
		waitNoCalls(t, b)
	})
}

// TestFailover: A is killed during calls. The next new call that hashes
// to A times out there; Kamailio disables A and sends it, and every call
// after it, to B; B's calls go on undisturbed. Once A runs again and the
// disable timeout has passed, Kamailio pings it, enables it and gives it
// new calls again.
func TestFailover(t *testing.T) {
	eachRelay(t, func(t *testing.T, k relayKind) {
		o := Options{DisableTimeout: 2, TimeoutMS: 200, Retries: 1, Children: 1}
		p, a, b := twoRelays(t, k, o, 1, 1, nil)

		// One callee for phases 1 and 2.
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		defer cancel()
		uasWait := p.runUAS(t, ctx, 10, p.uasBody(call{}))

		// Phase 1: calls on both relays, held across the kill.
		lists, done1 := p.whileUp(t, call{n: 6, hold: 4500 * time.Millisecond, cidTag: "p1", noUAS: true}, 1200*time.Millisecond, a, b)
		if len(lists[0]) == 0 || len(lists[1]) == 0 {
			t.Fatalf("calls on A %q, on B %q: want some on each", lists[0], lists[1])
		}
		a.Kill(t)
		killed := time.Now()

		// Phase 2, while phase 1 still runs: new calls, from another port.
		_, done2 := p.whileUp(t, call{n: 4, hold: 1000 * time.Millisecond, cidTag: "p2", port: 5082, noUAS: true}, 0)
		done2()
		for id, node := range nodeOf(p.k, "p2") {
			if node != sockOf(b) {
				t.Errorf("call %s after A died offered to %s, want B %s", id, node, sockOf(b))
			}
		}
		if got := len(nodeOf(p.k, "p2")); got != 4 {
			t.Errorf("%d of 4 calls after A died got media: %v", got, nodeOf(p.k, "p2"))
		}
		done1()
		if uas := uasWait(); uas.Stats["SuccessfulCall(C)"] != "10" {
			t.Errorf("callee of phases 1 and 2: %v", uas)
		}
		// B's phase 1 calls: 2 s of audio each way, complete.
		stats := checkRTPStatsOn(t, p.k, "p1", lists[1])
		for _, id := range lists[0] {
			if s, ok := stats[id]; ok && s.OK && s.Node == sockOf(a) {
				t.Errorf("call %s on the dead A has counters %+v", id, s)
			}
		}

		// Phase 3: A back. Once the disable timeout has passed, the next
		// call's node selection pings A and enables it. A worker whose UDP
		// socket to A took an ICMP port unreachable while A was down fails its
		// next send to A with that stale ECONNREFUSED and disables A again for
		// another disable timeout (Kamailio 5.6): with one worker (Children: 1)
		// this costs at most one more round. Short calls until one is offered
		// and answered on A.
		a.Restart(t)
		deadline := killed.Add(3*time.Duration(o.DisableTimeout)*time.Second + 2*time.Second)
		for round := 0; ; round++ {
			time.Sleep(500 * time.Millisecond)
			tag := "p3r" + itoa(round)
			_, done := p.whileUp(t, call{n: 2, hold: 300 * time.Millisecond, cidTag: tag}, 0)
			done()
			back := false
			for id, node := range nodeOf(p.k, tag) {
				back = back || node == sockOf(a) && len(p.k.Lines("ANSWER ci="+id+" node="+sockOf(a))) == 1
			}
			if back {
				t.Logf("A took calls again %v after it was killed, %d rounds after its restart", time.Since(killed).Round(100*time.Millisecond), round+1)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("A restarted but got no call %v after it was killed:\n%s", time.Since(killed), strings.Join(p.k.Lines("rtpengine"), "\n"))
			}
		}

		// Phase 4: both relays share the calls again, media and all.
		lists, done4 := p.whileUp(t, call{n: 6, hold: 2 * time.Second, cidTag: "p4"}, 1500*time.Millisecond, a, b)
		done4()
		t.Logf("after A's return: A has %d calls, B %d", len(lists[0]), len(lists[1]))
		if len(lists[0]) == 0 || len(lists[1]) == 0 {
			t.Errorf("after A's return: calls on A %q, on B %q; want some on each", lists[0], lists[1])
		}
		checkRTPStats(t, p.k, "p4", 6, mediaPackets)
		for _, id := range calls(t, a) {
			if strings.HasPrefix(id, "p4-") {
				t.Errorf("A still lists %s after its BYE", id)
			}
		}
		waitNoCalls(t, b)
		t.Logf("the module's messages:\n%s", strings.Join(p.k.Lines("rtpengine ["), "\n"))
	})
}

// checkRTPStatsOn checks the $rtpstat lines of the calls ids: full media,
// no errors.
func checkRTPStatsOn(t testing.TB, k *Kamailio, tag string, ids []string) map[string]RTPStat {
	t.Helper()
	all := map[string]RTPStat{}
	for _, s := range k.RTPStats() {
		if strings.HasPrefix(s.CallID, tag+"-") {
			all[s.CallID] = s
		}
	}
	for _, id := range ids {
		s, ok := all[id]
		if !ok || !s.OK || s.RTP.Packets < mediaPackets || s.RTP.Errors != 0 {
			t.Errorf("call %s on the surviving relay: $rtpstat %+v (logged %v), want >= %d packets, no errors", id, s, ok, mediaPackets)
		}
	}
	return all
}

func itoa(n int) string { return strconv.Itoa(n) }
