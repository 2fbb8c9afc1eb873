package audio

import (
	"math"
	"slices"
	"testing"
)

func rms(s []int16) float64 {
	var e float64
	for _, v := range s {
		e += float64(v) * float64(v)
	}
	return math.Sqrt(e / float64(len(s)))
}

func TestTone(t *testing.T) {
	s := Tone(1000, 0.5, 8000)
	if len(s) != 8000 || s[0] != 0 || s[2] != 16384 {
		t.Fatalf("Tone(1000, 0.5): %d samples, starts %v", len(s), s[:4])
	}
	if r := rms(s); math.Abs(r-0.5*32767/math.Sqrt2) > 1 {
		t.Errorf("RMS %.1f", r)
	}
	crossings := 0
	for i := 1; i < len(s); i++ {
		if s[i-1] < 0 && s[i] >= 0 {
			crossings++
		}
	}
	if crossings < 999 || crossings > 1000 {
		t.Errorf("%d upward zero crossings in a second, want 1000", crossings)
	}
	if c := Tone(440, 2, 100); slices.Max(c) != 32767 || slices.Min(c) != -32768 {
		t.Errorf("amplitude 2 does not clip: %d..%d", slices.Min(c), slices.Max(c))
	}
}

func TestSpeech(t *testing.T) {
	a, b := Speech(7, 80000), Speech(7, 80000)
	if !slices.Equal(a, b) {
		t.Fatal("Speech(7) differs between two calls")
	}
	if slices.Equal(a, Speech(8, 80000)) {
		t.Fatal("Speech(7) and Speech(8) are the same")
	}
	if p := max(slices.Max(a), -slices.Min(a)); p < 16380 || p > 16384 {
		t.Errorf("peak %d, want half full scale", p)
	}
	// Pauses (silent 20 ms segments) and talk: both plenty, and the
	// level of talk varies (syllables).
	var silent, loud, quiet int
	for off := 0; off+160 <= len(a); off += 160 {
		switch r := rms(a[off : off+160]); {
		case r == 0:
			silent++
		case r > 2000:
			loud++
		case r < 500:
			quiet++
		}
	}
	segs := len(a) / 160
	if silent < segs/10 || silent > segs/2 || loud < segs/5 || quiet < segs/20 {
		t.Errorf("of %d segments: %d silent, %d loud, %d quiet", segs, silent, loud, quiet)
	}
	if s := Speech(1, 0); len(s) != 0 {
		t.Errorf("Speech of 0 samples: %d", len(s))
	}
}
