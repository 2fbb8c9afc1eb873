package labrelay

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/lab"
)

// TestRelayLatching: symmetric RTP with the RTP Bleed guard, end to end.
// The caller signals its address with a wrong port (as behind a NAT); an
// attacker host sends to the relay port first. Within the latch window the
// relay learns the caller's real port only (the signalled address is
// routable, so the attacker's packets are dropped), sends the callee's media
// back there, and after the window locks the source and hands the flow back
// to XDP, which keeps dropping the attacker.
func TestRelayLatching(t *testing.T) {
	l := lab.NewT(t)
	if err := l.AddAttacker(); err != nil {
		t.Fatal(err)
	}
	r := startRelayIn(t, l, Options{ExtraMedia: `latch_window = "1s"`})

	a, b := netip.AddrPortFrom(l.RelayMedia4, 33000), netip.AddrPortFrom(l.RelayMedia4, 33002)
	signalled := netip.AddrPortFrom(l.CallerAddr4, 9000) // what the SDP said
	real := netip.AddrPortFrom(l.CallerAddr4, 4000)      // where the caller's NAT sends from
	calleeEP := netip.AddrPortFrom(l.CalleeAddr4, 5000)
	up, err := r.AddFlow(admin.FlowRequest{Match: a.String(), ExpectSource: signalled.String(), Latch: true, Reverse: b.String(),
		SendFrom: b.String(), SendTo: calleeEP.String()})
	if err != nil {
		t.Fatal(err)
	}
	down, err := r.AddFlow(admin.FlowRequest{Match: b.String(), ExpectSource: calleeEP.String(),
		SendFrom: a.String(), SendTo: signalled.String()})
	if err != nil {
		t.Fatal(err)
	}
	caller := openLeg(t, l.Caller, real, a)
	callee := openLeg(t, l.Callee, calleeEP, b)
	attacker := openLeg(t, l.Attacker, netip.AddrPortFrom(l.AttackerAddr4, 4000), a)

	// The attacker is first.
	if err := attacker.send(10, 1000, 66, 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := callee.recv(1, 66, 0, 200*time.Millisecond); got != 0 {
		t.Fatalf("callee received %d packets from the attacker", got)
	}
	// The caller starts: its port is learned, the callee's media goes back
	// to it (not to the signalled port).
	if err := caller.send(20, 1000, 1, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := callee.recv(20, 1, 0, time.Second); got != 20 {
		t.Fatalf("callee received %d of 20 caller packets (%v)", got, err)
	}
	if err := callee.send(20, 1000, 2, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := caller.recv(20, 2, 0, time.Second); got != 20 {
		t.Fatalf("caller received %d of 20 packets at its real port (%v)", got, err)
	}

	// After the window: the next packet locks the source and the flows go
	// back to XDP with the learned source.
	time.Sleep(1200 * time.Millisecond)
	if err := caller.send(10, 1000, 1, 20); err != nil {
		t.Fatal(err)
	}
	if got, _ := callee.recv(10, 1, 20, time.Second); got != 10 {
		t.Fatalf("after the window: callee received %d of 10", got)
	}
	var f admin.Flow
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		f = flowByID(t, r, up.ID)
		if !f.Latch {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if f.Latch || f.ExpectSource != real.String() || f.Path != "xdp" {
		t.Fatalf("flow after the window: %+v, want latch off, expect_source %s, on xdp", f, real)
	}
	if d := flowByID(t, r, down.ID); d.SendTo != real.String() {
		t.Errorf("reverse flow sends to %s, want %s", d.SendTo, real)
	}
	fwdBefore, err := r.Metric(`relayd_packets_total{reason="redirect",verdict="forward"}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := caller.send(50, 5000, 1, 30); err != nil {
		t.Fatal(err)
	}
	if got, _ := callee.recv(50, 1, 30, time.Second); got != 50 {
		t.Errorf("locked flow: callee received %d of 50", got)
	}
	if fwd, _ := r.Metric(`relayd_packets_total{reason="redirect",verdict="forward"}`); fwd-fwdBefore < 50 {
		t.Errorf("locked flow: %v packets redirected by XDP, want 50", fwd-fwdBefore)
	}
	// The attacker again, and the caller's own address from another port.
	if err := attacker.send(10, 1000, 66, 100); err != nil {
		t.Fatal(err)
	}
	other := openLeg(t, l.Caller, netip.AddrPortFrom(l.CallerAddr4, 4002), a)
	if err := other.send(10, 1000, 67, 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := callee.recv(1, 66, 100, 300*time.Millisecond); got != 0 {
		t.Errorf("callee received %d injected packets after the lock", got)
	}
	f = flowByID(t, r, up.ID)
	if f.Dropped != 30 {
		t.Errorf("flow dropped %d packets, want 30 (10 attacker in the window, 10 attacker and 10 wrong port after)", f.Dropped)
	}
	if f.Packets != 80 {
		t.Errorf("flow relayed %d packets, want 80", f.Packets)
	}
	if !strings.Contains(r.Log(), "source latched") {
		t.Error("no 'source latched' in the log")
	}
}
