package g729

import (
	"bytes"
	"fmt"
	"math"
	"testing"
)

func needBcg729(t testing.TB) {
	t.Helper()
	if !Available {
		t.Skip("built without bcg729")
	}
}

// tone is n samples of a hz sine at amplitude amp, 8 kHz.
func tone(n int, hz, amp float64) []int16 {
	s := make([]int16, n)
	for i := range s {
		s[i] = int16(amp * math.Sin(2*math.Pi*hz*float64(i)/8000))
	}
	return s
}

func encodeAll(t testing.TB, e *Encoder, pcm []int16) (frames [][]byte) {
	t.Helper()
	buf := make([]byte, 0, FrameBytes)
	for off := 0; off < len(pcm); off += FrameSamples {
		out, n, err := e.Encode(buf[:0], pcm[off:off+FrameSamples])
		if err != nil || n != FrameSamples {
			t.Fatalf("frame %d: consumed %d, %v", off/FrameSamples, n, err)
		}
		frames = append(frames, bytes.Clone(out))
	}
	return frames
}

// snrDB is the SNR of got against want, at the lag (0 to 200 samples) that
// fits best: the codec delays its output.
func snrDB(want, got []int16) (best float64, lag int) {
	best = math.Inf(-1)
	for l := 0; l <= 200; l++ {
		var sig, noise float64
		for i := 800; i+l < len(got) && i < len(want); i++ { // skip the codec's start-up
			d := float64(got[i+l]) - float64(want[i])
			sig += float64(want[i]) * float64(want[i])
			noise += d * d
		}
		if s := 10 * math.Log10(sig/noise); s > best {
			best, lag = s, l
		}
	}
	return best, lag
}

// TestRoundTrip encodes a second of a 1 kHz tone, decodes it, and wants it
// back: 10-byte frames, the same bitstream from a second encoder (the
// codec is deterministic), and the tone within 10 dB SNR after the codec's
// delay (G.729 is a speech codec: a pure tone does not come back exact).
func TestRoundTrip(t *testing.T) {
	needBcg729(t)
	pcm := tone(8000, 1000, 8000)
	e1, err := NewEncoder(false)
	if err != nil {
		t.Fatal(err)
	}
	defer e1.Close()
	e2, _ := NewEncoder(false)
	defer e2.Close()
	f1, f2 := encodeAll(t, e1, pcm), encodeAll(t, e2, pcm)
	for i := range f1 {
		if len(f1[i]) != FrameBytes {
			t.Fatalf("frame %d: %d bytes without VAD, want 10", i, len(f1[i]))
		}
		if !bytes.Equal(f1[i], f2[i]) {
			t.Fatalf("frame %d differs between two encoders of the same PCM", i)
		}
	}
	d, err := NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	out := make([]int16, 0, len(pcm))
	for _, f := range f1 {
		if out, err = d.Decode(out, f); err != nil {
			t.Fatal(err)
		}
	}
	if len(out) != len(pcm) {
		t.Fatalf("decoded %d samples, want %d", len(out), len(pcm))
	}
	if snr, lag := snrDB(pcm, out); snr < 10 {
		t.Errorf("SNR %.1f dB at lag %d, want at least 10", snr, lag)
	} else {
		t.Logf("SNR %.1f dB at lag %d samples", snr, lag)
	}
}

// TestVAD: with VAD on, a silent input turns into SID frames and
// suppressed frames, and a SID frame ends the payload Encode builds: no
// speech frame follows it in the same payload.
func TestVAD(t *testing.T) {
	needBcg729(t)
	e, _ := NewEncoder(true)
	defer e.Close()
	// Speech first, so the encoder has something to fall silent from.
	pcm := append(tone(50*FrameSamples, 500, 8000), make([]int16, 100*FrameSamples)...)
	var sids, none int
	buf := make([]byte, 0, 4*FrameBytes)
	for off := 0; off < len(pcm); {
		out, n, err := e.Encode(buf[:0], pcm[off:off+min(4*FrameSamples, len(pcm)-off)])
		if err != nil || n == 0 {
			t.Fatalf("at %d: consumed %d, %v", off, n, err)
		}
		if _, sid, err := Frames(out); err != nil {
			t.Fatalf("at %d: payload of %d bytes: %v", off, len(out), err)
		} else if sid {
			sids++
		}
		if len(out) == 0 {
			none++
		}
		off += n
	}
	if sids == 0 || none == 0 {
		t.Errorf("silence with VAD: %d SID payloads, %d empty ones; want both", sids, none)
	}
	cn, err := e.ComfortNoise(make([]byte, 11))
	if err != nil || len(cn) != 11 {
		t.Errorf("comfort noise payload %d bytes, %v", len(cn), err)
	}
}

// TestConceal: lost frames and SID frames still give 80 samples each.
func TestConceal(t *testing.T) {
	needBcg729(t)
	e, _ := NewEncoder(false)
	defer e.Close()
	d, _ := NewDecoder()
	defer d.Close()
	frames := encodeAll(t, e, tone(800, 440, 6000))
	out := make([]int16, 0, 20*FrameSamples)
	out, _ = d.Decode(out, frames[0])
	out, err := d.Conceal(out, 3)
	if err != nil || len(out) != 4*FrameSamples {
		t.Fatalf("after a frame and 3 concealed: %d samples, %v", len(out), err)
	}
	var energy float64
	for _, s := range out[FrameSamples:] {
		energy += float64(s) * float64(s)
	}
	if energy == 0 {
		t.Error("concealed frames are silent: concealment should continue the signal")
	}
	if out, err = d.Decode(out, []byte{0x12, 0x34}); err != nil || len(out) != 5*FrameSamples {
		t.Errorf("SID frame: %d samples, %v", len(out), err)
	}
}

func TestBadInput(t *testing.T) {
	needBcg729(t)
	e, _ := NewEncoder(false)
	d, _ := NewDecoder()
	if _, _, err := e.Encode(make([]byte, 0, 10), make([]int16, 79)); err != ErrFrameSize {
		t.Errorf("79 samples: %v, want ErrFrameSize", err)
	}
	if _, _, err := e.Encode(make([]byte, 0, 5), make([]int16, 80)); err != ErrShortDst {
		t.Errorf("5-byte destination: %v, want ErrShortDst", err)
	}
	for _, p := range [][]byte{make([]byte, 3), make([]byte, 11), make([]byte, 14)} {
		if _, err := d.Decode(make([]int16, 0, 400), p); err != ErrPayload {
			t.Errorf("%d-byte payload: %v, want ErrPayload", len(p), err)
		}
	}
	if _, err := d.Decode(make([]int16, 0, 79), make([]byte, 10)); err != ErrShortDst {
		t.Errorf("short PCM destination: %v, want ErrShortDst", err)
	}
	e.Close()
	e.Close()
	d.Close()
	d.Close()
	if _, _, err := e.Encode(nil, make([]int16, 80)); err != ErrClosed {
		t.Errorf("closed encoder: %v", err)
	}
	if _, err := d.Decode(nil, make([]byte, 10)); err != ErrClosed {
		t.Errorf("closed decoder: %v", err)
	}
}

func TestNoAlloc(t *testing.T) {
	needBcg729(t)
	e, _ := NewEncoder(true)
	defer e.Close()
	d, _ := NewDecoder()
	defer d.Close()
	pcm := tone(2*FrameSamples, 700, 5000)
	enc := make([]byte, 0, 2*FrameBytes)
	dec := make([]int16, 0, 2*FrameSamples)
	frame := make([]byte, 2*FrameBytes)
	if n := testing.AllocsPerRun(200, func() {
		out, _, _ := e.Encode(enc[:0], pcm)
		copy(frame, out)
		_, _ = d.Decode(dec[:0], frame)
		_, _ = d.Conceal(dec[:0], 2)
	}); n != 0 {
		t.Fatalf("%v allocations per 20 ms, want 0", n)
	}
}

func TestFrames(t *testing.T) {
	for _, tc := range []struct {
		n      int
		speech int
		sid    bool
		bad    bool
	}{{0, 0, false, false}, {10, 1, false, false}, {20, 2, false, false}, {2, 0, true, false}, {12, 1, true, false}, {5, 0, false, true}, {13, 0, false, true}} {
		s, sid, err := Frames(make([]byte, tc.n))
		if (err != nil) != tc.bad || !tc.bad && (s != tc.speech || sid != tc.sid) {
			t.Errorf("Frames(%d bytes) = %d, %v, %v", tc.n, s, sid, err)
		}
	}
}

// FuzzDecode: any payload decodes or is refused, never a crash, and
// decodes to 80 samples per frame.
func FuzzDecode(f *testing.F) {
	if !Available {
		f.Skip("built without bcg729")
	}
	f.Add(make([]byte, 10))
	f.Add([]byte{0xff, 0xff})
	f.Add(bytes.Repeat([]byte{0xa5}, 22))
	d, _ := NewDecoder()
	dst := make([]int16, 0, 64*FrameSamples)
	f.Fuzz(func(t *testing.T, p []byte) {
		if len(p) > 60*FrameBytes {
			return
		}
		out, err := d.Decode(dst[:0], p)
		if err != nil {
			return
		}
		speech, sid, _ := Frames(p)
		if want := speech + map[bool]int{true: 1}[sid]; len(out) != want*FrameSamples {
			t.Fatalf("%d bytes decoded to %d samples, want %d", len(p), len(out), want*FrameSamples)
		}
	})
}

func BenchmarkEncode(b *testing.B) {
	needBcg729(b)
	e, _ := NewEncoder(false)
	defer e.Close()
	pcm := tone(FrameSamples, 700, 5000)
	dst := make([]byte, 0, FrameBytes)
	b.ReportAllocs()
	for b.Loop() {
		_, _, _ = e.Encode(dst[:0], pcm)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "us/frame")
}

// BenchmarkEncodeC is BenchmarkEncode's yardstick: the same frame encoded
// b.N times in one C loop, so that the difference is the binding's cost.
func BenchmarkEncodeC(b *testing.B) {
	needBcg729(b)
	e, _ := NewEncoder(false)
	defer e.Close()
	pcm := tone(FrameSamples, 700, 5000)
	dst := make([]byte, FrameBytes)
	b.ResetTimer()
	encodeLoopC(e, pcm, dst, b.N)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "us/frame")
}

// BenchmarkDecodeC is BenchmarkDecode's yardstick, in one C loop.
func BenchmarkDecodeC(b *testing.B) {
	needBcg729(b)
	e, _ := NewEncoder(false)
	defer e.Close()
	d, _ := NewDecoder()
	defer d.Close()
	frame, _, _ := e.Encode(make([]byte, 0, FrameBytes), tone(FrameSamples, 700, 5000))
	dst := make([]int16, FrameSamples)
	b.ResetTimer()
	decodeLoopC(d, frame, dst, b.N)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "us/frame")
}

func BenchmarkDecode(b *testing.B) {
	needBcg729(b)
	e, _ := NewEncoder(false)
	defer e.Close()
	d, _ := NewDecoder()
	defer d.Close()
	frame, _, _ := e.Encode(make([]byte, 0, FrameBytes), tone(FrameSamples, 700, 5000))
	dst := make([]int16, 0, FrameSamples)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = d.Decode(dst[:0], frame)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "us/frame")
}

// BenchmarkEncodeStreams encodes as a relay with many calls does: one
// encoder per stream, each on its own signal, one frame of each in turn.
// With one stream it is BenchmarkEncode on a moving signal; with 200 the
// encoders' state no longer stays in the CPU's caches between two frames
// of a stream, and the cost per frame is what transcoding that many calls
// pays for bcg729 alone.
func BenchmarkEncodeStreams(b *testing.B) {
	needBcg729(b)
	for _, n := range []int{1, 200} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			encs := make([]*Encoder, n)
			pcm := make([][]int16, n)
			for i := range encs {
				encs[i], _ = NewEncoder(false)
				defer encs[i].Close()
				// A second of two tones and noise of the stream's own.
				pcm[i] = tone(8000, 300+float64(i%50)*13, 4000)
				r := uint32(i + 1)
				for j, v := range tone(8000, 1100+float64(i%37)*29, 2000) {
					r = r*1664525 + 1013904223
					pcm[i][j] += v + int16(r>>24) - 128
				}
			}
			dst := make([]byte, 0, FrameBytes)
			b.ReportAllocs()
			frames := 0
			for b.Loop() {
				s, f := frames%n, frames/n%(8000/FrameSamples)
				_, _, _ = encs[s].Encode(dst[:0], pcm[s][f*FrameSamples:(f+1)*FrameSamples])
				frames++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "us/frame")
		})
	}
}
