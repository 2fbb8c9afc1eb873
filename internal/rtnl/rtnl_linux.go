package rtnl

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// InNamespace runs fn on a thread in ns. It enters ns only when it is
// another than the thread's own: setns takes CAP_SYS_ADMIN, which relayd
// has not got under its unit.
func InNamespace(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if orig.Equal(ns) {
		return fn()
	}
	if err := netns.Set(ns); err != nil {
		return err
	}
	defer netns.Set(orig)
	return fn()
}

// InNamespacePath runs fn on a thread in the namespace at path (such as
// /run/netns/NAME).
func InNamespacePath(path string, fn func() error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	return InNamespace(ns, fn)
}

// DupNS returns a handle of its own on ns.
func DupNS(ns netns.NsHandle) (netns.NsHandle, error) {
	fd, err := unix.FcntlInt(uintptr(ns), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return netns.None(), fmt.Errorf("network namespace: %w", err)
	}
	return netns.NsHandle(fd), nil
}

// Subscribe opens a socket on the rtnetlink groups of ns, whose reads
// return EAGAIN after timeout without an event. The socket is opened on a
// thread in ns (InNamespace): netlink's SubscribeAt and NewHandleAt call
// setns even for the current namespace.
func Subscribe(ns netns.NsHandle, timeout time.Duration, groups ...uint) (*nl.NetlinkSocket, error) {
	var sock *nl.NetlinkSocket
	err := InNamespace(ns, func() (err error) {
		sock, err = nl.Subscribe(unix.NETLINK_ROUTE, groups...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := sock.SetReceiveTimeout(&tv); err != nil {
		sock.Close()
		return nil, err
	}
	return sock, nil
}

// LinkWatch follows network interfaces by name through RTNLGRP_LINK and
// calls its check whenever one of them may have changed: once before
// WatchLinks returns, at every link event about one of them, and after
// events were lost. The check compares what it cares about with the kernel's state
// itself (LinkIndex); it runs on the watch's goroutine, one call at a
// time.
type LinkWatch struct {
	ns    netns.NsHandle
	sock  *nl.NetlinkSocket
	names []string
	check func(*LinkWatch)
	log   *zap.Logger
	lost  string

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// linkPoll is how often a watch checks whether it is to stop while no
// event arrives.
const linkPoll = time.Second

// WatchLinks starts following the interfaces names in ns (which it
// duplicates: the caller keeps its handle). lost says, in the error
// logged if the watch fails for good, what is then no longer done.
func WatchLinks(ns netns.NsHandle, names []string, check func(*LinkWatch), log *zap.Logger, lost string) (*LinkWatch, error) {
	ns, err := DupNS(ns)
	if err != nil {
		return nil, err
	}
	w := &LinkWatch{ns: ns, names: names, check: check, log: log, lost: lost, stop: make(chan struct{}), done: make(chan struct{})}
	if w.sock, err = Subscribe(ns, linkPoll, unix.RTNLGRP_LINK); err != nil {
		ns.Close()
		return nil, fmt.Errorf("link events: %w", err)
	}
	// An interface re-created before the subscription is found by this
	// first check.
	check(w)
	go w.run()
	return w, nil
}

func (w *LinkWatch) run() {
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
			w.check(w)
			continue
		default:
			w.log.Error("interfaces are no longer followed: "+w.lost, zap.Error(err))
			return
		}
		if slices.ContainsFunc(msgs, w.concerns) {
			w.check(w)
		}
	}
}

// concerns reports whether the event m is about one of the interfaces.
func (w *LinkWatch) concerns(m syscall.NetlinkMessage) bool {
	if m.Header.Type != unix.RTM_NEWLINK && m.Header.Type != unix.RTM_DELLINK {
		return false
	}
	h := unix.NlMsghdr{Len: m.Header.Len, Type: m.Header.Type, Flags: m.Header.Flags, Seq: m.Header.Seq, Pid: m.Header.Pid}
	l, err := netlink.LinkDeserialize(&h, m.Data)
	if err != nil {
		return true // look anyway
	}
	return slices.Contains(w.names, l.Attrs().Name)
}

// NS is the namespace the watch follows, for the check's InNamespace.
func (w *LinkWatch) NS() netns.NsHandle { return w.ns }

// LinkIndex returns the ifindex of interface name in the watch's
// namespace; gone is set when there is no such interface.
func (w *LinkWatch) LinkIndex(name string) (index int, gone bool, err error) {
	err = InNamespace(w.ns, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		index = l.Attrs().Index
		return nil
	})
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return 0, true, nil
	}
	return index, false, err
}

// Close stops the watch and waits for a check under way.
func (w *LinkWatch) Close() {
	w.once.Do(func() {
		close(w.stop)
		w.sock.Close()
		<-w.done
		w.ns.Close()
	})
}
