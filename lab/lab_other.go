//go:build !linux

package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
)

var errUnsupported = fmt.Errorf("lab: network namespaces need Linux, not %s: %w", runtime.GOOS, errors.ErrUnsupported)

// NS is a named network namespace of a Lab; on this system there are none.
type NS struct{}

// New returns an error: the lab needs Linux.
func New(cfg Config) (*Lab, error) { return nil, errUnsupported }

// Close does nothing.
func (l *Lab) Close() error { return nil }

func available() error { return errUnsupported }

// Name returns "".
func (ns *NS) Name() string { return "" }

// Path returns "".
func (ns *NS) Path() string { return "" }

// String returns "".
func (ns *NS) String() string { return "" }

// Do returns an error.
func (ns *NS) Do(fn func() error) error { return errUnsupported }

// ListenUDP returns an error.
func (ns *NS) ListenUDP(network, addr string) (*net.UDPConn, error) { return nil, errUnsupported }

// DialUDP returns an error.
func (ns *NS) DialUDP(network, laddr, raddr string) (*net.UDPConn, error) {
	return nil, errUnsupported
}

// Command returns a command that fails to start.
func (ns *NS) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Err = errUnsupported
	return cmd
}

// CommandContext returns a command that fails to start.
func (ns *NS) CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Err = errUnsupported
	return cmd
}

// SetSysctl returns an error.
func (ns *NS) SetSysctl(key, value string) error { return errUnsupported }

// Sysctl returns an error.
func (ns *NS) Sysctl(key string) (string, error) { return "", errUnsupported }

// Iface returns an error.
func (ns *NS) Iface(name string) (Iface, error) { return Iface{}, errUnsupported }

// SetLinkUp returns an error.
func (ns *NS) SetLinkUp(name string) error { return errUnsupported }

// SetLinkDown returns an error.
func (ns *NS) SetLinkDown(name string) error { return errUnsupported }

// FlushNeighbors returns an error.
func (ns *NS) FlushNeighbors(ifname string) error { return errUnsupported }

// SetNeighbor returns an error.
func (ns *NS) SetNeighbor(ifname string, addr netip.Addr, mac net.HardwareAddr) error {
	return errUnsupported
}

// DeleteNeighbor returns an error.
func (ns *NS) DeleteNeighbor(ifname string, addr netip.Addr) error { return errUnsupported }

// SetGRO returns an error.
func (ns *NS) SetGRO(ifname string, on bool) error { return errUnsupported }

// GRO returns an error.
func (ns *NS) GRO(ifname string) (bool, error) { return false, errUnsupported }

// SetTxChecksum returns an error.
func (ns *NS) SetTxChecksum(ifname string, on bool) error { return errUnsupported }

// TxChecksum returns an error.
func (ns *NS) TxChecksum(ifname string) (bool, error) { return false, errUnsupported }

// AddAttacker needs Linux.
func (l *Lab) AddAttacker() error { return errUnsupported }

// NewNS needs Linux.
func NewNS(name string) (*NS, error) { return nil, errUnsupported }

// Close does nothing.
func (ns *NS) Close() error { return nil }

// DeleteNS needs Linux.
func DeleteNS(name string) error { return errUnsupported }

// AddVeth needs Linux.
func (ns *NS) AddVeth(name, peer string, peerNS *NS) error { return errUnsupported }

// AddAddr needs Linux.
func (ns *NS) AddAddr(ifname string, p netip.Prefix) error { return errUnsupported }

// AddRoute needs Linux.
func (ns *NS) AddRoute(ifname string, dst netip.Prefix, gw netip.Addr) error {
	return errUnsupported
}

// DeleteLinks needs Linux.
func (ns *NS) DeleteLinks(names ...string) error { return errUnsupported }
