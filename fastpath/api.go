package fastpath

import (
	"errors"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/dataplane"
)

// Config configures the fast path.
type Config struct {
	Interfaces       []string // where the XDP program attaches
	XDPMode          string   // "native" (falls back to generic) or "generic"
	PinPath          string   // bpffs directory; default /sys/fs/bpf/relayd
	MaxFlows         int      // flow table size; default 65536
	EnableForwarding bool     // turn IP forwarding on for the interfaces when off
}

// Fastpath is the attached XDP data plane. Safe for concurrent use.
type Fastpath struct{}

var errTODO = errors.New("fastpath: not built yet")

// New loads (or takes over the pinned) program and maps and attaches them.
func New(cfg Config, log *zap.Logger) (*Fastpath, error) { return nil, errTODO }

// Close releases this process's handles; pinned state keeps forwarding.
func (f *Fastpath) Close() error { return nil }

// Detach removes links, program and maps pinned under pinPath.
func Detach(pinPath string, log *zap.Logger) error { return errTODO }

func (f *Fastpath) Install(fl dataplane.Flow) error { return errTODO }
func (f *Fastpath) Update(fl dataplane.Flow) error  { return errTODO }
func (f *Fastpath) Remove(m netip.AddrPort) (dataplane.Stats, error) {
	return dataplane.Stats{}, errTODO
}
func (f *Fastpath) Stats(m netip.AddrPort) (dataplane.Stats, error) {
	return dataplane.Stats{}, errTODO
}
func (f *Fastpath) List() ([]dataplane.FlowStats, error)                    { return nil, errTODO }
func (f *Fastpath) Path() dataplane.Path                                    { return dataplane.PathXDP }
func (f *Fastpath) Counters() ([]dataplane.Counter, error)                  { return nil, errTODO }
func (f *Fastpath) Interfaces() []dataplane.Interface                       { return nil }
func (f *Fastpath) Sweep(idle time.Duration) ([]dataplane.FlowStats, error) { return nil, errTODO }
