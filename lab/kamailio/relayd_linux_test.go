package kamailio

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/labrelay"
	"github.com/relayd/relayd/lab/rtpengine"
	"github.com/relayd/relayd/lab/rtpengine/ngclient"
)

// relaydRelay is relayd, its ng front end in place of rtpengine's, its
// RTP forwarded by XDP on the namespace's interfaces toward the parties:
// the relay's two veths, or relay2's one link (where XDP sends the
// rewritten frame back out of the interface it came in on).
type relaydRelay struct {
	l      *lab.Lab
	spec   relaySpec
	r      *labrelay.Relay
	client *ngclient.Client
}

// placeholderCallID is the call a relay refusing every call (MaxSessions
// -1) carries itself: relayd has no "no calls at all" setting, so it gets
// [media] max_sessions = 1 and this call takes the one session; every
// call Kamailio offers then meets the session limit, which ng answers as
// "load limit". Calls leaves it out.
const placeholderCallID = "lab-placeholder@relayd"

func startRelayd(t testing.TB, l *lab.Lab, s relaySpec) mediaRelay {
	t.Helper()
	o := labrelay.Options{
		Dir: t.TempDir(), NS: s.NS, Media4: s.Media4, Media6: s.Media6,
		Ports: "30000-" + strconv.Itoa(cmp.Or(s.PortMax, 30999)), LogLevel: "info",
	}
	ng := fmt.Sprintf("[ng]\nlisten = [%q]\n", "udp:"+s.NGAddr.String())
	if !s.NGAddr.Addr().IsLoopback() {
		// Kamailio sends from the relay's end of the link.
		ng += fmt.Sprintf("allow = [%q]\n", netip.PrefixFrom(s.NGAddr.Addr(), 24).Masked().String())
	}
	if s.Keep {
		ng += fmt.Sprintf("[state]\npath = %q\n", o.Dir+"/state.db")
		// A flow still latching is relayed in userspace: its media waits
		// for the new relayd. The restart test kills relayd after the
		// sources are locked, when XDP alone carries the media.
		o.ExtraMedia += "\nlatch_window = \"300ms\"\n"
	}
	o.Extra = ng
	switch {
	case s.MaxSessions > 0:
		o.ExtraMedia += "\n" + "max_sessions = " + strconv.Itoa(s.MaxSessions)
	case s.MaxSessions < 0:
		o.ExtraMedia += "\nmax_sessions = 1"
	}
	if s.NS == l.Relay2 {
		o.Interfaces = []string{lab.Relay2IfName}
		// XDP_TX back into b0 lands in the relay's r3: it delivers
		// frames XDP sends only with GRO on. bpf_fib_lookup wants
		// forwarding on in relay2.
		for _, k := range []struct {
			ns   *lab.NS
			name string
		}{{l.Relay, lab.RelayRelay2IfName}, {l.Relay2, lab.Relay2IfName}} {
			if err := k.ns.SetGRO(k.name, true); err != nil {
				t.Fatal(err)
			}
		}
		for _, key := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/ipv6/conf/" + lab.Relay2IfName + "/forwarding"} {
			if err := l.Relay2.SetSysctl(key, "1"); err != nil {
				t.Fatal(err)
			}
		}
	}
	r, err := labrelay.New(l, o)
	if err != nil {
		t.Fatal(err)
	}
	d := &relaydRelay{l: l, spec: s, r: r}
	t.Cleanup(func() {
		if d.client != nil {
			d.client.Close()
		}
		if err := r.Close(); err != nil {
			t.Errorf("relayd close: %v", err)
		}
		if t.Failed() {
			t.Logf("relayd in %s, log tail:\n%s", s.NS.Name(), tail(r.Log(), 40))
		}
	})
	d.start(t)
	return d
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (d *relaydRelay) start(t testing.TB) {
	t.Helper()
	if err := d.r.Start(); err != nil {
		t.Fatal(err)
	}
	if d.client != nil {
		d.client.Close()
	}
	conn, err := d.spec.NS.DialUDP("udp4", "", d.spec.NGAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	if d.client, err = ngclient.New(conn, ngclient.Config{}); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.client.Ping(ctx); err != nil {
		t.Fatalf("relayd ng ping on %s: %v", d.spec.NGAddr, err)
	}
	if d.spec.MaxSessions < 0 {
		media := netip.AddrPortFrom(netip.MustParseAddr("198.18.1.2"), 9)
		if _, err := d.client.Offer(ctx, ngclient.Request{CallID: placeholderCallID, FromTag: "lab", SDP: rtpengine.AudioSDP(media, 1)}); err != nil {
			t.Fatalf("placeholder call on relayd: %v", err)
		}
	}
}

func (d *relaydRelay) NGAddr() netip.AddrPort { return d.spec.NGAddr }
func (d *relaydRelay) Pid() int               { return d.r.Pid() }
func (d *relaydRelay) Media4() netip.Addr     { return d.spec.Media4 }

func (d *relaydRelay) Calls(ctx context.Context) ([]string, error) {
	ids, err := d.client.List(ctx, 0)
	return slices.DeleteFunc(ids, func(id string) bool { return id == placeholderCallID }), err
}

func (d *relaydRelay) Kill(t testing.TB) {
	t.Helper()
	if err := d.r.Kill(); err != nil {
		t.Fatal(err)
	}
}

func (d *relaydRelay) Restart(t testing.TB) {
	t.Helper()
	d.start(t)
}

// checkIdle: relayd carries no call of any front end (/v1/calls), apart
// from the placeholder.
func (d *relaydRelay) checkIdle(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		infos, err := d.r.Calls()
		if err != nil {
			t.Fatalf("relayd /v1/calls: %v", err)
		}
		want := 0
		if d.spec.MaxSessions < 0 {
			want = 1
		}
		if len(infos) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("relayd in %s: /v1/calls lists %d calls, want %d: %+v", d.spec.NS.Name(), len(infos), want, infos)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// forwarded is the packets relayd's XDP program forwarded (every
// relayd_packets_total sample with verdict "forward") since it started.
func (d *relaydRelay) forwarded(t testing.TB) float64 {
	t.Helper()
	m, err := d.r.Metrics()
	if err != nil {
		t.Fatalf("relayd metrics: %v", err)
	}
	var sum float64
	for _, line := range strings.Split(m, "\n") {
		if !strings.HasPrefix(line, "relayd_packets_total{") || !strings.Contains(line, `verdict="forward"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// relayKind is one relay the tests run against.
type relayKind struct {
	name  string
	start func(t testing.TB, l *lab.Lab, s relaySpec) mediaRelay
}

var relayKinds = []relayKind{
	{"rtpengine", startRTPEngine},
	{"relayd", startRelayd},
}

// eachRelay runs f as a subtest per relay kind.
func eachRelay(t *testing.T, f func(t *testing.T, k relayKind)) {
	for _, k := range relayKinds {
		t.Run(k.name, func(t *testing.T) { f(t, k) })
	}
}

// checkFastPath checks, for relayd, that its XDP program forwarded at
// least min packets: the calls' RTP went through the fast path, not the
// stack. rtpengine, in userspace here, has nothing to check.
func checkFastPath(t testing.TB, r mediaRelay, min float64) {
	t.Helper()
	d, ok := r.(*relaydRelay)
	if !ok {
		return
	}
	got := d.forwarded(t)
	t.Logf("relayd in %s: XDP forwarded %v packets", d.spec.NS.Name(), got)
	if got < min {
		t.Errorf("relayd in %s: XDP forwarded %v packets, want >= %v", d.spec.NS.Name(), got, min)
	}
}

// TestRelaydRestartKeepsCalls: relayd killed (SIGKILL) and started again
// in the middle of calls Kamailio set up on it, after their sources are
// latched (a flow still latching is relayed in userspace and waits for
// the new process): media keeps flowing
// through the pinned XDP flows, the new relayd takes the calls back from
// its store, Kamailio's query and delete at the BYE find them (the
// $rtpstat counts span the restart), and nothing is left after.
func TestRelaydRestartKeepsCalls(t *testing.T) {
	l := lab.NewT(t)
	spec := relayA(l)
	spec.Keep = true
	r := startRelayd(t, l, spec).(*relaydRelay)
	p := newProxy(t, l, Options{}, []mediaRelay{r})
	const n = 2
	lists, done := p.whileUp(t, call{n: n, hold: 4 * time.Second, cidTag: "kept"}, 1200*time.Millisecond, r)
	if len(lists[0]) != n {
		t.Fatalf("relayd lists %q before the kill, want %d calls", lists[0], n)
	}
	before := r.forwarded(t)
	r.Kill(t)
	r.Restart(t)
	ids := calls(t, r)
	if len(ids) != n {
		t.Errorf("after the restart relayd lists %q, want the %d calls back", ids, n)
	}
	if !strings.Contains(r.r.Log(), "ng calls of the previous run restored") {
		t.Errorf("relayd did not restore the calls:\n%s", tail(r.r.Log(), 20))
	}
	done()
	// 2 s of audio each way per call, complete although relayd restarted.
	checkRTPStats(t, p.k, "kept", n, mediaPackets)
	for _, line := range p.k.Lines("rtpengine [") {
		if strings.Contains(line, "Unknown call-id") || strings.Contains(line, "not found") {
			t.Errorf("Kamailio met a call relayd lost: %s", line)
		}
	}
	// The new relayd's counters are its own; XDP kept forwarding the
	// pinned flows while no relayd ran.
	if after := r.forwarded(t); after <= 0 {
		t.Errorf("the restarted relayd's XDP forwarded %v packets (before the kill: %v)", after, before)
	}
	waitNoCalls(t, r)
}
