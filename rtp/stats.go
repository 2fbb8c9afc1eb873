package rtp

// Constants of RFC 3550 appendix A.1.
const (
	MaxDropout  = 3000    // largest forward jump still counted as in order
	MaxMisorder = 100     // largest backward jump still counted as late
	SeqMod      = 1 << 16 // RTP_SEQ_MOD
)

// ReceiverStats is the receive state of one RTP source, kept exactly as in
// RFC 3550 appendix A.1 (sequence numbers) and A.8 (interarrival jitter),
// with integer arithmetic only. It is the reference the XDP program's
// in-kernel per-flow statistics are tested against, which is why the
// algorithm below is spelled out rather than summarised:
//
// The first packet, or a packet whose SSRC differs from SSRC, starts a fresh
// source: every field is reset (SSRCChanges is carried over and incremented
// when the state was initialized and the SSRC differs), BaseSeq = MaxSeq =
// seq, Cycles = 0, BadSeq = SeqMod+1, Received = 1, and the jitter step runs
// with no previous transit time, so it only records LastTransit.
//
// Otherwise, with udelta = seq - MaxSeq in uint16 arithmetic:
//   - udelta < MaxDropout: in order with a permissible gap. If seq < MaxSeq
//     the sequence number wrapped and Cycles += SeqMod. MaxSeq = seq,
//     Received++.
//   - udelta <= SeqMod-MaxMisorder: a large jump. If seq == BadSeq, this is
//     the second packet of a new sequence following the first: the sequence
//     state is re-initialised as for a new source (BaseSeq, MaxSeq, Cycles,
//     BadSeq; Received = 1) while SSRC, SSRCChanges and the jitter state are
//     kept. Otherwise BadSeq = (seq+1) & 0xffff and the packet is rejected:
//     not counted and no jitter update.
//   - otherwise: a duplicate or reordered packet, Received++.
//
// Every packet not rejected then updates the jitter (A.8): transit =
// arrival - ts (uint32, wrapping); if HaveTransit, d = |int32(transit -
// LastTransit)| and Jitter16 += d - ((Jitter16 + 8) >> 4), i.e. the jitter
// estimate J += (|D| - J)/16 kept scaled by 16. LastTransit = transit,
// HaveTransit = true.
//
// Unlike appendix A.1 there is no probation (MIN_SEQUENTIAL): a relay and a
// test receiver know their sources from signalling, and counting from the
// first packet is what makes per-flow counts exact.
//
// Duplicates are counted in Received (as in the RFC), so Lost can be
// negative.
//
// The zero value is a source that has seen no packet. A ReceiverStats is
// not safe for concurrent use.
type ReceiverStats struct {
	SSRC        uint32
	BaseSeq     uint32
	MaxSeq      uint16
	Cycles      uint32 // count of sequence number wraps, times SeqMod
	BadSeq      uint32
	Received    uint64
	Jitter16    uint32 // interarrival jitter in timestamp units, times 16
	LastTransit uint32
	HaveTransit bool
	SSRCChanges uint32
	Initialized bool
}

// Update accounts one packet with the given SSRC, sequence number and RTP
// timestamp arriving at arrival, expressed in the stream's RTP timestamp
// units (any origin; only differences matter).
func (s *ReceiverStats) Update(ssrc uint32, seq uint16, ts uint32, arrival uint32) {
	if !s.Initialized || ssrc != s.SSRC {
		changes := s.SSRCChanges
		if s.Initialized {
			changes++
		}
		*s = ReceiverStats{SSRC: ssrc, SSRCChanges: changes, Initialized: true}
		s.initSeq(seq)
		s.Received = 1
		s.updateJitter(ts, arrival)
		return
	}

	udelta := seq - s.MaxSeq
	switch {
	case udelta < MaxDropout:
		if seq < s.MaxSeq {
			s.Cycles += SeqMod
		}
		s.MaxSeq = seq
		s.Received++
	case udelta <= SeqMod-MaxMisorder:
		if uint32(seq) != s.BadSeq {
			s.BadSeq = (uint32(seq) + 1) & (SeqMod - 1)
			return
		}
		s.initSeq(seq)
		s.Received = 1
	default:
		s.Received++
	}
	s.updateJitter(ts, arrival)
}

func (s *ReceiverStats) initSeq(seq uint16) {
	s.BaseSeq = uint32(seq)
	s.MaxSeq = seq
	s.Cycles = 0
	s.BadSeq = SeqMod + 1
}

func (s *ReceiverStats) updateJitter(ts, arrival uint32) {
	transit := arrival - ts
	if s.HaveTransit {
		d := int32(transit - s.LastTransit)
		if d < 0 {
			d = -d
		}
		s.Jitter16 += uint32(d) - ((s.Jitter16 + 8) >> 4)
	}
	s.LastTransit = transit
	s.HaveTransit = true
}

// ExtendedMax returns the extended highest sequence number received.
func (s *ReceiverStats) ExtendedMax() uint32 { return s.Cycles + uint32(s.MaxSeq) }

// Expected returns the number of packets expected since the base sequence
// number (appendix A.3).
func (s *ReceiverStats) Expected() uint32 { return s.ExtendedMax() - s.BaseSeq + 1 }

// Lost returns the cumulative number of packets lost; negative when
// duplicates outnumber losses.
func (s *ReceiverStats) Lost() int64 { return int64(s.Expected()) - int64(s.Received) }

// Jitter returns the interarrival jitter in RTP timestamp units.
func (s *ReceiverStats) Jitter() uint32 { return s.Jitter16 >> 4 }

// LossInterval holds the expected_prior and received_prior of RFC 3550
// appendix A.3 for one source, to compute the fraction lost per RTCP report
// interval. The zero value starts at the beginning of the stream. Kept apart
// from ReceiverStats so the reference state stays what the XDP program keeps.
type LossInterval struct {
	ExpectedPrior uint32
	ReceivedPrior uint64
	ssrc, base    uint32 // source the priors belong to
}

// Next returns the packets lost in the interval since the previous call and
// the fraction lost as the 8-bit fixed-point number of an RTCP report block,
// and starts a new interval. If s was re-initialised since the previous
// call (sequence resync or new SSRC), the interval restarts from zero.
func (iv *LossInterval) Next(s *ReceiverStats) (fraction uint8, lost int64) {
	expected := s.Expected()
	if s.SSRC != iv.ssrc || s.BaseSeq != iv.base || expected < iv.ExpectedPrior || s.Received < iv.ReceivedPrior {
		*iv = LossInterval{ssrc: s.SSRC, base: s.BaseSeq}
	}
	expectedInterval := int64(expected - iv.ExpectedPrior)
	receivedInterval := int64(s.Received - iv.ReceivedPrior)
	iv.ExpectedPrior = expected
	iv.ReceivedPrior = s.Received
	lost = expectedInterval - receivedInterval
	if expectedInterval == 0 || lost <= 0 {
		return 0, lost
	}
	return uint8((lost << 8) / expectedInterval), lost
}

// ReceptionReport fills r with the report block for s, advancing iv to a
// new interval. LSR and DLSR are left to the caller, which knows the last SR.
func (s *ReceiverStats) ReceptionReport(r *ReceptionReport, iv *LossInterval) {
	r.SSRC = s.SSRC
	r.FractionLost, _ = iv.Next(s)
	lost := s.Lost()
	switch {
	case lost > 0x7fffff:
		lost = 0x7fffff
	case lost < -0x800000:
		lost = -0x800000
	}
	r.TotalLost = int32(lost)
	r.HighestSeq = s.ExtendedMax()
	r.Jitter = s.Jitter()
}
