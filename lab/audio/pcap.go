package audio

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/relayd/relayd/internal/pktio"
	"github.com/relayd/relayd/rtp"
)

// UDPPacket is one datagram of a capture WritePcap writes. Its zero value
// is not a valid packet (no addresses).
type UDPPacket struct {
	// Time is when it was captured, after the capture's start (PcapEpoch):
	// SIPp's play_pcap_audio sends each packet at its time after the first.
	Time time.Duration
	// Src and Dst are both IPv4 or both IPv6.
	Src, Dst netip.AddrPort
	Payload  []byte
}

// PcapEpoch is the capture start of WritePcap's files, so that the same
// packets make the same file. It is read-only.
var PcapEpoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Link and network constants of the files WritePcap writes.
const (
	linktypeEthernet = 1 // SIPp 3.6 plays Ethernet and Linux cooked captures only
	etherIPv4        = 0x0800
	etherIPv6        = 0x86dd
	protoUDP         = 17
	snaplen          = 65535
)

// The MAC addresses of the Ethernet headers: locally administered, fixed.
var (
	srcMAC = [6]byte{0x02, 0, 0, 0, 0, 1}
	dstMAC = [6]byte{0x02, 0, 0, 0, 0, 2}
)

// WritePcap writes pkts to path as a classic pcap file (microsecond
// timestamps, little-endian, LINKTYPE_ETHERNET): each an Ethernet frame
// with an IPv4 header (its checksum, TTL 64, DF, an ID counting from 1) or
// an IPv6 header (hop limit 64), and a UDP header with its checksum. These
// are files SIPp's play_pcap_audio plays (it takes Ethernet or Linux
// cooked captures, not LINKTYPE_RAW) and tshark reads.
func WritePcap(path string, pkts []UDPPacket) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("pcap: %w", err)
	}
	w := bufio.NewWriter(f)
	le := binary.LittleEndian
	var hdr [24]byte
	le.PutUint32(hdr[0:], 0xa1b2c3d4)
	le.PutUint16(hdr[4:], 2)
	le.PutUint16(hdr[6:], 4)
	le.PutUint32(hdr[16:], snaplen)
	le.PutUint32(hdr[20:], linktypeEthernet)
	w.Write(hdr[:])
	var frame []byte
	for i, p := range pkts {
		frame, err = appendFrame(frame[:0], p, uint16(i+1))
		if err != nil {
			f.Close()
			return fmt.Errorf("pcap packet %d: %w", i, err)
		}
		t := PcapEpoch.Add(p.Time)
		var rec [16]byte
		le.PutUint32(rec[0:], uint32(t.Unix()))
		le.PutUint32(rec[4:], uint32(t.Nanosecond()/1000))
		le.PutUint32(rec[8:], uint32(len(frame)))
		le.PutUint32(rec[12:], uint32(len(frame)))
		w.Write(rec[:])
		w.Write(frame)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("pcap: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("pcap: %w", err)
	}
	return nil
}

// appendFrame appends p's Ethernet frame to b; id is its IPv4 ID.
func appendFrame(b []byte, p UDPPacket, id uint16) ([]byte, error) {
	src, dst := p.Src.Addr().Unmap(), p.Dst.Addr().Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return b, fmt.Errorf("addresses %v and %v are not both IPv4 or both IPv6", p.Src, p.Dst)
	}
	udpLen := 8 + len(p.Payload)
	if udpLen+40 > snaplen {
		return b, fmt.Errorf("%d bytes of payload do not fit", len(p.Payload))
	}
	be := binary.BigEndian
	b = append(b, dstMAC[:]...)
	b = append(b, srcMAC[:]...)
	// The UDP checksum's pseudo-header: addresses, protocol, UDP length.
	sum := pktio.Sum(0, src.AsSlice())
	sum = pktio.Sum(sum, dst.AsSlice())
	sum += protoUDP + uint64(udpLen)
	if src.Is4() {
		b = be.AppendUint16(b, etherIPv4)
		ip := len(b)
		b = append(b, 0x45, 0)
		b = be.AppendUint16(b, uint16(20+udpLen))
		b = be.AppendUint16(b, id)
		b = be.AppendUint16(b, 0x4000) // DF
		b = append(b, 64, protoUDP, 0, 0)
		b = append(b, src.AsSlice()...)
		b = append(b, dst.AsSlice()...)
		be.PutUint16(b[ip+10:], ^pktio.Fold(pktio.Sum(0, b[ip:ip+20])))
	} else {
		b = be.AppendUint16(b, etherIPv6)
		b = append(b, 0x60, 0, 0, 0)
		b = be.AppendUint16(b, uint16(udpLen))
		b = append(b, protoUDP, 64)
		b = append(b, src.AsSlice()...)
		b = append(b, dst.AsSlice()...)
	}
	udp := len(b)
	b = be.AppendUint16(b, p.Src.Port())
	b = be.AppendUint16(b, p.Dst.Port())
	b = be.AppendUint16(b, uint16(udpLen))
	b = append(b, 0, 0)
	b = append(b, p.Payload...)
	be.PutUint16(b[udp+6:], pktio.Checksum(pktio.Sum(sum, b[udp:])))
	return b, nil
}

// RTPStream describes the RTP packets RTPPackets makes. Its zero value is
// a stream of payload type 0, SSRC 0, from sequence number and timestamp
// 0, with no time between packets: set at least the addresses, Samples
// and Interval.
type RTPStream struct {
	Src, Dst  netip.AddrPort
	SSRC      uint32
	PT        uint8
	Seq       uint16        // of the first packet
	Timestamp uint32        // of the first packet
	Samples   uint32        // the timestamp's step per packet: 160 for 20 ms at 8 kHz
	Interval  time.Duration // between packets: 20 ms for 20 ms of audio each
	Start     time.Duration // the first packet's Time
	// Marker is set on the first packet (the start of a talkspurt).
	Marker bool
}

// RTPPackets returns one packet per payload of s: the sequence number
// counting up by one, the timestamp by s.Samples, the time by s.Interval.
func RTPPackets(s RTPStream, payloads [][]byte) []UDPPacket {
	pkts := make([]UDPPacket, len(payloads))
	for i, p := range payloads {
		h := rtp.Header{
			Marker:         s.Marker && i == 0,
			PayloadType:    s.PT,
			SequenceNumber: s.Seq + uint16(i),
			Timestamp:      s.Timestamp + uint32(i)*s.Samples,
			SSRC:           s.SSRC,
		}
		b, err := h.Append(make([]byte, 0, rtp.HeaderSize+len(p)))
		if err != nil {
			panic(err) // a header without CSRCs or extension always marshals
		}
		pkts[i] = UDPPacket{
			Time:    s.Start + time.Duration(i)*s.Interval,
			Src:     s.Src,
			Dst:     s.Dst,
			Payload: append(b, p...),
		}
	}
	return pkts
}

// Chunk cuts b into payloads of n bytes each (the last one shorter if b
// is not a multiple of n): 160 for 20 ms of G.711, 20 for 20 ms of G.729.
func Chunk(b []byte, n int) [][]byte {
	if n <= 0 {
		return nil
	}
	var out [][]byte
	for len(b) > 0 {
		k := min(n, len(b))
		out = append(out, b[:k:k])
		b = b[k:]
	}
	return out
}
