package pktio

import "encoding/binary"

// Sum adds b, as big-endian 16-bit words, to the unfolded one's complement
// sum and returns it. An odd last byte counts as its word's high byte, so
// only the last slice of a datagram may have an odd length. A uint64 holds
// the carries of any datagram: fold once at the end with Fold or
// Checksum.
func Sum(sum uint64, b []byte) uint64 {
	for len(b) >= 8 {
		v := binary.BigEndian.Uint64(b)
		sum += v>>48 + v>>32&0xffff + v>>16&0xffff + v&0xffff
		b = b[8:]
	}
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
