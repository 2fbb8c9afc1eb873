package labrelay

import (
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// transits reports whether a datagram from the caller to an address behind
// the relay's other interface (the callee's own address, not the relay's)
// arrives: the kernel's forwarding, which XDP does not do for it. It sends
// tries datagrams 200 ms apart and stops at the first that arrives.
func transits(t *testing.T, l *lab.Lab, v6 bool, port uint16, tries int) bool {
	t.Helper()
	network, from, to := "udp4", l.CallerAddr4, l.CalleeAddr4
	if v6 {
		network, from, to = "udp6", l.CallerAddr6, l.CalleeAddr6
	}
	rx, err := l.Callee.ListenUDP(network, netip.AddrPortFrom(to, port).String())
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := l.Caller.DialUDP(network, netip.AddrPortFrom(from, port).String(), netip.AddrPortFrom(to, port).String())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	buf := make([]byte, 64)
	for range tries {
		if _, err := tx.Write([]byte("transit")); err != nil {
			t.Fatal(err)
		}
		rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := rx.Read(buf)
		if err == nil && string(buf[:n]) == "transit" {
			return true
		}
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			t.Fatal(err)
		}
	}
	return false
}

var counterRE = regexp.MustCompile(`counter packets (\d+)`)

// TestPrepareForwardDrop runs `relayd -prepare` in the lab's relay (as the
// unit's ExecStartPre does), then relayd: transit traffic between r0 and
// r1, which the relay's kernel forwarded before, is dropped by the rule in
// table inet relayd, IPv4 and IPv6, while media relayed by XDP between the
// same interfaces still flows, every packet.
func TestPrepareForwardDrop(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		lab.SkipOrFail(t, "nft not installed (Debian package nftables): "+err.Error())
	}
	l := lab.NewT(t)
	r, err := New(l, Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relayd log:\n%s", r.tail())
		}
		if err := r.Close(); err != nil {
			t.Errorf("close relay: %v", err)
		}
	})
	// Up to 3 s: a neighbour solicitation lost on a new link is sent
	// again only after 1 s (RetransTimer), and the first IPv6 datagrams
	// wait for it.
	for _, v6 := range []bool{false, true} {
		if !transits(t, l, v6, 7000, 15) {
			t.Fatalf("ipv6 %v: the lab does not forward transit traffic before -prepare: the test would prove nothing", v6)
		}
	}

	out, err := l.Relay.Command(r.opts.Bin, "-prepare", "-config", r.ConfigPath).CombinedOutput()
	if err != nil {
		t.Fatalf("relayd -prepare: %v\n%s", err, out)
	}
	// Twice: the table is replaced, not duplicated or refused.
	if out, err := l.Relay.Command(r.opts.Bin, "-prepare", "-config", r.ConfigPath).CombinedOutput(); err != nil {
		t.Fatalf("relayd -prepare again: %v\n%s", err, out)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}

	for _, v6 := range []bool{false, true} {
		if transits(t, l, v6, 7002, 5) {
			t.Errorf("ipv6 %v: transit traffic forwarded after relayd -prepare", v6)
		}
	}
	rules, err := l.Relay.Command("nft", "list", "chain", "inet", "relayd", "forward").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list chain: %v\n%s", err, rules)
	}
	m := counterRE.FindSubmatch(rules)
	if m == nil {
		t.Fatalf("no counter in the forward chain:\n%s", rules)
	}
	// 5 datagrams per family were sent and dropped (the first -prepare
	// started the counter; the second replaced the table before any).
	if n, _ := strconv.Atoi(string(m[1])); n != 10 {
		t.Errorf("forward-drop counter %d, want 10 (5 IPv4 + 5 IPv6):\n%s", n, rules)
	}

	const n = 2000
	for i, v6 := range []bool{false, true} {
		caller, callee, flows := call(t, l, r, v6, uint16(30000+8*i))
		toCallee, toCaller := exchange(t, caller, callee, n, 5000)
		if toCallee != n || toCaller != n {
			t.Errorf("ipv6 %v: media received %d at callee and %d at caller, want %d each", v6, toCallee, toCaller, n)
		}
		for _, fl := range flows {
			if f := flowByID(t, r, fl.ID); f.Packets != n || f.Path != "xdp" {
				t.Errorf("flow %s: %d packets on %s, want %d on xdp", f.Match, f.Packets, f.Path, n)
			}
		}
	}
}
