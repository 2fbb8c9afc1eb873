package rtp

import "math/bits"

const dupWindow = 1024 // sequence numbers remembered for duplicate detection

// StreamAnalyzer is the receiver-side view of one RTP stream used by test
// receivers (voipgen recv): the RFC 3550 statistics of ReceiverStats plus
// wall-clock observations and a split of late packets into duplicates and
// reordered packets.
//
// Set ClockRate before the first Update; the rest of the zero value is a
// stream that has seen no packet. A StreamAnalyzer is not safe for
// concurrent use: it belongs to the goroutine that reads its socket.
type StreamAnalyzer struct {
	ClockRate uint32 // RTP clock of the payload format, e.g. 8000
	Stats     ReceiverStats

	Packets    uint64 // RTP packets seen, including ones Stats rejected
	Bytes      uint64 // UDP payload bytes of those packets
	Duplicates uint64 // packets whose sequence number was already seen
	Reordered  uint64 // packets arriving after a higher sequence number, not duplicates
	// Resyncs counts the times Stats restarted the sequence numbering
	// (RFC 3550 A.1: two consecutive packets of a jump over MaxDropout, or
	// later than MaxMisorder behind the highest): a sender that restarted,
	// or a stream whose packets came hundreds of sequence numbers out of
	// order, which a loss count alone would misreport. Expected and Lost
	// count from the last one.
	Resyncs     uint64
	PayloadType uint8 // of the last packet

	FirstArrival int64 // Unix nanoseconds of the first packet
	LastArrival  int64 // Unix nanoseconds of the last packet
	MaxGap       int64 // longest time between consecutive packets, ns

	// Loss periods: each run of consecutive sequence numbers missing when a
	// later packet arrived (a glitch), oldest first, at most
	// MaxLossPeriods; later ones are only counted in LossRuns. A missing
	// packet that arrives late shrinks the period it belonged to (and
	// removes it when none is left missing).
	LossPeriods []LossPeriod
	LossRuns    uint64 // loss periods seen, including the ones not kept

	seen    [dupWindow / 64]uint64 // bit per seq&(dupWindow-1), valid up to Stats.MaxSeq
	lastTS  uint32                 // RTP timestamp of the packet with Stats.MaxSeq
	lastMax int64                  // arrival of the packet with Stats.MaxSeq
}

// MaxLossPeriods bounds StreamAnalyzer.LossPeriods.
const MaxLossPeriods = 256

// LossPeriod is one run of lost packets of a stream.
type LossPeriod struct {
	// Before and After are the arrival times (Unix ns) of the packets on
	// either side of the run: the last one before and the first after.
	Before, After int64
	// FirstSeq is the extended sequence number of the first missing packet
	// (RFC 3550 A.1 numbering: cycles plus seq), Lost how many are missing.
	FirstSeq uint32
	Lost     uint32
	// Missing is the audio missing in ns, from the RTP timestamps around
	// the run: Lost packets of (timestamp step / clock rate) each.
	Missing int64
}

// GapMillis is the time in ms between the packets around the period.
func (p *LossPeriod) GapMillis() float64 { return float64(p.After-p.Before) / 1e6 }

// MissingMillis is the audio missing in ms.
func (p *LossPeriod) MissingMillis() float64 { return float64(p.Missing) / 1e6 }

// Update accounts one packet with parsed header h, UDP payload size size,
// which arrived at now (Unix nanoseconds, e.g. a kernel receive timestamp).
// It does not allocate.
func (a *StreamAnalyzer) Update(h *Header, size int, now int64) {
	if a.Packets == 0 {
		a.FirstArrival = now
	} else if gap := now - a.LastArrival; gap > a.MaxGap {
		a.MaxGap = gap
	}
	a.LastArrival = now
	a.Packets++
	a.Bytes += uint64(size)
	a.PayloadType = h.PayloadType

	seq := h.SequenceNumber
	st := &a.Stats
	fresh := !st.Initialized || st.SSRC != h.SSRC
	if !fresh {
		switch udelta := seq - st.MaxSeq; {
		case udelta == 0:
			a.Duplicates++
		case udelta < MaxDropout:
			if udelta > 1 {
				a.lossPeriod(h, udelta, now)
			}
			a.advance(st.MaxSeq, udelta)
			a.mark(seq)
		case udelta > SeqMod-MaxMisorder:
			if a.marked(seq) {
				a.Duplicates++
			} else {
				a.Reordered++
				a.mark(seq)
				a.found(seq)
			}
		}
	}
	prevMax, prevCycles := st.MaxSeq, st.Cycles
	st.Update(h.SSRC, seq, h.Timestamp, a.rtpTime(now))
	if fresh || (st.Received == 1 && st.BaseSeq == uint32(seq)) {
		if !fresh {
			a.Resyncs++
		}
		// New source or sequence resync: restart the window.
		a.seen = [dupWindow / 64]uint64{}
		a.mark(seq)
	}
	if fresh || st.MaxSeq != prevMax || st.Cycles != prevCycles {
		a.lastTS, a.lastMax = h.Timestamp, now
	}
}

// lossPeriod records the run of udelta-1 packets missing before h.
func (a *StreamAnalyzer) lossPeriod(h *Header, udelta uint16, now int64) {
	a.LossRuns++
	if len(a.LossPeriods) >= MaxLossPeriods {
		return
	}
	lost := uint32(udelta) - 1
	var missing int64
	if a.ClockRate > 0 {
		step := int64(h.Timestamp-a.lastTS) / int64(udelta) // per sequence number
		missing = step * int64(lost) * 1e9 / int64(a.ClockRate)
	}
	a.LossPeriods = append(a.LossPeriods, LossPeriod{
		Before: a.lastMax, After: now, Lost: lost, Missing: missing,
		FirstSeq: a.Stats.Cycles + uint32(a.Stats.MaxSeq) + 1,
	})
}

// found accounts a late packet seq against the loss period it was
// counted in, looking back over the last few periods.
func (a *StreamAnalyzer) found(seq uint16) {
	for i := len(a.LossPeriods) - 1; i >= 0 && i >= len(a.LossPeriods)-4; i-- {
		p := &a.LossPeriods[i]
		if uint16(seq-uint16(p.FirstSeq)) >= uint16(p.Lost) {
			continue
		}
		if p.Lost > 0 {
			p.Missing -= p.Missing / int64(p.Lost)
		}
		p.Lost--
		if p.Lost == 0 {
			a.LossPeriods = append(a.LossPeriods[:i], a.LossPeriods[i+1:]...)
			a.LossRuns--
		}
		return
	}
}

// rtpTime converts now to RTP timestamp units since the first packet.
func (a *StreamAnalyzer) rtpTime(now int64) uint32 {
	d := now - a.FirstArrival
	if d < 0 {
		d = 0
	}
	hi, lo := bits.Mul64(uint64(d), uint64(a.ClockRate))
	if hi >= 1e9 {
		return 0 // centuries; cannot happen for int64 nanoseconds
	}
	q, _ := bits.Div64(hi, lo, 1e9)
	return uint32(q)
}

// advance clears the window bits of the udelta sequence numbers after max.
func (a *StreamAnalyzer) advance(max, udelta uint16) {
	if udelta >= dupWindow {
		a.seen = [dupWindow / 64]uint64{}
		return
	}
	for i := uint16(1); i <= udelta; i++ {
		s := (max + i) & (dupWindow - 1)
		a.seen[s>>6] &^= 1 << (s & 63)
	}
}

func (a *StreamAnalyzer) mark(seq uint16) {
	s := seq & (dupWindow - 1)
	a.seen[s>>6] |= 1 << (s & 63)
}

func (a *StreamAnalyzer) marked(seq uint16) bool {
	s := seq & (dupWindow - 1)
	return a.seen[s>>6]&(1<<(s&63)) != 0
}

// JitterMillis returns the RFC 3550 interarrival jitter in milliseconds.
func (a *StreamAnalyzer) JitterMillis() float64 {
	if a.ClockRate == 0 {
		return 0
	}
	return float64(a.Stats.Jitter16) / 16 * 1000 / float64(a.ClockRate)
}

// MaxGapMillis returns the longest gap between consecutive packets in ms.
func (a *StreamAnalyzer) MaxGapMillis() float64 { return float64(a.MaxGap) / 1e6 }
