package transcode

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/relayd/relayd/slowpath/codec/g729"
)

// bestLag is the delay (0 to 200 samples) at which got fits want best:
// G.729 delays its output.
func bestLag(want, got []int16) int {
	best, lag := math.Inf(-1), 0
	for l := 0; l <= 200; l++ {
		if s := snr(want, got, l); s > best {
			best, lag = s, l
		}
	}
	return lag
}

// snr of got against want at lag, skipping the first 100 ms (start-up).
func snr(want, got []int16, lag int) float64 {
	var sig, noise float64
	for i := 800; i+lag < len(got) && i < len(want); i++ {
		d := float64(got[i+lag]) - float64(want[i])
		sig += float64(want[i]) * float64(want[i])
		noise += d * d
	}
	return 10 * math.Log10(sig/noise)
}

// segSNR is the mean of the per-10-ms SNRs (each clamped to -10..35 dB,
// the usual bounds), over the frames of want that are not silent.
func segSNR(want, got []int16, lag int) float64 {
	var sum float64
	var n int
	for f := 10; (f+1)*FrameSamples+lag <= len(got) && (f+1)*FrameSamples <= len(want); f++ {
		var sig, noise float64
		for i := f * FrameSamples; i < (f+1)*FrameSamples; i++ {
			d := float64(got[i+lag]) - float64(want[i])
			sig += float64(want[i]) * float64(want[i])
			noise += d * d
		}
		if sig < FrameSamples*100*100 { // below -50 dBov: a pause
			continue
		}
		sum += min(max(10*math.Log10(sig/max(noise, 1)), -10), 35)
		n++
	}
	return sum / float64(n)
}

// reference is bcg729's own round trip of pcm, with the G.711 companding
// of both legs: what a perfect engine gives.
func reference(t *testing.T, pcm []int16) []int16 {
	e, _ := g729.NewEncoder(false)
	defer e.Close()
	d, _ := g729.NewDecoder()
	defer d.Close()
	in := ulawRoundTrip(pcm)
	out := make([]int16, 0, len(in))
	for off := 0; off+FrameSamples <= len(in); off += FrameSamples {
		code, _, _ := e.Encode(make([]byte, 0, 10), in[off:off+FrameSamples])
		out, _ = d.Decode(out, code)
	}
	return ulawRoundTrip(out)
}

// twoLegs sends pcm as PCMU 20 ms through a PCMU->G.729 stream and the
// result through a G.729->PCMU stream, dropping the PCMU packets lose
// says, and returns the PCM of the far leg.
func twoLegs(t *testing.T, pcm []int16, lose func(i int) bool) []int16 {
	a := newRun(t, newStream(t, pcmu(20), g729c(20, false)))
	b := newRun(t, newStream(t, g729c(20, false), pcmu(20)))
	for i, p := range g711Packets(pcmu(20), pcm) {
		at := t0 + int64(i)*20*ms
		a.until(at)
		if !lose(i) {
			a.push(mkPkt(ptPCMU, uint16(inSeq0+i), uint32(inTs0+160*i), inSSRC, false, p), at)
		}
		for ; len(a.out) > 0; a.out = a.out[1:] {
			o := a.out[0]
			raw := mkPkt(o.PayloadType, o.SequenceNumber, o.Timestamp, o.SSRC, o.Marker, o.payload)
			b.push(raw, at)
		}
	}
	return decodeOut(t, pcmu(20), b.out)
}

// TestQuality: through two streams (G.711 -> G.729 -> G.711), a 1 kHz tone
// and a speech-like signal come out as bcg729's own round trip (with the
// G.711 companding of both legs) does, within 0.1 dB: with nothing lost
// the engine adds nothing of its own to the audio (the bit-exactness test
// shows the same frames), so the margin is only rounding. Measured: 11.1
// dB for the tone, 3.2 dB for the speech-like signal (G.729 is
// perceptually tuned, its waveform SNR is low), equal to bcg729's.
//
// Under 5% packet loss on the G.711 leg (random, seeded) the segmental
// SNR of the speech-like signal must stay above 3.9 dB, half a dB under
// the 4.47 dB of the same run without loss (measured: 4.29 dB), and must
// beat silence in place of the lost packets (measured: 4.19 dB): a
// concealment that made things worse than silence, or much worse than
// the loss-free run, fails.
func TestQuality(t *testing.T) {
	needBcg729(t)
	for _, tc := range []struct {
		name string
		pcm  []int16
	}{
		{"1kHz tone", tone(3*8000, 1000, 8000)},
		{"speech-like", speechLike(4*8000, false)},
	} {
		ref := reference(t, tc.pcm)
		lag := bestLag(tc.pcm, ref)
		want := snr(tc.pcm, ref, lag)
		got := twoLegs(t, tc.pcm, func(int) bool { return false })
		gotSNR := snr(tc.pcm, got, bestLag(tc.pcm, got))
		t.Logf("%s: bcg729 round trip %.2f dB at lag %d, through the engine %.2f dB", tc.name, want, lag, gotSNR)
		if !(math.Abs(gotSNR-want) <= 0.1) {
			t.Errorf("%s: %.2f dB through the engine, %.2f dB bcg729 alone: want within 0.1 dB", tc.name, gotSNR, want)
		}
	}

	pcm := speechLike(8*8000, false)
	rng := rand.New(rand.NewPCG(7, 7))
	lost := make(map[int]bool)
	for i := range len(pcm) / 160 {
		if i > 5 && rng.Float64() < 0.05 {
			lost[i] = true
		}
	}
	clean := twoLegs(t, pcm, func(int) bool { return false })
	lag := bestLag(pcm, clean)
	got := twoLegs(t, pcm, func(i int) bool { return lost[i] })
	// What no concealment would give: the lost packets' time silent.
	holes := append([]int16(nil), clean...)
	for i := range lost {
		for j := i*160 + lag; j < (i+1)*160+lag && j < len(holes); j++ {
			holes[j] = 0
		}
	}
	seg, segClean, segHoles := segSNR(pcm, got, lag), segSNR(pcm, clean, lag), segSNR(pcm, holes, lag)
	t.Logf("5%% loss (%d of %d packets): segmental SNR %.2f dB, %.2f dB without loss, %.2f dB with silence for the lost packets", len(lost), len(pcm)/160, seg, segClean, segHoles)
	if !(seg >= 3.9) || !(seg > segHoles) {
		t.Errorf("segmental SNR %.2f dB under 5%% loss, want at least 3.9 and more than silence's %.2f", seg, segHoles)
	}
}
