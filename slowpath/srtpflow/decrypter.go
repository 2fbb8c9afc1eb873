package srtpflow

// Decrypter turns one flow's SRTP into RTP and its SRTCP into RTCP. It keeps
// a rollover counter and replay windows per SSRC. The zero value is not
// usable; create one with NewDecrypter. A Decrypter is owned by one worker
// and is not safe for concurrent use.
type Decrypter struct {
	t transform
}

// NewDecrypter returns a Decrypter for cfg.
func NewDecrypter(cfg Config) (*Decrypter, error) {
	d := &Decrypter{}
	if err := d.t.init(cfg); err != nil {
		return nil, err
	}
	return d, nil
}

// DecryptRTP authenticates and decrypts the SRTP packet src and writes the RTP
// packet from the start of dst's backing array, returning it. cap(dst) must be
// at least len(src); dst may be src for in-place decryption. On error the
// packet must be dropped: ErrShort, ErrMalformed, ErrShortBuffer, ErrReplay,
// ErrAuth or ErrUnknownMKI (rarely another error wrapping ErrMalformed).
func (d *Decrypter) DecryptRTP(dst, src []byte) ([]byte, error) {
	hl, err := rtpHeaderLength(src)
	if err != nil {
		return nil, err
	}
	if len(src) < hl+d.t.rtpOver {
		return nil, ErrShort
	}
	if cap(dst) < len(src) {
		return nil, ErrShortBuffer
	}
	if d.t.ownRTP {
		return d.t.cm.decrypt(dst[:0:cap(dst)], src, hl)
	}
	d.t.replayed = false
	out, err := d.t.ctx.DecryptRTP(dst[:0], src, &d.t.rtpHdr)
	if err != nil {
		return nil, d.t.mapErr("decrypt SRTP", err)
	}
	return out, nil
}

// DecryptRTCP authenticates and decrypts the SRTCP packet src (a compound
// packet as one unit) into dst like DecryptRTP; cap(dst) must be at least
// len(src).
func (d *Decrypter) DecryptRTCP(dst, src []byte) ([]byte, error) {
	if err := checkRTCP(src, rtcpHeaderLen+d.t.rtcpOver); err != nil {
		return nil, err
	}
	if cap(dst) < len(src) {
		return nil, ErrShortBuffer
	}
	d.t.replayed = false
	out, err := d.t.ctx.DecryptRTCP(dst[:0], src, &d.t.rtcpHdr)
	if err != nil {
		return nil, d.t.mapErr("decrypt SRTCP", err)
	}
	return out, nil
}

// Prefetch starts the loads of the lines the next RTP packet's protection
// will read, so that a worker can have the contexts of a whole batch of
// packets on their way to the CPU's caches before it works on the first.
// It changes nothing.
func (d *Decrypter) Prefetch() { d.t.prefetch() }
