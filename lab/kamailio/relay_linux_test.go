package kamailio

import (
	"cmp"
	"context"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/rtpengine"
)

// The tests run against "the relay", a mediaRelay: each test runs once
// per relayKind (eachRelay), against Debian's rtpengine and against
// relayd's ng front end (relayd_linux_test.go).

// relaySpec says where to start a relay.
type relaySpec struct {
	NS             *lab.NS        // its namespace
	NGAddr         netip.AddrPort // its ng listener, in NS, reachable from Kamailio
	Media4, Media6 netip.Addr     // its media addresses
	// MaxSessions > 0 makes it refuse more concurrent calls with
	// rtpengine's "load limit" reply; -1 refuses every call. 0: no limit.
	MaxSessions int
	// PortMax ends the media port range 30000-PortMax; 0 means 30999
	// (500 pairs: 250 calls).
	PortMax int
	// Keep gives relayd a [state] store: its answered calls survive a
	// restart (rtpengine would need Redis).
	Keep bool
}

// mediaRelay is a running relay under test.
type mediaRelay interface {
	// NGAddr is its ng listener.
	NGAddr() netip.AddrPort
	// Media4 is the media address its SDP names.
	Media4() netip.Addr
	// Calls lists its calls' Call-IDs (ng list).
	Calls(ctx context.Context) ([]string, error)
	// Kill kills it abruptly (SIGKILL) and waits until it is gone.
	Kill(t testing.TB)
	// Pid is its process.
	Pid() int
	// Restart starts it again with the same spec, after Kill.
	Restart(t testing.TB)
}

// relayA is the relay in the relay namespace, with Kamailio, reached over
// loopback; relayB (relayPair) the one in relay2.
func relayA(l *lab.Lab) relaySpec {
	return relaySpec{NS: l.Relay, NGAddr: netip.MustParseAddrPort("127.0.0.1:2223"), Media4: l.RelayMedia4, Media6: l.RelayMedia6}
}

func relayB(t testing.TB, l *lab.Lab) relaySpec {
	t.Helper()
	if err := l.AddRelay2(); err != nil {
		t.Fatal(err)
	}
	return relaySpec{NS: l.Relay2, NGAddr: netip.AddrPortFrom(l.Relay2Addr4, 2223), Media4: l.Relay2Media4, Media6: l.Relay2Media6}
}

// rtpEngineRelay is Debian's rtpengine as the relay under test.
type rtpEngineRelay struct {
	l    *lab.Lab
	spec relaySpec
	e    *rtpengine.Engine
}

func startRTPEngine(t testing.TB, l *lab.Lab, s relaySpec) mediaRelay {
	t.Helper()
	r := &rtpEngineRelay{l: l, spec: s}
	r.start(t)
	return r
}

func (r *rtpEngineRelay) start(t testing.TB) {
	t.Helper()
	o := rtpengine.Options{
		NS: r.spec.NS, NGAddr: r.spec.NGAddr, Media4: r.spec.Media4, Media6: r.spec.Media6,
		Threads: 1, PortMin: 30000, PortMax: cmp.Or(r.spec.PortMax, 30999),
	}
	switch {
	case r.spec.MaxSessions > 0:
		o.ExtraArgs = []string{"--max-sessions=" + strconv.Itoa(r.spec.MaxSessions)}
	case r.spec.MaxSessions < 0:
		o.ExtraArgs = []string{"--max-sessions=0"}
	}
	r.e = rtpengine.StartT(t, r.l, o)
}

func (r *rtpEngineRelay) NGAddr() netip.AddrPort { return r.spec.NGAddr }
func (r *rtpEngineRelay) Pid() int               { return r.e.Pid() }
func (r *rtpEngineRelay) Media4() netip.Addr     { return r.spec.Media4 }

func (r *rtpEngineRelay) Calls(ctx context.Context) ([]string, error) {
	return r.e.Client().List(ctx, 0)
}

func (r *rtpEngineRelay) Kill(t testing.TB) {
	t.Helper()
	pid := r.e.Pid()
	if pid == 0 {
		t.Fatal("rtpengine not running")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.e.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("rtpengine still running 5 s after SIGKILL")
	}
}

func (r *rtpEngineRelay) Restart(t testing.TB) {
	t.Helper()
	r.e.Close()
	r.start(t)
}

// calls lists a relay's calls, failing the test on error.
func calls(t testing.TB, r mediaRelay) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ids, err := r.Calls(ctx)
	if err != nil {
		t.Fatalf("ng list on %s: %v", r.NGAddr(), err)
	}
	return ids
}

// waitNoCalls waits up to 3 s until the relay lists no call; relayd must
// also carry none (/v1/calls).
func waitNoCalls(t testing.TB, r mediaRelay) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		ids := calls(t, r)
		if len(ids) == 0 {
			if d, ok := r.(*relaydRelay); ok {
				d.checkIdle(t)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("relay %s still lists calls %q", r.NGAddr(), ids)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
