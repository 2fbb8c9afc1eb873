//go:build cgo && !nobcg729

package g729

/*
#cgo pkg-config: libbcg729
#include <stdint.h>
#include <bcg729/encoder.h>
#include <bcg729/decoder.h>

// The binding's yardstick: n frames through bcg729 in one C loop, no Go
// in between (BenchmarkEncodeC, BenchmarkDecodeC).
static void relayd_encode_loop(bcg729EncoderChannelContextStruct *ctx, const int16_t *pcm, uint8_t *out, long n) {
	uint8_t len;
	for (long i = 0; i < n; i++) bcg729Encoder(ctx, pcm, out, &len);
}
static void relayd_decode_loop(bcg729DecoderChannelContextStruct *ctx, const uint8_t *frame, int16_t *out, long n) {
	for (long i = 0; i < n; i++) bcg729Decoder(ctx, frame, 10, 0, 0, 0, out);
}
*/
import "C"

import "unsafe"

// Available reports whether the package was built with bcg729.
const Available = true

// Encoder encodes 8 kHz linear PCM into G.729 frames. Its zero value is
// not usable: use NewEncoder.
type Encoder struct {
	ctx *C.bcg729EncoderChannelContextStruct
	n   C.uint8_t // bcg729Encoder's output length: here, not on the stack, so it does not escape per call
}

// NewEncoder returns an encoder; vad turns Annex B voice activity
// detection and discontinuous transmission on (SID frames and suppressed
// frames in silence).
func NewEncoder(vad bool) (*Encoder, error) {
	var v C.uint8_t
	if vad {
		v = 1
	}
	ctx := C.initBcg729EncoderChannel(v)
	if ctx == nil {
		return nil, errAlloc
	}
	return &Encoder{ctx: ctx}, nil
}

// Encode appends to dst the G.729 payload of pcm, a whole number of
// 80-sample frames: per frame 10 bytes, or with VAD a 2-byte SID frame or
// nothing. A SID frame can only end an RTP payload (RFC 3551), so Encode
// stops after one and returns how many samples it consumed; the caller
// sends the payload and encodes the rest into the next. It does not
// allocate when dst has room for 10 bytes per frame.
func (e *Encoder) Encode(dst []byte, pcm []int16) (out []byte, consumed int, err error) {
	if e.ctx == nil {
		return dst, 0, ErrClosed
	}
	if len(pcm)%FrameSamples != 0 {
		return dst, 0, ErrFrameSize
	}
	for consumed < len(pcm) {
		if cap(dst)-len(dst) < FrameBytes {
			return dst, consumed, ErrShortDst
		}
		buf := dst[len(dst) : len(dst)+FrameBytes]
		C.bcg729Encoder(e.ctx, (*C.int16_t)(unsafe.Pointer(&pcm[consumed])), (*C.uint8_t)(unsafe.Pointer(&buf[0])), &e.n)
		dst = dst[:len(dst)+int(e.n)]
		consumed += FrameSamples
		if int(e.n) == SIDBytes {
			break
		}
	}
	return dst, consumed, nil
}

// ComfortNoise writes the RFC 3389 comfort noise payload for the encoder's
// current background noise into p (at least 11 bytes) and returns it.
func (e *Encoder) ComfortNoise(p []byte) ([]byte, error) {
	if e.ctx == nil {
		return nil, ErrClosed
	}
	if len(p) < 11 {
		return nil, ErrShortDst
	}
	C.bcg729GetRFC3389Payload(e.ctx, (*C.uint8_t)(unsafe.Pointer(&p[0])))
	return p[:11], nil
}

// Close frees the encoder; it is safe to call twice.
func (e *Encoder) Close() {
	if e.ctx != nil {
		C.closeBcg729EncoderChannel(e.ctx)
		e.ctx = nil
	}
}

// Decoder decodes G.729 frames into 8 kHz linear PCM. Its zero value is
// not usable: use NewDecoder.
type Decoder struct {
	ctx    *C.bcg729DecoderChannelContextStruct
	erased [FrameBytes]byte // the bitstream of an erased frame: never read, never nil
}

// NewDecoder returns a decoder.
func NewDecoder() (*Decoder, error) {
	ctx := C.initBcg729DecoderChannel()
	if ctx == nil {
		return nil, errAlloc
	}
	return &Decoder{ctx: ctx}, nil
}

// Decode appends to dst the PCM of a G.729 RTP payload: 80 samples per
// 10-byte frame and for a trailing SID frame (comfort noise). It does not
// allocate when dst has room.
func (d *Decoder) Decode(dst []int16, payload []byte) ([]int16, error) {
	if d.ctx == nil {
		return dst, ErrClosed
	}
	speech, sid, err := Frames(payload)
	if err != nil {
		return dst, err
	}
	n := speech
	if sid {
		n++
	}
	if cap(dst)-len(dst) < n*FrameSamples {
		return dst, ErrShortDst
	}
	for i := range n {
		out := dst[len(dst) : len(dst)+FrameSamples]
		var flag C.uint8_t
		size := FrameBytes
		if i == speech {
			flag, size = 1, SIDBytes
		}
		C.bcg729Decoder(d.ctx, (*C.uint8_t)(unsafe.Pointer(&payload[i*FrameBytes])), C.uint8_t(size), 0, flag, 0,
			(*C.int16_t)(unsafe.Pointer(&out[0])))
		dst = dst[:len(dst)+FrameSamples]
	}
	return dst, nil
}

// Conceal appends frames frames of PCM for frames that were lost
// (bcg729's frame erasure concealment) or, silent, that DTX did not send
// (comfort noise continues from the last SID).
func (d *Decoder) Conceal(dst []int16, frames int) ([]int16, error) {
	if d.ctx == nil {
		return dst, ErrClosed
	}
	if cap(dst)-len(dst) < frames*FrameSamples {
		return dst, ErrShortDst
	}
	for range frames {
		out := dst[len(dst) : len(dst)+FrameSamples]
		C.bcg729Decoder(d.ctx, (*C.uint8_t)(unsafe.Pointer(&d.erased[0])), FrameBytes, 1, 0, 0, (*C.int16_t)(unsafe.Pointer(&out[0])))
		dst = dst[:len(dst)+FrameSamples]
	}
	return dst, nil
}

// Close frees the decoder; it is safe to call twice.
func (d *Decoder) Close() {
	if d.ctx != nil {
		C.closeBcg729DecoderChannel(d.ctx)
		d.ctx = nil
	}
}

// encodeLoopC encodes the 80-sample frame pcm n times in one C loop; dst
// holds at least 10 bytes. For the benchmarks that measure the binding.
func encodeLoopC(e *Encoder, pcm []int16, dst []byte, n int) {
	C.relayd_encode_loop(e.ctx, (*C.int16_t)(unsafe.Pointer(&pcm[0])), (*C.uint8_t)(unsafe.Pointer(&dst[0])), C.long(n))
}

// decodeLoopC decodes the 10-byte frame n times in one C loop into dst (at
// least 80 samples).
func decodeLoopC(d *Decoder, frame []byte, dst []int16, n int) {
	C.relayd_decode_loop(d.ctx, (*C.uint8_t)(unsafe.Pointer(&frame[0])), (*C.int16_t)(unsafe.Pointer(&dst[0])), C.long(n))
}
