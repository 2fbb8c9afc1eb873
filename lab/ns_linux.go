package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named namespaces are bind-mounted, as by `ip netns add`.
const netnsDir = "/run/netns"

// NS is a named network namespace of a Lab. It is safe for concurrent use;
// its zero value is not usable. It stays valid until its Lab is closed.
type NS struct {
	name string
	fd   netns.NsHandle // open until the Lab is closed
}

// Name returns the namespace's name, as `ip netns list` shows it.
func (ns *NS) Name() string { return ns.name }

// Path returns the namespace's bind mount, /run/netns/NAME.
func (ns *NS) Path() string { return filepath.Join(netnsDir, ns.name) }

// String returns the namespace's name.
func (ns *NS) String() string { return ns.name }

// newNamedNS creates a network namespace and bind-mounts it at
// /run/netns/name, like `ip netns add name`.
func newNamedNS(name string) (*NS, error) {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(netnsDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	f.Close()
	// Unshare on a locked thread, bind-mount its namespace, and let the
	// thread die with its goroutine instead of switching it back.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the runtime ends the thread
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind mount: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	fd, err := netns.GetFromPath(path)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open namespace %s: %w", name, err), deleteNamedNS(name))
	}
	return &NS{name: name, fd: fd}, nil
}

// deleteNamedNS undoes newNamedNS. The kernel destroys the namespace, and
// the interfaces in it, once nothing else refers to it.
func deleteNamedNS(name string) error {
	path := filepath.Join(netnsDir, name)
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete namespace %s: unmount: %w", name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete namespace %s: %w", name, err)
	}
	return nil
}

// close releases the namespace and removes its name.
func (ns *NS) close() error {
	ns.fd.Close()
	return deleteNamedNS(ns.name)
}

// Do runs fn on an OS thread that is locked and switched into the
// namespace, and returns its error. Sockets fn creates stay in the
// namespace; goroutines fn starts do not run in it. A panic in fn is
// re-raised in the caller.
func (ns *NS) Do(fn func() error) error {
	type result struct {
		err      error
		panicked bool
		panicVal any
	}
	done := make(chan result, 1)
	go func() {
		var res result
		defer func() { done <- res }()
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			res.err = fmt.Errorf("get current namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns.fd); err != nil {
			// The thread may be half switched: keep it locked so that
			// the runtime ends it with this goroutine.
			res.err = fmt.Errorf("enter namespace %s: %w", ns.name, err)
			return
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					res.panicked, res.panicVal = true, r
				}
			}()
			res.err = fn()
		}()
		if err := netns.Set(orig); err != nil {
			res.err = errors.Join(res.err, fmt.Errorf("leave namespace %s: %w", ns.name, err))
			return // stay locked, see above
		}
		runtime.UnlockOSThread()
	}()
	res := <-done
	if res.panicked {
		panic(res.panicVal)
	}
	return res.err
}

// ListenUDP is net.ListenUDP inside the namespace, with addr in the
// form host:port (host may be empty); the socket stays in the namespace.
func (ns *NS) ListenUDP(network, addr string) (*net.UDPConn, error) {
	var la *net.UDPAddr
	if addr != "" {
		a, err := net.ResolveUDPAddr(network, addr)
		if err != nil {
			return nil, err
		}
		la = a
	}
	var c *net.UDPConn
	err := ns.Do(func() (err error) {
		c, err = net.ListenUDP(network, la)
		return err
	})
	return c, err
}

// DialUDP is net.DialUDP inside the namespace: a UDP socket bound to laddr
// (empty for any) and connected to raddr, both host:port. The socket stays
// in the namespace.
func (ns *NS) DialUDP(network, laddr, raddr string) (*net.UDPConn, error) {
	var la *net.UDPAddr
	if laddr != "" {
		a, err := net.ResolveUDPAddr(network, laddr)
		if err != nil {
			return nil, err
		}
		la = a
	}
	ra, err := net.ResolveUDPAddr(network, raddr)
	if err != nil {
		return nil, err
	}
	var c *net.UDPConn
	err = ns.Do(func() (err error) {
		c, err = net.DialUDP(network, la, ra)
		return err
	})
	return c, err
}

// Command returns a command that runs name with args inside the namespace.
// It runs through `ip netns exec`, which also mounts the namespace's own
// /sys for the program, so tools like ip, ethtool, tcpdump and bpftool see
// the namespace's interfaces; the started process is the program itself
// (ip execs it). iproute2 must be installed.
func (ns *NS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", ns.commandArgs(name, args)...)
}

// CommandContext is Command with a context, like exec.CommandContext.
func (ns *NS) CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", ns.commandArgs(name, args)...)
}

func (ns *NS) commandArgs(name string, args []string) []string {
	return append([]string{"netns", "exec", ns.name, name}, args...)
}

// sysctlPath maps "net.ipv4.ip_forward" or "net/ipv4/ip_forward" to its
// file under /proc/sys.
func sysctlPath(key string) string {
	if !strings.Contains(key, "/") {
		key = strings.ReplaceAll(key, ".", "/")
	}
	return filepath.Join("/proc/sys", key)
}

// SetSysctl writes value to the sysctl key ("net.ipv4.ip_forward", or
// "net/ipv6/conf/r0.5/forwarding" when a part contains a dot) inside the
// namespace.
func (ns *NS) SetSysctl(key, value string) error {
	return ns.Do(func() error {
		if err := os.WriteFile(sysctlPath(key), []byte(value+"\n"), 0o644); err != nil {
			return fmt.Errorf("sysctl %s in %s: %w", key, ns.name, err)
		}
		return nil
	})
}

// Sysctl reads the sysctl key (see SetSysctl) inside the namespace.
func (ns *NS) Sysctl(key string) (string, error) {
	var v string
	err := ns.Do(func() error {
		b, err := os.ReadFile(sysctlPath(key))
		if err != nil {
			return fmt.Errorf("sysctl %s in %s: %w", key, ns.name, err)
		}
		v = strings.TrimSpace(string(b))
		return nil
	})
	return v, err
}

// handle returns a netlink handle for the namespace; the caller closes it.
// It speaks rtnetlink only: without a family list netlink opens xfrm and
// netfilter sockets too, which fail on kernels where those are modules not
// yet loaded (Debian's).
func (ns *NS) handle() (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(ns.fd, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", ns.name, err)
	}
	return h, nil
}

// link looks up an interface by name with h.
func (ns *NS) link(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("interface %s in %s: %w", name, ns.name, err)
	}
	return l, nil
}

// Iface looks up the interface called name in the namespace.
func (ns *NS) Iface(name string) (Iface, error) {
	h, err := ns.handle()
	if err != nil {
		return Iface{}, err
	}
	defer h.Close()
	l, err := ns.link(h, name)
	if err != nil {
		return Iface{}, err
	}
	a := l.Attrs()
	return Iface{Name: a.Name, Index: a.Index, HardwareAddr: a.HardwareAddr}, nil
}

// SetLinkUp sets the interface called name up.
func (ns *NS) SetLinkUp(name string) error { return ns.setLink(name, true) }

// SetLinkDown sets the interface called name down. On a veth this also
// takes the carrier of its peer down.
func (ns *NS) SetLinkDown(name string) error { return ns.setLink(name, false) }

func (ns *NS) setLink(name string, up bool) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := ns.link(h, name)
	if err != nil {
		return err
	}
	if up {
		err = h.LinkSetUp(l)
	} else {
		err = h.LinkSetDown(l)
	}
	if err != nil {
		return fmt.Errorf("set %s in %s up=%t: %w", name, ns.name, up, err)
	}
	return nil
}

// FlushNeighbors deletes the IPv4 and IPv6 neighbour entries of the
// interface called ifname, or of all interfaces when ifname is empty, like
// `ip neigh flush`: permanent and NOARP entries stay. The next packet to a
// flushed neighbour has to resolve it first.
func (ns *NS) FlushNeighbors(ifname string) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	index := 0
	if ifname != "" {
		l, err := ns.link(h, ifname)
		if err != nil {
			return err
		}
		index = l.Attrs().Index
	}
	var errs []error
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		neighs, err := h.NeighList(index, family)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return fmt.Errorf("list neighbours in %s: %w", ns.name, err)
		}
		for _, n := range neighs {
			if n.State&(netlink.NUD_NOARP|netlink.NUD_PERMANENT) != 0 {
				continue
			}
			if err := h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete neighbour %s in %s: %w", n.IP, ns.name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// onLink calls fn with a netlink handle in ns and the interface called
// ifname.
func (ns *NS) onLink(ifname string, fn func(h *netlink.Handle, l netlink.Link) error) error {
	h, err := ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := ns.link(h, ifname)
	if err != nil {
		return err
	}
	return fn(h, l)
}

// neighbor is the neighbour entry for addr on l, with no state or
// hardware address.
func neighbor(l netlink.Link, addr netip.Addr) netlink.Neigh {
	family := netlink.FAMILY_V4
	if addr.Is6() {
		family = netlink.FAMILY_V6
	}
	return netlink.Neigh{LinkIndex: l.Attrs().Index, Family: family, IP: addr.AsSlice()}
}

// SetNeighbor installs a reachable neighbour entry for addr with the
// hardware address mac on the interface called ifname, like `ip neigh
// replace ... nud reachable`, without the fork and exec of ip(8).
func (ns *NS) SetNeighbor(ifname string, addr netip.Addr, mac net.HardwareAddr) error {
	return ns.onLink(ifname, func(h *netlink.Handle, l netlink.Link) error {
		n := neighbor(l, addr)
		n.HardwareAddr, n.State = mac, netlink.NUD_REACHABLE
		if err := h.NeighSet(&n); err != nil {
			return fmt.Errorf("set neighbour %s on %s in %s: %w", addr, ifname, ns.name, err)
		}
		return nil
	})
}

// DeleteNeighbor deletes the neighbour entry for addr on the interface
// called ifname. It is not an error if there is none.
func (ns *NS) DeleteNeighbor(ifname string, addr netip.Addr) error {
	return ns.onLink(ifname, func(h *netlink.Handle, l netlink.Link) error {
		n := neighbor(l, addr)
		if err := h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete neighbour %s on %s in %s: %w", addr, ifname, ns.name, err)
		}
		return nil
	})
}
