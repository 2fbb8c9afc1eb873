package transcode

import "github.com/relayd/relayd/rtp"

const ntpEpochOffset = 2208988800 // seconds from 1900 (NTP) to 1970 (Unix)

// ntpTime is the 64-bit NTP timestamp of a Unix time in ns.
func ntpTime(ns int64) uint64 {
	sec := uint64(ns/1e9) + ntpEpochOffset
	frac := uint64(ns%1e9) << 32 / 1e9
	return sec<<32 | frac
}

// rtpTime is the output timestamp that corresponds to now: the timeline
// of the last frame released, extrapolated at 8 kHz.
func (s *Stream) rtpTime(now int64) uint32 {
	if !s.anchored {
		return s.pos
	}
	return s.anchorTs + uint32((now-s.anchorNs)/sampleNs)
}

// Report writes an RTCP compound packet into dst: a sender report for
// what the stream sent (NTP time of now, the output RTP timestamp of now,
// packet and payload octet counts) with one reception report block for
// recv (what relayd received from the leg the stream sends to, that is
// the reverse flow's statistics; nil: no block; iv nil: the fraction lost
// is over the whole stream), then an SDES CNAME chunk. LSR and DLSR are
// 0: the stream does not see the leg's own sender reports. It returns the
// length, 0 when dst is too short. It does not allocate.
func (s *Stream) Report(dst []byte, now int64, recv *rtp.ReceiverStats, iv *rtp.LossInterval, cname string) int {
	if len(cname) > 255 {
		cname = cname[:255]
	}
	srLen := rtp.RTCPHeaderSize + rtp.SenderInfoSize
	if recv != nil {
		srLen += rtp.ReceptionReportSize
	}
	sdesLen := (rtp.RTCPHeaderSize + 2 + len(cname) + 1 + 3) &^ 3 // chunk: SSRC, CNAME item, at least one null
	if len(dst) < srLen+sdesLen {
		return 0
	}
	h := rtp.RTCPHeader{Type: rtp.TypeSenderReport, Length: uint16(srLen/4 - 1), SSRC: s.ssrc}
	if recv != nil {
		h.Count = 1
	}
	n, _ := h.MarshalTo(dst)
	si := rtp.SenderInfo{NTPTime: ntpTime(now), RTPTime: s.rtpTime(now),
		PacketCount: uint32(s.st.SentPackets), OctetCount: uint32(s.st.SentOctets)}
	m, _ := si.MarshalTo(dst[n:])
	n += m
	if recv != nil {
		var rr rtp.ReceptionReport
		var whole rtp.LossInterval
		if iv == nil {
			iv = &whole
		}
		recv.ReceptionReport(&rr, iv)
		m, _ = rr.MarshalTo(dst[n:])
		n += m
	}
	h = rtp.RTCPHeader{Type: rtp.TypeSDES, Count: 1, Length: uint16(sdesLen/4 - 1), SSRC: s.ssrc}
	m, _ = h.MarshalTo(dst[n:])
	n += m
	dst[n] = 1 // CNAME
	dst[n+1] = byte(len(cname))
	n += 2 + copy(dst[n+2:], cname)
	for end := srLen + sdesLen; n < end; n++ {
		dst[n] = 0
	}
	s.st.RTCPSent++
	return n
}
