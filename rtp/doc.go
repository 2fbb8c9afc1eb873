// Package rtp parses and builds RTP (RFC 3550) and RTCP headers without
// allocating, demultiplexes media-port traffic by its first byte (RFC 7983,
// RFC 5761) and keeps per-stream receive statistics exactly as in RFC 3550
// appendix A.
//
// Parsers fill structs the caller owns and reuses; marshallers append to or
// fill a caller's buffer. Errors returned on the packet path are the
// pre-allocated values below, so callers may compare them with ==.
//
// ReceiverStats is the reference implementation the XDP program's in-kernel
// per-flow statistics are tested against; change it only together with
// bpf/ and its tests.
package rtp

import "errors"

// Pre-allocated errors returned by the parsers and marshallers.
var (
	ErrShortPacket     = errors.New("rtp: packet too short")
	ErrBadVersion      = errors.New("rtp: version is not 2")
	ErrBadPadding      = errors.New("rtp: padding length exceeds payload")
	ErrShortExtension  = errors.New("rtp: header extension exceeds packet")
	ErrExtensionLength = errors.New("rtp: header extension length not a multiple of 4")
	ErrTooManyCSRC     = errors.New("rtp: more than 15 CSRCs")
	ErrShortBuffer     = errors.New("rtp: destination buffer too small")
	ErrBadLength       = errors.New("rtcp: length field exceeds packet")
)
