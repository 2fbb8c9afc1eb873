package rtnl

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/internal/testenv"
)

// newNS makes a network namespace of the test's own.
func newNS(t *testing.T) netns.NsHandle {
	t.Helper()
	testenv.NeedRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func addVeth(t *testing.T, ns netns.NsHandle, name string) {
	t.Helper()
	err := InNamespace(ns, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLinkWatch: the check runs before WatchLinks returns and again when
// a followed interface is deleted and when it is created again, not for
// another interface; LinkIndex says gone in between and then gives the
// new ifindex.
func TestLinkWatch(t *testing.T) {
	ns := newNS(t)
	addVeth(t, ns, "watched0")
	var checks atomic.Int32
	w, err := WatchLinks(ns, []string{"watched0"}, func(*LinkWatch) { checks.Add(1) }, zaptest.NewLogger(t), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if checks.Load() != 1 {
		t.Fatalf("%d checks before WatchLinks returned, want 1", checks.Load())
	}
	old, gone, err := w.LinkIndex("watched0")
	if err != nil || gone || old == 0 {
		t.Fatalf("LinkIndex = %d, %v, %v", old, gone, err)
	}
	waitChecks := func(what string, n int32) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Second); checks.Load() < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d checks, want %d", what, checks.Load(), n)
			}
		}
	}
	addVeth(t, ns, "other0")
	time.Sleep(200 * time.Millisecond)
	if n := checks.Load(); n != 1 {
		t.Errorf("another interface's creation made %d checks, want none", n-1)
	}
	if err := InNamespace(ns, func() error { return netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "watched0"}}) }); err != nil {
		t.Fatal(err)
	}
	waitChecks("deleted", 2)
	if _, gone, err := w.LinkIndex("watched0"); err != nil || !gone {
		t.Errorf("after the deletion LinkIndex says gone %v, %v", gone, err)
	}
	n := checks.Load()
	addVeth(t, ns, "watched0")
	waitChecks("created again", n+1)
	if now, gone, err := w.LinkIndex("watched0"); err != nil || gone || now == old {
		t.Errorf("after the re-creation LinkIndex = %d, %v, %v (was %d)", now, gone, err, old)
	}
	w.Close()
	w.Close() // idempotent
}
