package payload

import "math"

// SpeechSamples is the length of Speech's signal: one second at 8 kHz.
const SpeechSamples = 8000

// Speech returns one second of a speech-like test signal at 8 kHz, 16-bit
// linear: five syllables of voiced sound (harmonics of a pitch gliding
// between 110 and 190 Hz, shaped by two formant peaks that move from
// syllable to syllable, under a raised-cosine envelope) separated by short
// pauses of low noise. It is no speech, but a codec meets what it meets in
// speech: a pitch to track, a moving spectrum, onsets and near-silence.
// The result is a fresh slice; the signal is the same on every call.
func Speech() []int16 {
	const (
		syllables = 5
		sylLen    = SpeechSamples / syllables // 200 ms
		voiced    = sylLen * 3 / 4            // 150 ms of voice, 50 ms of pause
	)
	formants := [syllables][2]float64{{700, 1200}, {400, 2000}, {300, 2300}, {600, 900}, {500, 1700}}
	out := make([]int16, SpeechSamples)
	var phase float64
	rng := uint32(0x2545f491)
	for n := range out {
		k, pos := n/sylLen, n%sylLen
		// Low noise everywhere (about -60 dBm0), voice over it.
		rng ^= rng << 13
		rng ^= rng >> 17
		rng ^= rng << 5
		v := float64(int32(rng%64) - 32)
		if pos < voiced {
			t := float64(pos) / voiced
			f0 := 110 + 80*math.Sin(math.Pi*t) // rises and falls within the syllable
			phase += 2 * math.Pi * f0 / 8000
			env := 0.5 - 0.5*math.Cos(2*math.Pi*t)
			var s float64
			for h := 1; h*int(f0) < 3400; h++ {
				f := float64(h) * f0
				// Two resonances: the harmonic's weight falls off with its
				// distance to the nearer formant.
				w := 0.0
				for _, fm := range formants[k] {
					d := (f - fm) / 150
					w = max(w, 1/(1+d*d))
				}
				s += w * math.Sin(float64(h)*phase)
			}
			v += 6000 * env * s
		}
		out[n] = int16(max(-32767, min(32767, v)))
	}
	return out
}
