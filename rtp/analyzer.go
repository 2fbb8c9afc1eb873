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

	Packets     uint64 // RTP packets seen, including ones Stats rejected
	Bytes       uint64 // UDP payload bytes of those packets
	Duplicates  uint64 // packets whose sequence number was already seen
	Reordered   uint64 // packets arriving after a higher sequence number, not duplicates
	PayloadType uint8  // of the last packet

	FirstArrival int64 // Unix nanoseconds of the first packet
	LastArrival  int64 // Unix nanoseconds of the last packet
	MaxGap       int64 // longest time between consecutive packets, ns

	seen [dupWindow / 64]uint64 // bit per seq&(dupWindow-1), valid up to Stats.MaxSeq
}

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
			a.advance(st.MaxSeq, udelta)
			a.mark(seq)
		case udelta > SeqMod-MaxMisorder:
			if a.marked(seq) {
				a.Duplicates++
			} else {
				a.Reordered++
				a.mark(seq)
			}
		}
	}
	st.Update(h.SSRC, seq, h.Timestamp, a.rtpTime(now))
	if fresh || (st.Received == 1 && st.BaseSeq == uint32(seq)) {
		// New source or sequence resync: restart the window.
		a.seen = [dupWindow / 64]uint64{}
		a.mark(seq)
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
