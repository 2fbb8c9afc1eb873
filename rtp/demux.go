package rtp

// Class is what a packet arriving on a media port is, judged by its first
// bytes (RFC 7983 section 7, RFC 5761 section 4).
type Class uint8

const (
	ClassUnknown Class = iota // drop: no protocol of RFC 7983 starts this way
	ClassSTUN                 // first byte 0-3
	ClassZRTP                 // 16-19
	ClassDTLS                 // 20-63
	ClassTURN                 // 64-79, TURN ChannelData
	ClassRTP                  // 128-191 and second byte not 192-223
	ClassRTCP                 // 128-191 and second byte 192-223
)

var classNames = [...]string{"unknown", "stun", "zrtp", "dtls", "turn", "rtp", "rtcp"}

func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "invalid"
}

// Demux classifies a packet by its first byte as RFC 7983 prescribes and,
// for RTP/RTCP, by its second byte as RFC 5761 prescribes for rtcp-mux:
// RTCP packet types 192-223 (payload types 64-95 with the marker bit) are
// RTCP. It looks at no more than two bytes and validates nothing else.
func Demux(b []byte) Class {
	if len(b) == 0 {
		return ClassUnknown
	}
	switch b0 := b[0]; {
	case b0 <= 3:
		return ClassSTUN
	case b0 >= 16 && b0 <= 19:
		return ClassZRTP
	case b0 >= 20 && b0 <= 63:
		return ClassDTLS
	case b0 >= 64 && b0 <= 79:
		return ClassTURN
	case b0 >= 128 && b0 <= 191:
		if len(b) < 2 {
			return ClassUnknown
		}
		if b[1] >= 192 && b[1] <= 223 {
			return ClassRTCP
		}
		return ClassRTP
	}
	return ClassUnknown
}
