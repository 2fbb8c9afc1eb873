package fastpath

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/internal/rtnl"
	"github.com/relayd/relayd/lab"
)

// testEnv is a private network namespace in which the XDP program runs
// through BPF_PROG_TEST_RUN, so its fib lookups see a known topology:
//
//	in0  198.18.0.1/24 2001:2::1/64      ingress; neighbours .2 (sender) and .3
//	out0 198.18.2.1/24 2001:2:0:2::1/64  egress in the DEVMAP, MTU 1280; neighbour .2
//	nox0 198.18.4.1/24                   egress not in the DEVMAP; neighbour .2
//	lo   198.18.1.1/32 2001:2:0:1::1/128 relay media address
//
// 198.18.2.3 on out0 has no neighbour entry; 198.19.0.0/16 has no route.
type testEnv struct {
	ns       netns.NsHandle
	fp       *Fastpath
	in, out  int // ifindexes
	nox      int
	outMAC   net.HardwareAddr
	inMAC    net.HardwareAddr
	neighMAC net.HardwareAddr // MAC of every static neighbour
}

var (
	relay4   = netip.MustParseAddr("198.18.1.1")
	relay6   = netip.MustParseAddr("2001:2:0:1::1")
	caller4  = netip.MustParseAddr("198.18.0.2")
	caller6  = netip.MustParseAddr("2001:2::2")
	callee4  = netip.MustParseAddr("198.18.2.2")
	callee6  = netip.MustParseAddr("2001:2:0:2::2")
	unres4   = netip.MustParseAddr("198.18.2.3")
	noroute4 = netip.MustParseAddr("198.19.0.9")
	nox4     = netip.MustParseAddr("198.18.4.2")
	near4    = netip.MustParseAddr("198.18.0.3") // on the ingress side
)

// requireBPF skips when the test cannot load BPF programs or create network
// namespaces: not root, or a kernel without them.
func requireBPF(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		lab.SkipOrFail(tb, "needs root: loads BPF programs and creates network namespaces")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		lab.SkipOrFail(tb, "no network namespace support: "+err.Error())
	}
}

// inNS runs fn on a thread in ns.
var inNS = rtnl.InNamespace

func newTestEnv(tb testing.TB) *testEnv {
	tb.Helper()
	return newTestEnvFlows(tb, 1024)
}

// newTestEnvFlows is newTestEnv with maps sized for maxFlows flows.
func newTestEnvFlows(tb testing.TB, maxFlows int) *testEnv {
	tb.Helper()
	return newTestEnvConfig(tb, Config{MaxFlows: maxFlows})
}

// newTestEnvConfig is newTestEnv with the Fastpath's configuration cfg
// (its neighbour resolution off).
func newTestEnvConfig(tb testing.TB, cfg Config) *testEnv {
	tb.Helper()
	requireBPF(tb)
	e := &testEnv{neighMAC: net.HardwareAddr{0x02, 0xaa, 0, 0, 0, 0x02}}

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		tb.Fatal(err)
	}
	e.ns, err = netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		tb.Fatal("create network namespace:", err)
	}
	setupErr := e.setup()
	netns.Set(orig)
	orig.Close()
	runtime.UnlockOSThread()
	tb.Cleanup(func() {
		if e.fp != nil {
			e.fp.Close()
		}
		e.ns.Close()
	})
	if setupErr != nil {
		tb.Fatal(setupErr)
	}

	// Private maps, no pinning, no attachment: BPF_PROG_TEST_RUN only.
	e.fp = &Fastpath{
		log:       zaptest.NewLogger(tb),
		cfg:       cfg,
		installed: map[flowKey]installedFlow{},
	}
	e.fp.cfg.NeighbourWait = -1
	e.fp.cfg.setDefaults()
	if err := e.fp.load(false); err != nil {
		tb.Fatal(err)
	}
	// DEVMAP entries resolve ifindexes in the writer's namespace.
	if err := inNS(e.ns, func() error {
		return e.fp.objs.TxPorts.Put(uint32(e.out), relayBpfDevmapVal{Ifindex: uint32(e.out)})
	}); err != nil {
		tb.Fatal(err)
	}
	// The route cache on, as in relayd: its watch follows the namespace.
	e.watchRoutes(tb, routeRefresh)
	return e
}

// watchRoutes (re)starts the route cache's watch of the namespace's
// routing state, with the given refresh.
func (e *testEnv) watchRoutes(tb testing.TB, refresh time.Duration) {
	tb.Helper()
	if e.fp.routes != nil {
		if err := e.fp.routes.close(); err != nil {
			tb.Fatal(err)
		}
		e.fp.routes = nil
	}
	e.fp.watchRoutes(e.ns, refresh)
	if e.fp.routes == nil && e.fp.routeSlots != 0 {
		tb.Fatal("route cache off")
	}
}

func (e *testEnv) setup() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	for _, a := range []string{"198.18.1.1/32", "2001:2:0:1::1/128"} {
		if err := addAddr(lo, a); err != nil {
			return err
		}
	}
	mk := func(name, peer string, addrs ...string) (netlink.Link, error) {
		va := netlink.NewLinkAttrs()
		va.Name = name
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: va, PeerName: peer}); err != nil {
			return nil, fmt.Errorf("add veth %s: %w", name, err)
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return nil, err
		}
		p, _ := netlink.LinkByName(peer)
		for _, x := range []netlink.Link{l, p} {
			if err := netlink.LinkSetUp(x); err != nil {
				return nil, err
			}
		}
		for _, a := range addrs {
			if err := addAddr(l, a); err != nil {
				return nil, err
			}
		}
		return l, nil
	}
	in, err := mk("in0", "in1", "198.18.0.1/24", "2001:2::1/64")
	if err != nil {
		return err
	}
	out, err := mk("out0", "out1", "198.18.2.1/24", "2001:2:0:2::1/64")
	if err != nil {
		return err
	}
	nox, err := mk("nox0", "nox1", "198.18.4.1/24")
	if err != nil {
		return err
	}
	// A frame of 1,300 bytes is over the egress MTU.
	if err := netlink.LinkSetMTU(out, 1280); err != nil {
		return err
	}
	e.in, e.out, e.nox = in.Attrs().Index, out.Attrs().Index, nox.Attrs().Index
	e.inMAC, e.outMAC = in.Attrs().HardwareAddr, out.Attrs().HardwareAddr
	for _, n := range []struct {
		l  netlink.Link
		ip string
	}{{in, "198.18.0.2"}, {in, "198.18.0.3"}, {in, "2001:2::2"}, {out, "198.18.2.2"}, {out, "2001:2:0:2::2"}, {nox, "198.18.4.2"}} {
		err := netlink.NeighAdd(&netlink.Neigh{
			LinkIndex: n.l.Attrs().Index, State: netlink.NUD_PERMANENT,
			IP: net.ParseIP(n.ip), HardwareAddr: e.neighMAC,
		})
		if err != nil {
			return fmt.Errorf("add neighbour %s: %w", n.ip, err)
		}
	}
	for _, p := range []string{"/proc/sys/net/ipv4/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func addAddr(l netlink.Link, cidr string) error {
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	a.Flags = unix.IFA_F_NODAD
	if err := netlink.AddrAdd(l, a); err != nil {
		return fmt.Errorf("add address %s: %w", cidr, err)
	}
	return nil
}

// xdpMd mirrors struct xdp_md for BPF_PROG_TEST_RUN's context.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// run runs the program on frame as if received on in0 and returns the
// verdict and the frame as the program left it.
func (e *testEnv) run(tb testing.TB, frame []byte) (uint32, []byte) {
	tb.Helper()
	return e.runOn(tb, frame, e.in)
}

// runOn is run with frame received on the device of ifindex.
func (e *testEnv) runOn(tb testing.TB, frame []byte, ifindex int) (uint32, []byte) {
	tb.Helper()
	var ret uint32
	out := make([]byte, len(frame)+256)
	err := inNS(e.ns, func() error {
		// Always on the same CPU, as a flow's packets are in relayd (a
		// receive queue's): the program's per-CPU state, its route
		// cache entries, is the same from one run to the next.
		restore, err := pinThread()
		if err != nil {
			return err
		}
		defer restore()
		ret, err = e.fp.objs.RelayXdp.Run(&ebpf.RunOptions{
			Data:    frame,
			DataOut: out,
			Context: xdpMd{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)},
		})
		return err
	})
	if err != nil {
		tb.Fatalf("prog run: %v", err)
	}
	return ret, out[:len(frame)]
}

// counters returns the global counters by "verdict/reason".
func (e *testEnv) counters(tb testing.TB) map[string]uint64 {
	tb.Helper()
	cs, err := e.fp.Counters()
	if err != nil {
		tb.Fatal(err)
	}
	m := make(map[string]uint64, len(cs))
	for _, c := range cs {
		m[c.Verdict+"/"+c.Reason] = c.Packets
	}
	return m
}

func osWrite(path, v string) error { return os.WriteFile(path, []byte(v), 0o644) }

// pinThread binds the calling thread, locked to it, to the last CPU it may
// run on, and returns what gives it back its CPUs.
func pinThread() (func(), error) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		return nil, fmt.Errorf("CPU affinity: %w", err)
	}
	last := -1
	for cpu := range 1024 {
		if all.IsSet(cpu) {
			last = cpu
		}
	}
	var one unix.CPUSet
	one.Set(last)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return nil, fmt.Errorf("CPU affinity: %w", err)
	}
	return func() { unix.SchedSetaffinity(0, &all) }, nil
}
