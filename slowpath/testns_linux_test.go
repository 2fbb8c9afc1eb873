package slowpath

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/lab"
)

// enterTestNS locks the test's goroutine to its thread and moves the
// thread into a new network namespace with lo up and addrs (prefixes) on
// it, usable at once (no DAD); the test's cleanup moves it back. It needs
// root, and fails under CI without it.
func enterTestNS(tb testing.TB, addrs ...string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		lab.SkipOrFail(tb, "needs root: creates a network namespace and attaches sk_lookup")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		tb.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		tb.Fatal("create network namespace:", err)
	}
	tb.Cleanup(func() {
		netns.Set(orig)
		ns.Close()
		orig.Close()
		runtime.UnlockOSThread()
	})
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		tb.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		tb.Fatal(err)
	}
	for _, a := range addrs {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			tb.Fatal(err)
		}
		addr.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(lo, addr); err != nil {
			tb.Fatal(err)
		}
	}
}
