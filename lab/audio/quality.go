package audio

import (
	"math"
	"math/cmplx"
)

// DefaultMaxLag is the largest lag, in samples either way, that SNR and
// SegSNR try when they align: 250 ms, more than a codec's delay (G.729's
// encoder and decoder together delay by 5 ms plus a few samples) and a
// jitter buffer's.
const DefaultMaxLag = 2000

// Segment limits of SegSNR, in dB: a segment's SNR counts as at least
// SegSNRMin (a segment the codec ruined costs no more than this) and at
// most SegSNRMax (a segment it kept perfectly gains no more), the usual
// practice of speech codec evaluation.
const (
	SegSNRMin = -10
	SegSNRMax = 35
)

// silentRMS is the RMS, in sample units, below which a reference segment
// is silence that SegSNR leaves out: -60 dBFS.
const silentRMS = fullScale / 1000.0

// Align returns the lag, in samples, at which got best matches ref: got[i+lag]
// corresponds to ref[i]. A positive lag is got delayed against ref. It tries
// every lag in [-maxLag, maxLag] whose overlap is at least half of the
// shorter signal and picks the one of the largest normalized
// cross-correlation
//
//	r(lag) = sum ref[i] got[i+lag] / sqrt(sum ref[i]^2 * sum got[i+lag]^2)
//
// (the sums over the overlap), the smallest |lag| on a tie. Signals with
// no such lag, or silent ones, align at 0. A periodic signal (a tone)
// matches at every multiple of its period: the lag is then only one of
// them, which does not change an SNR.
func Align(ref, got []int16, maxLag int) (lag int) {
	if len(ref) == 0 || len(got) == 0 || maxLag < 0 {
		return 0
	}
	minOverlap := max(1, min(len(ref), len(got))/2)
	// The cross-correlation for every lag at once, through the FFT.
	n := 1
	for n < len(ref)+len(got) {
		n <<= 1
	}
	a := make([]complex128, n)
	b := make([]complex128, n)
	for i, v := range ref {
		a[i] = complex(float64(v), 0)
	}
	for i, v := range got {
		b[i] = complex(float64(v), 0)
	}
	fft(a, false)
	fft(b, false)
	for i := range a {
		a[i] = cmplx.Conj(a[i]) * b[i]
	}
	fft(a, true) // a[lag mod n] = sum ref[i] got[i+lag]
	// Energies of the overlaps from prefix sums of squares.
	pr := prefixSquares(ref)
	pg := prefixSquares(got)
	best, bestR := 0, math.Inf(-1)
	for l := -maxLag; l <= maxLag; l++ {
		lo, hi := max(0, -l), min(len(ref), len(got)-l) // ref indices of the overlap
		if hi-lo < minOverlap {
			continue
		}
		er := pr[hi] - pr[lo]
		eg := pg[hi+l] - pg[lo+l]
		if er <= 0 || eg <= 0 {
			continue
		}
		c := real(a[(l+n)%n])
		r := c / math.Sqrt(er*eg)
		// Float noise of the FFT must not decide between equal lags.
		if r > bestR+1e-9 || (math.Abs(r-bestR) <= 1e-9 && abs(l) < abs(best)) {
			best, bestR = l, r
		}
	}
	return best
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func prefixSquares(s []int16) []float64 {
	p := make([]float64, len(s)+1)
	for i, v := range s {
		p[i+1] = p[i] + float64(v)*float64(v)
	}
	return p
}

// fft transforms x in place (its length a power of two): the forward DFT,
// or with inverse the inverse DFT including the 1/n.
func fft(x []complex128, inverse bool) {
	n := len(x)
	for i, j := 1, 0; i < n; i++ {
		bit := n >> 1
		for ; j&bit != 0; bit >>= 1 {
			j ^= bit
		}
		j ^= bit
		if i < j {
			x[i], x[j] = x[j], x[i]
		}
	}
	sign := -1.0
	if inverse {
		sign = 1
	}
	for size := 2; size <= n; size <<= 1 {
		w := cmplx.Rect(1, sign*2*math.Pi/float64(size))
		for start := 0; start < n; start += size {
			wk := complex(1, 0)
			for k := 0; k < size/2; k++ {
				u := x[start+k]
				v := x[start+k+size/2] * wk
				x[start+k] = u + v
				x[start+k+size/2] = u - v
				wk *= w
			}
		}
	}
	if inverse {
		for i := range x {
			x[i] /= complex(float64(n), 0)
		}
	}
}

// overlap returns the ref indices [lo, hi) that have a got sample at lag.
func overlap(ref, got []int16, lag int) (lo, hi int) {
	lo, hi = max(0, -lag), min(len(ref), len(got)-lag)
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

// SNR is the signal-to-noise ratio of got against ref, in dB, at the lag
// Align finds (up to DefaultMaxLag):
//
//	SNR = 10 log10( sum ref[i]^2 / sum (ref[i] - got[i+lag])^2 )
//
// over the samples both have at that lag: a got longer or shorter than
// ref is compared where they overlap. There is no gain compensation: a
// level change counts as noise. got equal to ref is +Inf; a silent ref, or
// no overlap, is NaN.
func SNR(ref, got []int16) float64 {
	return SNRAt(ref, got, Align(ref, got, DefaultMaxLag))
}

// SNRAt is SNR at a given lag (got[i+lag] against ref[i]).
func SNRAt(ref, got []int16, lag int) float64 {
	lo, hi := overlap(ref, got, lag)
	var sig, noise float64
	for i := lo; i < hi; i++ {
		r := float64(ref[i])
		d := r - float64(got[i+lag])
		sig += r * r
		noise += d * d
	}
	if sig == 0 {
		return math.NaN()
	}
	return 10 * math.Log10(sig/noise)
}

// SegSNR is the segmental SNR of got against ref, in dB, at the lag Align
// finds (up to DefaultMaxLag): the overlap cut into segments of segment
// samples (80 or 160: 10 or 20 ms; a shorter last one is left out), each
// segment's SNR
//
//	SNR_k = 10 log10( sum_k ref[i]^2 / sum_k (ref[i] - got[i+lag])^2 )
//
// clamped to [SegSNRMin, SegSNRMax] (-10 to 35 dB), and their mean over
// the segments where ref is not silence (RMS at least -60 dBFS). It
// follows a speech codec's quality over time better than SNR, which the
// loudest segments dominate. NaN when no segment has signal or segment is
// not positive.
func SegSNR(ref, got []int16, segment int) float64 {
	return SegSNRAt(ref, got, Align(ref, got, DefaultMaxLag), segment)
}

// SegSNRAt is SegSNR at a given lag (got[i+lag] against ref[i]).
func SegSNRAt(ref, got []int16, lag, segment int) float64 {
	if segment <= 0 {
		return math.NaN()
	}
	lo, hi := overlap(ref, got, lag)
	var sum float64
	var count int
	for s := lo; s+segment <= hi; s += segment {
		var sig, noise float64
		for i := s; i < s+segment; i++ {
			r := float64(ref[i])
			d := r - float64(got[i+lag])
			sig += r * r
			noise += d * d
		}
		if sig < silentRMS*silentRMS*float64(segment) {
			continue
		}
		snr := float64(SegSNRMax)
		if noise > 0 {
			snr = min(SegSNRMax, max(SegSNRMin, 10*math.Log10(sig/noise)))
		}
		sum += snr
		count++
	}
	if count == 0 {
		return math.NaN()
	}
	return sum / float64(count)
}
