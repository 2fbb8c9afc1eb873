package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Frame building and checking for the XDP tests, independent of the C code:
// checksums are computed from scratch.

type frameOpts struct {
	ttl       uint8
	tos       uint8  // IPv4 TOS, IPv6 traffic class
	zeroCsum  bool   // IPv4: send with UDP checksum 0
	ipOptions bool   // IPv4: add 4 bytes of options (NOP x4)
	fragOff   uint16 // IPv4 frag_off field (flags + offset), host order
	vlan      bool   // insert an 802.1Q tag
	ipv6Ext   uint8  // IPv6: with hasExt, insert an extension header of this type before UDP
	hasExt    bool
	srcMAC    [6]byte
	dstMAC    [6]byte
}

func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func csumFold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// udpChecksum computes the UDP checksum over the pseudo-header and the UDP
// segment (with its checksum field treated as zero).
func udpChecksum(src, dst netip.Addr, udp []byte) uint16 {
	var sum uint32
	sum = csumAdd(sum, src.AsSlice())
	sum = csumAdd(sum, dst.AsSlice())
	sum += 17 + uint32(len(udp))
	seg := append([]byte(nil), udp...)
	seg[6], seg[7] = 0, 0
	sum = csumAdd(sum, seg)
	c := ^csumFold(sum)
	if c == 0 {
		c = 0xffff
	}
	return c
}

func buildFrame(src, dst netip.AddrPort, payload []byte, o frameOpts) []byte {
	if o.ttl == 0 {
		o.ttl = 64
	}
	if o.srcMAC == ([6]byte{}) {
		o.srcMAC = [6]byte{0x02, 0, 0, 0, 0, 0x01}
	}
	if o.dstMAC == ([6]byte{}) {
		o.dstMAC = [6]byte{0x02, 0, 0, 0, 0, 0x02}
	}
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	if !(src.Addr().Is4() && o.zeroCsum) {
		binary.BigEndian.PutUint16(udp[6:], udpChecksum(src.Addr(), dst.Addr(), udp))
	}

	var f []byte
	f = append(f, o.dstMAC[:]...)
	f = append(f, o.srcMAC[:]...)
	if o.vlan {
		f = append(f, 0x81, 0x00, 0x00, 0x64)
	}
	if src.Addr().Is4() {
		f = append(f, 0x08, 0x00)
		ihl := 5
		if o.ipOptions {
			ihl = 6
		}
		ip := make([]byte, ihl*4)
		ip[0] = 0x40 | byte(ihl)
		ip[1] = o.tos
		binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+len(udp)))
		binary.BigEndian.PutUint16(ip[4:], 0x1234)
		binary.BigEndian.PutUint16(ip[6:], o.fragOff)
		ip[8] = o.ttl
		ip[9] = 17
		copy(ip[12:], src.Addr().AsSlice())
		copy(ip[16:], dst.Addr().AsSlice())
		if o.ipOptions {
			copy(ip[20:], []byte{1, 1, 1, 0})
		}
		binary.BigEndian.PutUint16(ip[10:], ^csumFold(csumAdd(0, ip)))
		f = append(f, ip...)
	} else {
		f = append(f, 0x86, 0xdd)
		ip := make([]byte, 40)
		ip[0] = 0x60 | o.tos>>4
		ip[1] = o.tos << 4
		next := byte(17)
		var ext []byte
		if o.hasExt {
			next = o.ipv6Ext
			ext = make([]byte, 8)
			ext[0] = 17
		}
		binary.BigEndian.PutUint16(ip[4:], uint16(len(ext)+len(udp)))
		ip[6] = next
		ip[7] = o.ttl
		copy(ip[8:], src.Addr().AsSlice())
		copy(ip[24:], dst.Addr().AsSlice())
		f = append(f, ip...)
		f = append(f, ext...)
	}
	return append(f, udp...)
}

// parsedFrame is a frame that passed full validation in Go.
type parsedFrame struct {
	srcMAC, dstMAC [6]byte
	src, dst       netip.AddrPort
	ttl            uint8
	udpCsum        uint16
	payload        []byte
}

var errUDPChecksum = errors.New("bad UDP checksum")

// parseFrame validates every header of an untagged IPv4 or IPv6 UDP frame
// from scratch: lengths, the IPv4 header checksum and the UDP checksum. A
// frame whose only fault is its UDP checksum is returned with
// errUDPChecksum.
func parseFrame(f []byte) (p parsedFrame, err error) {
	if len(f) < 14 {
		return p, errors.New("short ethernet header")
	}
	copy(p.dstMAC[:], f[0:6])
	copy(p.srcMAC[:], f[6:12])
	et := binary.BigEndian.Uint16(f[12:])
	b := f[14:]
	var src, dst netip.Addr
	var udp []byte
	switch et {
	case 0x0800:
		if len(b) < 20 || b[0] != 0x45 {
			return p, errors.New("bad IPv4 header")
		}
		tot := int(binary.BigEndian.Uint16(b[2:]))
		if tot < 28 || tot > len(b) {
			return p, fmt.Errorf("bad IPv4 total length %d", tot)
		}
		if binary.BigEndian.Uint16(b[6:])&0x3fff != 0 {
			return p, errors.New("fragment")
		}
		if b[9] != 17 {
			return p, errors.New("not UDP")
		}
		if csumFold(csumAdd(0, b[:20])) != 0xffff {
			return p, errors.New("bad IPv4 header checksum")
		}
		p.ttl = b[8]
		src = netip.AddrFrom4([4]byte(b[12:16]))
		dst = netip.AddrFrom4([4]byte(b[16:20]))
		udp = b[20:tot]
	case 0x86dd:
		if len(b) < 40 || b[0]>>4 != 6 || b[6] != 17 {
			return p, errors.New("bad IPv6 header")
		}
		pl := int(binary.BigEndian.Uint16(b[4:]))
		if pl < 8 || 40+pl > len(b) {
			return p, errors.New("bad IPv6 payload length")
		}
		p.ttl = b[7]
		src = netip.AddrFrom16([16]byte(b[8:24]))
		dst = netip.AddrFrom16([16]byte(b[24:40]))
		udp = b[40 : 40+pl]
	default:
		return p, fmt.Errorf("ethertype %#x", et)
	}
	if len(udp) < 8 || int(binary.BigEndian.Uint16(udp[4:])) != len(udp) {
		return p, errors.New("bad UDP length")
	}
	p.udpCsum = binary.BigEndian.Uint16(udp[6:])
	if p.udpCsum != 0 || dst.Is6() {
		var sum uint32
		sum = csumAdd(sum, src.AsSlice())
		sum = csumAdd(sum, dst.AsSlice())
		sum += 17 + uint32(len(udp))
		sum = csumAdd(sum, udp)
		if csumFold(sum) != 0xffff {
			err = errUDPChecksum
		}
	}
	p.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(udp[0:]))
	p.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(udp[2:]))
	p.payload = udp[8:]
	return p, err
}

// rtpPacket builds a 12-byte RTP header plus payload.
func rtpPacket(ssrc uint32, seq uint16, ts uint32, payloadLen int) []byte {
	b := make([]byte, 12+payloadLen)
	b[0] = 0x80
	b[1] = 0 // PCMU
	binary.BigEndian.PutUint16(b[2:], seq)
	binary.BigEndian.PutUint32(b[4:], ts)
	binary.BigEndian.PutUint32(b[8:], ssrc)
	for i := 12; i < len(b); i++ {
		b[i] = byte(i)
	}
	return b
}
