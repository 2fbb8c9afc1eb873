package audio

import (
	"context"
	"errors"
	"math"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/rtp/g711"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

func needFFmpeg(t *testing.T) {
	t.Helper()
	testenv.NeedCommand(t, "ffmpeg", "ffmpeg")
}

func needBcg729(t *testing.T) {
	t.Helper()
	if !g729.Available {
		testenv.Skip(t, "built without bcg729 (cgo and libbcg729-dev)")
	}
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// encodeG729 encodes pcm (whole 10 ms frames) with bcg729, VAD off, into
// concatenated 10-byte frames.
func encodeG729(t *testing.T, pcm []int16) []byte {
	t.Helper()
	e, err := g729.NewEncoder(false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	out := make([]byte, 0, len(pcm)/8)
	out, n, err := e.Encode(out, pcm)
	if err != nil || n != len(pcm) {
		t.Fatalf("encode: %d of %d samples: %v", n, len(pcm), err)
	}
	return out
}

// decodeBcg729 decodes concatenated 10-byte frames with bcg729.
func decodeBcg729(t *testing.T, frames []byte) []int16 {
	t.Helper()
	d, err := g729.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pcm, err := d.Decode(make([]int16, 0, len(frames)*8), frames)
	if err != nil {
		t.Fatal(err)
	}
	return pcm
}

// Thresholds of TestG729FFmpeg, in dB, under what was measured (the test
// logs the figures). G.729 is a CELP codec: it keeps what the ear hears,
// not the waveform, so its SNR is low and depends on the signal. Measured
// with bcg729 1.1.1 and ffmpeg 5.1 (Debian 12), the first 100 ms left out:
//
//	1 kHz tone, 0.3 of full scale   SNR 10.8 dB (bcg729), 10.1 (ffmpeg)
//	440 Hz tone                     SNR 21.2, 23.6
//	Speech seed 11 (10 s)           SegSNR 5.95, 5.94; SNR 6.6, 6.7
//	Speech seed 3                   SegSNR 6.35, 6.33
//	ffmpeg against bcg729           SNR 27.6 (1 kHz), 22.5 (440 Hz),
//	                                23.4 (speech seed 11), 23.4 (seed 3)
//
// Speech of a low-pitched speaker (seeds 1 and 8, about 100 Hz) comes
// back at 1.3 to 1.9 dB SegSNR from both decoders; the test uses the
// seeds above.
const (
	minToneSNR      = 8  // tones of 440 Hz and 1 kHz
	minSpeechSegSNR = 4  // Speech, 20 ms segments
	minDecodersSNR  = 18 // ffmpeg's decode against bcg729's, same bitstream, lag 0
)

// TestG729FFmpeg encodes a tone and Speech with bcg729 and decodes the
// bitstream with bcg729 and with ffmpeg: both near the input, and the two
// decodes near each other (they implement the same standard, with
// different arithmetic and postfilters: bcg729 is Annex A, ffmpeg the
// main body).
func TestG729FFmpeg(t *testing.T) {
	needFFmpeg(t)
	needBcg729(t)
	ctx := testContext(t)
	for _, tc := range []struct {
		name   string
		pcm    []int16
		minSNR float64 // of SNR (tone) or SegSNR (speech)
		seg    bool
	}{
		{"tone 1 kHz", Tone(1000, 0.3, 5*8000), minToneSNR, false},
		{"tone 440 Hz", Tone(440, 0.3, 5*8000), minToneSNR, false},
		{"speech 11", Speech(11, 10*8000), minSpeechSegSNR, true},
		{"speech 3", Speech(3, 10*8000), minSpeechSegSNR, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frames := encodeG729(t, tc.pcm)
			bc := decodeBcg729(t, frames)
			ff, err := DecodeG729FFmpeg(ctx, frames)
			if err != nil {
				t.Fatal(err)
			}
			if len(ff) != len(tc.pcm) || len(bc) != len(tc.pcm) {
				t.Fatalf("%d samples in, ffmpeg %d out, bcg729 %d", len(tc.pcm), len(ff), len(bc))
			}
			// The codec's start-up (its first 100 ms) is left out.
			ref := tc.pcm[800:]
			lagBC, lagFF := Align(ref, bc[800:], 200), Align(ref, ff[800:], 200)
			snrBC, snrFF := SNRAt(ref, bc[800:], lagBC), SNRAt(ref, ff[800:], lagFF)
			segBC, segFF := SegSNRAt(ref, bc[800:], lagBC, 160), SegSNRAt(ref, ff[800:], lagFF, 160)
			between := SNRAt(bc, ff, 0)
			segBetween := SegSNRAt(bc, ff, 0, 160)
			t.Logf("bcg729: lag %d, SNR %.2f dB, SegSNR %.2f dB; ffmpeg: lag %d, SNR %.2f dB, SegSNR %.2f dB; ffmpeg against bcg729: lag %d, SNR %.2f dB, SegSNR %.2f dB",
				lagBC, snrBC, segBC, lagFF, snrFF, segFF, Align(bc, ff, 200), between, segBetween)
			q := map[string]float64{"bcg729": snrBC, "ffmpeg": snrFF}
			if tc.seg {
				q = map[string]float64{"bcg729": segBC, "ffmpeg": segFF}
			}
			for dec, v := range q {
				if !(v >= tc.minSNR) {
					t.Errorf("%s: %.2f dB, want at least %.0f", dec, v, tc.minSNR)
				}
			}
			if l := Align(bc, ff, 200); l != 0 { // the same delay
				t.Errorf("ffmpeg's decode is %d samples off bcg729's", l)
			}
			if !(between >= minDecodersSNR) {
				t.Errorf("ffmpeg against bcg729: SNR %.2f dB, want at least %d", between, minDecodersSNR)
			}
		})
	}
}

// TestG729FFmpegCatchesDamage: a bitstream damaged after encoding comes
// out of ffmpeg worse, so the comparison can fail.
func TestG729FFmpegCatchesDamage(t *testing.T) {
	needFFmpeg(t)
	needBcg729(t)
	pcm := Speech(12, 5*8000)
	frames := encodeG729(t, pcm)
	for i := 0; i < len(frames); i += 10 * G729FrameBytes {
		frames[i+3] ^= 0x5a // every tenth frame
	}
	ff, err := DecodeG729FFmpeg(testContext(t), frames)
	if err != nil {
		t.Fatal(err)
	}
	if s := SegSNR(pcm[800:], ff[800:], 160); s >= minSpeechSegSNR {
		t.Errorf("damaged bitstream: SegSNR %.2f dB, want under %d", s, minSpeechSegSNR)
	}
}

func TestDecodeG729FFmpegRefusesSID(t *testing.T) {
	if _, err := DecodeG729FFmpeg(context.Background(), make([]byte, 22)); !errors.Is(err, ErrSID) {
		t.Errorf("22 bytes: %v, want ErrSID", err)
	}
}

// TestSpeechFrames: a stream encoded with VAD has SID frames, which each
// mode handles as documented, and ffmpeg decodes what SpeechFrames makes.
func TestSpeechFrames(t *testing.T) {
	needBcg729(t)
	e, err := g729.NewEncoder(true)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	pcm := Speech(13, 5*8000)
	var payloads [][]byte
	var speech, sid int
	for off := 0; off < len(pcm); {
		out, n, err := e.Encode(make([]byte, 0, 20), pcm[off:min(len(pcm), off+160)])
		if err != nil {
			t.Fatal(err)
		}
		off += n
		if len(out) > 0 {
			payloads = append(payloads, out)
		}
		speech += len(out) / G729FrameBytes
		sid += len(out) % G729FrameBytes / G729SIDBytes
	}
	if sid == 0 || speech == 0 {
		t.Fatalf("VAD made %d speech and %d SID frames", speech, sid)
	}
	if _, _, err := SpeechFrames(payloads, SIDReject); !errors.Is(err, ErrSID) {
		t.Errorf("SIDReject: %v, want ErrSID", err)
	}
	dropped, at, err := SpeechFrames(payloads, SIDDrop)
	if err != nil || len(dropped) != speech*G729FrameBytes || len(at) != sid {
		t.Errorf("SIDDrop: %d bytes, %d SID indexes, %v; want %d speech frames, %d SIDs", len(dropped), len(at), err, speech, sid)
	}
	repeated, at, err := SpeechFrames(payloads, SIDRepeat)
	if err != nil || len(repeated) != (speech+sid)*G729FrameBytes || len(at) != sid {
		t.Fatalf("SIDRepeat: %d bytes, %d SID indexes, %v", len(repeated), len(at), err)
	}
	for _, i := range at {
		if i > 0 && !slices.Equal(repeated[i*G729FrameBytes:(i+1)*G729FrameBytes], repeated[(i-1)*G729FrameBytes:i*G729FrameBytes]) {
			t.Errorf("SIDRepeat: frame %d is not the frame before it", i)
		}
	}
	if _, _, err := SpeechFrames([][]byte{make([]byte, 15)}, SIDDrop); err == nil {
		t.Error("a 15-byte payload: no error")
	}
	if testenvHas("ffmpeg") {
		out, err := DecodeG729FFmpeg(testContext(t), repeated)
		if err != nil || len(out) != (speech+sid)*G729FrameSamples {
			t.Errorf("ffmpeg of SIDRepeat's frames: %d samples, %v", len(out), err)
		}
	}
}

// TestG711FFmpeg: ffmpeg's G.711 decoders agree with rtp/g711 on every
// code, µ-law and A-law.
func TestG711FFmpeg(t *testing.T) {
	needFFmpeg(t)
	ctx := testContext(t)
	codes := make([]byte, 256)
	for i := range codes {
		codes[i] = byte(i)
	}
	// And a signal through the encoder, so the order is checked too.
	speech := Speech(14, 8000)
	for _, alaw := range []bool{false, true} {
		in := append([]byte(nil), codes...)
		dec := g711.DecodeUlaw
		if alaw {
			in = g711.AppendAlaw(in, speech)
			dec = g711.DecodeAlaw
		} else {
			in = g711.AppendUlaw(in, speech)
		}
		got, err := DecodeG711FFmpeg(ctx, in, alaw)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]int16, len(in))
		for i, c := range in {
			want[i] = dec(c)
		}
		if !slices.Equal(got, want) {
			n := 0
			for i := range min(len(got), len(want)) {
				if got[i] != want[i] {
					n++
				}
			}
			t.Errorf("alaw=%v: ffmpeg %d samples, rtp/g711 %d, %d differ", alaw, len(got), len(want), n)
		}
		if s := SNRAt(speech, got[256:], 0); !(s > 30) || math.IsInf(s, 1) {
			t.Errorf("alaw=%v: G.711 of Speech %.2f dB, want over 30 and finite", alaw, s)
		}
	}
}

func testenvHas(cmd string) bool {
	_, err := exec.LookPath(cmd)
	return err == nil
}
