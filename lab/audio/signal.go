package audio

import (
	"math"
	"math/rand/v2"
)

// fullScale is the largest positive sample.
const fullScale = 32767

// clip16 rounds v to the nearest sample, saturating at the int16 range.
func clip16(v float64) int16 {
	v = math.Round(v)
	switch {
	case v > fullScale:
		return fullScale
	case v < -fullScale-1:
		return -fullScale - 1
	}
	return int16(v)
}

// Tone returns samples samples of a sine of freqHz at amplitude amp, a
// fraction of full scale (1 is a peak of 32767; larger values clip), with
// phase 0 at sample 0.
func Tone(freqHz, amp float64, samples int) []int16 {
	s := make([]int16, max(samples, 0))
	w := 2 * math.Pi * freqHz / SampleRate
	for i := range s {
		s[i] = clip16(amp * fullScale * math.Sin(w*float64(i)))
	}
	return s
}

// vowel is the first three formants of a vowel, in Hz (adult male values
// of Peterson and Barney's measurements, rounded).
type vowel [3]float64

var vowels = []vowel{
	{730, 1090, 2440}, // a (father)
	{530, 1840, 2480}, // e (bed)
	{270, 2290, 3010}, // i (beet)
	{570, 840, 2410},  // o (bought)
	{300, 870, 2240},  // u (boot)
	{660, 1720, 2410}, // ae (bat)
	{490, 1350, 1690}, // er (bird)
}

// formantBandwidth is each formant's bandwidth, in Hz.
var formantBandwidth = [3]float64{80, 100, 140}

// resonator is a two-pole filter with unity gain at 0 Hz (Klatt's digital
// formant resonator): y[n] = a x[n] + b y[n-1] + c y[n-2].
type resonator struct{ y1, y2 float64 }

func (r *resonator) step(x, f, bw float64) float64 {
	c := -math.Exp(-2 * math.Pi * bw / SampleRate)
	b := 2 * math.Exp(-math.Pi*bw/SampleRate) * math.Cos(2*math.Pi*f/SampleRate)
	a := 1 - b - c
	y := a*x + b*r.y1 + c*r.y2
	r.y2, r.y1 = r.y1, y
	return y
}

// Speech returns samples samples of a deterministic speech-like signal:
// the same seed gives the same samples. It is a source-filter model: a
// glottal pulse train (Rosenberg pulses, with a pitch contour per phrase
// around a speaker's base pitch of 90 to 220 Hz chosen by the seed, plus
// a little aspiration noise), through three formant resonators that glide
// from one vowel to the next within each syllable; syllables of 120 to 320
// ms (about 4 a second) rise and fall in amplitude, words of one to four
// syllables are separated by pauses of 80 to 500 ms of digital silence.
// The whole is scaled to a peak of half full scale (-6 dBFS) and has no
// DC component. The signal starts with a syllable.
//
// It is not speech, but it has what a speech codec models (pitch,
// formants, onsets, silence) and what a pure tone lacks, so a codec's
// quality on it follows its quality on real speech. G.729's waveform SNR
// on it depends on the seed's pitch: 6 to 7 dB SegSNR for a speaker
// around 180 to 200 Hz (seeds 3, 4, 7, 11), under 2 dB around 100 Hz
// (seeds 1, 8).
func Speech(seed int64, samples int) []int16 {
	samples = max(samples, 0)
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eec4))
	out := make([]float64, samples)
	base := 90 + 130*rng.Float64() // the speaker's pitch
	var res [3]resonator
	var phase float64 // position in the glottal period, 0..1
	cur := vowels[rng.IntN(len(vowels))]
	n := 0
	for n < samples {
		// A word: syllables back to back, then a pause.
		syllables := 1 + rng.IntN(4)
		for s := 0; s < syllables && n < samples; s++ {
			length := int((0.12 + 0.2*rng.Float64()) * SampleRate)
			next := vowels[rng.IntN(len(vowels))]
			f0start := base * (0.85 + 0.35*rng.Float64())
			f0end := base * (0.8 + 0.3*rng.Float64())
			loud := 0.5 + 0.5*rng.Float64()
			for i := 0; i < length && n < samples; i, n = i+1, n+1 {
				x := float64(i) / float64(length)
				f0 := f0start + (f0end-f0start)*x
				f0 *= 1 + 0.01*(rng.Float64()-0.5) // jitter
				phase += f0 / SampleRate
				if phase >= 1 {
					phase--
				}
				src := rosenberg(phase) + 0.02*rng.NormFloat64()
				// Formants glide from this vowel to the next over the
				// syllable's second half.
				g := math.Max(0, 2*x-1)
				v := src
				for k := range res {
					f := cur[k] + (next[k]-cur[k])*g
					v = res[k].step(v, f, formantBandwidth[k])
				}
				env := math.Sin(math.Pi * x)
				out[n] = loud * env * env * v
			}
			cur = next
		}
		pause := int((0.08 + 0.42*rng.Float64()) * SampleRate)
		for i := 0; i < pause && n < samples; i, n = i+1, n+1 {
			out[n] = 0
			// The resonators ring down in the pause without input.
			for k := range res {
				res[k].step(0, cur[k], formantBandwidth[k])
			}
		}
	}
	// Lip radiation (a first difference) removes DC; then scale.
	prev := 0.0
	peak := 0.0
	for i, v := range out {
		out[i], prev = v-prev, v
		peak = math.Max(peak, math.Abs(out[i]))
	}
	pcm := make([]int16, samples)
	if peak == 0 {
		return pcm
	}
	scale := 0.5 * fullScale / peak
	for i, v := range out {
		pcm[i] = clip16(v * scale)
	}
	return pcm
}

// rosenberg is the Rosenberg glottal pulse at phase p (0..1) of its
// period: opening over 40% of the period, closing over 16%, closed the
// rest.
func rosenberg(p float64) float64 {
	const open, closing = 0.4, 0.16
	switch {
	case p < open:
		return 0.5 * (1 - math.Cos(math.Pi*p/open))
	case p < open+closing:
		return math.Cos(math.Pi / 2 * (p - open) / closing)
	}
	return 0
}
