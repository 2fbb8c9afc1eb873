package rtp

import "encoding/binary"

// RTCP packet types (RFC 3550 section 12.1, RFC 4585).
const (
	TypeSenderReport   = 200
	TypeReceiverReport = 201
	TypeSDES           = 202
	TypeBye            = 203
	TypeApp            = 204
	TypeRTPFB          = 205
	TypePSFB           = 206
)

// RTCPHeaderSize is the size of the common RTCP header including the
// sender SSRC that every packet type of RFC 3550 carries after it.
const RTCPHeaderSize = 8

// RTCPHeader is the common header of one RTCP packet (RFC 3550 section 6.4)
// followed by the SSRC of its sender.
//
// The zero value is empty; Unmarshal overwrites every field. Not safe for
// concurrent use.
type RTCPHeader struct {
	Padding bool
	Count   uint8  // reception report count, source count or FMT (5 bits)
	Type    uint8  // packet type, e.g. TypeSenderReport
	Length  uint16 // length in 32-bit words minus one, as on the wire
	SSRC    uint32 // sender SSRC (the first word after the header)
}

// PacketLen returns the length in bytes of the RTCP packet h describes.
func (h *RTCPHeader) PacketLen() int { return (int(h.Length) + 1) * 4 }

// Unmarshal parses the RTCP packet header at the start of b. It returns the
// offset of the type-specific body (after the sender SSRC); the packet ends
// at h.PacketLen(), where the next packet of a compound packet starts.
func (h *RTCPHeader) Unmarshal(b []byte) (bodyOffset int, err error) {
	if len(b) < RTCPHeaderSize {
		return 0, ErrShortPacket
	}
	if b[0]>>6 != Version {
		return 0, ErrBadVersion
	}
	h.Padding = b[0]&0x20 != 0
	h.Count = b[0] & 0x1f
	h.Type = b[1]
	h.Length = binary.BigEndian.Uint16(b[2:])
	h.SSRC = binary.BigEndian.Uint32(b[4:])
	if h.PacketLen() > len(b) || h.PacketLen() < RTCPHeaderSize {
		return 0, ErrBadLength
	}
	if h.Padding {
		p := int(b[h.PacketLen()-1])
		if p == 0 || RTCPHeaderSize+p > h.PacketLen() {
			return 0, ErrBadPadding
		}
	}
	return RTCPHeaderSize, nil
}

// MarshalTo writes h to the start of buf and returns RTCPHeaderSize.
func (h *RTCPHeader) MarshalTo(buf []byte) (int, error) {
	if len(buf) < RTCPHeaderSize {
		return 0, ErrShortBuffer
	}
	b0 := byte(Version<<6) | h.Count&0x1f
	if h.Padding {
		b0 |= 0x20
	}
	buf[0] = b0
	buf[1] = h.Type
	binary.BigEndian.PutUint16(buf[2:], h.Length)
	binary.BigEndian.PutUint32(buf[4:], h.SSRC)
	return RTCPHeaderSize, nil
}

// SenderInfoSize is the size of the sender information block of an SR.
const SenderInfoSize = 20

// SenderInfo is the sender information of an RTCP SR (RFC 3550 section 6.4.1).
type SenderInfo struct {
	NTPTime     uint64
	RTPTime     uint32
	PacketCount uint32
	OctetCount  uint32
}

// Unmarshal parses a sender information block from the start of b.
func (s *SenderInfo) Unmarshal(b []byte) error {
	if len(b) < SenderInfoSize {
		return ErrShortPacket
	}
	s.NTPTime = binary.BigEndian.Uint64(b)
	s.RTPTime = binary.BigEndian.Uint32(b[8:])
	s.PacketCount = binary.BigEndian.Uint32(b[12:])
	s.OctetCount = binary.BigEndian.Uint32(b[16:])
	return nil
}

// MarshalTo writes s to the start of buf and returns SenderInfoSize.
func (s *SenderInfo) MarshalTo(buf []byte) (int, error) {
	if len(buf) < SenderInfoSize {
		return 0, ErrShortBuffer
	}
	binary.BigEndian.PutUint64(buf, s.NTPTime)
	binary.BigEndian.PutUint32(buf[8:], s.RTPTime)
	binary.BigEndian.PutUint32(buf[12:], s.PacketCount)
	binary.BigEndian.PutUint32(buf[16:], s.OctetCount)
	return SenderInfoSize, nil
}

// ReceptionReportSize is the size of one report block in an SR or RR.
const ReceptionReportSize = 24

// ReceptionReport is one report block of an RTCP SR or RR (RFC 3550
// section 6.4.1). TotalLost is the signed 24-bit cumulative loss, clamped to
// that range by MarshalTo.
type ReceptionReport struct {
	SSRC         uint32
	FractionLost uint8
	TotalLost    int32
	HighestSeq   uint32 // extended highest sequence number received
	Jitter       uint32 // interarrival jitter in timestamp units
	LSR          uint32 // middle 32 bits of the last SR's NTP timestamp
	DLSR         uint32 // delay since last SR in 1/65536 s
}

// Unmarshal parses a report block from the start of b.
func (r *ReceptionReport) Unmarshal(b []byte) error {
	if len(b) < ReceptionReportSize {
		return ErrShortPacket
	}
	r.SSRC = binary.BigEndian.Uint32(b)
	r.FractionLost = b[4]
	// Sign-extend the 24-bit cumulative loss.
	r.TotalLost = int32(binary.BigEndian.Uint32(b[4:])<<8) >> 8
	r.HighestSeq = binary.BigEndian.Uint32(b[8:])
	r.Jitter = binary.BigEndian.Uint32(b[12:])
	r.LSR = binary.BigEndian.Uint32(b[16:])
	r.DLSR = binary.BigEndian.Uint32(b[20:])
	return nil
}

// MarshalTo writes r to the start of buf and returns ReceptionReportSize.
func (r *ReceptionReport) MarshalTo(buf []byte) (int, error) {
	if len(buf) < ReceptionReportSize {
		return 0, ErrShortBuffer
	}
	lost := r.TotalLost
	if lost > 0x7fffff {
		lost = 0x7fffff
	} else if lost < -0x800000 {
		lost = -0x800000
	}
	binary.BigEndian.PutUint32(buf, r.SSRC)
	binary.BigEndian.PutUint32(buf[4:], uint32(r.FractionLost)<<24|uint32(lost)&0xffffff)
	binary.BigEndian.PutUint32(buf[8:], r.HighestSeq)
	binary.BigEndian.PutUint32(buf[12:], r.Jitter)
	binary.BigEndian.PutUint32(buf[16:], r.LSR)
	binary.BigEndian.PutUint32(buf[20:], r.DLSR)
	return ReceptionReportSize, nil
}
