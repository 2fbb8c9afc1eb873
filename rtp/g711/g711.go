// Package g711 implements the ITU-T G.711 mu-law and A-law companders on
// 16-bit linear PCM, following the reference algorithm of Sun's g711.c
// (the one CPython's audioop and most VoIP stacks use).
//
// The functions are pure, allocation-free and safe for concurrent use.
// The slow path's transcoder may import this package rather than keep a
// second copy.
package g711

import (
	"math/bits"
	"slices"
)

const (
	ulawBias = 0x84
	ulawClip = 8159
)

// EncodeUlaw compands one linear sample to mu-law.
//
// It is Sun's g711.c without its branches: the sign is folded with a mask,
// and the segment, which g711.c finds by searching a table of the
// segments' ends, is where the biased magnitude's top bit lies above the
// first segment's six bits. Clipping one below g711.c's clip gives the
// code g711.c returns past the last segment, so no test is needed for it.
func EncodeUlaw(sample int16) byte {
	v := int32(sample) >> 2
	sign := v >> 31                                  // 0, or -1 for a negative sample
	mask := 0xFF ^ sign&0x80                         // 0xFF, or 0x7F
	v = min((v^sign)-sign, ulawClip-1) + ulawBias>>2 // |v|, clipped, biased
	seg := max(int32(bits.Len32(uint32(v)))-6, 0)
	return byte((seg<<4 | (v>>(seg+1))&0xF) ^ mask)
}

// EncodeAlaw compands one linear sample to A-law, as Sun's g711.c does,
// without its branches (see EncodeUlaw). A 13-bit magnitude never passes
// the last segment.
func EncodeAlaw(sample int16) byte {
	v := int32(sample) >> 3
	sign := v >> 31
	mask := 0xD5 ^ sign&0x80 // 0xD5, or 0x55
	v ^= sign                // v, or -v-1
	seg := max(int32(bits.Len32(uint32(v)))-5, 0)
	return byte((seg<<4 | (v>>max(seg, 1))&0xF) ^ mask)
}

// DecodeUlaw expands one mu-law code to a linear sample.
func DecodeUlaw(code byte) int16 { return ulawLinear[code] }

// DecodeAlaw expands one A-law code to a linear sample.
func DecodeAlaw(code byte) int16 { return alawLinear[code] }

// The decoders' tables, 512 bytes each: a load costs a third of the
// arithmetic (BenchmarkDecodeUlaw160).
var ulawLinear, alawLinear = expansions()

func expansions() (ulaw, alaw [256]int16) {
	for c := range 256 {
		ulaw[c], alaw[c] = expandUlaw(byte(c)), expandAlaw(byte(c))
	}
	return ulaw, alaw
}

// expandUlaw is Sun's g711.c's mu-law expansion.
func expandUlaw(code byte) int16 {
	u := int32(^code)
	t := ((u & 0xF) << 3) + ulawBias
	t <<= (u & 0x70) >> 4
	if u&0x80 != 0 {
		return int16(ulawBias - t)
	}
	return int16(t - ulawBias)
}

// expandAlaw is Sun's g711.c's A-law expansion.
func expandAlaw(code byte) int16 {
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
	dst, out := grow(dst, len(pcm))
	out = out[:len(pcm)]
	for i, s := range pcm {
		out[i] = EncodeUlaw(s)
	}
	return dst
}

// AppendAlaw appends the A-law encoding of pcm to dst.
func AppendAlaw(dst []byte, pcm []int16) []byte {
	dst, out := grow(dst, len(pcm))
	out = out[:len(pcm)]
	for i, s := range pcm {
		out[i] = EncodeAlaw(s)
	}
	return dst
}

// grow extends dst by n bytes and returns it and the n bytes added.
func grow(dst []byte, n int) (grown, added []byte) {
	dst = slices.Grow(dst, n)
	grown = dst[:len(dst)+n]
	return grown, grown[len(dst):]
}
