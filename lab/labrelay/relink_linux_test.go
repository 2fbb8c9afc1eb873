package labrelay

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// TestRelayInterfaceRecreated: the caller-side interface is deleted and
// re-created while relayd is stopped, which severs its pinned XDP link.
// The next start replaces that link with a fresh attachment instead of
// failing, leaves the other interface's link alone (adopted), and keeps
// every pinned flow with its counters; media flows through XDP again.
func TestRelayInterfaceRecreated(t *testing.T) {
	l, r := startRelay(t, "native")
	caller, callee, flows := call(t, l, r, false, 30800)
	if a, b := exchange(t, caller, callee, 100, 5000); a != 100 || b != 100 {
		t.Fatalf("before: %d and %d packets, want 100", a, b)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	oldIndex := l.RelayCallerIf.Index
	if err := l.RecreateCallerLink(); err != nil {
		t.Fatal(err)
	}
	if l.RelayCallerIf.Index == oldIndex {
		t.Fatalf("%s kept ifindex %d", lab.RelayCallerIfName, oldIndex)
	}
	if xdpAttached(t, l, lab.RelayCallerIfName) {
		t.Fatal("XDP attached to the new interface before relayd started")
	}
	before := len(r.Log())
	if err := r.Start(); err != nil {
		t.Fatalf("start after the interface was re-created: %v", err)
	}
	log := r.Log()[before:]
	if !strings.Contains(log, "replacing the stale pinned XDP link") || !strings.Contains(log, `"reason":"severed`) || !strings.Contains(log, `"interface":"`+lab.RelayCallerIfName+`"`) {
		t.Errorf("no replacement logged for %s:\n%s", lab.RelayCallerIfName, log)
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `"msg":"XDP attached"`) && strings.Contains(line, `"interface":"`+lab.RelayCalleeIfName+`"`) &&
			!strings.Contains(line, `"adopted":true`) {
			t.Errorf("%s's link was not adopted: %s", lab.RelayCalleeIfName, line)
		}
	}
	for _, ifname := range []string{lab.RelayCallerIfName, lab.RelayCalleeIfName} {
		if !xdpAttached(t, l, ifname) {
			t.Errorf("XDP not attached to %s after the start", ifname)
		}
	}
	for _, want := range flows {
		f := flowByID(t, r, want.ID)
		if f.Match != want.Match || f.SendTo != want.SendTo || f.Packets != 100 {
			t.Errorf("flow %d after the restart: %+v, want the same addresses and its 100 packets", want.ID, f)
		}
	}
	exchangeAgain(t, l, r, caller, callee, flows[0].ID)
}

// exchangeAgain sends 100 packets each way on the call once more, the
// caller's sockets opened again (they lost their address with c0), and
// checks that the caller's flow counted them in XDP's path.
func exchangeAgain(t *testing.T, l *lab.Lab, r *Relay, caller, callee *leg, callerFlow uint64) {
	t.Helper()
	caller.conn.Close()
	caller2 := openLeg(t, l.Caller, caller.local, caller.relay)
	if a, b := exchange(t, caller2, callee, 100, 5000); a != 100 || b != 100 {
		t.Errorf("after: %d and %d packets, want 100", a, b)
	}
	f := flowByID(t, r, callerFlow)
	if f.Path != "xdp" || f.Packets != 200 {
		t.Errorf("caller's flow after: path %s, %d packets; want xdp and 200", f.Path, f.Packets)
	}
}

// TestRelayInterfaceRecreatedWhileRunning: the caller-side interface is
// deleted and re-created while relayd runs (as ifupdown does to VLAN and
// bond devices when networking restarts). relayd notices, attaches XDP to
// the new device without a restart, and the call's media flows through
// XDP again.
func TestRelayInterfaceRecreatedWhileRunning(t *testing.T) {
	l, r := startRelay(t, "native")
	caller, callee, flows := call(t, l, r, false, 30800)
	if a, b := exchange(t, caller, callee, 100, 5000); a != 100 || b != 100 {
		t.Fatalf("before: %d and %d packets, want 100", a, b)
	}
	before := len(r.Log())
	oldIndex := l.RelayCallerIf.Index
	if err := l.RecreateCallerLink(); err != nil {
		t.Fatal(err)
	}
	if l.RelayCallerIf.Index == oldIndex {
		t.Fatalf("%s kept ifindex %d", lab.RelayCallerIfName, oldIndex)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !xdpAttached(t, l, lab.RelayCallerIfName) {
		if time.Now().After(deadline) {
			t.Fatalf("XDP not attached to the re-created %s:\n%s", lab.RelayCallerIfName, r.Log()[before:])
		}
		time.Sleep(20 * time.Millisecond)
	}
	if log := r.Log()[before:]; !strings.Contains(log, "interface re-created: XDP attached again") {
		t.Errorf("no re-attachment logged:\n%s", log)
	}
	if v, err := r.Metric(`relayd_xdp_attached{interface="` + lab.RelayCallerIfName + `",mode="native"}`); err != nil || v != 1 {
		t.Errorf("relayd_xdp_attached for %s: %v, %v; want 1", lab.RelayCallerIfName, v, err)
	}
	// The redirect monitor probed the new device at once, maybe before
	// the lab had set its peer up (a veth takes redirected frames only
	// then): it probes again every second until the device takes them.
	for {
		v, err := r.Metric(`relayd_xdp_egress_fallback{device="` + lab.RelayCallerIfName + `"}`)
		if err != nil {
			t.Fatal(err)
		}
		if v == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still in redirect fallback:\n%s", lab.RelayCallerIfName, r.Log()[before:])
		}
		time.Sleep(50 * time.Millisecond)
	}
	forwarded := func() float64 {
		t.Helper()
		v, err := r.Metric(`relayd_packets_total{reason="redirect",verdict="forward"}`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	fwd0 := forwarded()
	exchangeAgain(t, l, r, caller, callee, flows[0].ID)
	// Both ways through XDP, but for the first packets toward the caller
	// (its neighbour entry went with the old device, and is resolved by
	// the kernel on their way through userspace).
	if got := forwarded() - fwd0; got < 190 {
		t.Errorf("%.0f of the 200 packets redirected by XDP after the interface came back", got)
	}
}

// TestRelayInterfaceRecreatedAFXDP: with userspace_io afxdp, the
// caller-side interface deleted and re-created while relayd runs gets its
// AF_XDP receive back too, in mode xdp (the relay program hands a latching
// flow's packets to the workers within the latch window) and in mode
// userspace (the pool's own program): the flow's packets reach the
// workers through their AF_XDP sockets before and after, all relayed.
func TestRelayInterfaceRecreatedAFXDP(t *testing.T) {
	for _, mode := range []string{"xdp", "userspace"} {
		t.Run(mode, func(t *testing.T) { testRelayInterfaceRecreatedAFXDP(t, mode) })
	}
}

func testRelayInterfaceRecreatedAFXDP(t *testing.T, mode string) {
	l := lab.NewT(t)
	r := startRelayIn(t, l, Options{Mode: mode, ExtraMedia: `latch_window = "60s"`, UserspaceIO: "afxdp"})
	a, b := netip.AddrPortFrom(l.RelayMedia4, 33000), netip.AddrPortFrom(l.RelayMedia4, 33002)
	from := netip.AddrPortFrom(l.CallerAddr4, 4000)
	_, _, caller, callee := latchingCall(t, l, r, a, b, from, from, netip.AddrPortFrom(l.CalleeAddr4, 5000))
	viaXSK := func() float64 {
		t.Helper()
		return metrics(t, r, "relayd_userspace_afxdp_packets_total")[0]
	}
	if err := caller.send(20, 1000, 1, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := callee.recv(20, 1, 0, time.Second); got != 20 {
		t.Fatalf("before: callee received %d of 20 (%v)", got, err)
	}
	if x := viaXSK(); x != 20 {
		t.Fatalf("before: the workers read %.0f packets from their AF_XDP sockets, want 20", x)
	}
	before := len(r.Log())
	if err := l.RecreateCallerLink(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.Log()[before:], "interface re-created: AF_XDP receive moved to it") {
		if time.Now().After(deadline) {
			t.Fatalf("AF_XDP receive not moved to the re-created %s:\n%s", lab.RelayCallerIfName, r.Log()[before:])
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := caller.send(50, 1000, 1, 20); err != nil {
		t.Fatal(err)
	}
	if got, err := callee.recv(50, 1, 20, time.Second); got != 50 {
		t.Fatalf("after: callee received %d of 50 (%v)", got, err)
	}
	if x := viaXSK(); x != 70 {
		t.Errorf("after: the workers read %.0f packets from their AF_XDP sockets, want 70", x)
	}
}
