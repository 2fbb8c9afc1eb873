package fastpath

import (
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
)

// TestAdoptLink: a pinned link on the interface's ifindex is taken over
// (new program, same link); one pinned for another ifindex is removed,
// detaching it, so that the caller attaches afresh.
func TestAdoptLink(t *testing.T) {
	e := newTestEnv(t)
	dir := bpffsT(t)
	log := zaptest.NewLogger(t)
	pin := func(ifindex int, name string) string {
		t.Helper()
		path := filepath.Join(dir, "link_"+name)
		err := inNS(e.ns, func() error {
			l, err := link.AttachXDP(link.XDPOptions{Program: e.fp.objs.RelayXdp, Interface: ifindex, Flags: link.XDPGenericMode})
			if err != nil {
				return err
			}
			defer l.Close() // the pin keeps it
			return l.Pin(path)
		})
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
	attached := func(name string) bool {
		t.Helper()
		var on bool
		inNS(e.ns, func() error {
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			on = l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached
			return nil
		})
		return on
	}

	// out0's own link: adopted.
	outPath := pin(e.out, "out0")
	l, err := e.fp.adoptLink(outPath, "out0", e.out, log)
	if err != nil || l == nil {
		t.Fatalf("own link: %v, %v; want it adopted", l, err)
	}
	l.Close()

	// The pin for in0 holds a link on nox0's ifindex (in0 was re-created,
	// its old ifindex reused): removed and detached.
	inPath := pin(e.nox, "in0")
	if !attached("nox0") {
		t.Fatal("test link not attached")
	}
	l, err = e.fp.adoptLink(inPath, "in0", e.in, log)
	if err != nil || l != nil {
		t.Fatalf("foreign link: %v, %v; want nil, nil", l, err)
	}
	if _, err := link.LoadPinnedLink(inPath, nil); err == nil {
		t.Error("foreign link still pinned")
	}
	if attached("nox0") {
		t.Error("foreign link still attached to nox0")
	}
	if !attached("out0") {
		t.Error("out0's link was touched")
	}
	// No pin: nothing to adopt.
	if l, err := e.fp.adoptLink(filepath.Join(dir, "link_none"), "none", 99, log); l != nil || err != nil {
		t.Errorf("no pin: %v, %v", l, err)
	}
}
