package fastpath

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
)

// linkWatch follows the configured interfaces while relayd runs. An
// interface deleted and created again (ifupdown does that to VLAN and
// bond devices when networking restarts; a driver reload does it to a
// NIC) comes back with another ifindex, and the program's attachment and
// redirect entry went with the old device: its packets climb the
// kernel's stack to the userspace shadows, relayed but at the workers'
// cost. The watch attaches the program to the new device (its pinned link
// replacing the severed one), makes it an egress again and hands it to
// the redirect monitor, without a restart. It runs on a thread in the
// namespace relayd started in, as the route cache's watch does.
type linkWatch struct {
	f    *Fastpath
	log  *zap.Logger
	ns   netns.NsHandle
	sock *nl.NetlinkSocket

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// linkPoll is how often the watch checks whether it is to stop while
// no event arrives.
const linkPoll = time.Second

// watchLinks starts following the configured interfaces in ns (which it
// duplicates: the caller keeps its handle).
func (f *Fastpath) watchLinks(ns netns.NsHandle) error {
	ns, err := dupNS(ns)
	if err != nil {
		return err
	}
	w := &linkWatch{f: f, log: f.log, ns: ns, stop: make(chan struct{}), done: make(chan struct{})}
	if w.sock, err = subscribe(ns, linkPoll, unix.RTNLGRP_LINK); err != nil {
		ns.Close()
		return fmt.Errorf("link events: %w", err)
	}
	f.mu.Lock()
	f.lw = w
	f.mu.Unlock()
	// An interface re-created between its attachment and the
	// subscription is found by this first check.
	w.check()
	go w.run()
	return nil
}

func (w *linkWatch) run() {
	defer close(w.done)
	for {
		msgs, _, err := w.sock.Receive()
		select {
		case <-w.stop:
			return
		default:
		}
		switch {
		case err == nil, errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.ENOBUFS):
			// Events were lost: look at every interface.
			w.check()
			continue
		default:
			w.log.Error("interfaces are no longer followed: one deleted and re-created goes without XDP until relayd restarts",
				zap.Error(err))
			return
		}
		if slices.ContainsFunc(msgs, w.concerns) {
			w.check()
		}
	}
}

// concerns reports whether the event m is about a configured interface.
func (w *linkWatch) concerns(m syscall.NetlinkMessage) bool {
	if m.Header.Type != unix.RTM_NEWLINK && m.Header.Type != unix.RTM_DELLINK {
		return false
	}
	h := unix.NlMsghdr{Len: m.Header.Len, Type: m.Header.Type, Flags: m.Header.Flags, Seq: m.Header.Seq, Pid: m.Header.Pid}
	l, err := netlink.LinkDeserialize(&h, m.Data)
	if err != nil {
		return true // look anyway
	}
	return slices.Contains(w.f.cfg.Interfaces, l.Attrs().Name)
}

// check compares each configured interface's ifindex with the one the
// program is attached to, and attaches it again where they differ.
func (w *linkWatch) check() {
	for _, name := range w.f.cfg.Interfaces {
		var cur int
		err := inNamespace(w.ns, func() error {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			cur = l.Attrs().Index
			return nil
		})
		w.f.mu.Lock()
		i := slices.IndexFunc(w.f.ifaces, func(in ifaceState) bool { return in.Name == name })
		var was ifaceState
		if i >= 0 {
			was = w.f.ifaces[i]
		}
		w.f.mu.Unlock()
		if i < 0 {
			continue
		}
		var notFound netlink.LinkNotFoundError
		switch {
		case errors.As(err, &notFound):
			if !was.gone {
				w.log.Warn("interface deleted: XDP is attached again when it comes back",
					zap.String("interface", name), zap.Int("ifindex", was.Index))
				w.f.markGone(name)
			}
			continue
		case err != nil:
			w.log.Warn("cannot read interface", zap.String("interface", name), zap.Error(err))
			continue
		case cur == was.Index && !was.gone:
			continue
		}
		var now int
		if err := inNamespace(w.ns, func() (err error) { now, err = w.f.reattach(name, was.Index); return err }); err != nil {
			w.log.Error("interface re-created, XDP not attached to it: its media goes through userspace",
				zap.String("interface", name), zap.Error(err))
			continue
		}
		if x := w.f.cfg.XSK; x != nil && x.Recreated != nil && now != 0 {
			if err := inNamespace(w.ns, func() error { return x.Recreated(name, was.Index, now) }); err != nil {
				w.log.Error("interface re-created, AF_XDP receive not moved to it: the workers' packets on it take the kernel's receive path",
					zap.String("interface", name), zap.Error(err))
			}
		}
	}
}

// close stops the watch.
func (w *linkWatch) close() {
	w.once.Do(func() {
		close(w.stop)
		w.sock.Close()
		<-w.done
		w.ns.Close()
	})
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
// (Interfaces) last, and returned (0 when f is closed). It runs on a
// thread in relayd's namespace.
func (f *Fastpath) reattach(name string, old int) (int, error) {
	iface, l, err := f.attachIface(name)
	if err != nil {
		return 0, err
	}
	// Under mu: Close, which waits for the watch, has either not begun or
	// marked f closed.
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		l.Close()
		return 0, nil
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
	return iface.Index, nil
}

// ifaceState is an interface the program is attached to, and whether it
// was deleted since.
type ifaceState struct {
	dataplane.Interface
	gone bool
}
