package lab

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// roles are the namespace name suffixes of the standard topology.
var roles = [...]string{"caller", "relay", "callee"}

// New builds the standard topology described in the package documentation.
// It first removes namespaces of the same names left by an earlier run that
// did not close its lab. On error it tears down what it built.
func New(cfg Config) (_ *Lab, err error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("lab config: %w", err)
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = defaultPrefix()
	}
	if err := removeStale(prefix); err != nil {
		return nil, err
	}
	l := newLab(prefix)
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	for i, p := range []**NS{&l.Caller, &l.Relay, &l.Callee} {
		ns, err := newNamedNS(prefix + roles[i])
		if err != nil {
			return nil, err
		}
		*p = ns
	}
	if err := l.build(); err != nil {
		return nil, fmt.Errorf("build lab %s: %w", prefix, err)
	}
	return l, nil
}

// Close tears the lab down: it deletes the veths and the namespaces. The
// kernel frees a namespace once no socket or process refers to it any
// more. Close is idempotent.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	// Delete the veths explicitly: a socket left open in a namespace
	// keeps it, and its interfaces, alive.
	if l.Relay != nil {
		if err := l.Relay.deleteLinks(RelayCallerIfName, RelayCalleeIfName, RelayAttackerIfName, RelayRelay2IfName); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ns := range []*NS{l.Caller, l.Relay, l.Callee, l.Attacker, l.Relay2} {
		if ns == nil {
			continue
		}
		if err := ns.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteLinks deletes the named interfaces (and so their veth peers) if
// they exist.
func (ns *NS) deleteLinks(names ...string) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	var errs []error
	for _, name := range names {
		l, err := h.LinkByName(name)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) {
				errs = append(errs, fmt.Errorf("interface %s in %s: %w", name, ns.name, err))
			}
			continue
		}
		if err := h.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s in %s: %w", name, ns.name, err))
		}
	}
	return errors.Join(errs...)
}

// staleName matches namespaces with a default prefix; the number after rl
// is the pid of the process that made them.
var staleName = regexp.MustCompile(`^rl([0-9]+)-[0-9]+-(caller|relay|callee|attacker|relay2)$`)

// removeStale deletes the namespaces the lab with prefix is about to
// create, and namespaces with a default prefix whose process is gone.
func removeStale(prefix string) error {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove stale namespaces: %w", err)
	}
	mine := map[string]bool{prefix + "attacker": true, prefix + "relay2": true}
	for _, r := range roles {
		mine[prefix+r] = true
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !mine[name] && !orphaned(name) {
			continue
		}
		if err := deleteNamedNS(name); err != nil {
			errs = append(errs, fmt.Errorf("remove stale namespace: %w", err))
		}
	}
	return errors.Join(errs...)
}

// orphaned reports whether name has a default prefix of a process that no
// longer runs.
func orphaned(name string) bool {
	m := staleName.FindStringSubmatch(name)
	if m == nil {
		return false
	}
	pid, err := strconv.Atoi(m[1])
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	return errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

// testHookBuild, when set, runs first in build; an error aborts it.
var testHookBuild func() error

// build wires the namespaces of l together.
func (l *Lab) build() error {
	if testHookBuild != nil {
		if err := testHookBuild(); err != nil {
			return err
		}
	}
	// IPv6 settings that new interfaces inherit: no duplicate address
	// detection, so link-local addresses and neighbour discovery work at
	// once; keep addresses when a link goes down, as IPv4 does.
	for _, ns := range []*NS{l.Caller, l.Relay, l.Callee} {
		for _, key := range []string{
			"net/ipv6/conf/all/accept_dad",
			"net/ipv6/conf/default/accept_dad",
		} {
			if err := ns.SetSysctl(key, "0"); err != nil {
				return err
			}
		}
		for _, key := range []string{
			"net/ipv6/conf/all/keep_addr_on_down",
			"net/ipv6/conf/default/keep_addr_on_down",
		} {
			if err := ns.SetSysctl(key, "1"); err != nil {
				return err
			}
		}
	}

	// Create each veth in the relay with its peer directly in the other
	// namespace, so no name ever appears in the namespace of the process.
	for _, v := range []struct {
		name, peer string
		peerNS     *NS
	}{
		{RelayCallerIfName, CallerIfName, l.Caller},
		{RelayCalleeIfName, CalleeIfName, l.Callee},
	} {
		if err := l.Relay.addVeth(v.name, v.peer, v.peerNS); err != nil {
			return err
		}
	}

	links := []struct {
		ns   *NS
		name string
		iff  *Iface
	}{
		{l.Caller, CallerIfName, &l.CallerIf},
		{l.Relay, RelayCallerIfName, &l.RelayCallerIf},
		{l.Relay, RelayCalleeIfName, &l.RelayCalleeIf},
		{l.Callee, CalleeIfName, &l.CalleeIf},
	}
	// Offloads, see docs/architecture.md, "Lab and measurement": GRO on so that frames XDP sends
	// into the peer are not dropped, tx checksum offload off so that
	// locally generated UDP carries a full checksum.
	for _, k := range links {
		if err := k.ns.SetGRO(k.name, true); err != nil {
			return err
		}
		if err := k.ns.SetTxChecksum(k.name, false); err != nil {
			return err
		}
	}

	// Forwarding in the relay; bpf_fib_lookup needs it on the ingress
	// device too.
	for _, key := range []string{
		"net/ipv4/ip_forward",
		"net/ipv6/conf/all/forwarding",
		"net/ipv6/conf/" + RelayCallerIfName + "/forwarding",
		"net/ipv6/conf/" + RelayCalleeIfName + "/forwarding",
	} {
		if err := l.Relay.SetSysctl(key, "1"); err != nil {
			return err
		}
	}

	// Links up first, so that connected routes exist for the gateways.
	for _, ns := range []*NS{l.Caller, l.Relay, l.Callee} {
		if err := ns.SetLinkUp("lo"); err != nil {
			return err
		}
	}
	for _, k := range links {
		if err := k.ns.SetLinkUp(k.name); err != nil {
			return err
		}
	}

	addrs := []struct {
		ns     *NS
		ifname string
		addr   netip.Prefix
	}{
		{l.Caller, CallerIfName, netip.PrefixFrom(l.CallerAddr4, 24)},
		{l.Caller, CallerIfName, netip.PrefixFrom(l.CallerAddr6, 64)},
		{l.Relay, RelayCallerIfName, netip.PrefixFrom(l.RelayCallerAddr4, 24)},
		{l.Relay, RelayCallerIfName, netip.PrefixFrom(l.RelayCallerAddr6, 64)},
		{l.Relay, "lo", netip.PrefixFrom(l.RelayMedia4, 32)},
		{l.Relay, "lo", netip.PrefixFrom(l.RelayMedia6, 128)},
		{l.Relay, RelayCalleeIfName, netip.PrefixFrom(l.RelayCalleeAddr4, 24)},
		{l.Relay, RelayCalleeIfName, netip.PrefixFrom(l.RelayCalleeAddr6, 64)},
		{l.Callee, CalleeIfName, netip.PrefixFrom(l.CalleeAddr4, 24)},
		{l.Callee, CalleeIfName, netip.PrefixFrom(l.CalleeAddr6, 64)},
	}
	for _, a := range addrs {
		if err := a.ns.addAddr(a.ifname, a.addr); err != nil {
			return err
		}
	}

	routes := []struct {
		ns     *NS
		ifname string
		gw     netip.Addr
	}{
		{l.Caller, CallerIfName, l.RelayCallerAddr4},
		{l.Caller, CallerIfName, l.RelayCallerAddr6},
		{l.Callee, CalleeIfName, l.RelayCalleeAddr4},
		{l.Callee, CalleeIfName, l.RelayCalleeAddr6},
	}
	for _, r := range routes {
		if err := r.ns.addDefaultRoute(r.ifname, r.gw); err != nil {
			return err
		}
	}

	for _, k := range links {
		iff, err := k.ns.Iface(k.name)
		if err != nil {
			return err
		}
		*k.iff = iff
	}
	return nil
}

// addVeth creates the veth pair name (in ns) and peer (in peerNS).
func (ns *NS) addVeth(name, peer string, peerNS *NS) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	v := netlink.NewVeth(netlink.LinkAttrs{Name: name})
	v.PeerName = peer
	v.PeerNamespace = netlink.NsFd(peerNS.fd)
	if err := h.LinkAdd(v); err != nil {
		return fmt.Errorf("add veth %s in %s, peer %s in %s: %w", name, ns.name, peer, peerNS.name, err)
	}
	return nil
}

// addAddr adds p to the interface ifname; IPv6 addresses skip duplicate
// address detection, so they are usable at once.
func (ns *NS) addAddr(ifname string, p netip.Prefix) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := ns.link(h, ifname)
	if err != nil {
		return err
	}
	a := &netlink.Addr{IPNet: prefixNet(p)}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(l, a); err != nil {
		return fmt.Errorf("add address %s to %s in %s: %w", p, ifname, ns.name, err)
	}
	return nil
}

// addDefaultRoute adds a default route via gw on ifname.
func (ns *NS) addDefaultRoute(ifname string, gw netip.Addr) error {
	unspec := netip.IPv4Unspecified()
	if gw.Is6() {
		unspec = netip.IPv6Unspecified()
	}
	return ns.addRoute(ifname, netip.PrefixFrom(unspec, 0), gw)
}

// addRoute adds a route to dst via gw on ifname.
func (ns *NS) addRoute(ifname string, dst netip.Prefix, gw netip.Addr) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := ns.link(h, ifname)
	if err != nil {
		return err
	}
	r := &netlink.Route{
		LinkIndex: l.Attrs().Index,
		Dst:       prefixNet(dst),
		Gw:        gw.AsSlice(),
	}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("add route to %s via %s in %s: %w", dst, gw, ns.name, err)
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	a := p.Addr()
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(p.Bits(), a.BitLen())}
}

// available reports why the lab cannot be built here, or nil.
func available() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN)")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return fmt.Errorf("network namespaces unavailable: %w", err)
	}
	// Try to create a namespace on a thread that then dies with its
	// goroutine, leaving the rest of the process alone.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the runtime ends the thread
		errc <- unix.Unshare(unix.CLONE_NEWNET)
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("network namespaces unavailable: unshare: %w", err)
	}
	return nil
}

// Names of the attacker's link.
const (
	RelayAttackerIfName = "r2" // in relay, towards the attacker
	AttackerIfName      = "a0" // in attacker
)

// AddAttacker adds a fourth namespace, attacker, behind the relay's r2
// (198.18.4.0/24, 2001:2:0:4::/64), routed like the caller: a host on the
// path that is not a party to any call, for RTP Bleed and injection tests.
// The relay's XDP is not attached to r2, so its packets take the kernel's
// path to the relay's sockets.
func (l *Lab) AddAttacker() error {
	if l.Attacker != nil {
		return nil
	}
	ns, err := newNamedNS(l.prefix + "attacker")
	if err != nil {
		return err
	}
	l.Attacker = ns
	l.AttackerAddr4 = netip.MustParseAddr("198.18.4.2")
	l.AttackerAddr6 = netip.MustParseAddr("2001:2:0:4::2")
	relay4, relay6 := netip.MustParseAddr("198.18.4.1"), netip.MustParseAddr("2001:2:0:4::1")
	for _, key := range []string{"net/ipv6/conf/all/accept_dad", "net/ipv6/conf/default/accept_dad"} {
		if err := ns.SetSysctl(key, "0"); err != nil {
			return err
		}
	}
	if err := l.Relay.addVeth(RelayAttackerIfName, AttackerIfName, ns); err != nil {
		return err
	}
	if err := ns.SetTxChecksum(AttackerIfName, false); err != nil {
		return err
	}
	for _, k := range []struct {
		ns   *NS
		name string
	}{{ns, "lo"}, {ns, AttackerIfName}, {l.Relay, RelayAttackerIfName}} {
		if err := k.ns.SetLinkUp(k.name); err != nil {
			return err
		}
	}
	if err := l.Relay.SetSysctl("net/ipv6/conf/"+RelayAttackerIfName+"/forwarding", "1"); err != nil {
		return err
	}
	for _, a := range []struct {
		ns     *NS
		ifname string
		addr   netip.Prefix
	}{
		{ns, AttackerIfName, netip.PrefixFrom(l.AttackerAddr4, 24)},
		{ns, AttackerIfName, netip.PrefixFrom(l.AttackerAddr6, 64)},
		{l.Relay, RelayAttackerIfName, netip.PrefixFrom(relay4, 24)},
		{l.Relay, RelayAttackerIfName, netip.PrefixFrom(relay6, 64)},
	} {
		if err := a.ns.addAddr(a.ifname, a.addr); err != nil {
			return err
		}
	}
	for _, gw := range []netip.Addr{relay4, relay6} {
		if err := ns.addDefaultRoute(AttackerIfName, gw); err != nil {
			return err
		}
	}
	return nil
}

// endQueueLen is the transmit queue EndHostQueues gives the caller's and
// callee's veths: a second of a 10,000-pps burst.
const endQueueLen = 10000

// EndHostQueues gives the caller's and callee's veths what a host's NIC
// has and a bare veth lacks, for tests that must lose nothing at high
// rates (the soak):
//
//   - A transmit queue (pfifo, endQueueLen packets). A veth whose peer
//     runs XDP or GRO hands frames to the peer's 256-frame ring; without
//     a qdisc it drops what the ring cannot take at once (a sender's
//     burst while the relay's CPU is busy), with one it stops the queue
//     and requeues (Linux 6.16 and later), as a NIC's full ring does.
//   - One receive ring per CPU (`ethtool -L rx N`). The relay's XDP
//     redirects into the peer's ring of the CPU it runs on; with one ring
//     both CPUs fill the same 256 frames, and a burst from one while the
//     other's NAPI waits for its CPU is dropped (xdp_xmit_errors).
//   - Threaded NAPI at real-time priority (endNAPIPriority, SCHED_FIFO):
//     a NIC's receive interrupt runs at once, but a veth's NAPI is a
//     softirq that the kernel hands to ksoftirqd, an ordinary task, when
//     softirqs run long; behind the sender, the sink and the relay on a
//     busy 2-CPU machine it can wait 10 ms and more, long enough for the
//     relay's XDP to fill the 256 frames (at 50,000 pps, 5 ms) and lose
//     the rest. Each receive ring gets its own kernel thread
//     ("napi/<device>-<id>") that preempts ordinary tasks, as a NIC's
//     interrupt would.
//
// Call it before the relay attaches XDP: the relay's veths keep one
// queue each, so the number of transmit queues, which native XDP on a
// veth requires its peer not to exceed, does not change.
func (l *Lab) EndHostQueues() error {
	for _, e := range []struct {
		ns   *NS
		name string
	}{{l.Caller, CallerIfName}, {l.Callee, CalleeIfName}} {
		if _, err := e.ns.HostQueues(e.name); err != nil {
			return err
		}
	}
	return nil
}

// HostQueues gives ifname, a veth in ns, what EndHostQueues gives the end
// hosts' (a pfifo queue of endQueueLen packets, a receive ring per CPU,
// threaded NAPI at endNAPIPriority) and returns its NAPI threads' pids,
// whose CPU time is the device's receive work, in the order of the rings
// (veth adds ring 0's NAPI instance first, and NAPI ids grow): an XDP
// redirect into a veth fills the ring of the CPU it runs on, so pinning
// thread i to CPU i keeps the thread that drains a ring beside the one
// that fills it. Call it before XDP is attached to the veth's peer.
func (ns *NS) HostQueues(ifname string) ([]int, error) {
	// A veth has as many receive queues as the machine has possible
	// CPUs, one of them in use.
	rings := runtime.NumCPU()
	if err := ns.setTxQueue(ifname, endQueueLen); err != nil {
		return nil, err
	}
	if rings > 1 {
		if out, err := ns.Command("ethtool", "-L", ifname, "rx", strconv.Itoa(rings)).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ethtool -L %s rx %d in %s: %v: %s", ifname, rings, ns.name, err, bytes.TrimSpace(out))
		}
	}
	pids, err := ns.threadedNAPI(ifname, endNAPIPriority)
	if err != nil {
		return nil, err
	}
	// Ring i's thread on CPU i, where the relay's XDP redirects into
	// ring i run: a thread woken on the other CPU waits there for a kernel
	// without full preemption (this machine's 6.18 is PREEMPT_NONE,
	// Debian's 6.1 PREEMPT_VOLUNTARY) to reach a scheduling point, for
	// milliseconds, while the 256-frame ring overflows.
	for i, pid := range pids {
		var set unix.CPUSet
		set.Set(i % rings)
		if err := unix.SchedSetaffinity(pid, &set); err != nil {
			return nil, fmt.Errorf("pin %s's NAPI thread %d in %s to CPU %d: %w", ifname, pid, ns.name, i%rings, err)
		}
	}
	return pids, nil
}

// relayNAPIPriority is the SCHED_FIFO priority RelayNAPIThreads gives the
// relay's NAPI threads: below the end hosts' (endNAPIPriority), so that a
// relay thread that has just redirected a poll's frames (at most 64) into
// an end host's ring yields to the thread that drains it.
const relayNAPIPriority = 40

// RelayNAPIThreads moves the receive work of the relay's veths toward the
// caller and the callee, where its XDP program runs, into NAPI threads at
// SCHED_FIFO relayNAPIPriority, for tests that must lose nothing at high
// rates on a busy machine (the soak), after EndHostQueues. In a softirq
// the relay's XDP can redirect far more than an end host's 256-frame ring
// holds before that ring's thread runs: with a backlog in the sender's
// queue, softirq rounds of up to 300 packets follow one another for
// milliseconds (the kernel hands them to ksoftirqd only after ten). A
// thread yields after each poll of at most 64 frames to the higher
// priority thread of the ring it filled. The relay's veths keep their one
// receive ring and the thread is not pinned. It returns the threads'
// pids.
func (l *Lab) RelayNAPIThreads() ([]int, error) {
	var pids []int
	for _, name := range []string{RelayCallerIfName, RelayCalleeIfName} {
		p, err := l.Relay.threadedNAPI(name, relayNAPIPriority)
		if err != nil {
			return nil, err
		}
		pids = append(pids, p...)
	}
	return pids, nil
}

// endNAPIPriority is the SCHED_FIFO priority EndHostQueues gives the end
// hosts' NAPI threads: that of the kernel's threaded interrupt handlers.
const endNAPIPriority = 50

// threadedNAPI moves ifname's NAPI instances (its receive rings: a veth
// has them while GRO or XDP is on) into kernel threads and gives those
// threads SCHED_FIFO priority prio. The threads are found by name among
// the ones that were not there before: a device name is unique only in
// its namespace, and another lab may have threads of the same name. It
// returns their pids.
func (ns *NS) threadedNAPI(ifname string, prio int) ([]int, error) {
	prefix := "napi/" + ifname + "-"
	// Threads are told apart from another lab's of the same name by
	// being new: no other process of this code may create some between
	// the two looks.
	unlock, err := lockFile(napiLock)
	if err != nil {
		return nil, err
	}
	defer unlock()
	before, err := kernelThreads(prefix)
	if err != nil {
		return nil, err
	}
	// sysfs shows the devices of the namespace that mounted it: ip netns
	// exec mounts one of the namespace's own.
	if out, err := ns.Command("sh", "-c", "echo 1 > /sys/class/net/"+ifname+"/threaded").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("threaded NAPI on %s in %s: %v: %s", ifname, ns.name, err, bytes.TrimSpace(out))
	}
	after, err := kernelThreads(prefix)
	if err != nil {
		return nil, err
	}
	var pids []int
	for pid := range after {
		if before[pid] {
			continue
		}
		attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(prio)}
		if err := unix.SchedSetAttr(pid, attr, 0); err != nil {
			return nil, fmt.Errorf("SCHED_FIFO %d for %s's NAPI thread %d in %s: %w", prio, ifname, pid, ns.name, err)
		}
		pids = append(pids, pid)
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("threaded NAPI on %s in %s: no new %s* kernel thread (is GRO or XDP on?)", ifname, ns.name, prefix)
	}
	// By NAPI id, the number after the prefix.
	id := func(pid int) int {
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		n, _ := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(string(comm)), prefix))
		return n
	}
	slices.SortFunc(pids, func(a, b int) int { return id(a) - id(b) })
	return pids, nil
}

// napiLock serializes threadedNAPI across processes (test binaries of
// several packages run at once).
const napiLock = "/run/lock/relayd-lab-napi.lock"

// lockFile takes an exclusive flock on path, creating it, and returns the
// function that releases it.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// kernelThreads returns the pids of the tasks whose name starts with
// prefix.
func kernelThreads(prefix string) (map[int]bool, error) {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]bool{}
	for _, d := range dir {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + d.Name() + "/comm")
		if err != nil {
			continue // gone
		}
		if bytes.HasPrefix(comm, []byte(prefix)) {
			out[pid] = true
		}
	}
	return out, nil
}

// setTxQueue sets ifname's transmit queue length to n and gives it a
// pfifo qdisc of that length.
func (ns *NS) setTxQueue(ifname string, n int) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := ns.link(h, ifname)
	if err != nil {
		return err
	}
	if err := h.LinkSetTxQLen(l, n); err != nil {
		return fmt.Errorf("set the transmit queue of %s in %s to %d: %w", ifname, ns.name, n, err)
	}
	// pfifo's limit is the device's queue length when it is created.
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}, QdiscType: "pfifo"}
	if err := h.QdiscReplace(q); err != nil {
		return fmt.Errorf("pfifo qdisc on %s in %s: %w", ifname, ns.name, err)
	}
	return nil
}
