// Package g729 is ITU-T G.729 (with Annex A and B) for relayd's
// transcoding workers, through bcg729 (Debian's libbcg729-dev) and cgo.
//
// A frame is 10 ms of 8 kHz audio: 80 samples of 16-bit linear PCM in, and
// out of the encoder 10 bytes (speech), 2 bytes (an Annex B SID frame,
// when voice activity detection is on) or nothing (a frame DTX
// suppressed). An Encoder and a Decoder each hold one direction of one
// stream's state: they belong to the worker that owns the stream, are not
// safe for concurrent use, and are freed with Close. Encode and Decode do
// not allocate.
//
// Built without cgo, or with the build tag nobcg729, Available is false and
// NewEncoder and NewDecoder return ErrUnavailable: relayd still builds and
// runs, and refuses the calls that would need G.729.
package g729

import "errors"

const (
	// FrameSamples is the PCM samples of one 10 ms frame.
	FrameSamples = 80
	// FrameBytes is the size of an encoded speech frame.
	FrameBytes = 10
	// SIDBytes is the size of an Annex B silence insertion descriptor.
	SIDBytes = 2
)

// ErrUnavailable is returned by NewEncoder and NewDecoder when relayd was
// built without bcg729.
var ErrUnavailable = errors.New("g729: built without bcg729 (cgo and libbcg729-dev)")

// Errors of Encode and Decode, pre-allocated: they sit on the per-frame
// path.
var (
	ErrFrameSize = errors.New("g729: PCM is not a whole number of 80-sample frames")
	ErrPayload   = errors.New("g729: payload is not 10-byte frames with at most one 2-byte SID frame at its end")
	ErrShortDst  = errors.New("g729: destination too short")
	ErrClosed    = errors.New("g729: codec closed")
)

// Frames splits a G.729 RTP payload (RFC 3551 4.5.6: zero or more 10-byte
// frames, then optionally one 2-byte SID frame) into its number of speech
// frames and whether a SID frame ends it.
func Frames(payload []byte) (speech int, sid bool, err error) {
	switch len(payload) % FrameBytes {
	case 0:
		return len(payload) / FrameBytes, false, nil
	case SIDBytes:
		return len(payload) / FrameBytes, true, nil
	}
	return 0, false, ErrPayload
}
