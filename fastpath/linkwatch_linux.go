package fastpath

import (
	"errors"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/rtnl"
)

// The link watch follows the configured interfaces while relayd runs. An
// interface deleted and created again (ifupdown does that to VLAN and
// bond devices when networking restarts; a driver reload does it to a
// NIC) comes back with another ifindex, and the program's attachment and
// redirect entry went with the old device: its packets climb the
// kernel's stack to the userspace shadows, relayed but at the workers'
// cost. The watch attaches the program to the new device (its pinned link
// replacing the severed one), makes it an egress again and hands it to
// the redirect monitor, without a restart (the workers' AF_XDP sockets are
// the pool's to move: slowpath follows the interfaces too). It runs on a
// thread in the namespace relayd started in, as the route cache's watch
// does.

// watchLinks starts following the configured interfaces in ns (which it
// duplicates: the caller keeps its handle).
func (f *Fastpath) watchLinks(ns netns.NsHandle) error {
	lw, err := rtnl.WatchLinks(ns, f.cfg.Interfaces, f.checkLinks, f.log,
		"one deleted and re-created goes without XDP until relayd restarts")
	if err != nil {
		return err
	}
	f.mu.Lock()
	closed := f.closed
	if !closed {
		f.lw = lw
	}
	f.mu.Unlock()
	if closed {
		// Not under mu: a re-attachment under way takes it.
		lw.Close()
	}
	return nil
}

// checkLinks compares each configured interface's ifindex with the one
// the program is attached to, and attaches it again where they differ.
func (f *Fastpath) checkLinks(lw *rtnl.LinkWatch) {
	for _, name := range f.cfg.Interfaces {
		cur, gone, err := lw.LinkIndex(name)
		f.mu.Lock()
		i := slices.IndexFunc(f.ifaces, func(in ifaceState) bool { return in.Name == name })
		var was ifaceState
		if i >= 0 {
			was = f.ifaces[i]
		}
		f.mu.Unlock()
		if i < 0 {
			continue
		}
		switch {
		case err != nil:
			f.log.Warn("cannot read interface", zap.String("interface", name), zap.Error(err))
			continue
		case gone:
			if !was.gone {
				f.log.Warn("interface deleted: XDP is attached again when it comes back",
					zap.String("interface", name), zap.Int("ifindex", was.Index))
				f.markGone(name)
			}
			continue
		case cur == was.Index && !was.gone:
			continue
		}
		if err := rtnl.InNamespace(lw.NS(), func() error { return f.reattach(name, was.Index) }); err != nil {
			f.log.Error("interface re-created, XDP not attached to it: its media goes through userspace",
				zap.String("interface", name), zap.Error(err))
		}
	}
}

// markGone records that interface name was deleted.
func (f *Fastpath) markGone(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.ifaces {
		if f.ifaces[i].Name == name {
			f.ifaces[i].gone = true
		}
	}
}

// reattach attaches the program to interface name, re-created since it
// was attached to ifindex old, and makes it the egress in its place, the
// redirect monitor's device too; the interface's new ifindex is published
// (Interfaces) last. It runs on a thread in relayd's namespace.
func (f *Fastpath) reattach(name string, old int) error {
	iface, l, err := f.attachIface(name)
	if err != nil {
		return err
	}
	// Under mu: Close, which waits for the watch, has either not begun or
	// marked f closed.
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		l.Close()
		return nil
	}
	i := slices.IndexFunc(f.ifaces, func(in ifaceState) bool { return in.Name == name })
	// The kernel drops a deleted device's redirect entry; the old ifindex
	// may be another device's by now, which must not stay an egress.
	inUse := slices.ContainsFunc(f.ifaces, func(in ifaceState) bool { return in.Name != name && in.Index == old })
	if !inUse {
		if err := f.objs.TxPorts.Delete(uint32(old)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			f.log.Warn("old ifindex left in the redirect map", zap.Int("ifindex", old), zap.Error(err))
		}
	}
	if f.mon != nil {
		f.mon.replace(old, iface)
	}
	f.links[i].Close()
	f.ifaces[i] = ifaceState{Interface: iface}
	f.links[i] = l
	f.log.Info("interface re-created: XDP attached again", zap.String("interface", name),
		zap.Int("old_ifindex", old), zap.Int("ifindex", iface.Index), zap.String("mode", iface.Mode))
	return nil
}

// ifaceState is an interface the program is attached to, and whether it
// was deleted since.
type ifaceState struct {
	dataplane.Interface
	gone bool
}
