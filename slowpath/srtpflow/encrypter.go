package srtpflow

// Encrypter turns one flow's RTP into SRTP and its RTCP into SRTCP. It keeps
// a rollover counter per SSRC and an SRTCP index per SSRC. The zero value is
// not usable; create one with NewEncrypter. An Encrypter is owned by one
// worker and is not safe for concurrent use.
type Encrypter struct {
	t transform
}

// NewEncrypter returns an Encrypter for cfg.
func NewEncrypter(cfg Config) (*Encrypter, error) {
	e := &Encrypter{}
	if err := e.t.init(cfg); err != nil {
		return nil, err
	}
	return e, nil
}

// RTPOverhead is the number of bytes EncryptRTP adds to a packet (tag and MKI).
func (e *Encrypter) RTPOverhead() int { return e.t.rtpOver }

// RTCPOverhead is the number of bytes EncryptRTCP adds to a packet (tag, SRTCP
// index and MKI).
func (e *Encrypter) RTCPOverhead() int { return e.t.rtcpOver }

// EncryptRTP encrypts and authenticates the RTP packet src and writes the
// SRTP packet from the start of dst's backing array, returning it. cap(dst)
// must be at least len(src)+RTPOverhead(); dst may be src (with spare
// capacity) for in-place encryption. Errors: ErrShort, ErrMalformed,
// ErrShortBuffer, ErrExhausted.
func (e *Encrypter) EncryptRTP(dst, src []byte) ([]byte, error) {
	hl, err := rtpHeaderLength(src)
	if err != nil {
		return nil, err
	}
	if cap(dst) < len(src)+e.t.rtpOver {
		return nil, ErrShortBuffer
	}
	if e.t.ownRTP {
		return e.t.cm.encrypt(dst[:0:cap(dst)], src, hl)
	}
	out, err := e.t.ctx.EncryptRTP(dst[:0], src, &e.t.rtpHdr)
	if err != nil {
		return nil, e.t.mapErr("encrypt RTP", err)
	}
	return out, nil
}

// EncryptRTCP encrypts and authenticates the RTCP packet src (a compound
// packet as one unit) into dst like EncryptRTP; cap(dst) must be at least
// len(src)+RTCPOverhead().
func (e *Encrypter) EncryptRTCP(dst, src []byte) ([]byte, error) {
	if err := checkRTCP(src, rtcpHeaderLen); err != nil {
		return nil, err
	}
	if cap(dst) < len(src)+e.t.rtcpOver {
		return nil, ErrShortBuffer
	}
	out, err := e.t.ctx.EncryptRTCP(dst[:0], src, &e.t.rtcpHdr)
	if err != nil {
		return nil, e.t.mapErr("encrypt RTCP", err)
	}
	return out, nil
}

// Prefetch starts the loads of the lines the next RTP packet's protection
// will read, so that a worker can have the contexts of a whole batch of
// packets on their way to the CPU's caches before it works on the first.
// It changes nothing.
func (e *Encrypter) Prefetch() { e.t.prefetch() }
