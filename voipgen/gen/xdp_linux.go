package gen

import (
	"fmt"
	"net"
	"net/netip"
	"time"
	"unsafe"

	"github.com/relayd/relayd/internal/pktio"

	"github.com/vishvananda/netlink"
)

// The AF_XDP transport (--transport xdp) hands whole Ethernet frames to
// the driver through an XDP socket's TX ring (pktio.XSK), skipping the
// kernel's IP and UDP output path: the way to the goal of a million
// packets per second per core. Frames are the raw transport's IP packets
// behind an Ethernet header to the next hop's MAC address, resolved from
// the neighbour table when the generator starts (a route's gateway, or the
// destination on a link).

// xdpSock is one thread's AF_XDP socket and the Ethernet header of its
// frames.
type xdpSock struct {
	*pktio.XSK
	eth [14]byte
}

// openXDP opens an AF_XDP socket on queue of the device with ifindex.
func openXDP(ifindex, queue int, eth [14]byte) (*xdpSock, error) {
	x, err := pktio.OpenXSK(ifindex, queue)
	if err != nil {
		return nil, err
	}
	return &xdpSock{XSK: x, eth: eth}, nil
}

func (x *xdpSock) close() error { return x.Close() }

// send queues the IP packets of ms behind the Ethernet header and kicks
// the kernel. It returns how many were queued (the rest had no free
// frame) and the bytes queued. It does not allocate.
func (x *xdpSock) send(ms []pktio.Mmsghdr) (n int, bytes uint64) {
	for i := range ms {
		f := x.Frame()
		if f == nil {
			break
		}
		iov := ms[i].Hdr.Iov
		pkt := unsafe.Slice(iov.Base, iov.Len)
		copy(f, x.eth[:])
		x.Queue(14 + copy(f[14:], pkt))
		n++
		bytes += uint64(len(pkt))
	}
	// Copy mode transmits only when kicked: Flush kicks every batch (a
	// syscall per 32 frames) rather than trust XDP_RING_NEED_WAKEUP.
	x.Flush()
	return n, bytes
}

// NextHop returns the output interface and the Ethernet header towards dst
// from src's interface, resolving the neighbour (by sending it a datagram
// to the discard port) when it is not known yet, in the calling thread's
// network namespace.
func NextHop(dst netip.Addr) (ifindex int, eth [14]byte, err error) {
	routes, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return 0, eth, fmt.Errorf("route to %s: %v", dst, err)
	}
	r := routes[0]
	link, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return 0, eth, fmt.Errorf("route to %s: %w", dst, err)
	}
	hop := dst
	if r.Gw != nil {
		hop, _ = netip.AddrFromSlice(r.Gw)
		hop = hop.Unmap()
	}
	family := netlink.FAMILY_V4
	if !hop.Is4() {
		family = netlink.FAMILY_V6
	}
	for try := 0; try < 50; try++ {
		neighs, err := netlink.NeighList(r.LinkIndex, family)
		if err != nil {
			return 0, eth, fmt.Errorf("neighbours of %s: %w", link.Attrs().Name, err)
		}
		for _, n := range neighs {
			if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == hop && len(n.HardwareAddr) == 6 &&
				n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE|netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0 {
				copy(eth[0:6], n.HardwareAddr)
				copy(eth[6:12], link.Attrs().HardwareAddr)
				if hop.Is4() {
					eth[12], eth[13] = 0x08, 0x00
				} else {
					eth[12], eth[13] = 0x86, 0xdd
				}
				return r.LinkIndex, eth, nil
			}
		}
		if try == 0 || try%10 == 0 {
			network := "udp4"
			if !dst.Is4() {
				network = "udp6"
			}
			if c, err := net.DialUDP(network, nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9))); err == nil {
				_, _ = c.Write([]byte{0})
				c.Close()
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, eth, fmt.Errorf("next hop %s on %s did not resolve", hop, link.Attrs().Name)
}
