package fastpath

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
)

// TestInterfaceRecreated: an interface deleted and created again while
// relayd runs gets the program back on its new ifindex, with its pinned
// link (which the next start adopts), its redirect map entry (the old
// ifindex's gone) and the redirect monitor's watch, without a restart.
func TestInterfaceRecreated(t *testing.T) {
	e := newTestEnv(t)
	const name = "rc0"
	// The peer gets an XDP program: a veth takes redirected frames only
	// then (or with GRO on the peer), and the redirect monitor would
	// otherwise put rc0 into fallback, out of the redirect map.
	pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, xdpPass), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pass.Close()
	create := func() int {
		t.Helper()
		var idx, peerIdx int
		err := inNS(e.ns, func() error {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "rc1"}); err != nil {
				return err
			}
			for _, n := range []string{name, "rc1"} {
				l, err := netlink.LinkByName(n)
				if err != nil {
					return err
				}
				if err := netlink.LinkSetUp(l); err != nil {
					return err
				}
				if n == name {
					idx = l.Attrs().Index
				} else {
					peerIdx = l.Attrs().Index
				}
			}
			peer, err := link.AttachXDP(link.XDPOptions{Program: pass, Interface: peerIdx, Flags: link.XDPDriverMode})
			if err != nil {
				return fmt.Errorf("XDP on the peer: %w", err)
			}
			t.Cleanup(func() { peer.Close() })
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return idx
	}
	// progOn returns the id of the XDP program on the interface, 0 for none.
	progOn := func() uint32 {
		t.Helper()
		var id uint32
		inNS(e.ns, func() error {
			l, err := netlink.LinkByName(name)
			if err == nil && l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached {
				id = l.Attrs().Xdp.ProgId
			}
			return nil
		})
		return id
	}
	inTxPorts := func(f *Fastpath, idx int) bool {
		var v relayBpfDevmapVal
		err := f.objs.TxPorts.Lookup(uint32(idx), &v)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatal(err)
		}
		return err == nil
	}

	first := create()
	log := zaptest.NewLogger(t)
	pins := bpffsT(t)
	cfg := Config{Interfaces: []string{name}, PinPath: pins, MaxFlows: 16, NeighbourWait: -1}
	var f *Fastpath
	if err := inNS(e.ns, func() (err error) { f, err = New(cfg, log); return err }); err != nil {
		t.Fatal(err)
	}
	defer func() { f.Close() }()
	<-f.monDone // the monitor and the watch started
	info, err := f.objs.RelayXdp.Info()
	if err != nil {
		t.Fatal(err)
	}
	progID, _ := info.ID()
	if got := progOn(); got != uint32(progID) || !inTxPorts(f, first) {
		t.Fatalf("at start: program %d on %s (want %d), in the redirect map %v", got, name, progID, inTxPorts(f, first))
	}

	if err := inNS(e.ns, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deletion noticed", func() bool { return f.Interfaces()[0].Gone })
	second := create()
	if second == first {
		t.Fatalf("re-created %s on the same ifindex %d", name, first)
	}
	waitFor(t, "the program on the re-created interface", func() bool {
		return progOn() == uint32(progID) && inTxPorts(f, second) && f.Interfaces()[0].Index == second
	})
	if f.Interfaces()[0].Gone {
		t.Errorf("%s still reported gone after the re-attachment", name)
	}
	if inTxPorts(f, first) {
		t.Errorf("the old ifindex %d is still in the redirect map", first)
	}
	pinned, err := link.LoadPinnedLink(f.linkPath(name), nil)
	if err != nil {
		t.Fatalf("pinned link: %v", err)
	}
	if li, err := pinned.Info(); err != nil || li.XDP() == nil || int(li.XDP().Ifindex) != second {
		t.Errorf("pinned link: %+v, %v; want one on ifindex %d", li, err, second)
	}
	pinned.Close()
	if eg := f.Egress(); len(eg) != 1 || eg[0].Device != name || eg[0].Fallback {
		t.Errorf("redirect monitor's devices %+v, want %s alone, not in fallback", eg, name)
	}
	f.mu.Lock()
	mon := f.mon
	f.mu.Unlock()
	mon.mu.Lock()
	_, watched := mon.devs[second]
	mon.mu.Unlock()
	if !watched {
		t.Errorf("the redirect monitor does not watch ifindex %d", second)
	}

	// The next start takes the new attachment over.
	f.Close()
	if err := inNS(e.ns, func() (err error) { f, err = New(cfg, log); return err }); err != nil {
		t.Fatal(err)
	}
	if in := f.Interfaces(); len(in) != 1 || in[0].Index != second || !in[0].Adopted || in[0].Gone {
		t.Errorf("after a restart: %+v, want %s on ifindex %d, its link adopted", in, name, second)
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
