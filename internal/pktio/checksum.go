package pktio

import (
	"encoding/binary"
	"math/bits"
)

// Sum adds b, as big-endian 16-bit words, to the unfolded one's complement
// sum and returns it. An odd last byte counts as its word's high byte, so
// only the last slice of a datagram may have an odd length. A uint64 holds
// the carries of any datagram: fold once at the end with Fold or
// Checksum. The result is the one's complement sum up to a multiple of
// 0xffff (RFC 1071's deferred carries): only its folded value is defined.
//
// It adds 64-bit words with end-around carry (four per round) and folds
// them to 32 bits, which one's complement arithmetic allows (RFC 1071,
// section 2): a quarter of the additions of 16-bit words.
func Sum(sum uint64, b []byte) uint64 {
	var acc, c uint64
	for len(b) >= 32 {
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[8:]), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[16:]), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[24:]), c)
		b = b[32:]
	}
	for len(b) >= 8 {
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b), c)
		b = b[8:]
	}
	acc, c = bits.Add64(acc, 0, c) // the last carry, end-around
	acc += c                       // acc was all ones: cannot carry again
	sum += acc>>32 + acc&0xffffffff
	for len(b) >= 2 {
		sum += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint64(b[0]) << 8
	}
	return sum
}

// Fold folds the carries of sum into 16 bits (not complemented).
func Fold(sum uint64) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// Checksum is the checksum field for sum: folded and complemented. A
// result of 0 is sent as 0xffff, as UDP requires (RFC 768: 0 means no
// checksum), which is the same value in one's complement arithmetic, so
// it is right for IPv4 headers too.
func Checksum(sum uint64) uint16 {
	c := ^Fold(sum)
	if c == 0 {
		return 0xffff
	}
	return c
}
