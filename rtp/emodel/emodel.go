// Package emodel computes the transmission rating R and the estimated
// mean opinion score of the ITU-T G.107 E-model for one direction of a
// call, from the codec, the packet loss observed and the one-way delay.
//
// Scope: every G.107 parameter other than delay and loss keeps its default
// value (Table 3 of G.107), for which G.107 gives R = 93.2; echo is taken
// as fully controlled, so delay enters through the absolute-delay term Idd
// only. Loss enters through the effective equipment impairment
//
//	Ie,eff = Ie + (95 - Ie) * Ppl / (Ppl/BurstR + Bpl)      (G.107 eq. 7-29)
//
// with the codec's Ie and Bpl from ITU-T G.113 Appendix I, and MOS follows
// from R by G.107 Annex B (eq. B-4). Functions are pure and safe for
// concurrent use.
package emodel

import "math"

// DefaultR is the rating of G.107 with all parameters at their default
// values: the best a narrowband connection rates.
const DefaultR = 93.2

// Codec is the equipment impairment of a codec (ITU-T G.113 Appendix I).
type Codec struct {
	Name string
	Ie   float64 // equipment impairment factor without loss
	Bpl  float64 // packet-loss robustness factor; 0: unknown
}

// Codecs from ITU-T G.113 Appendix I (Table I.1 for Ie, Table I.3 for Bpl,
// random loss).
var (
	// G711 is G.711 with the packet loss concealment of G.711 Appendix I,
	// as phones and gateways run it.
	G711 = Codec{Name: "G.711 (PLC)", Ie: 0, Bpl: 25.1}
	// G711NoPLC is G.711 without packet loss concealment.
	G711NoPLC = Codec{Name: "G.711 (no PLC)", Ie: 0, Bpl: 4.3}
	// G729A is G.729 Annex A with VAD, the row of G.113 Table I.3 for G.729.
	G729A = Codec{Name: "G.729A", Ie: 11, Bpl: 19.0}
)

// Input describes one direction of a call.
type Input struct {
	Codec Codec
	// LossPercent is the packet loss probability Ppl in percent (0 to 100).
	LossPercent float64
	// BurstR is the burst ratio (G.107 eq. 7-30): 1 for random loss, above
	// 1 for bursty loss; values below 1 or NaN count as 1.
	BurstR float64
	// DelayMs is the absolute one-way mouth-to-ear delay Ta in ms.
	DelayMs float64
}

// IeEff returns the effective equipment impairment (G.107 eq. 7-29).
func IeEff(c Codec, lossPercent, burstR float64) float64 {
	if !(burstR >= 1) {
		burstR = 1
	}
	p := math.Max(0, math.Min(100, lossPercent))
	if p == 0 {
		return c.Ie
	}
	return c.Ie + (95-c.Ie)*p/(p/burstR+c.Bpl)
}

// Idd returns the impairment of absolute delay Ta in ms (G.107 eq. 7-27,
// 7-28): 0 up to 100 ms.
func Idd(ta float64) float64 {
	if ta <= 100 {
		return 0
	}
	x := math.Log10(ta/100) / math.Log10(2)
	return 25 * (math.Pow(1+math.Pow(x, 6), 1.0/6) - 3*math.Pow(1+math.Pow(x/3, 6), 1.0/6) + 2)
}

// R returns the transmission rating of in.
func R(in Input) float64 {
	return DefaultR - Idd(in.DelayMs) - IeEff(in.Codec, in.LossPercent, in.BurstR)
}

// MOS returns the estimated conversational MOS for rating r (G.107 Annex B).
func MOS(r float64) float64 {
	switch {
	case r <= 0:
		return 1
	case r >= 100:
		return 4.5
	}
	return 1 + 0.035*r + r*(r-60)*(100-r)*7e-6
}

// BurstRatio estimates BurstR from a loss pattern (G.107 eq. 7-30 for a
// two-state Markov model, BurstR = 1/(p+q)): p is the probability that a
// packet is lost after a received one, estimated as lossRuns/received,
// and q that one is received after a lost one, lossRuns/lost. It returns 1
// when nothing or everything was lost.
func BurstRatio(received, lost, lossRuns uint64) float64 {
	if lost == 0 || received == 0 || lossRuns == 0 {
		return 1
	}
	p := float64(lossRuns) / float64(received)
	q := float64(lossRuns) / float64(lost)
	if p+q <= 0 {
		return 1
	}
	return max(1/(p+q), 0)
}
