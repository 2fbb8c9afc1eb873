package transcode

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/rtp/g711"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

const (
	ms      = int64(time.Millisecond)
	t0      = int64(1_700_000_000) * int64(time.Second)
	baseSeq = 1000 // the output's first sequence number in tests
	baseTs  = 5000 // and its first timestamp
	inSSRC  = 0x11223344
	outSSRC = 0xcafe0001
	ptPCMU  = 0
	ptPCMA  = 8
	ptG729  = 18
	ptEvent = 101
	ptCN    = 13
	ptEvOut = 96
	ptCNOut = 19
	inSeq0  = 40000 // input sequence numbers start here
	inTs0   = 123456
)

func needBcg729(t testing.TB) {
	t.Helper()
	if !g729.Available {
		t.Skip("built without bcg729")
	}
}

func pcmu(ptime uint8) dataplane.Codec {
	return dataplane.Codec{Name: "PCMU", PT: ptPCMU, Ptime: ptime}
}
func pcma(ptime uint8) dataplane.Codec {
	return dataplane.Codec{Name: "PCMA", PT: ptPCMA, Ptime: ptime}
}
func g729c(ptime uint8, vad bool) dataplane.Codec {
	return dataplane.Codec{Name: "G729", PT: ptG729, Ptime: ptime, VAD: vad}
}

// newStream is New with the random initial sequence number and timestamp
// fixed, so that tests can compare runs.
func newStream(t testing.TB, in, out dataplane.Codec) *Stream {
	t.Helper()
	s, err := New(dataplane.Transcode{In: in, Out: out}, outSSRC)
	if err != nil {
		t.Fatal(err)
	}
	s.seq, s.initTs, s.noise.state = baseSeq, baseTs, 1
	t.Cleanup(s.Close)
	return s
}

func mkPkt(pt uint8, seq uint16, ts, ssrc uint32, marker bool, payload []byte) []byte {
	h := rtp.Header{PayloadType: pt, SequenceNumber: seq, Timestamp: ts, SSRC: ssrc, Marker: marker}
	b, _ := h.Append(nil)
	return append(b, payload...)
}

type outPacket struct {
	rtp.Header
	payload []byte
	at      int64
}

// run feeds a stream and collects what it sends.
type run struct {
	t   testing.TB
	s   *Stream
	out []outPacket
	buf []byte
	now int64
}

func newRun(t testing.TB, s *Stream) *run {
	return &run{t: t, s: s, buf: make([]byte, MaxPacket), now: t0}
}

func (r *run) push(p []byte, now int64) {
	r.t.Helper()
	r.now = now
	if err := r.s.Push(p, now); err != nil {
		r.t.Fatalf("push at %d ms: %v", (now-t0)/ms, err)
	}
	r.drain(now)
}

func (r *run) drain(now int64) {
	r.t.Helper()
	for {
		n := r.s.Pull(r.buf, now)
		if n == 0 {
			return
		}
		var h rtp.Header
		off, err := h.Unmarshal(r.buf[:n])
		if err != nil {
			r.t.Fatalf("output packet: %v", err)
		}
		r.out = append(r.out, outPacket{Header: h, payload: bytes.Clone(r.buf[off:n]), at: now})
	}
}

// until runs the stream's deadlines up to now, as the worker would.
func (r *run) until(now int64) {
	r.t.Helper()
	for {
		d := r.s.Deadline()
		if d == 0 || d > now {
			break
		}
		r.drain(max(d, r.now))
		r.now = max(d, r.now)
		if r.s.Deadline() == d && r.s.qn == 0 {
			r.t.Fatalf("deadline %d did not move after Pull", d)
		}
	}
	r.now = now
	r.drain(now)
}

// checkSeq fails unless the output sequence numbers go up by one from
// baseSeq and the SSRC is the stream's.
func checkSeq(t testing.TB, out []outPacket) {
	t.Helper()
	for i, p := range out {
		if p.SequenceNumber != uint16(baseSeq+i) || p.SSRC != outSSRC {
			t.Fatalf("packet %d: seq %d ssrc %x, want %d %x", i, p.SequenceNumber, p.SSRC, baseSeq+i, outSSRC)
		}
	}
}

// frameCount is the 10 ms frames of an audio payload.
func frameCount(c dataplane.Codec, p []byte) int {
	if c.Name == "G729" {
		speech, sid, err := g729.Frames(p)
		if err != nil {
			panic(err)
		}
		return speech + b2i(sid)
	}
	return len(p) / FrameSamples
}

// checkContinuous fails unless the audio packets of out follow one
// another without a gap in timestamps, starting at baseTs, and returns the
// frames they carry.
func checkContinuous(t testing.TB, c dataplane.Codec, out []outPacket) int {
	t.Helper()
	next := uint32(baseTs)
	frames := 0
	for i, p := range out {
		if p.PayloadType != c.PT {
			continue
		}
		if p.Timestamp != next {
			t.Fatalf("packet %d: ts %d, want %d (%+d samples)", i, p.Timestamp, next, int32(p.Timestamp-next))
		}
		n := frameCount(c, p.payload)
		if n > int(c.Ptime)/10 {
			t.Fatalf("packet %d: %d frames, ptime %d", i, n, c.Ptime)
		}
		frames += n
		next += uint32(n * FrameSamples)
	}
	return frames
}

// tone is n samples of a sine.
func tone(n int, hz, amp float64) []int16 {
	s := make([]int16, n)
	for i := range s {
		s[i] = int16(amp * math.Sin(2*math.Pi*hz*float64(i)/8000))
	}
	return s
}

// speechLike is a synthetic voiced signal: a glottal-like harmonic series
// on a gliding pitch (110 to 180 Hz), shaped by two moving formants and a
// 4 Hz syllable envelope, with pauses when silent is set.
func speechLike(n int, silent bool) []int16 {
	out := make([]int16, n)
	rng := rand.New(rand.NewPCG(1, 2))
	var phase float64
	for i := range out {
		tt := float64(i) / 8000
		f0 := 145 + 35*math.Sin(2*math.Pi*0.7*tt)
		phase += 2 * math.Pi * f0 / 8000
		f1 := 500 + 250*math.Sin(2*math.Pi*1.3*tt)
		f2 := 1500 + 500*math.Sin(2*math.Pi*0.9*tt+1)
		var v float64
		for h := 1; float64(h)*f0 < 3600; h++ {
			hf := float64(h) * f0
			a := 1/(1+math.Pow((hf-f1)/150, 2)) + 0.5/(1+math.Pow((hf-f2)/250, 2))
			v += a * math.Sin(float64(h)*phase) / math.Sqrt(float64(h))
		}
		env := 0.55 + 0.45*math.Sin(2*math.Pi*4*tt)
		if silent && math.Mod(tt, 1.0) > 0.6 {
			env = 0
		}
		out[i] = int16(max(min(4000*env*v+20*rng.NormFloat64(), 32767), -32768))
	}
	return out
}

// g711Packets packetizes pcm (whole frames) into G.711 payloads of ptime.
func g711Packets(c dataplane.Codec, pcm []int16) [][]byte {
	n := int(c.Ptime) * 8
	var out [][]byte
	for off := 0; off+n <= len(pcm); off += n {
		if c.Name == "PCMU" {
			out = append(out, g711.AppendUlaw(nil, pcm[off:off+n]))
		} else {
			out = append(out, g711.AppendAlaw(nil, pcm[off:off+n]))
		}
	}
	return out
}

// g729Frames encodes pcm into per-frame G.729 codes (empty: suppressed).
func g729Frames(t testing.TB, pcm []int16, vad bool) [][]byte {
	t.Helper()
	e, err := g729.NewEncoder(vad)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var frames [][]byte
	for off := 0; off+FrameSamples <= len(pcm); off += FrameSamples {
		code, _, err := e.Encode(make([]byte, 0, g729.FrameBytes), pcm[off:off+FrameSamples])
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, code)
	}
	return frames
}

// g729Packets groups speech frames (no VAD) into payloads of ptime.
func g729Packets(frames [][]byte, ptime int) [][]byte {
	k := ptime / 10
	var out [][]byte
	for i := 0; i+k <= len(frames); i += k {
		out = append(out, bytes.Join(frames[i:i+k], nil))
	}
	return out
}

// decodeOut decodes the audio packets of out into PCM, in order, with
// silence for timestamps no packet covered.
func decodeOut(t testing.TB, c dataplane.Codec, out []outPacket) []int16 {
	t.Helper()
	var pcm []int16
	var d *g729.Decoder
	if c.Name == "G729" {
		var err error
		if d, err = g729.NewDecoder(); err != nil {
			t.Fatal(err)
		}
		defer d.Close()
	}
	var next uint32
	for i, p := range out {
		if p.PayloadType != c.PT {
			continue
		}
		if i > 0 && int32(p.Timestamp-next) > 0 {
			pcm = append(pcm, make([]int16, p.Timestamp-next)...)
		}
		next = p.Timestamp + uint32(frameCount(c, p.payload)*FrameSamples)
		switch c.Name {
		case "PCMU":
			for _, b := range p.payload {
				pcm = append(pcm, g711.DecodeUlaw(b))
			}
		case "PCMA":
			for _, b := range p.payload {
				pcm = append(pcm, g711.DecodeAlaw(b))
			}
		default:
			var err error
			if pcm, err = d.Decode(pcm, p.payload); err != nil {
				t.Fatal(err)
			}
		}
	}
	return pcm
}

func ulawRoundTrip(pcm []int16) []int16 {
	out := make([]int16, len(pcm))
	for i, v := range pcm {
		out[i] = g711.DecodeUlaw(g711.EncodeUlaw(v))
	}
	return out
}
