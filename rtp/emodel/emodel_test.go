package emodel

import (
	"math"
	"testing"
)

// TestG711RandomLoss checks R and MOS for G.711 at 0%, 1% and 3% random
// loss, default G.107 parameters.
//
// Sources of the expected values:
//   - 0%: ITU-T G.107 states that all parameters at their default values
//     give R = 93.2; G.107 Annex B maps R = 93.2 to MOS 4.41 (the figure
//     quoted for "toll quality" G.711 throughout G.107/G.108/G.109).
//   - 1% and 3%: G.107 eq. 7-29 with the G.113 Appendix I values for G.711
//     (Ie = 0; Bpl = 25.1 with the PLC of G.711 Appendix I, 4.3 without),
//     BurstR = 1, worked by hand:
//     with PLC, 1%: Ie,eff = 95*1/(1+25.1) = 3.64, R = 89.56, MOS 4.33;
//     3%: Ie,eff = 95*3/(3+25.1) = 10.14, R = 83.06, MOS 4.13.
//     without PLC, 1%: Ie,eff = 95/5.3 = 17.92, R = 75.28, MOS 3.83;
//     3%: Ie,eff = 285/7.3 = 39.04, R = 54.16, MOS 2.79.
//     The slopes agree with the published G.113 curves for G.711 at low
//     random loss: about 4 R points per percent with PLC and over 20
//     without (Telektronikk 2004 survey of G.113: "about 4" and "25").
func TestG711RandomLoss(t *testing.T) {
	for _, tc := range []struct {
		codec   Codec
		loss    float64
		r, mos  float64
		comment string
	}{
		{G711, 0, 93.2, 4.41, "G.107 default"},
		{G711, 1, 89.56, 4.33, "PLC"},
		{G711, 3, 83.06, 4.13, "PLC"},
		{G711NoPLC, 0, 93.2, 4.41, "G.107 default"},
		{G711NoPLC, 1, 75.28, 3.83, "no PLC"},
		{G711NoPLC, 3, 54.16, 2.79, "no PLC"},
	} {
		r := R(Input{Codec: tc.codec, LossPercent: tc.loss, BurstR: 1})
		mos := MOS(r)
		if math.Abs(r-tc.r) > 0.01 || math.Abs(mos-tc.mos) > 0.005 {
			t.Errorf("%s %.0f%% (%s): R %.3f MOS %.3f, want R %.2f MOS %.2f", tc.codec.Name, tc.loss, tc.comment, r, mos, tc.r, tc.mos)
		}
	}
}

func TestMOSBounds(t *testing.T) {
	for _, tc := range []struct{ r, mos float64 }{
		{-5, 1}, {0, 1}, {100, 4.5}, {120, 4.5},
		{50, 1 + 1.75 + 50*-10*50*7e-6}, // 2.575
		{70, 3.6},                       // 1 + 2.45 + 70*10*30*7e-6 = 3.597
	} {
		if got := MOS(tc.r); math.Abs(got-tc.mos) > 0.005 {
			t.Errorf("MOS(%v) = %.3f, want %.3f", tc.r, got, tc.mos)
		}
	}
}

func TestIdd(t *testing.T) {
	if Idd(100) != 0 || Idd(50) != 0 {
		t.Fatal("delay up to 100 ms must not impair")
	}
	// G.107 eq. 7-28 at Ta = 200 ms: X = 1, Idd = 25*(2^(1/6) - 3*(1+1/729)^(1/6) + 2).
	want := 25 * (math.Pow(2, 1.0/6) - 3*math.Pow(1+1.0/729, 1.0/6) + 2)
	if got := Idd(200); math.Abs(got-want) > 1e-9 || got < 3 || got > 4 {
		t.Fatalf("Idd(200) = %v, want %v (about 3.4)", got, want)
	}
	if Idd(400) <= Idd(200) {
		t.Fatal("Idd must grow with delay")
	}
}

func TestBurstRatio(t *testing.T) {
	// Random loss of 1%: 990 received, 10 lost in 10 runs of one.
	if br := BurstRatio(990, 10, 10); math.Abs(br-1) > 0.02 {
		t.Errorf("random loss: BurstR %.3f, want about 1", br)
	}
	// The same 10 packets in one run of 10: bursty.
	if br := BurstRatio(990, 10, 1); br < 9 {
		t.Errorf("one burst of 10: BurstR %.3f, want about 10", br)
	}
	if BurstRatio(1000, 0, 0) != 1 || BurstRatio(0, 10, 1) != 1 {
		t.Error("degenerate inputs must give 1")
	}
	// Bursty loss impairs more than random loss at the same rate.
	if R(Input{Codec: G711, LossPercent: 2, BurstR: 4}) >= R(Input{Codec: G711, LossPercent: 2, BurstR: 1}) {
		t.Error("burstiness must lower R")
	}
}
