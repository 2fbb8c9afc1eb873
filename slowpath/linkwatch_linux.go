package slowpath

import (
	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/rtnl"
)

// linkWatch follows the interfaces of AF_XDP receive (Config.IO "afxdp"):
// one deleted and created again under its name (ifupdown does that to
// VLAN and bond devices when networking restarts) gets the workers'
// sockets back, and the pool's program when it is its own (without
// ExternalXDP: mode userspace), without a restart (InterfaceRecreated).
// With ExternalXDP the program's owner (the XDP data plane) follows the
// interfaces for its program; either may come first: until both have,
// the device's packets for the workers take the kernel's path.
type linkWatch struct {
	p    *Pool
	lw   *rtnl.LinkWatch
	gone []bool // by device: its deletion was logged; the watch's goroutine only
}

// watchLinks starts following the AF_XDP interfaces in ns.
func (p *Pool) watchLinks(ns netns.NsHandle) (*linkWatch, error) {
	w := &linkWatch{p: p, gone: make([]bool, len(p.xsk.names))}
	lw, err := rtnl.WatchLinks(ns, p.xsk.names, w.check, p.log,
		"one deleted and created again keeps its AF_XDP receive on the old device until relayd restarts")
	if err != nil {
		return nil, err
	}
	w.lw = lw
	return w, nil
}

// check compares each interface's ifindex with the one its sockets are
// bound to, and moves them where they differ.
func (w *linkWatch) check(lw *rtnl.LinkWatch) {
	x := w.p.xsk
	for d, name := range x.names {
		cur, gone, err := lw.LinkIndex(name)
		x.mu.Lock()
		was := x.ifindex[d]
		x.mu.Unlock()
		switch {
		case err != nil:
			w.p.log.Warn("cannot read interface", zap.String("interface", name), zap.Error(err))
			continue
		case gone:
			if !w.gone[d] {
				w.p.log.Warn("interface deleted: AF_XDP receive moves to it when it comes back",
					zap.String("interface", name), zap.Int("ifindex", was))
				w.gone[d] = true
			}
			continue
		case cur == was && !w.gone[d]:
			continue
		}
		w.gone[d] = false
		if err := rtnl.InNamespace(lw.NS(), func() error { return w.p.InterfaceRecreated(name, was, cur) }); err != nil {
			w.p.log.Error("interface re-created, AF_XDP receive not moved to it: the workers' packets on it take the kernel's receive path",
				zap.String("interface", name), zap.Error(err))
		}
	}
}

func (w *linkWatch) close() {
	if w != nil {
		w.lw.Close()
	}
}
