package lab

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with ifr_data set, padded beyond the size of
// the kernel's struct.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24]byte
}

// ethtool runs the ethtool_value command cmd on the interface ifname in
// the current namespace and returns the value the kernel left in it.
func ethtool(ifname string, cmd, data uint32) (uint32, error) {
	if len(ifname) >= unix.IFNAMSIZ {
		return 0, fmt.Errorf("interface name %q too long", ifname)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	v := ethtoolValue{cmd: cmd, data: data}
	var ifr ifreqData
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(&v)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(&v)
	if errno != 0 {
		return 0, errno
	}
	return v.data, nil
}

func (ns *NS) ethtoolSet(ifname, what string, cmd uint32, on bool) error {
	var data uint32
	if on {
		data = 1
	}
	return ns.Do(func() error {
		if _, err := ethtool(ifname, cmd, data); err != nil {
			return fmt.Errorf("set %s on %s in %s: %w", what, ifname, ns.name, err)
		}
		return nil
	})
}

func (ns *NS) ethtoolGet(ifname, what string, cmd uint32) (bool, error) {
	var on bool
	err := ns.Do(func() error {
		v, err := ethtool(ifname, cmd, 0)
		if err != nil {
			return fmt.Errorf("get %s of %s in %s: %w", what, ifname, ns.name, err)
		}
		on = v != 0
		return nil
	})
	return on, err
}

// SetGRO turns generic receive offload of the interface ifname on or off,
// like `ethtool -K IF gro on|off`. A veth delivers frames that XDP
// redirects or transmits into it only when its peer has GRO on or an XDP
// program attached.
func (ns *NS) SetGRO(ifname string, on bool) error {
	return ns.ethtoolSet(ifname, "gro", unix.ETHTOOL_SGRO, on)
}

// GRO reports whether generic receive offload is on for ifname.
func (ns *NS) GRO(ifname string) (bool, error) {
	return ns.ethtoolGet(ifname, "gro", unix.ETHTOOL_GGRO)
}

// SetTxChecksum turns tx checksum offload of the interface ifname on or
// off, like `ethtool -K IF tx on|off`. With it off, locally generated UDP
// leaves a veth with a full checksum rather than a partial one.
func (ns *NS) SetTxChecksum(ifname string, on bool) error {
	return ns.ethtoolSet(ifname, "tx checksum offload", unix.ETHTOOL_STXCSUM, on)
}

// TxChecksum reports whether tx checksum offload is on for ifname.
func (ns *NS) TxChecksum(ifname string) (bool, error) {
	return ns.ethtoolGet(ifname, "tx checksum offload", unix.ETHTOOL_GTXCSUM)
}
