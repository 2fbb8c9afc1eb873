package transcode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/rtp/g711"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

const (
	// MaxPacket is the room Pull and Report need in dst.
	MaxPacket = 1500
	// FrameSamples is the samples of one 10 ms frame at 8 kHz.
	FrameSamples = 80
	// MaxFrames is the most 10 ms frames an input packet may carry (160
	// ms; 1280 bytes of G.711, within an Ethernet MTU).
	MaxFrames = 16
	// HoldLimit is the longest a packet after a gap is held for the
	// missing one to arrive.
	HoldLimit = 60 * time.Millisecond
	// HoldPackets is the most packets held after a gap: one more arriving
	// gives up on the missing packet at once.
	HoldPackets = 3
	// ReorderWindow is how far ahead (in sequence numbers) a packet can be
	// held; a packet farther ahead gives up on the ones before it at once.
	ReorderWindow = 8
	// MaxConceal is the longest loss concealed, in frames: a longer one
	// is a jump in the output timestamps, nothing synthesised. It is also
	// the most frames of comfort noise made for one gap (noise the worker
	// did not ask for in time); the rest of a longer gap is a jump.
	MaxConceal = 12
	// NoiseGrace is how long after its input would have arrived a frame
	// of comfort noise is synthesised: an input packet up to this late
	// still takes its own slot (no rebase of the timeline).
	NoiseGrace = 20 * time.Millisecond
)

const (
	maxDropout   = 3000 // RFC 3550 A.1: larger jumps ahead need a second packet to confirm
	maxMisorder  = 100  // ... and so do jumps back farther than this
	maxSmall     = 64   // payload bytes of a telephone-event or CN packet
	maxInPayload = MaxFrames * FrameSamples
	queueLen     = 128
	frameNs      = int64(10 * time.Millisecond)
	sampleNs     = int64(time.Second / 8000)
)

// Errors of Push, pre-allocated: malformed packets arrive at line rate.
var (
	ErrPayloadType = errors.New("transcode: unknown payload type")
	ErrPayload     = errors.New("transcode: payload size does not fit its payload type")
	ErrClosed      = errors.New("transcode: stream closed")
)

type codecKind uint8

const (
	kindUlaw codecKind = iota
	kindAlaw
	kindG729
)

func kindOf(c dataplane.Codec) (codecKind, error) {
	switch c.Name {
	case "PCMU":
		return kindUlaw, nil
	case "PCMA":
		return kindAlaw, nil
	case "G729":
		return kindG729, nil
	}
	return 0, fmt.Errorf("codec %q: want PCMU, PCMA or G729", c.Name)
}

// Stats are a Stream's counters.
type Stats struct {
	FramesIn      uint64        // 10 ms frames decoded (or passed) from arriving packets
	FramesOut     uint64        // 10 ms frames encoded into sent packets (SID frames included)
	Concealed     uint64        // frames synthesised for lost or late input
	Noise         uint64        // comfort noise frames synthesised for silence the input did not send
	SentPackets   uint64        // RTP packets returned by Pull
	SentOctets    uint64        // their payload octets (for the RTCP SR)
	Events        uint64        // telephone-event packets passed through
	EventsDropped uint64        // telephone-event packets dropped: the output side has none
	CNSent        uint64        // RFC 3389 comfort noise packets sent
	LateDropped   uint64        // packets that arrived after their slot was concealed
	Duplicates    uint64        // packets received twice
	Discarded     uint64        // packets dropped otherwise (a lone sequence jump; CN toward G.729 when passing G.729 through)
	Overflow      uint64        // packets lost because the output queue was full (a bug if ever non-zero)
	RTCPSent      uint64        // reports Report wrote
	MaxHold       time.Duration // the longest a packet was held for reordering
}

type heldPkt struct {
	valid   bool
	marker  bool
	pt      uint8
	seq     uint16
	ts      uint32
	arrival int64
	n       int
	payload [maxInPayload]byte
}

type outPkt struct {
	marker bool
	pt     uint8
	ts     uint32
	n      int
}

// Stream is the transcoding engine of one direction of one media stream:
// RTP in one codec goes in with Push, RTP in the other comes out of Pull.
// The zero value is not usable: use New. A Stream belongs to the worker
// that owns the flow and is not safe for concurrent use.
type Stream struct {
	in, out         dataplane.Codec
	inKind, outKind codecKind
	pass            bool // G.729 to G.729: frames are copied, bit-exact
	cnOut           bool // silence toward the output is an RFC 3389 packet, not audio
	genOut          bool // silence toward the output is comfort noise, sent in real time
	fpp             int  // frames per output packet
	ssrc            uint32
	dec             *g729.Decoder
	enc             *g729.Encoder
	closed          bool
	hdr             rtp.Header

	// Input sequence.
	started  bool
	inSSRC   uint32
	nextSeq  uint16
	recvBits uint64 // bit i: nextSeq-1-i was received
	badSeq   int32  // the sequence number that would confirm a jump; -1: none
	held     [ReorderWindow]heldPkt
	nheld    int
	lost     bool // input was lost since the last audio released

	// Output timeline: out ts = in ts + offset; pos is the next frame's.
	offset   uint32
	pos      uint32
	anchorNs int64 // when the frame ending at anchorTs was released
	anchorTs uint32
	anchored bool

	// Silence.
	silence bool
	cng     bool // the silence is the G.729 decoder's (SID), not a CN level
	lastSID [g729.SIDBytes]byte
	haveSID bool
	noise   noise
	plc     plc

	// Packet being built.
	pend       []byte
	pendFrames int
	pendTs     uint32
	pendMarker bool
	pendSpeech bool
	markNext   bool
	code       []byte
	pcm        []int16
	frame      [FrameSamples]int16
	small      [maxSmall]byte

	// Packets due.
	q      [queueLen]outPkt
	qbuf   []byte
	slot   int
	qhead  int
	qn     int
	seq    uint32 // extended: cycles<<16 | the next packet's number
	initTs uint32
	initAt int64 // when initTs holds (Unix ns; 0: at the first frame)

	st Stats
}

// New returns the engine of one direction. ssrc is the SSRC of the output
// stream. It fails (wrapping g729.ErrUnavailable) when G.729 is needed and
// relayd was built without bcg729.
func New(t dataplane.Transcode, ssrc uint32) (*Stream, error) {
	s := &Stream{in: t.In, out: t.Out, ssrc: ssrc, badSeq: -1}
	var err error
	if s.inKind, err = kindOf(t.In); err != nil {
		return nil, fmt.Errorf("transcode from: %w", err)
	}
	if s.outKind, err = kindOf(t.Out); err != nil {
		return nil, fmt.Errorf("transcode to: %w", err)
	}
	for _, c := range []dataplane.Codec{t.In, t.Out} {
		if c.Ptime == 0 || c.Ptime > 40 || c.Ptime%10 != 0 {
			return nil, fmt.Errorf("transcode: ptime %d: want 10, 20, 30 or 40", c.Ptime)
		}
	}
	s.fpp = int(t.Out.Ptime) / 10
	s.pass = s.inKind == kindG729 && s.outKind == kindG729 && (!t.In.VAD || t.Out.VAD)
	s.cnOut = s.outKind != kindG729 && t.Out.CN != 0
	s.genOut = !s.pass && !s.cnOut
	if s.inKind == kindG729 && !s.pass {
		if s.dec, err = g729.NewDecoder(); err != nil {
			return nil, fmt.Errorf("transcode: g729 decoder: %w", err)
		}
	}
	if s.outKind == kindG729 && !s.pass {
		if s.enc, err = g729.NewEncoder(t.Out.VAD); err != nil {
			s.Close()
			return nil, fmt.Errorf("transcode: g729 encoder: %w", err)
		}
	}
	frameBytes := FrameSamples
	if s.outKind == kindG729 {
		frameBytes = g729.FrameBytes
	}
	slotSize := max(s.fpp*frameBytes, maxSmall)
	s.pend = make([]byte, 0, s.fpp*frameBytes)
	s.code = make([]byte, 0, FrameSamples)
	s.pcm = make([]int16, 0, (MaxFrames+1)*FrameSamples)
	s.qbuf = make([]byte, queueLen*slotSize)
	s.slot = slotSize
	if r := t.Resume; r.Valid {
		s.seq, s.initTs, s.initAt = r.Seq, r.Timestamp, r.At
	} else {
		s.seq, s.initTs = rand.Uint32()&0xffff, rand.Uint32()
	}
	s.noise.state = rand.Uint32()
	return s, nil
}

// Close frees the codec contexts; it is safe to call twice.
func (s *Stream) Close() {
	s.closed = true
	if s.dec != nil {
		s.dec.Close()
	}
	if s.enc != nil {
		s.enc.Close()
	}
}

// Stats returns the stream's counters.
func (s *Stream) Stats() Stats { return s.st }

// Position is where the output stream is at now: the extended sequence
// number of the next packet (cycles<<16 | number) and the RTP timestamp
// that corresponds to now. A stream made again after a restart continues
// from it (dataplane.Resume), so that its receiver sees the same stream
// with a gap, never numbers or times going back.
func (s *Stream) Position(now int64) (seq, ts uint32) {
	if !s.started {
		return s.seq, s.firstTs(now)
	}
	return s.seq, s.rtpTime(now)
}

// check validates the payload of a packet of payload type pt.
func (s *Stream) check(pt uint8, p []byte) error {
	switch {
	case pt == s.in.PT:
		if s.inKind == kindG729 {
			speech, sid, err := g729.Frames(p)
			if err != nil {
				return ErrPayload
			}
			if n := speech + b2i(sid); n == 0 || n > MaxFrames {
				return ErrPayload
			}
			return nil
		}
		if len(p) == 0 || len(p)%FrameSamples != 0 || len(p) > maxInPayload {
			return ErrPayload
		}
	case s.in.Event != 0 && pt == s.in.Event:
		if len(p) < 4 || len(p)%4 != 0 || len(p) > maxSmall {
			return ErrPayload
		}
	case s.in.CN != 0 && pt == s.in.CN:
		if len(p) == 0 || len(p) > maxSmall {
			return ErrPayload
		}
	default:
		return ErrPayloadType
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Push takes one plain RTP packet (header included; never RTCP) that
// arrived at now (Unix ns). A malformed packet or an unknown payload type
// returns an error and changes nothing. It does not allocate.
func (s *Stream) Push(pkt []byte, now int64) error {
	if s.closed {
		return ErrClosed
	}
	h := &s.hdr
	off, err := h.Unmarshal(pkt)
	if err != nil {
		return err
	}
	payload := pkt[off : len(pkt)-int(h.PaddingLen)]
	if err := s.check(h.PayloadType, payload); err != nil {
		return err
	}
	if !s.started || h.SSRC != s.inSSRC {
		s.newSource(h.SSRC, h.SequenceNumber, h.Timestamp, now)
	}
	d := int16(h.SequenceNumber - s.nextSeq)
	if d > maxDropout || d < -maxMisorder {
		if int32(h.SequenceNumber) != s.badSeq {
			s.badSeq = int32(h.SequenceNumber + 1)
			s.st.Discarded++
			return nil
		}
		s.newSource(h.SSRC, h.SequenceNumber, h.Timestamp, now)
		d = 0
	}
	switch {
	case d == 0:
		s.release(h.Marker, h.PayloadType, h.Timestamp, payload, now)
		s.drain(now)
	case d < 0:
		if k := -int(d) - 1; k < 64 && s.recvBits>>k&1 == 1 {
			s.st.Duplicates++
		} else {
			s.st.LateDropped++
		}
	case d >= ReorderWindow:
		s.expireAll(now)
		s.skipTo(h.SequenceNumber)
		s.release(h.Marker, h.PayloadType, h.Timestamp, payload, now)
		s.drain(now)
	default:
		slot := &s.held[h.SequenceNumber%ReorderWindow]
		if slot.valid && slot.seq == h.SequenceNumber {
			s.st.Duplicates++
			return nil
		}
		*slot = heldPkt{valid: true, marker: h.Marker, pt: h.PayloadType, seq: h.SequenceNumber,
			ts: h.Timestamp, arrival: now, n: len(payload)}
		copy(slot.payload[:], payload)
		s.nheld++
		if s.nheld > HoldPackets {
			s.expireFirst(now)
		}
	}
	return nil
}

// newSource starts the input sequence at a packet of a new source (or a
// confirmed sequence jump): what is held is given up on and released, and
// the timestamp mapping is rebased so that the new source's timeline
// continues the output's.
func (s *Stream) newSource(ssrc uint32, seq uint16, ts uint32, now int64) {
	if s.started {
		s.expireAll(now)
		s.flush()
		s.markNext = true
	} else {
		s.pos = s.firstTs(now)
		s.markNext = true
	}
	s.started, s.inSSRC, s.nextSeq, s.recvBits, s.badSeq, s.lost = true, ssrc, seq, 0, -1, false
	s.offset = s.pos - ts
}

// firstTs is the output timestamp of a first frame sent at now: a resumed
// stream's moved on by the time since its resume point.
func (s *Stream) firstTs(now int64) uint32 {
	if s.initAt != 0 && now > s.initAt {
		return s.initTs + uint32((now-s.initAt)/sampleNs)
	}
	return s.initTs
}

// advance moves the input sequence on by one packet.
func (s *Stream) advance(received bool) {
	s.recvBits = s.recvBits<<1 | uint64(b2i(received))
	s.nextSeq++
}

// skipTo gives up on the packets before seq.
func (s *Stream) skipTo(seq uint16) {
	if k := int(seq - s.nextSeq); k > 0 {
		if k >= 64 {
			s.recvBits = 0
		} else {
			s.recvBits <<= k
		}
		s.nextSeq = seq
		s.lost = true
	}
}

// drain releases the held packets that are now in sequence.
func (s *Stream) drain(now int64) {
	for s.nheld > 0 {
		p := &s.held[s.nextSeq%ReorderWindow]
		if !p.valid || p.seq != s.nextSeq {
			return
		}
		p.valid = false
		s.nheld--
		if d := time.Duration(now - p.arrival); d > s.st.MaxHold {
			s.st.MaxHold = d
		}
		s.release(p.marker, p.pt, p.ts, p.payload[:p.n], now)
	}
}

// expireFirst gives up on the packets missing before the first held one
// and releases it and those in sequence after it.
func (s *Stream) expireFirst(now int64) {
	first, best := -1, ReorderWindow
	for i := range s.held {
		if p := &s.held[i]; p.valid {
			if d := int(p.seq - s.nextSeq); d < best {
				first, best = i, d
			}
		}
	}
	if first < 0 {
		return
	}
	s.skipTo(s.held[first].seq)
	s.drain(now)
}

func (s *Stream) expireAll(now int64) {
	for s.nheld > 0 {
		s.expireFirst(now)
	}
}

func (s *Stream) oldestHeld() int64 {
	var t int64
	for i := range s.held {
		if p := &s.held[i]; p.valid && (t == 0 || p.arrival < t) {
			t = p.arrival
		}
	}
	return t
}

// release plays one packet in sequence.
func (s *Stream) release(marker bool, pt uint8, ts uint32, p []byte, now int64) {
	s.advance(true)
	switch {
	case pt == s.in.PT:
		s.releaseAudio(marker, ts, p, now)
	case pt == s.in.Event:
		if s.out.Event == 0 {
			s.st.EventsDropped++
			return
		}
		s.st.Events++
		s.enqueue(s.out.Event, ts+s.offset, marker, p)
	default:
		s.releaseCN(ts, p, now)
	}
}

// gap brings the output to the frame at out timestamp ts: frames lost
// before it are concealed, silence the input did not send is filled with
// comfort noise when the output wants it, and beyond MaxConceal frames
// (or when nothing is to be synthesised) the output timestamps jump. A
// timestamp behind the output or off the 10 ms grid rebases the mapping.
func (s *Stream) gap(ts uint32) {
	d := int32(ts - s.pos)
	if d < 0 {
		s.offset += uint32(-d)
		return
	}
	frames := int(d / FrameSamples)
	s.offset -= uint32(d % FrameSamples)
	if frames == 0 {
		return
	}
	n := min(frames, MaxConceal)
	switch {
	case s.pass || s.silence && s.cnOut:
		n = 0
	case s.lost && frames > MaxConceal:
		// A loss is known when the packet after it arrives: frames made
		// for a long one would leave now, in a burst, with the
		// timestamps of audio the far end should have played a gap ago.
		// Its jitter buffer drops them (or grows for them), and each
		// costs an encode just when every stream resumes at once (a
		// network outage, a firewall pair's failover).
		n = 0
	case s.lost:
		for range n {
			s.putPCM(s.concealFrame())
			s.st.Concealed++
		}
	case s.silence:
		for range n {
			s.putPCM(s.noiseFrame())
			s.st.Noise++
		}
	default:
		n = 0
	}
	if frames > n {
		s.flush()
		s.pos += uint32(frames-n) * FrameSamples
		s.markNext = true
	}
}

func (s *Stream) concealFrame() []int16 {
	switch {
	case s.inKind == kindG729:
		out, _ := s.dec.Conceal(s.frame[:0], 1)
		return out
	case s.silence:
		s.noise.fill(s.frame[:])
	default:
		s.plc.conceal(s.frame[:])
	}
	return s.frame[:]
}

func (s *Stream) noiseFrame() []int16 {
	if s.cng {
		out, _ := s.dec.Conceal(s.frame[:0], 1)
		return out
	}
	s.noise.fill(s.frame[:])
	return s.frame[:]
}

func (s *Stream) setAnchor(now int64) {
	s.anchorNs, s.anchorTs, s.anchored = now, s.pos, true
}

func (s *Stream) releaseAudio(marker bool, ts uint32, p []byte, now int64) {
	s.gap(ts + s.offset)
	s.lost = false
	if marker {
		s.flush()
		s.markNext = true
	}
	switch {
	case s.pass:
		speech, sid, _ := g729.Frames(p)
		for i := range speech {
			s.putFrame(p[i*g729.FrameBytes : (i+1)*g729.FrameBytes])
		}
		s.silence = false
		if sid {
			s.putFrame(p[speech*g729.FrameBytes:])
			s.silence = true
		}
		s.st.FramesIn += uint64(speech + b2i(sid))
	case s.inKind == kindG729:
		speech, sid, _ := g729.Frames(p)
		pcm, _ := s.dec.Decode(s.pcm[:0], p)
		s.st.FramesIn += uint64(speech + b2i(sid))
		if speech > 0 {
			s.silence = false
		}
		for i := range speech {
			s.putPCM(pcm[i*FrameSamples : (i+1)*FrameSamples])
		}
		if sid {
			s.sid([g729.SIDBytes]byte(p[speech*g729.FrameBytes:]), pcm[speech*FrameSamples:])
		}
	default:
		s.silence = false
		for i := 0; i < len(p); i += FrameSamples {
			if s.inKind == kindUlaw {
				for j, c := range p[i : i+FrameSamples] {
					s.frame[j] = g711.DecodeUlaw(c)
				}
			} else {
				for j, c := range p[i : i+FrameSamples] {
					s.frame[j] = g711.DecodeAlaw(c)
				}
			}
			s.plc.good(s.frame[:])
			s.putPCM(s.frame[:])
			s.st.FramesIn++
		}
	}
	s.setAnchor(now)
}

// sid handles a G.729 Annex B SID frame and its decoded comfort noise.
func (s *Stream) sid(sid [g729.SIDBytes]byte, pcm []int16) {
	was := s.silence && s.cng
	changed := !s.haveSID || sid != s.lastSID
	s.silence, s.cng, s.lastSID, s.haveSID = true, true, sid, true
	if !s.cnOut {
		s.putPCM(pcm)
		return
	}
	if !was || changed {
		s.small[0] = levelOf(pcm)
		s.sendCN(s.small[:1])
	}
	s.pos += FrameSamples
}

func (s *Stream) releaseCN(ts uint32, p []byte, now int64) {
	s.gap(ts + s.offset)
	s.lost = false
	s.silence, s.cng = true, false
	s.noise.setLevel(p[0])
	switch {
	case s.pass:
		s.st.Discarded++
	case s.cnOut:
		s.sendCN(p)
	default:
		s.flush()
		s.markNext = true
	}
	s.setAnchor(now)
}

func (s *Stream) sendCN(p []byte) {
	s.flush()
	s.enqueue(s.out.CN, s.pos, false, p)
	s.markNext = true
	s.st.CNSent++
}

// putPCM encodes one frame at s.pos.
func (s *Stream) putPCM(pcm []int16) {
	var code []byte
	switch s.outKind {
	case kindUlaw:
		code = g711.AppendUlaw(s.code[:0], pcm)
	case kindAlaw:
		code = g711.AppendAlaw(s.code[:0], pcm)
	default:
		code, _, _ = s.enc.Encode(s.code[:0], pcm)
	}
	s.putFrame(code)
}

// putFrame adds one encoded frame at s.pos to the packet being built:
// empty is a frame DTX suppressed, 2 bytes a SID frame that ends the
// packet.
func (s *Stream) putFrame(code []byte) {
	if len(code) == 0 {
		s.flush()
		s.markNext = true
		s.pos += FrameSamples
		return
	}
	if s.pendFrames == 0 {
		s.pendTs, s.pendMarker, s.pendSpeech = s.pos, s.markNext, false
	}
	s.pend = append(s.pend, code...)
	s.pendFrames++
	s.st.FramesOut++
	s.pos += FrameSamples
	if len(code) == g729.SIDBytes {
		s.flush()
		s.markNext = true
		return
	}
	s.pendSpeech = true
	s.markNext = false
	if s.pendFrames == s.fpp {
		s.flush()
	}
}

// flush queues the packet being built. A packet of a SID frame alone does
// not start a talkspurt: the marker waits for the next speech.
func (s *Stream) flush() {
	if s.pendFrames == 0 {
		return
	}
	marker := s.pendMarker && s.pendSpeech
	if s.pendMarker && !s.pendSpeech {
		s.markNext = true
	}
	s.enqueue(s.out.PT, s.pendTs, marker, s.pend)
	s.pend = s.pend[:0]
	s.pendFrames = 0
}

func (s *Stream) enqueue(pt uint8, ts uint32, marker bool, p []byte) {
	if s.qn == queueLen {
		s.st.Overflow++
		return
	}
	i := (s.qhead + s.qn) % queueLen
	s.q[i] = outPkt{marker: marker, pt: pt, ts: ts, n: copy(s.qbuf[i*s.slot:(i+1)*s.slot], p)}
	s.qn++
}

func (s *Stream) generating() bool {
	return s.silence && s.genOut && s.anchored
}

// due is when the frame at out timestamp ts is synthesised: NoiseGrace
// after it would have arrived had the input sent it (the end of the
// frame, on the clock of the last release).
func (s *Stream) due(ts uint32) int64 {
	return s.anchorNs + int64(int32(ts+FrameSamples-s.anchorTs))*sampleNs + int64(NoiseGrace)
}

// timers gives up on held packets whose hold expired and synthesises the
// comfort noise due by now.
func (s *Stream) timers(now int64) {
	for s.nheld > 0 && now >= s.oldestHeld()+int64(HoldLimit) {
		s.expireFirst(now)
	}
	if !s.generating() {
		return
	}
	if late := (now - s.due(s.pos)) / frameNs; late > MaxConceal {
		// Too late (the worker did not call Pull in time): jump and
		// synthesise only the last MaxConceal frames, on a clock
		// re-anchored so that no long catch-up follows.
		s.flush()
		s.pos += uint32(late-MaxConceal) * FrameSamples
		s.anchorTs, s.anchorNs = s.pos, now-int64(NoiseGrace)-MaxConceal*frameNs
		s.markNext = true
	}
	for s.due(s.pos) <= now {
		s.putPCM(s.noiseFrame())
		s.st.Noise++
	}
}

// Pull writes into dst (len >= MaxPacket) the next RTP packet due at or
// before now and returns its length; 0 when nothing is due. It does not
// allocate.
func (s *Stream) Pull(dst []byte, now int64) int {
	if s.closed {
		return 0
	}
	s.timers(now)
	if s.qn == 0 {
		return 0
	}
	o := &s.q[s.qhead]
	if len(dst) < rtp.HeaderSize+o.n {
		return 0
	}
	dst[0] = rtp.Version << 6
	dst[1] = o.pt & 0x7f
	if o.marker {
		dst[1] |= 0x80
	}
	binary.BigEndian.PutUint16(dst[2:], uint16(s.seq))
	binary.BigEndian.PutUint32(dst[4:], o.ts)
	binary.BigEndian.PutUint32(dst[8:], s.ssrc)
	n := copy(dst[rtp.HeaderSize:], s.qbuf[s.qhead*s.slot:s.qhead*s.slot+o.n])
	s.seq++
	s.qhead = (s.qhead + 1) % queueLen
	s.qn--
	s.st.SentPackets++
	s.st.SentOctets += uint64(n)
	return rtp.HeaderSize + n
}

// Deadline is the earliest Unix ns at which Pull has work without new
// input: a packet already queued (a time in the past), a reorder hold
// expiring, or comfort noise due toward an output that wants it sent
// (a G.711 leg without a CN payload type, or G.729). 0: none.
func (s *Stream) Deadline() int64 {
	if s.closed {
		return 0
	}
	if s.qn > 0 {
		return 1
	}
	var d int64
	if s.nheld > 0 {
		d = s.oldestHeld() + int64(HoldLimit)
	}
	if s.generating() {
		g := s.due(s.pos + uint32(max(s.fpp-s.pendFrames-1, 0))*FrameSamples)
		if d == 0 || g < d {
			d = g
		}
	}
	return d
}
