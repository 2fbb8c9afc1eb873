package fwpair

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/lab"
)

// received reports whether a datagram sent from src (in the from host) to
// dst (in the to host) arrives within timeout.
func crosses(t *testing.T, p *Pair, fromLAN bool, src, dst netip.AddrPort, timeout time.Duration) bool {
	t.Helper()
	from, to := p.LAN, p.WAN
	if !fromLAN {
		from, to = p.WAN, p.LAN
	}
	rx, err := to.ListenUDP("udp4", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := from.DialUDP("udp4", src.String(), dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 64)
	for time.Now().Before(deadline) {
		tx.Write([]byte("crosses"))
		rx.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if n, err := rx.Read(buf); err == nil && string(buf[:n]) == "crosses" {
			return true
		}
	}
	return false
}

// TestStateful: the pair comes up with fw1 as master, forwards a flow the
// LAN opens both ways, and the WAN cannot open one.
func TestStateful(t *testing.T) {
	p := newPairT(t, Config{HostAddrs: 2, Advert: 100 * time.Millisecond})
	m, err := p.Master()
	if err != nil {
		t.Fatal(err)
	}
	if m != 0 {
		t.Errorf("master is fw%d, want fw1 (higher priority)", m+1)
	}
	lan := netip.AddrPortFrom(p.LANAddrs[1], 5000)
	wan := netip.AddrPortFrom(p.WANAddrs[1], 6000)
	before, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if !crosses(t, p, false, wan, netip.AddrPortFrom(p.LANAddrs[0], 5002), 300*time.Millisecond) {
		t.Log("as it should, the WAN cannot open a flow")
	} else {
		t.Error("a flow opened from the WAN crossed the stateful pair")
	}
	if !crosses(t, p, true, lan, wan, time.Second) {
		t.Fatal("LAN to WAN: nothing crossed")
	}
	if !crosses(t, p, false, wan, lan, time.Second) {
		t.Error("WAN to LAN on the flow the LAN opened: nothing crossed")
	}
	after, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if d := after[0][LANIfName].RxPackets - before[0][LANIfName].RxPackets; d == 0 {
		t.Errorf("fw1's lan counted no packets in")
	}
	if d := after[0][WANIfName].TxPackets - before[0][WANIfName].TxPackets; d == 0 {
		t.Errorf("fw1's wan counted no packets out")
	}
	ctx := context.Background()
	if _, err := p.Fail(ctx, Failure(0)); err == nil {
		t.Error("Fail accepted the zero Failure")
	}
	if _, err := p.Recover(ctx); err == nil {
		t.Error("Recover with no failure in force did not fail")
	}
	if m, err := p.Master(); err != nil || m != 0 {
		t.Errorf("after the rejected calls: master %d, %v; want fw1", m+1, err)
	}
}

// forwarded reads Ip: ForwDatagrams, the kernel's forwarded packet count,
// in ns.
func forwarded(t *testing.T, ns *lab.NS) int {
	t.Helper()
	var n int
	err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		names, vals := strings.Fields(lines[0]), strings.Fields(lines[1])
		for i, name := range names {
			if name == "ForwDatagrams" {
				n, err = strconv.Atoi(vals[i])
				return err
			}
		}
		return errors.New("no ForwDatagrams in snmp")
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestXDPStateless: with the XDP forwarder the stateless pair forwards a
// flow the WAN opens, and a LAN stream, past the kernel's forwarding.
func TestXDPStateless(t *testing.T) {
	p := newPairT(t, Config{Forwarder: ForwarderXDP, Stateless: true, Advert: 100 * time.Millisecond})
	if !crosses(t, p, false, netip.AddrPortFrom(p.WANAddrs[0], 6000), netip.AddrPortFrom(p.LANAddrs[0], 5000), time.Second) {
		t.Fatal("the stateless pair does not forward a flow the WAN opens")
	}
	before := forwarded(t, p.FW[0])
	s := startStream(t, p.LAN, p.WAN, netip.AddrPortFrom(p.LANAddrs[0], 5002), netip.AddrPortFrom(p.WANAddrs[0], 6002), 1000, oneWay)
	start := time.Now()
	time.Sleep(500 * time.Millisecond)
	r := s.analyze(start)
	s.close()
	if r.received < 400 {
		t.Errorf("received %d of about 500 packets", r.received)
	}
	if k := forwarded(t, p.FW[0]) - before; k > 10 {
		t.Errorf("fw1's kernel forwarded %d packets: the XDP forwarder did not", k)
	}
}

// TestClose: Close leaves no namespace, process or file behind.
func TestClose(t *testing.T) {
	p := newPairT(t, Config{Conntrackd: true, Advert: 100 * time.Millisecond})
	pids, dir := p.pids(), p.Dir
	if len(pids) != 4 {
		t.Errorf("%d daemons, want 4 (keepalived and conntrackd twice)", len(pids))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	checkGone(t, p.prefix, dir, pids)
}

// TestContextCancel: the end of New's context tears the pair down.
func TestContextCancel(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedCommand(t, "keepalived", "keepalived")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := New(ctx, Config{Advert: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	pids, dir := p.pids(), p.Dir
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && len(namespaces(t, p.prefix)) > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if err := p.Close(); err != nil {
		t.Errorf("close after the context ended: %v", err)
	}
	checkGone(t, p.prefix, dir, pids)
}

// TestStaleRemoved: New removes what a crashed run with the same prefix
// left: its namespaces and the processes in them.
func TestStaleRemoved(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedCommand(t, "keepalived", "keepalived")
	prefix := fmt.Sprintf("fst%d-", os.Getpid())
	ns, err := lab.NewNS(prefix + "fw1")
	if err != nil {
		t.Fatal(err)
	}
	sleeper := ns.Command("sleep", "60")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := sleeper.Start(); err != nil {
		ns.Close()
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sleeper.Wait() }()
	t.Cleanup(func() {
		sleeper.Process.Kill()
		ns.Close() // its name is gone by now: this releases the handle
	})
	// ip netns exec enters the namespace after Start returns: wait until
	// the sleeper is in it, or New could look before it arrives.
	for deadline := time.Now().Add(5 * time.Second); !slices.Contains(nsPids(ns.Path()), sleeper.Process.Pid); {
		if time.Now().After(deadline) {
			t.Fatal("the sleeper never entered its namespace")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// As a crash would, leave ns behind, not closed.
	newPairT(t, Config{Prefix: prefix, Advert: 100 * time.Millisecond})
	select {
	case <-exited:
	case <-time.After(2 * time.Second):
		t.Error("the process left in the stale namespace still runs")
	}
}

// namespaces lists the namespaces with prefix.
func namespaces(t *testing.T, prefix string) []string {
	t.Helper()
	entries, err := os.ReadDir("/run/netns")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// checkGone asserts that no namespace with prefix, no directory dir and
// none of pids remain, and no process refers to dir.
func checkGone(t *testing.T, prefix, dir string, pids []int) {
	t.Helper()
	if names := namespaces(t, prefix); len(names) > 0 {
		t.Errorf("namespaces left: %v", names)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s left (%v)", dir, err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("daemon %d still exists (%v)", pid, err)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range procs {
		b, _ := os.ReadFile(c)
		if strings.Contains(string(b), dir) {
			t.Errorf("%s still runs: %q", c, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
