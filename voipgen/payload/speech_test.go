package payload

import (
	"slices"
	"testing"
)

// TestSpeech: one second, the same on every call, voiced syllables loud
// and pauses near silence.
func TestSpeech(t *testing.T) {
	a, b := Speech(), Speech()
	if len(a) != SpeechSamples || !slices.Equal(a, b) {
		t.Fatalf("%d samples, equal %v", len(a), slices.Equal(a, b))
	}
	peak := func(s []int16) int {
		m := 0
		for _, v := range s {
			m = max(m, int(v), -int(v))
		}
		return m
	}
	// Syllable 0: 1200 samples of voice (its middle loud), then 400 of pause.
	if p := peak(a[400:800]); p < 3000 {
		t.Errorf("voiced peak %d, want at least 3000", p)
	}
	if p := peak(a[1250:1600]); p > 100 {
		t.Errorf("pause peak %d, want at most 100", p)
	}
}
