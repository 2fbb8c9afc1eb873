package labrelay

import (
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// TestRelayRedirectRefused: a veth whose peer has neither GRO nor an XDP
// program refuses the frames XDP redirects into it, and the kernel drops
// them after the program counted them forwarded. relayd sees the refusals
// (the xdp tracepoints), counts them per device, warns, and punts the
// flows toward that device to the userspace workers, so that media keeps
// flowing; once the peer takes redirected frames again (GRO back on) the
// redirect probe sees it and the flows go back to XDP (or, where the
// kernel refuses the probe's live-frame run, the device's untried return
// after its interval finds it taking them).
func TestRelayRedirectRefused(t *testing.T) {
	l, r := startRelay(t, "native")
	metric := func(name string) float64 {
		t.Helper()
		v, err := r.Metric(name)
		if err != nil {
			m, _ := r.Metrics()
			t.Fatalf("%v\n%s", err, m)
		}
		return v
	}
	const (
		errorsMetric   = `relayd_xdp_redirect_errors_total{device="r1"}`
		fallbackMetric = `relayd_xdp_egress_fallback{device="r1"}`
		noEgress       = `relayd_packets_total{reason="no_egress",verdict="punt"}`
		redirected     = `relayd_packets_total{reason="redirect",verdict="forward"}`
		// Frames lost between the first refusal and the fallback: the
		// refusal reaches relayd through a ring buffer at once, and one
		// map update later the program punts. At 250 packets a second, 10
		// packets are 40 ms.
		maxLost = 10
	)
	caller, callee, flows := call(t, l, r, false, 32000)
	// The monitor starts beside relayd's readiness.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(r.Log(), "watching XDP redirect refusals"); {
		if time.Now().After(deadline) {
			t.Fatalf("the redirect monitor did not start:\n%s", r.tail())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The callee's side stops taking redirected frames.
	if err := l.Callee.SetGRO(lab.CalleeIfName, false); err != nil {
		t.Fatal(err)
	}
	n := max(500/rateDivisor, 25)
	done := make(chan error, 1)
	go func() { done <- caller.send(n, 250, 1, 0) }()
	got, err := callee.recv(n, 1, 0, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lost := n - got
	t.Logf("peer without GRO: %d of %d packets arrived", got, n)
	if lost > maxLost {
		t.Errorf("%d of %d packets lost toward a device that refuses redirected frames, want at most %d", lost, n, maxLost)
	}
	if v := metric(errorsMetric); v != float64(lost) || v < 1 {
		t.Errorf("%s = %v, want the %d packets lost (at least 1: the refusal that gave the fallback away)", errorsMetric, v, lost)
	}
	// Where the kernel refuses live-frame test runs the monitor cannot
	// probe: a device in fallback goes back untried every interval, and
	// the next frame toward it sends it back (fastpath's TestRedirectMonitor).
	// It may be back, untried, when the sending stops.
	noProbe := strings.Contains(r.Log(), "refuses to run XDP programs on live frames")
	if v := metric(fallbackMetric); v != 1 && !(noProbe && strings.Contains(r.Log(), "tried again without a probe")) {
		t.Errorf("%s = %v with the peer still without GRO, want 1", fallbackMetric, v)
	}
	if log := r.Log(); !strings.Contains(log, "refuses redirected frames") || !strings.Contains(log, `"device":"r1"`) {
		t.Errorf("no warning naming r1 in the log:\n%s", r.tail())
	}
	if f := flowByID(t, r, flows[0].ID); f.Packets < uint64(got) {
		t.Errorf("flow %s counted %d packets, want at least the %d that arrived", f.Match, f.Packets, got)
	}

	// GRO back on: the probe finds the device takes redirected frames and
	// the flows go back to XDP.
	if err := l.Callee.SetGRO(lab.CalleeIfName, true); err != nil {
		t.Fatal(err)
	}
	// Without probes the device's interval doubled at each refusal after
	// an untried return: up to 4 s after the 2 s of sending above.
	wait := 5 * time.Second
	if noProbe {
		wait = 12 * time.Second
	}
	deadline := time.Now().Add(wait)
	for metric(fallbackMetric) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s still 1 %s after the peer's GRO came back on", fallbackMetric, wait)
		}
		time.Sleep(50 * time.Millisecond)
	}
	errs, punted, fwd := metric(errorsMetric), metric(noEgress), metric(redirected)
	const m = 200
	go func() { done <- caller.send(m, 1000, 1, uint16(n)) }()
	got, err = callee.recv(m, 1, uint16(n), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got != m {
		t.Errorf("after recovery: %d of %d packets arrived", got, m)
	}
	if v := metric(noEgress); v != punted {
		t.Errorf("after recovery: %v packets punted for no_egress, want none", v-punted)
	}
	if v := metric(redirected); v-fwd != m {
		t.Errorf("after recovery: %v packets redirected by XDP, want %d", v-fwd, m)
	}
	if v := metric(errorsMetric); v != errs {
		t.Errorf("after recovery: %v more redirect errors", v-errs)
	}
}
