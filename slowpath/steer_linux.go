package slowpath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/relayd/relayd/internal/flowkey"
)

// MaxSteerSockets is how many sockets a Steering can hand packets to
// (the size of bpf/steer.c's SOCKMAP).
const MaxSteerSockets = 512

// Steering is the userspace data plane's socket steering: the sk_lookup
// program bpf/steer.c attached to one network namespace, with its map of
// relay addresses and ports to socket indexes and its map of sockets. A
// UDP packet to a steered address and port goes to the socket of its
// index, whatever that socket is bound to; every other packet takes the
// kernel's normal socket lookup. The Pool steers to its workers; lab
// benchmarks use it to give other relays the same kernel path.
type Steering struct {
	objs steerObjects
	link link.Link
}

// NewSteering loads the steering program with room for maxFlows steered
// addresses and ports, and attaches it to the network namespace whose
// file is netns (/proc/thread-self/ns/net, /run/netns/NAME).
func NewSteering(netns string, maxFlows int) (*Steering, error) {
	if maxFlows <= 0 {
		return nil, fmt.Errorf("steering for %d flows", maxFlows)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("raise memlock limit: %w", err)
	}
	spec, err := loadSteer()
	if err != nil {
		return nil, fmt.Errorf("load steering spec: %w", err)
	}
	spec.Maps["steer"].MaxEntries = uint32(maxFlows)
	s := &Steering{}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("load steering program: %w", err)
	}
	ns, err := os.Open(netns)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	defer ns.Close()
	if s.link, err = link.AttachNetNs(int(ns.Fd()), s.objs.RelaySteer); err != nil {
		s.Close()
		return nil, fmt.Errorf("attach socket steering to %s: %w", netns, err)
	}
	return s, nil
}

// SetSocket makes the UDP socket fd the one of index i
// (0..MaxSteerSockets-1). The map holds its own reference: fd may be
// closed afterwards, the socket stays until Close.
func (s *Steering) SetSocket(i int, fd int) error {
	if i < 0 || i >= MaxSteerSockets {
		return fmt.Errorf("socket index %d: want 0-%d", i, MaxSteerSockets-1)
	}
	if err := s.objs.Sockets.Update(uint32(i), uint64(fd), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("add socket %d to the sockmap: %w", i, err)
	}
	return nil
}

// Steer hands the packets to match to the socket of index i.
func (s *Steering) Steer(match netip.AddrPort, i int) error {
	if err := s.objs.Steer.Update(new(steerKey(match)), new(uint32(i)), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("steer %s: %w", match, err)
	}
	return nil
}

// Unsteer gives the packets to match back to the normal socket lookup.
// An address and port not steered is no error.
func (s *Steering) Unsteer(match netip.AddrPort) error {
	if err := s.objs.Steer.Delete(new(steerKey(match))); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unsteer %s: %w", match, err)
	}
	return nil
}

// Close detaches the program and unloads it and its maps. A nil
// Steering closes without error.
func (s *Steering) Close() error {
	if s == nil {
		return nil
	}
	var errs []error
	if s.link != nil {
		errs = append(errs, s.link.Close())
	}
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}

func steerKey(ap netip.AddrPort) steerSteerKey {
	var k steerSteerKey
	k.Family, k.Addr, k.Port = flowkey.Parts(ap)
	return k
}
