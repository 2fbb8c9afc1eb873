package payload

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/rtp/g711"
)

// Codec describes what voipgen puts on the wire for one payload format.
type Codec struct {
	Name        string
	PayloadType uint8
	ClockRate   uint32
	// BytesPerMs is the payload size per millisecond of audio.
	BytesPerMs int
	// FrameMs is the granularity ptime must be a multiple of.
	FrameMs int
	// Kbps is the bit rate of a variable-rate codec (opus), whose payload
	// size voipgen derives from it; 0 for the fixed-rate ones.
	Kbps int
}

var Codecs = map[string]Codec{
	"pcmu": {Name: "pcmu", PayloadType: 0, ClockRate: 8000, BytesPerMs: 8, FrameMs: 1},
	"pcma": {Name: "pcma", PayloadType: 8, ClockRate: 8000, BytesPerMs: 8, FrameMs: 1},
	"g729": {Name: "g729", PayloadType: 18, ClockRate: 8000, BytesPerMs: 1, FrameMs: 10},
	// Opus (RFC 7587): dynamic payload type, 48 kHz RTP clock whatever the
	// audio bandwidth, payload size from the bit rate (see opusFrame).
	"opus": {Name: "opus", PayloadType: OpusPT, ClockRate: 48000, FrameMs: 10, Kbps: 32},
}

// OpusPT is the dynamic payload type voipgen uses for Opus, as many phones
// and WebRTC stacks do.
const OpusPT = 111

// MaxPtime bounds ptime for every codec (Opus packets carry at most 120 ms).
const MaxPtime = 120 * time.Millisecond

// Lookup returns a fixed-rate codec (pcmu, pcma, g729), as the demo
// and the basic sender take.
func Lookup(name string, ptime time.Duration) (Codec, error) {
	if c, ok := Codecs[name]; !ok || c.Kbps != 0 {
		return Codec{}, fmt.Errorf("unknown codec %q (want pcmu, pcma or g729)", name)
	}
	return LookupAny(name, ptime)
}

// LookupAny is lookupCodec with opus too (voipgen send, call, answer).
func LookupAny(name string, ptime time.Duration) (Codec, error) {
	c, ok := Codecs[name]
	if !ok {
		return Codec{}, fmt.Errorf("unknown codec %q (want pcmu, pcma, g729 or opus)", name)
	}
	if ptime <= 0 || ptime > MaxPtime || ptime%(time.Duration(c.FrameMs)*time.Millisecond) != 0 {
		return Codec{}, fmt.Errorf("ptime %v is not a multiple of %d ms up to %v for %s", ptime, c.FrameMs, MaxPtime, name)
	}
	return c, nil
}

// WithKbps returns c with its bit rate set, for opus (6 to 510 kbit/s).
func (c Codec) WithKbps(kbps int) (Codec, error) {
	if c.Kbps == 0 {
		return c, fmt.Errorf("codec %s has a fixed bit rate", c.Name)
	}
	if kbps < 6 || kbps > 510 {
		return c, fmt.Errorf("opus bit rate %d kbit/s: want 6 to 510", kbps)
	}
	c.Kbps = kbps
	return c, nil
}

func (c Codec) PayloadSize(ptime time.Duration) int {
	if c.Kbps != 0 {
		// TOC byte, plus the frame count byte of a code 3 packet.
		n := 1 + c.Kbps*int(ptime/time.Millisecond)/8
		if ptime > 20*time.Millisecond {
			n++
		}
		return n
	}
	return int(ptime/time.Millisecond) * c.BytesPerMs
}

func (c Codec) SamplesPer(ptime time.Duration) uint32 {
	return uint32(int64(ptime) * int64(c.ClockRate) / int64(time.Second))
}

// sine is one period of a sine wave at about -10 dBm0 (amplitude 10000 of 32767).
var sine = func() (t [1024]int16) {
	for i := range t {
		t[i] = int16(math.Round(10000 * math.Sin(2*math.Pi*float64(i)/float64(len(t)))))
	}
	return t
}()

// ToneHz returns the tone frequency of stream i: 400 Hz to 3300 Hz in 100 Hz
// steps, so neighbouring streams are distinguishable when listened to.
func ToneHz(i int) int { return 400 + 100*(i%toneCount) }

const toneCount = 30

// toneTables holds one second (8000 samples) of each tone, G.711 encoded:
// index 0 mu-law, 1 A-law. Built on first use; the per-packet path copies.
var (
	toneOnce   sync.Once
	toneTables [2][toneCount][]byte
)

func toneTable(pt uint8, tone int) []byte {
	toneOnce.Do(func() {
		for k := range toneCount {
			u, a := make([]byte, 8000), make([]byte, 8000)
			inc := uint32(uint64(ToneHz(k)) << 32 / 8000)
			var ph uint32
			for i := range u {
				u[i], a[i] = g711.EncodeUlaw(sine[ph>>22]), g711.EncodeAlaw(sine[ph>>22])
				ph += inc
			}
			toneTables[0][k], toneTables[1][k] = u, a
		}
	})
	if pt == 8 {
		return toneTables[1][tone]
	}
	return toneTables[0][tone]
}

// Stream is the sending state of one RTP Stream. Its packet buffer is
// allocated once; next rewrites it in place.
type Stream struct {
	codec  Codec
	Header rtp.Header
	TSStep uint32
	rng    uint64 // xorshift state for G.729 frames
	tone   int    // index of the stream's tone (toneHz)
	pos    int    // next sample of the tone table
	Buf    []byte // header + payload, constant length
	Sent   uint64
}

func NewStream(c Codec, ptime time.Duration, i int, ssrc uint32, seq uint16, ts uint32) *Stream {
	s := &Stream{
		codec:  c,
		Header: rtp.Header{PayloadType: c.PayloadType, SSRC: ssrc, SequenceNumber: seq, Timestamp: ts, Marker: true},
		TSStep: c.SamplesPer(ptime),
		rng:    uint64(ssrc)<<32 | uint64(i) | 1,
		tone:   i % toneCount,
		Buf:    make([]byte, rtp.HeaderSize+c.PayloadSize(ptime)),
	}
	return s
}

// Next builds the stream's Next packet into its buffer and returns it. It
// does not allocate.
func (s *Stream) Next() []byte {
	n, _ := s.Header.MarshalTo(s.Buf) // fixed 12-byte header always fits
	p := s.Buf[n:]
	switch s.codec.PayloadType {
	case 0, 8:
		// One second of the stream's tone, encoded once: an integer
		// number of periods, so it loops without a click.
		t := toneTable(s.codec.PayloadType, s.tone)
		for off := 0; off < len(p); {
			n := copy(p[off:], t[s.pos:])
			off += n
			s.pos = (s.pos + n) % len(t)
		}
	case 18:
		for off := 0; off+10 <= len(p); off += 10 {
			s.g729Frame(p[off : off+10])
		}
	default:
		s.opusFrame(p)
	}
	s.Header.Marker = false
	s.Header.SequenceNumber++
	s.Header.Timestamp += s.TSStep
	s.Sent++
	return s.Buf
}

// g729Frame writes a 10-byte, 80-bit frame with the field layout of G.729
// (RFC 3551 4.5.6): L0 L1 L2 L3 (18 bits of LSP indices), P1 P0 C1 S1 GA1
// GB1 P2 C2 S2 GA2 GB2. LSP indices stay near constant (a steady spectrum),
// pitch and codebook fields are pseudo-random and P0 is the real parity of
// P1's six most significant bits. It is not encoded audio: voipgen has no
// G.729 encoder, and a decoder would produce noise-like sound from it.
func (s *Stream) g729Frame(f []byte) {
	r := s.rand()
	var w bitWriter
	w.put(0, 1)                          // L0
	w.put(uint64(s.Header.SSRC)&0x7f, 7) // L1: fixed per stream
	w.put(16, 5)                         // L2
	w.put(16, 5)                         // L3
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

// opusFrame writes an Opus packet (RFC 6716 section 3.1): a TOC byte for
// CELT-only fullband mono (config 30: 10 ms, 31: 20 ms), code 0 for one
// frame; for ptimes over 20 ms code 3 with a constant-bitrate frame count
// byte (frames of 20 ms, or 10 ms when ptime is not a multiple of 20). The
// frame bytes are pseudo-random: the sizes are real, the audio is not.
func (s *Stream) opusFrame(p []byte) {
	ms := int(s.TSStep / 48)
	toc, frames := byte(31<<3), 0
	switch {
	case ms == 10:
		toc = 30 << 3
	case ms == 20:
	case ms%20 == 0:
		toc, frames = 31<<3|3, ms/20
	default:
		toc, frames = 30<<3|3, ms/10
	}
	p[0] = toc
	body := p[1:]
	if frames > 0 {
		p[1] = byte(frames)
		body = p[2:]
	}
	for i := 0; i < len(body); i += 8 {
		r := s.rand()
		for j := i; j < i+8 && j < len(body); j++ {
			body[j] = byte(r)
			r >>= 8
		}
	}
}

// Restart makes the stream a new call's stream: new SSRC, sequence number
// and timestamp, marker on the next packet.
func (s *Stream) Restart(ssrc uint32, seq uint16, ts uint32) {
	s.Header.SSRC, s.Header.SequenceNumber, s.Header.Timestamp, s.Header.Marker = ssrc, seq, ts, true
	s.Sent = 0
}

func (s *Stream) rand() uint64 {
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
