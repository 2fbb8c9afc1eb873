package audio

import (
	"math"
	"testing"
)

// delayed returns s delayed by lag samples (a negative lag drops its
// first -lag samples), n samples long, zero where s has none.
func delayed(s []int16, lag, n int) []int16 {
	out := make([]int16, n)
	for i := range out {
		if j := i - lag; j >= 0 && j < len(s) {
			out[i] = s[j]
		}
	}
	return out
}

func TestAlign(t *testing.T) {
	ref := Speech(3, 16000)
	for _, tc := range []struct{ lag, n int }{
		{0, 16000}, {37, 16000}, {-23, 16000}, {1999, 17000}, {40, 12000}, {-500, 20000},
	} {
		got := delayed(ref, tc.lag, tc.n)
		if l := Align(ref, got, DefaultMaxLag); l != tc.lag {
			t.Errorf("delay %d, %d samples: Align %d", tc.lag, tc.n, l)
		}
		if s := SNR(ref, got); !math.IsInf(s, 1) {
			t.Errorf("delay %d, %d samples: SNR %.2f dB, want +Inf", tc.lag, tc.n, s)
		}
	}
	// Beyond maxLag the true lag is not found.
	if l := Align(ref, delayed(ref, 300, 16000), 100); l == 300 {
		t.Errorf("Align found lag 300 with maxLag 100")
	}
	// Noise does not move the match.
	got := delayed(ref, 41, 16000)
	for i := range got {
		got[i] += int16((i*7919)%2001 - 1000)
	}
	if l := Align(ref, got, 200); l != 41 {
		t.Errorf("with noise: Align %d, want 41", l)
	}
	if l := Align(nil, got, 10); l != 0 {
		t.Errorf("empty ref: Align %d", l)
	}
}

func TestSNR(t *testing.T) {
	ref := Speech(4, 24000)
	// got = 0.9 ref, delayed: the noise is 0.1 ref, 20 dB (rounding aside).
	scaled := make([]int16, len(ref))
	for i, v := range ref {
		scaled[i] = int16(math.Round(0.9 * float64(v)))
	}
	got := delayed(scaled, 55, len(ref)+300)
	if s := SNR(ref, got); math.Abs(s-20) > 0.05 {
		t.Errorf("0.9 ref: SNR %.3f dB, want 20", s)
	}
	if s := SegSNR(ref, got, 160); math.Abs(s-20) > 0.3 {
		t.Errorf("0.9 ref: SegSNR %.3f dB, want 20", s)
	}
	if s := SNRAt(make([]int16, 100), got, 0); !math.IsNaN(s) {
		t.Errorf("silent ref: SNR %v, want NaN", s)
	}
}

func TestSegSNRClamps(t *testing.T) {
	ref := Tone(500, 0.1, 800) // 10 segments of 80
	got := make([]int16, len(ref))
	copy(got, ref[:400]) // segments 0-4 exact: 35 dB each (clamped from +Inf)
	for i := 400; i < 560; i++ {
		got[i] = 0 // segments 5, 6: 0 dB
	}
	for i := 560; i < 800; i++ {
		got[i] = -ref[i] // segments 7-9: -6 dB
	}
	want := (5*35 + 2*0 + 3*(-10*math.Log10(4))) / 10
	if s := SegSNRAt(ref, got, 0, 80); math.Abs(s-want) > 1e-9 {
		t.Errorf("SegSNR %.4f, want %.4f", s, want)
	}
	for i := 560; i < 800; i++ {
		got[i] = -4 * ref[i] // -14 dB: clamped to -10
	}
	want = (5*35 + 2*0 + 3*(-10)) / 10.0
	if s := SegSNRAt(ref, got, 0, 80); math.Abs(s-want) > 1e-9 {
		t.Errorf("SegSNR with a ruined segment %.4f, want %.4f", s, want)
	}
	// Silent reference segments are left out.
	ref2 := append(make([]int16, 800), ref...)
	got2 := append(Tone(300, 0.5, 800), ref...)
	if s := SegSNRAt(ref2, got2, 0, 80); s != SegSNRMax {
		t.Errorf("SegSNR over silence then an exact copy: %.2f, want %d", s, SegSNRMax)
	}
	if s := SegSNRAt(ref, got, 0, 0); !math.IsNaN(s) {
		t.Errorf("segment 0: %v", s)
	}
}
