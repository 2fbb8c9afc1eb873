package lab

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	osexec "os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// sendRecv sends payload from a socket bound to src in from to a socket
// bound to dst:port in to, and returns what arrived and its source.
func sendRecv(t *testing.T, from, to *NS, src, dst netip.Addr, port uint16, payload []byte, timeout time.Duration) ([]byte, netip.AddrPort, error) {
	t.Helper()
	network := "udp4"
	if dst.Is6() {
		network = "udp6"
	}
	dstAP := netip.AddrPortFrom(dst, port)
	rc, err := to.ListenUDP(network, dstAP.String())
	if err != nil {
		t.Fatalf("listen in %s: %v", to, err)
	}
	defer rc.Close()
	sc, err := from.DialUDP(network, netip.AddrPortFrom(src, 0).String(), dstAP.String())
	if err != nil {
		t.Fatalf("dial in %s: %v", from, err)
	}
	defer sc.Close()
	if _, err := sc.Write(payload); err != nil {
		t.Fatalf("send from %s: %v", from, err)
	}
	buf := make([]byte, 2048)
	rc.SetReadDeadline(time.Now().Add(timeout))
	n, ap, err := rc.ReadFromUDPAddrPort(buf)
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	return buf[:n], netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// expectDelivery sends a datagram from the caller to dst in to and fails
// the test unless it arrives intact from the caller's address.
func expectDelivery(t *testing.T, l *Lab, to *NS, dst netip.Addr, port uint16) {
	t.Helper()
	src := l.CallerAddr4
	if dst.Is6() {
		src = l.CallerAddr6
	}
	payload := fmt.Appendf(nil, "hello %s from %s", dst, src)
	got, from, err := sendRecv(t, l.Caller, to, src, dst, port, payload, 5*time.Second)
	if err != nil {
		t.Fatalf("receive at %s in %s: %v", dst, to, err)
	}
	if !bytes.Equal(got, payload) {
		t.Errorf("payload = %q, want %q", got, payload)
	}
	if from.Addr() != src {
		t.Errorf("source = %s, want %s", from.Addr(), src)
	}
}

func TestForwarding(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	for _, tc := range []struct {
		name string
		to   *NS
		dst  netip.Addr
	}{
		{"ipv4/callee", l.Callee, l.CalleeAddr4},
		{"ipv6/callee", l.Callee, l.CalleeAddr6},
		{"ipv4/relay-media", l.Relay, l.RelayMedia4},
		{"ipv6/relay-media", l.Relay, l.RelayMedia6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectDelivery(t, l, tc.to, tc.dst, 5000)
		})
	}
}

func TestOffloads(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	for _, k := range []struct {
		ns     *NS
		ifname string
	}{
		{l.Caller, CallerIfName},
		{l.Relay, RelayCallerIfName},
		{l.Relay, RelayCalleeIfName},
		{l.Callee, CalleeIfName},
	} {
		gro, err := k.ns.GRO(k.ifname)
		if err != nil {
			t.Fatal(err)
		}
		if !gro {
			t.Errorf("%s/%s: gro off, want on", k.ns, k.ifname)
		}
		tx, err := k.ns.TxChecksum(k.ifname)
		if err != nil {
			t.Fatal(err)
		}
		if tx {
			t.Errorf("%s/%s: tx checksum offload on, want off", k.ns, k.ifname)
		}
	}
	// And they can be switched back.
	if err := l.Caller.SetGRO(CallerIfName, false); err != nil {
		t.Fatal(err)
	}
	if gro, err := l.Caller.GRO(CallerIfName); err != nil || gro {
		t.Errorf("after SetGRO(false): gro = %t, %v; want false, nil", gro, err)
	}
	if err := l.Caller.SetTxChecksum(CallerIfName, true); err != nil {
		t.Fatal(err)
	}
	if tx, err := l.Caller.TxChecksum(CallerIfName); err != nil || !tx {
		t.Errorf("after SetTxChecksum(true): tx = %t, %v; want true, nil", tx, err)
	}
}

func TestSysctl(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	for _, key := range []string{
		"net.ipv4.ip_forward",
		"net.ipv6.conf.all.forwarding",
		"net.ipv6.conf.r0.forwarding",
		"net.ipv6.conf.r1.forwarding",
	} {
		v, err := l.Relay.Sysctl(key)
		if err != nil {
			t.Fatal(err)
		}
		if v != "1" {
			t.Errorf("relay %s = %q, want 1", key, v)
		}
	}
	// The caller's namespace has its own settings.
	if v, err := l.Caller.Sysctl("net.ipv6.conf.all.forwarding"); err != nil || v != "0" {
		t.Errorf("caller net.ipv6.conf.all.forwarding = %q, %v; want 0", v, err)
	}
}

func TestIfaces(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	for _, tc := range []struct {
		ns   *NS
		got  Iface
		name string
	}{
		{l.Caller, l.CallerIf, CallerIfName},
		{l.Relay, l.RelayCallerIf, RelayCallerIfName},
		{l.Relay, l.RelayCalleeIf, RelayCalleeIfName},
		{l.Callee, l.CalleeIf, CalleeIfName},
	} {
		if tc.got.Name != tc.name || tc.got.Index <= 0 || len(tc.got.HardwareAddr) != 6 {
			t.Errorf("%s: Iface = %+v", tc.name, tc.got)
		}
		want, err := tc.ns.Iface(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if want.Index != tc.got.Index {
			t.Errorf("%s: index = %d, want %d", tc.name, tc.got.Index, want.Index)
		}
	}
}

func TestCommand(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	out, err := l.Relay.Command("ip", "-o", "addr", "show", "dev", "lo").CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr in relay: %v: %s", err, out)
	}
	for _, a := range []netip.Addr{l.RelayMedia4, l.RelayMedia6} {
		if !strings.Contains(string(out), a.String()+"/") {
			t.Errorf("relay lo lacks %s:\n%s", a, out)
		}
	}
	// /sys is the namespace's own: only lo, c0 in the caller.
	out, err = l.Caller.Command("ls", "/sys/class/net").CombinedOutput()
	if err != nil {
		t.Fatalf("ls in caller: %v: %s", err, out)
	}
	if got := strings.Fields(string(out)); strings.Join(got, " ") != "c0 lo" {
		t.Errorf("caller /sys/class/net = %q, want [c0 lo]", got)
	}
}

func TestDoPanics(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	defer func() {
		if r := recover(); r != "boom" {
			t.Errorf("recover() = %v, want boom", r)
		}
	}()
	l.Relay.Do(func() error { panic("boom") })
}

func TestDoError(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	errBoom := errors.New("boom")
	if err := l.Callee.Do(func() error { return errBoom }); !errors.Is(err, errBoom) {
		t.Errorf("Do = %v, want %v", err, errBoom)
	}
}

func TestLinkDownUp(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	if err := l.Relay.SetLinkDown(RelayCalleeIfName); err != nil {
		t.Fatal(err)
	}
	payload := []byte("while down")
	if _, _, err := sendRecv(t, l.Caller, l.Callee, l.CallerAddr4, l.CalleeAddr4, 5002, payload, 300*time.Millisecond); err == nil {
		t.Errorf("datagram arrived while %s was down", RelayCalleeIfName)
	}
	if err := l.Relay.SetLinkUp(RelayCalleeIfName); err != nil {
		t.Fatal(err)
	}
	expectDelivery(t, l, l.Callee, l.CalleeAddr4, 5002)
	expectDelivery(t, l, l.Callee, l.CalleeAddr6, 5002)
}

func TestNeighbors(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	// Populate the relay's neighbour table, flush it, and check that the
	// first datagram to an unresolved neighbour still arrives.
	expectDelivery(t, l, l.Callee, l.CalleeAddr4, 5004)
	expectDelivery(t, l, l.Callee, l.CalleeAddr6, 5004)
	if n := neighbors(t, l.Relay, l.RelayCalleeIf.Index); n == 0 {
		t.Fatalf("relay has no neighbours on %s after traffic", RelayCalleeIfName)
	}
	if err := l.Relay.FlushNeighbors(""); err != nil {
		t.Fatal(err)
	}
	if n := neighbors(t, l.Relay, l.RelayCalleeIf.Index); n != 0 {
		t.Errorf("relay has %d neighbours on %s after flush, want 0", n, RelayCalleeIfName)
	}
	expectDelivery(t, l, l.Callee, l.CalleeAddr4, 5004)
	expectDelivery(t, l, l.Callee, l.CalleeAddr6, 5004)

	for _, a := range []netip.Addr{l.CalleeAddr4, l.CalleeAddr6} {
		if err := l.Relay.DeleteNeighbor(RelayCalleeIfName, a); err != nil {
			t.Fatal(err)
		}
		if err := l.Relay.DeleteNeighbor(RelayCalleeIfName, a); err != nil {
			t.Errorf("second delete of %s: %v", a, err)
		}
	}
	if n := neighbors(t, l.Relay, l.RelayCalleeIf.Index); n != 0 {
		t.Errorf("relay has %d neighbours on %s after delete, want 0", n, RelayCalleeIfName)
	}
	expectDelivery(t, l, l.Callee, l.CalleeAddr4, 5004)
	expectDelivery(t, l, l.Callee, l.CalleeAddr6, 5004)
}

// neighbors counts the resolvable (not NOARP or permanent) neighbour
// entries for the lab's global addresses on the interface index in ns.
func neighbors(t *testing.T, ns *NS, index int) int {
	t.Helper()
	h, err := ns.handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	n := 0
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		list, err := h.NeighList(index, family)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list {
			if e.State&(netlink.NUD_NOARP|netlink.NUD_PERMANENT) == 0 && e.IP.IsGlobalUnicast() {
				n++
			}
		}
	}
	return n
}

func TestCloseRemovesNamespaces(t *testing.T) {
	t.Parallel()
	if err := available(); err != nil {
		SkipOrFail(t, "lab: "+err.Error())
	}
	l, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	paths := []string{l.Caller.Path(), l.Relay.Path(), l.Callee.Path()}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("before Close: %v", err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after Close: stat %s: %v, want not exist", p, err)
		}
	}
	out, err := run("ip", "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, l.Prefix()) {
		t.Errorf("ip netns list still shows %s*:\n%s", l.Prefix(), out)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestTwoLabs(t *testing.T) {
	t.Parallel()
	a := NewConfigT(t, Config{Prefix: fmt.Sprintf("rltest%d-a-", os.Getpid())})
	b := NewConfigT(t, Config{Prefix: fmt.Sprintf("rltest%d-b-", os.Getpid())})
	if a.Relay.Name() == b.Relay.Name() {
		t.Fatalf("both labs use namespace %s", a.Relay.Name())
	}
	for _, l := range []*Lab{a, b} {
		expectDelivery(t, l, l.Callee, l.CalleeAddr4, 5006)
		expectDelivery(t, l, l.Callee, l.CalleeAddr6, 5006)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// b is untouched by a's teardown.
	expectDelivery(t, b, b.Callee, b.CalleeAddr4, 5006)
}

func TestRemovesLeftovers(t *testing.T) {
	t.Parallel()
	if err := available(); err != nil {
		SkipOrFail(t, "lab: "+err.Error())
	}
	prefix := fmt.Sprintf("rltest%d-stale-", os.Getpid())
	// A crashed run leaves a namespace behind.
	stale, err := newNamedNS(prefix + "relay")
	if err != nil {
		t.Fatal(err)
	}
	stale.fd.Close()
	// A crashed run with a default prefix leaves one behind too.
	pid := 4194000
	for !errors.Is(unix.Kill(pid, 0), unix.ESRCH) {
		pid--
	}
	// Another test process building a lab at the same moment may remove
	// the orphan while it is being made: that is the behaviour under
	// test, so try again.
	var orphan *NS
	for try := 0; ; try++ {
		orphan, err = newNamedNS(fmt.Sprintf("rl%d-1-callee", pid))
		if err == nil {
			break
		}
		if try == 5 {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	orphan.fd.Close()
	t.Cleanup(func() { deleteNamedNS(orphan.name) })

	l := NewConfigT(t, Config{Prefix: prefix})
	expectDelivery(t, l, l.Callee, l.CalleeAddr4, 5008)
	if _, err := os.Stat(orphan.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphan %s: stat: %v, want not exist", orphan.Path(), err)
	}
}

func TestNewCleansUpOnError(t *testing.T) {
	if err := available(); err != nil {
		SkipOrFail(t, "lab: "+err.Error())
	}
	if _, err := New(Config{Prefix: "bad/prefix"}); err == nil {
		t.Error("New accepted a prefix with a slash")
	}
	errBuild := errors.New("injected")
	testHookBuild = func() error { return errBuild }
	defer func() { testHookBuild = nil }()
	prefix := fmt.Sprintf("rltest%d-fail-", os.Getpid())
	l, err := New(Config{Prefix: prefix})
	if !errors.Is(err, errBuild) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("New = %v, want %v", err, errBuild)
	}
	for _, r := range roles {
		p := netnsDir + "/" + prefix + r
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after failed New: stat %s: %v, want not exist", p, err)
		}
	}
}

func run(name string, args ...string) (string, error) {
	out, err := osexec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s: %w: %s", name, err, out)
	}
	return string(out), nil
}

// TestTeardownOnPanic runs a test that panics with a lab up in a child
// process, and checks that the lab was torn down all the same.
func TestTeardownOnPanic(t *testing.T) {
	if prefix := os.Getenv("LAB_TEST_PANIC_PREFIX"); prefix != "" {
		NewConfigT(t, Config{Prefix: prefix})
		panic("test panics with a lab up")
	}
	if err := available(); err != nil {
		SkipOrFail(t, "lab: "+err.Error())
	}
	prefix := fmt.Sprintf("rltest%d-panic-", os.Getpid())
	cmd := osexec.Command(os.Args[0], "-test.run=^TestTeardownOnPanic$", "-test.count=1")
	cmd.Env = append(os.Environ(), "LAB_TEST_PANIC_PREFIX="+prefix)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "test panics with a lab up") {
		t.Fatalf("child: err = %v, want a panic:\n%s", err, out)
	}
	for _, r := range roles {
		p := netnsDir + "/" + prefix + r
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after panic: stat %s: %v, want not exist", p, err)
			deleteNamedNS(prefix + r)
		}
	}
}

func TestEndHostQueues(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	if err := l.EndHostQueues(); err != nil {
		t.Fatal(err)
	}
	rings := runtime.NumCPU()
	for _, e := range []struct {
		ns     *NS
		ifname string
	}{{l.Caller, CallerIfName}, {l.Callee, CalleeIfName}} {
		out, err := e.ns.Command("sh", "-c", "cat /sys/class/net/"+e.ifname+"/threaded; ls -d /sys/class/net/"+e.ifname+"/queues/rx-* | wc -l; tc qdisc show dev "+e.ifname).CombinedOutput()
		if err != nil {
			t.Fatalf("%s/%s: %v: %s", e.ns, e.ifname, err, out)
		}
		f := strings.SplitN(string(out), "\n", 3)
		if len(f) < 3 {
			t.Fatalf("%s/%s: short output %q", e.ns, e.ifname, out)
		}
		if f[0] != "1" {
			t.Errorf("%s/%s: threaded = %q, want 1", e.ns, e.ifname, f[0])
		}
		if f[1] != strconv.Itoa(rings) {
			t.Errorf("%s/%s: %s receive queues, want %d", e.ns, e.ifname, f[1], rings)
		}
		if want := fmt.Sprintf(" limit %dp", endQueueLen); !strings.HasPrefix(f[2], "qdisc pfifo 1: root") || !strings.Contains(f[2], want) {
			t.Errorf("%s/%s: qdisc %q, want a root pfifo with%s", e.ns, e.ifname, f[2], want)
		}
	}
	// The end hosts still reach each other through the relay.
	expectDelivery(t, l, l.Callee, l.CalleeAddr4, 40000)
	expectDelivery(t, l, l.Callee, l.CalleeAddr6, 40001)
}

func TestHostQueuesThreads(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	pids, err := l.Caller.HostQueues(CallerIfName)
	if err != nil {
		t.Fatal(err)
	}
	rings := runtime.NumCPU()
	if len(pids) != rings {
		t.Fatalf("%d NAPI threads, want one per ring: %d", len(pids), rings)
	}
	prefix := "napi/" + CallerIfName + "-"
	last := -1
	for i, pid := range pids {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			t.Fatal(err)
		}
		id, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(string(comm)), prefix))
		if err != nil || id <= last {
			t.Errorf("thread %d is %q: want %s<NAPI id> in increasing order", i, comm, prefix)
		}
		last = id
		attr, err := unix.SchedGetAttr(pid, 0)
		if err != nil || attr.Policy != unix.SCHED_FIFO || attr.Priority != endNAPIPriority {
			t.Errorf("thread %s: %+v, %v; want SCHED_FIFO %d", comm, attr, err, endNAPIPriority)
		}
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(pid, &set); err != nil || set.Count() != 1 || !set.IsSet(i%rings) {
			t.Errorf("thread %s (ring %d): affinity %v, %v; want CPU %d alone", comm, i, set, err, i%rings)
		}
	}
	expectDelivery(t, l, l.Callee, l.CalleeAddr4, 40002)
}

func TestRelayNAPIThreads(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	if err := l.EndHostQueues(); err != nil {
		t.Fatal(err)
	}
	pids, err := l.RelayNAPIThreads()
	if err != nil {
		t.Fatal(err)
	}
	// One receive ring each toward the caller and the callee.
	if len(pids) != 2 {
		t.Fatalf("%d relay NAPI threads, want 2", len(pids))
	}
	for i, pid := range pids {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			t.Fatal(err)
		}
		name := []string{RelayCallerIfName, RelayCalleeIfName}[i]
		if !strings.HasPrefix(string(comm), "napi/"+name+"-") {
			t.Errorf("thread %d is %q, want napi/%s-<id>", pid, comm, name)
		}
		attr, err := unix.SchedGetAttr(pid, 0)
		if err != nil || attr.Policy != unix.SCHED_FIFO || attr.Priority != relayNAPIPriority || relayNAPIPriority >= endNAPIPriority {
			t.Errorf("thread %s: %+v, %v; want SCHED_FIFO %d, below the end hosts' %d", comm, attr, err, relayNAPIPriority, endNAPIPriority)
		}
	}
	expectDelivery(t, l, l.Callee, l.CalleeAddr4, 40003)
	expectDelivery(t, l, l.Callee, l.CalleeAddr6, 40004)
}
