// Package minfwd loads a minimal XDP IPv4 forwarder (bpf/minfwd.c) on lab
// interfaces: the yardstick relayd's XDP program is benchmarked against in
// the same run. Benchmarks only; nothing in relayd uses it.
package minfwd

//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -nostdinc" -target bpfel minfwd ../../bpf/minfwd.c -- -I../../bpf/include

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/relayd/relayd/internal/rtnl"
)

// Forwarder is the program attached to some interfaces of one namespace.
type Forwarder struct {
	objs  minfwdObjects
	links []link.Link
}

// Attach loads the forwarder and attaches it (native XDP) to ifnames in
// the network namespace at nsPath; the DEVMAP is filled from inside that
// namespace, where its ifindexes resolve.
func Attach(nsPath string, ifnames ...string) (*Forwarder, error) {
	f := &Forwarder{}
	if err := loadMinfwdObjects(&f.objs, nil); err != nil {
		return nil, fmt.Errorf("load minimal forwarder: %w", err)
	}
	err := rtnl.InNamespacePath(nsPath, func() error {
		for _, name := range ifnames {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			idx := l.Attrs().Index
			if err := f.objs.MinPorts.Put(uint32(idx), minfwdBpfDevmapVal{Ifindex: uint32(idx)}); err != nil {
				return fmt.Errorf("devmap %s: %w", name, err)
			}
			xl, err := link.AttachXDP(link.XDPOptions{Program: f.objs.MinFwd, Interface: idx, Flags: link.XDPDriverMode})
			if err != nil {
				return fmt.Errorf("attach to %s: %w", name, err)
			}
			f.links = append(f.links, xl)
		}
		return nil
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Program returns the loaded program, e.g. for its run-time statistics.
// It stays owned by the Forwarder.
func (f *Forwarder) Program() *ebpf.Program { return f.objs.MinFwd }

// Close detaches and unloads.
func (f *Forwarder) Close() error {
	var errs []error
	for _, l := range f.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, f.objs.Close())
	return errors.Join(errs...)
}

// Load loads the forwarder without attaching it, for BPF_PROG_TEST_RUN
// benchmarks: the program and its DEVMAP (ifindex -> ifindex), which the
// caller fills from the right namespace.
func Load() (prog *ebpf.Program, devmap *ebpf.Map, closeFn func() error, err error) {
	var objs minfwdObjects
	if err := loadMinfwdObjects(&objs, nil); err != nil {
		return nil, nil, nil, fmt.Errorf("load minimal forwarder: %w", err)
	}
	return objs.MinFwd, objs.MinPorts, objs.Close, nil
}

// DevmapValue is the DEVMAP value for ifindex.
func DevmapValue(ifindex uint32) any { return minfwdBpfDevmapVal{Ifindex: ifindex} }
