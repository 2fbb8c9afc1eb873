package transcode

import "math"

// G.711 packet loss concealment on PCM: one pitch period repeated with a
// fading gain, in the spirit of G.711 Appendix I (see doc.go).
const (
	plcHist    = 240 // samples of history kept: 30 ms, enough for a 15 ms lag over a 10 ms window
	pitchMin   = 40  // 5 ms: 200 Hz
	pitchMax   = 120 // 15 ms: 66 Hz
	pitchWin   = 80  // the window the lag is matched over
	plcFull    = FrameSamples
	plcFadeLen = 5 * FrameSamples // after the first 10 ms, -20% per 10 ms: silent after 60 ms
	plcResume  = 32               // 4 ms cross-fade from the concealment back into real speech
)

// plc conceals lost G.711 frames from the PCM decoded before them. The
// zero value has an all-silent history and is ready to use.
type plc struct {
	hist   [plcHist]int16 // the latest samples, the newest last
	cycle  [pitchMax]int16
	period int
	phase  int // index into cycle of the next sample
	n      int // samples concealed in the current burst
	active bool
}

// gain is the concealment's gain, in 1/1024, for the n-th concealed sample.
func plcGain(n int) int32 {
	switch {
	case n < plcFull:
		return 1024
	case n >= plcFull+plcFadeLen:
		return 0
	}
	return int32(1024 - (n-plcFull)*1024/plcFadeLen)
}

func (p *plc) push(frame []int16) {
	copy(p.hist[:], p.hist[len(frame):])
	copy(p.hist[plcHist-len(frame):], frame)
}

// start picks the pitch period of the end of the history (the lag that
// best matches the last 10 ms, by normalised autocorrelation) and builds
// the cycle to repeat: the last period, its end cross-faded into the
// sample before its start, so that the repetition has no step at the
// joint.
func (p *plc) start() {
	end := p.hist[plcHist-pitchWin:]
	best, bestScore := pitchMin, math.Inf(-1)
	for lag := pitchMin; lag <= pitchMax; lag++ {
		past := p.hist[plcHist-pitchWin-lag : plcHist-lag]
		var c, e int64
		for i := range end {
			c += int64(end[i]) * int64(past[i])
			e += int64(past[i]) * int64(past[i])
		}
		if e == 0 {
			continue
		}
		score := float64(c) * math.Abs(float64(c)) / float64(e)
		if score > bestScore {
			best, bestScore = lag, score
		}
	}
	p.period = best
	src := p.hist[plcHist-best:]
	copy(p.cycle[:best], src)
	ola := best / 4
	for i := range ola {
		j := best - ola + i
		w := int32(i + 1)
		prev := int32(p.hist[plcHist-best-ola+i])
		p.cycle[j] = int16((int32(p.cycle[j])*(int32(ola)-w) + prev*w) / int32(ola))
	}
	p.phase, p.n, p.active = 0, 0, true
}

// synth writes the next len(out) concealment samples; advance false
// leaves the state as it was (for the cross-fade at resumption).
func (p *plc) synth(out []int16, advance bool) {
	phase, n := p.phase, p.n
	for i := range out {
		out[i] = int16(int32(p.cycle[phase]) * plcGain(n) / 1024)
		if phase++; phase == p.period {
			phase = 0
		}
		n++
	}
	if advance {
		p.phase, p.n = phase, n
	}
}

// conceal fills out (one frame) for a lost frame.
func (p *plc) conceal(out []int16) {
	if !p.active {
		p.start()
	}
	p.synth(out, true)
	p.push(out)
}

// good takes a frame that arrived, cross-fading its start from the
// concealment when it ends one, and keeps it as history.
func (p *plc) good(frame []int16) {
	if p.active {
		var cont [plcResume]int16
		p.synth(cont[:], false)
		for i := range cont {
			w := int32(i + 1)
			frame[i] = int16((int32(cont[i])*(plcResume-w) + int32(frame[i])*w) / plcResume)
		}
		p.active = false
	}
	p.push(frame)
}

// noise is comfort noise at an RFC 3389 level: white noise from a linear
// congruential generator. The zero value is silent.
type noise struct {
	amp   int32 // peak amplitude; uniform noise has an RMS of amp/sqrt(3)
	state uint32
}

// setLevel sets the noise to level -dBov (0 to 127), 0 dBov being the
// mean power of a full-scale square wave (32767 squared).
func (z *noise) setLevel(level uint8) {
	rms := 32767 * math.Pow(10, -float64(level&0x7f)/20)
	z.amp = int32(min(rms*math.Sqrt(3), 32767))
}

func (z *noise) fill(out []int16) {
	for i := range out {
		z.state = z.state*1664525 + 1013904223
		out[i] = int16(int32(int16(z.state>>16)) * z.amp >> 15)
	}
}

// levelOf is the RFC 3389 level (-dBov, 0 to 127) of a frame.
func levelOf(pcm []int16) uint8 {
	var e float64
	for _, v := range pcm {
		e += float64(v) * float64(v)
	}
	if e == 0 {
		return 127
	}
	l := -10 * math.Log10(e/float64(len(pcm))/(32767*32767))
	return uint8(min(max(math.Round(l), 0), 127))
}
