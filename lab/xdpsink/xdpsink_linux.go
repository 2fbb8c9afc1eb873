// Package xdpsink loads the benchmarks' XDP sink (bpf/sink.c) on lab
// interfaces: it counts the UDP datagrams to two ports per RTP stream and
// per run, by SSRC (bits 0-15 the stream, 16-23 the run tag), and drops
// them, at a fraction of what a receiving socket costs. Benchmarks only;
// nothing in relayd uses it.
package xdpsink

//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -nostdinc" -target bpfel sink ../../bpf/sink.c -- -I../../bpf/include

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/relayd/relayd/internal/rtnl"
)

const (
	// Streams is how many streams the sink tells apart (the SSRC's low
	// 16 bits).
	Streams = 65536
	// Runs is how many run tags it counts (the SSRC's bits 16-23).
	Runs = 256
	// total is the runs map's key counting every datagram to a port.
	total = Runs
)

// Sink is the program, loaded once, and its attachments.
type Sink struct {
	objs  sinkObjects
	links []link.Link
	cpus  int
	// buffers for reading per-CPU values
	keys []uint32
	vals []uint64
}

// Load loads the sink counting datagrams to ports a and b (either may be
// 0: none), not attached yet.
func Load(a, b uint16) (*Sink, error) {
	spec, err := loadSink()
	if err != nil {
		return nil, err
	}
	for name, v := range map[string]uint16{"sink_port_a": a, "sink_port_b": b} {
		vs, ok := spec.Variables[name]
		if !ok {
			return nil, fmt.Errorf("sink: no variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return nil, fmt.Errorf("sink: set %s: %w", name, err)
		}
	}
	s := &Sink{}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("load XDP sink: %w", err)
	}
	if s.cpus, err = ebpf.PossibleCPU(); err != nil {
		s.objs.Close()
		return nil, err
	}
	return s, nil
}

// Attach attaches the sink (native XDP) to ifnames in the network
// namespace at nsPath.
func (s *Sink) Attach(nsPath string, ifnames ...string) error {
	return rtnl.InNamespacePath(nsPath, func() error {
		for _, name := range ifnames {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			xl, err := link.AttachXDP(link.XDPOptions{Program: s.objs.SinkXdp, Interface: l.Attrs().Index, Flags: link.XDPDriverMode})
			if err != nil {
				return fmt.Errorf("attach XDP sink to %s: %w", name, err)
			}
			s.links = append(s.links, xl)
		}
		return nil
	})
}

// Program returns the loaded program (its run-time statistics, tests).
// It stays owned by the Sink.
func (s *Sink) Program() *ebpf.Program { return s.objs.SinkXdp }

// Run returns the datagrams counted for run tag, over all CPUs.
func (s *Sink) Run(tag uint8) (uint64, error) { return s.sum(s.objs.SinkRuns, uint32(tag)) }

// Total returns every datagram to a sink port counted, RTP or not.
func (s *Sink) Total() (uint64, error) { return s.sum(s.objs.SinkRuns, total) }

func (s *Sink) sum(m *ebpf.Map, key uint32) (uint64, error) {
	var per []uint64
	if err := m.Lookup(key, &per); err != nil {
		return 0, err
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

// Streams fills counts[i] with stream i's datagrams, over all CPUs, for
// i < len(counts) (at most Streams), in batches.
func (s *Sink) Streams(counts []uint64) error {
	const batch = 1024
	if len(counts) > Streams {
		return fmt.Errorf("sink: %d streams, at most %d", len(counts), Streams)
	}
	if s.keys == nil {
		s.keys, s.vals = make([]uint32, batch), make([]uint64, batch*s.cpus)
	}
	for i := range counts {
		counts[i] = 0
	}
	var cursor ebpf.MapBatchCursor
	for done := 0; done < len(counts); {
		n, err := s.objs.SinkStreams.BatchLookup(&cursor, s.keys, s.vals, nil)
		for j := range n {
			k := int(s.keys[j])
			if k >= len(counts) {
				continue
			}
			for c := range s.cpus {
				counts[k] += s.vals[j*s.cpus+c]
			}
		}
		done += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break // the end of the array
		}
		if err != nil {
			return fmt.Errorf("sink streams: %w", err)
		}
	}
	return nil
}

// Close detaches and unloads.
func (s *Sink) Close() error {
	var errs []error
	for _, l := range s.links {
		errs = append(errs, l.Close())
	}
	s.links = nil
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}
