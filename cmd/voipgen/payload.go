package main

import (
	"fmt"
	"math"
	"time"

	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/rtp/g711"
)

// codec describes what voipgen puts on the wire for one payload format.
type codec struct {
	name        string
	payloadType uint8
	clockRate   uint32
	// bytesPerMs is the payload size per millisecond of audio.
	bytesPerMs int
	// frameMs is the granularity ptime must be a multiple of.
	frameMs int
}

var codecs = map[string]codec{
	"pcmu": {name: "pcmu", payloadType: 0, clockRate: 8000, bytesPerMs: 8, frameMs: 1},
	"pcma": {name: "pcma", payloadType: 8, clockRate: 8000, bytesPerMs: 8, frameMs: 1},
	"g729": {name: "g729", payloadType: 18, clockRate: 8000, bytesPerMs: 1, frameMs: 10},
}

func lookupCodec(name string, ptime time.Duration) (codec, error) {
	c, ok := codecs[name]
	if !ok {
		return codec{}, fmt.Errorf("unknown codec %q (want pcmu, pcma or g729)", name)
	}
	if ptime <= 0 || ptime%(time.Duration(c.frameMs)*time.Millisecond) != 0 {
		return codec{}, fmt.Errorf("ptime %v is not a positive multiple of %d ms for %s", ptime, c.frameMs, name)
	}
	return c, nil
}

func (c codec) payloadSize(ptime time.Duration) int {
	return int(ptime/time.Millisecond) * c.bytesPerMs
}

func (c codec) samplesPer(ptime time.Duration) uint32 {
	return uint32(int64(ptime) * int64(c.clockRate) / int64(time.Second))
}

// sine is one period of a sine wave at about -10 dBm0 (amplitude 10000 of 32767).
var sine = func() (t [1024]int16) {
	for i := range t {
		t[i] = int16(math.Round(10000 * math.Sin(2*math.Pi*float64(i)/float64(len(t)))))
	}
	return t
}()

// toneHz returns the tone frequency of stream i: 400 Hz to 3300 Hz in 100 Hz
// steps, so neighbouring streams are distinguishable when listened to.
func toneHz(i int) int { return 400 + 100*(i%30) }

// stream is the sending state of one RTP stream. Its packet buffer is
// allocated once; next rewrites it in place.
type stream struct {
	codec    codec
	hdr      rtp.Header
	tsStep   uint32
	phase    uint32 // DDS phase accumulator, top 10 bits index sine
	phaseInc uint32
	rng      uint64 // xorshift state for G.729 frames
	buf      []byte // header + payload, constant length
	sent     uint64
}

func newStream(c codec, ptime time.Duration, i int, ssrc uint32, seq uint16, ts uint32) *stream {
	s := &stream{
		codec:    c,
		hdr:      rtp.Header{PayloadType: c.payloadType, SSRC: ssrc, SequenceNumber: seq, Timestamp: ts, Marker: true},
		tsStep:   c.samplesPer(ptime),
		phaseInc: uint32(uint64(toneHz(i)) << 32 / uint64(c.clockRate)),
		rng:      uint64(ssrc)<<32 | uint64(i) | 1,
		buf:      make([]byte, rtp.HeaderSize+c.payloadSize(ptime)),
	}
	return s
}

// next builds the stream's next packet into its buffer and returns it. It
// does not allocate.
func (s *stream) next() []byte {
	n, _ := s.hdr.MarshalTo(s.buf) // fixed 12-byte header always fits
	p := s.buf[n:]
	switch s.codec.payloadType {
	case 0:
		for i := range p {
			p[i] = g711.EncodeUlaw(sine[s.phase>>22])
			s.phase += s.phaseInc
		}
	case 8:
		for i := range p {
			p[i] = g711.EncodeAlaw(sine[s.phase>>22])
			s.phase += s.phaseInc
		}
	default:
		for off := 0; off+10 <= len(p); off += 10 {
			s.g729Frame(p[off : off+10])
		}
	}
	s.hdr.Marker = false
	s.hdr.SequenceNumber++
	s.hdr.Timestamp += s.tsStep
	s.sent++
	return s.buf
}

// g729Frame writes a 10-byte, 80-bit frame with the field layout of G.729
// (RFC 3551 4.5.6): L0 L1 L2 L3 (18 bits of LSP indices), P1 P0 C1 S1 GA1
// GB1 P2 C2 S2 GA2 GB2. LSP indices stay near constant (a steady spectrum),
// pitch and codebook fields are pseudo-random and P0 is the real parity of
// P1's six most significant bits. It is not encoded audio: voipgen has no
// G.729 encoder, and a decoder would produce noise-like sound from it.
func (s *stream) g729Frame(f []byte) {
	r := s.rand()
	var w bitWriter
	w.put(0, 1)                       // L0
	w.put(uint64(s.hdr.SSRC)&0x7f, 7) // L1: fixed per stream
	w.put(16, 5)                      // L2
	w.put(16, 5)                      // L3
	p1 := r & 0xff
	w.put(p1, 8) // P1
	par := uint64(0)
	for b := p1 >> 2; b != 0; b >>= 1 {
		par ^= b & 1
	}
	w.put(par, 1)           // P0
	w.put(r>>8&0x1fff, 13)  // C1
	w.put(r>>21&0xf, 4)     // S1
	w.put(r>>25&0x7, 3)     // GA1
	w.put(r>>28&0xf, 4)     // GB1
	w.put(r>>32&0x1f, 5)    // P2
	w.put(r>>37&0x1fff, 13) // C2
	w.put(r>>50&0xf, 4)     // S2
	w.put(r>>54&0x7, 3)     // GA2
	w.put(r>>57&0xf, 4)     // GB2
	w.flush(f)
}

func (s *stream) rand() uint64 {
	x := s.rng
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	s.rng = x
	return x
}

// bitWriter packs up to 80 bits MSB first.
type bitWriter struct {
	hi uint64 // first 64 bits
	lo uint64 // next 16 bits, left-aligned in the low 16
	n  uint
}

func (w *bitWriter) put(v uint64, bits uint) {
	for i := int(bits) - 1; i >= 0; i-- {
		b := v >> uint(i) & 1
		if w.n < 64 {
			w.hi |= b << (63 - w.n)
		} else {
			w.lo |= b << (79 - w.n)
		}
		w.n++
	}
}

func (w *bitWriter) flush(f []byte) {
	for i := 0; i < 8; i++ {
		f[i] = byte(w.hi >> (56 - 8*i))
	}
	f[8] = byte(w.lo >> 8)
	f[9] = byte(w.lo)
}
