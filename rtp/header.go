package rtp

import "encoding/binary"

// Version is the only RTP/RTCP version these parsers accept.
const Version = 2

// HeaderSize is the size of the fixed RTP header without CSRCs or extension.
const HeaderSize = 12

// MaxCSRC is the largest number of CSRCs a header can carry (4-bit CC field).
const MaxCSRC = 15

// Header is an RTP fixed header with its CSRC list and header extension
// (RFC 3550 section 5.1 and 5.3.1).
//
// The zero value is an empty header; Unmarshal overwrites every field, so a
// Header can be reused for every packet of a loop. A Header is not safe for
// concurrent use.
type Header struct {
	Padding        bool
	Extension      bool
	Marker         bool
	PayloadType    uint8
	SequenceNumber uint16
	Timestamp      uint32
	SSRC           uint32
	CSRCCount      uint8
	CSRC           [MaxCSRC]uint32 // only CSRC[:CSRCCount] is meaningful

	// ExtensionProfile is the 16-bit "defined by profile" field (0xBEDE for
	// RFC 8285 one-byte headers) and ExtensionPayload the extension data
	// without its 4-byte header. After Unmarshal, ExtensionPayload aliases
	// the parsed buffer. Both are meaningful only when Extension is set.
	ExtensionProfile uint16
	ExtensionPayload []byte

	// PaddingLen is the number of padding octets at the end of the packet,
	// including the count octet itself (0 when Padding is not set). It is set
	// by Unmarshal and ignored by the marshallers, which write only the P bit.
	PaddingLen uint8
}

// Unmarshal parses the RTP header at the start of b into h. It returns the
// offset of the payload: the payload is b[payloadOffset:len(b)-int(h.PaddingLen)].
// It does not allocate; ExtensionPayload aliases b.
func (h *Header) Unmarshal(b []byte) (payloadOffset int, err error) {
	if len(b) < HeaderSize {
		return 0, ErrShortPacket
	}
	b0 := b[0]
	if b0>>6 != Version {
		return 0, ErrBadVersion
	}
	h.Padding = b0&0x20 != 0
	h.Extension = b0&0x10 != 0
	h.CSRCCount = b0 & 0x0f
	h.Marker = b[1]&0x80 != 0
	h.PayloadType = b[1] & 0x7f
	h.SequenceNumber = binary.BigEndian.Uint16(b[2:])
	h.Timestamp = binary.BigEndian.Uint32(b[4:])
	h.SSRC = binary.BigEndian.Uint32(b[8:])

	n := HeaderSize + 4*int(h.CSRCCount)
	if len(b) < n {
		return 0, ErrShortPacket
	}
	for i := 0; i < int(h.CSRCCount); i++ {
		h.CSRC[i] = binary.BigEndian.Uint32(b[HeaderSize+4*i:])
	}

	h.ExtensionProfile = 0
	h.ExtensionPayload = nil
	if h.Extension {
		if len(b) < n+4 {
			return 0, ErrShortExtension
		}
		h.ExtensionProfile = binary.BigEndian.Uint16(b[n:])
		extLen := 4 * int(binary.BigEndian.Uint16(b[n+2:]))
		n += 4
		if len(b) < n+extLen {
			return 0, ErrShortExtension
		}
		h.ExtensionPayload = b[n : n+extLen : n+extLen]
		n += extLen
	}

	h.PaddingLen = 0
	if h.Padding {
		p := int(b[len(b)-1])
		// RFC 3550: the count includes itself, so 0 is invalid.
		if p == 0 || n+p > len(b) {
			return 0, ErrBadPadding
		}
		h.PaddingLen = uint8(p)
	}
	return n, nil
}

// MarshalSize returns the number of bytes Append and MarshalTo write for h.
func (h *Header) MarshalSize() int {
	n := HeaderSize + 4*int(h.CSRCCount)
	if h.Extension {
		n += 4 + len(h.ExtensionPayload)
	}
	return n
}

// MarshalTo writes h to the start of buf and returns the number of bytes
// written. It does not allocate.
func (h *Header) MarshalTo(buf []byte) (int, error) {
	if h.CSRCCount > MaxCSRC {
		return 0, ErrTooManyCSRC
	}
	if h.Extension && (len(h.ExtensionPayload)%4 != 0 || len(h.ExtensionPayload) > 4*0xffff) {
		return 0, ErrExtensionLength
	}
	n := h.MarshalSize()
	if len(buf) < n {
		return 0, ErrShortBuffer
	}
	b0 := byte(Version<<6) | h.CSRCCount
	if h.Padding {
		b0 |= 0x20
	}
	if h.Extension {
		b0 |= 0x10
	}
	buf[0] = b0
	b1 := h.PayloadType & 0x7f
	if h.Marker {
		b1 |= 0x80
	}
	buf[1] = b1
	binary.BigEndian.PutUint16(buf[2:], h.SequenceNumber)
	binary.BigEndian.PutUint32(buf[4:], h.Timestamp)
	binary.BigEndian.PutUint32(buf[8:], h.SSRC)
	off := HeaderSize
	for i := 0; i < int(h.CSRCCount); i++ {
		binary.BigEndian.PutUint32(buf[off:], h.CSRC[i])
		off += 4
	}
	if h.Extension {
		binary.BigEndian.PutUint16(buf[off:], h.ExtensionProfile)
		binary.BigEndian.PutUint16(buf[off+2:], uint16(len(h.ExtensionPayload)/4))
		off += 4
		off += copy(buf[off:], h.ExtensionPayload)
	}
	return off, nil
}

// Append appends the marshalled header to dst and returns the extended
// slice. It allocates only when dst lacks capacity.
func (h *Header) Append(dst []byte) ([]byte, error) {
	n := h.MarshalSize()
	l := len(dst)
	if cap(dst)-l < n {
		nd := make([]byte, l, l+n)
		copy(nd, dst)
		dst = nd
	}
	if _, err := h.MarshalTo(dst[l : l+n]); err != nil {
		return dst[:l], err
	}
	return dst[:l+n], nil
}
