// Package g711 implements the ITU-T G.711 mu-law and A-law companders on
// 16-bit linear PCM, following the reference algorithm of Sun's g711.c
// (the one CPython's audioop and most VoIP stacks use).
//
// The functions are pure, allocation-free and safe for concurrent use.
// The slow path's transcoder may import this package rather than keep a
// second copy.
package g711

var segUEnd = [8]int32{0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF}
var segAEnd = [8]int32{0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF}

const (
	ulawBias = 0x84
	ulawClip = 8159
)

func segment(v int32, end *[8]int32) int32 {
	for i, e := range end {
		if v <= e {
			return int32(i)
		}
	}
	return 8
}

// EncodeUlaw compands one linear sample to mu-law.
func EncodeUlaw(sample int16) byte {
	v := int32(sample) >> 2
	mask := int32(0xFF)
	if v < 0 {
		v = -v
		mask = 0x7F
	}
	if v > ulawClip {
		v = ulawClip
	}
	v += ulawBias >> 2
	seg := segment(v, &segUEnd)
	if seg >= 8 {
		return byte(0x7F ^ mask)
	}
	return byte((seg<<4 | (v>>(seg+1))&0xF) ^ mask)
}

// EncodeAlaw compands one linear sample to A-law.
func EncodeAlaw(sample int16) byte {
	v := int32(sample) >> 3
	mask := int32(0xD5)
	if v < 0 {
		mask = 0x55
		v = -v - 1
	}
	seg := segment(v, &segAEnd)
	if seg >= 8 {
		return byte(0x7F ^ mask)
	}
	a := seg << 4
	if seg < 2 {
		a |= (v >> 1) & 0xF
	} else {
		a |= (v >> seg) & 0xF
	}
	return byte(a ^ mask)
}

// DecodeUlaw expands one mu-law code to a linear sample.
func DecodeUlaw(code byte) int16 {
	u := int32(^code)
	t := ((u & 0xF) << 3) + ulawBias
	t <<= (u & 0x70) >> 4
	if u&0x80 != 0 {
		return int16(ulawBias - t)
	}
	return int16(t - ulawBias)
}

// DecodeAlaw expands one A-law code to a linear sample.
func DecodeAlaw(code byte) int16 {
	a := int32(code ^ 0x55)
	t := (a & 0xF) << 4
	switch seg := (a & 0x70) >> 4; seg {
	case 0:
		t += 8
	case 1:
		t += 0x108
	default:
		t += 0x108
		t <<= seg - 1
	}
	if a&0x80 != 0 {
		return int16(t)
	}
	return int16(-t)
}

// AppendUlaw appends the mu-law encoding of pcm to dst.
func AppendUlaw(dst []byte, pcm []int16) []byte {
	for _, s := range pcm {
		dst = append(dst, EncodeUlaw(s))
	}
	return dst
}

// AppendAlaw appends the A-law encoding of pcm to dst.
func AppendAlaw(dst []byte, pcm []int16) []byte {
	for _, s := range pcm {
		dst = append(dst, EncodeAlaw(s))
	}
	return dst
}
