package srtpflow

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // HMAC-SHA1 is what RFC 3711 specifies
	"crypto/subtle"
	"encoding/binary"
	"hash"
	"reflect"
	"unsafe"
)

// cmRTP is the SRTP (not SRTCP) transform of the AES-CM/HMAC-SHA1 suites,
// RFC 3711 sections 4.1.1 and 4.2, done with crypto/aes, crypto/hmac and
// crypto/subtle directly. It replaces pion for RTP packets because pion's
// AES-CM takes a pooled buffer per packet and XORs one 16-byte block at a
// time, and its packet handling (an rtp.Header parse, closures, interface
// calls) costs as much again; here a packet's counter blocks are encrypted
// a few at a time into a small per-context buffer and XORed in one call per
// chunk, or, where the standard library's pipelined CTR can be moved to a
// packet's counter (ctrStream), by that CTR: cipher.NewCTR allocates per
// IV, so a context keeps one. The rollover counter
// estimation and the replay window follow pion's (context.go, srtp.go,
// transport's replaydetector) so that both paths accept and reject the same
// packets; TestDifferential checks that.
//
// What a packet touches is kept small: a worker meets hundreds of flows in
// turn, so their state is rarely in the CPU's first caches and every line
// of it costs a miss (BenchmarkEncryptDecryptRTPFlows). The fields read per
// packet come first, 120 bytes (cmHotBytes) that two cache lines hold: an
// Encrypter or Decrypter, which holds a cmRTP first, is an object of more
// than 512 bytes, which the runtime places 8 bytes (its allocation header)
// past the start of a line, in a size class of a multiple of 64 bytes
// (TestPrefetch checks it); the replay window is two words of the SSRC's
// state, not a detector behind an interface and two more pointers.
type cmRTP struct {
	mac            hash.Hash // HMAC-SHA1 under the session auth key; Reset keeps the keyed state
	saltHi, saltLo uint64    // session salt, 112 bits, as the IV's halves (low 16 bits zero)
	// ctr is the keystream's stream, moved to each packet's counter (see
	// ctrStream); without a stream, one block Encrypt per 16 bytes.
	ctr    ctrStream
	last   *cmState // the SSRC of the previous packet, to skip the map
	mki    []byte
	sum    [sha1.Size]byte // the tag's MAC; first the ROC the MAC takes, when not in place
	tagLen int32

	// The rest is read by a packet of a new SSRC, or with no CTR stream.
	block  cipher.Block
	states map[uint32]*cmState
	spare  *cmState // state for an SSRC seen but not yet authenticated
	ks     [keystreamChunk]byte

	warm warmSet // the lines a packet reads, its own and the standard library's
}

// cmHotBytes is how much of a cmRTP every packet reads: up to block.
const cmHotBytes = unsafe.Offsetof(cmRTP{}.block)

// keystreamChunk is how much keystream is generated per pass: four blocks,
// one cache line. A bigger buffer saves XOR calls but costs the lines it
// spans in every context; the stack cannot hold it, as the slices handed to
// cipher.Block's Encrypt, an interface method, escape.
const keystreamChunk = 4 * aes.BlockSize

// cmState is one SSRC's rollover state (pion's srtpSSRCState): index is the
// highest packet index seen, ROC<<16 | SEQ.
type cmState struct {
	ssrc      uint32
	processed bool // rolloverHasProcessed
	index     uint64
	replay    replayWindow
}

// replayWindow is the replay list of RFC 3711 section 3.3.2 over the last
// ReplayWindow packet indices, with the semantics of pion/transport's
// sliding-window detector (replaydetector.New(ReplayWindow, 1<<48-1)):
// bit i of mask says index latest-i was accepted. The zero value is an
// empty window.
type replayWindow struct {
	latest uint64
	mask   [ReplayWindow / 64]uint64
}

const maxIndex = 1<<48 - 1

// check reports whether index idx may be accepted: not past the largest
// index, not older than the window, not accepted before.
func (w *replayWindow) check(idx uint64) bool {
	if idx > maxIndex {
		return false
	}
	if idx > w.latest {
		return true
	}
	d := w.latest - idx
	return d < ReplayWindow && w.mask[d/64]&(1<<(d%64)) == 0
}

// accept records idx, which check allowed.
func (w *replayWindow) accept(idx uint64) {
	if idx > w.latest {
		switch n := idx - w.latest; {
		case n >= 128:
			w.mask = [2]uint64{}
		case n >= 64:
			w.mask = [2]uint64{0, w.mask[0] << (n - 64)}
		default:
			w.mask = [2]uint64{w.mask[0] << n, w.mask[1]<<n | w.mask[0]>>(64-n)}
		}
		w.latest = idx
	}
	d := w.latest - idx
	w.mask[d/64] |= 1 << (d % 64)
}

const (
	seqNumMedian = 1 << 15
	seqNumMax    = 1 << 16
	maxROC       = 1<<32 - 1
)

// init derives the SRTP session keys from the master key and salt with
// the RFC 3711 section 4.3 KDF (key_derivation_rate 0).
func (c *cmRTP) init(cfg Config) error {
	ekey, err := sessionKey(0, cfg.Key, cfg.Salt, len(cfg.Key))
	if err != nil {
		return err
	}
	akey, err := sessionKey(1, cfg.Key, cfg.Salt, sha1.Size)
	if err != nil {
		return err
	}
	salt, err := sessionKey(2, cfg.Key, cfg.Salt, len(cfg.Salt))
	if err != nil {
		return err
	}
	blk, err := aes.NewCipher(ekey)
	if err != nil {
		return err
	}
	var iv [16]byte
	copy(iv[:], salt)
	*c = cmRTP{
		block:  blk,
		mac:    hmac.New(sha1.New, akey),
		saltHi: binary.BigEndian.Uint64(iv[0:]),
		saltLo: binary.BigEndian.Uint64(iv[8:]),
		tagLen: int32(cfg.Suite.RTPTagLen()),
		mki:    append([]byte(nil), cfg.MKI...),
		states: make(map[uint32]*cmState),
	}
	if l, ok := ctrFields(); ok {
		c.ctr, _ = newCTRStream(blk, l)
	}
	// The first Reset replaces the HMAC's pads by its marshalled keyed
	// states: the objects every packet reads from then on.
	c.mac.Reset()
	c.warm = c.warmLines(len(ekey))
	return nil
}

// warmLines finds the lines a packet reads in c's fixed objects: c's own
// first lines (c does not move once made: it is held in its Encrypter or
// Decrypter), the key schedule's (the CTR stream's copy of it, up to the
// last round key the key's size uses, and the stream's counter; or the AES
// block's) and the HMAC's (see warmSet). keyLen is the cipher key's size.
func (c *cmRTP) warmLines(keyLen int) warmSet {
	var w warmSet
	w.add(unsafe.Pointer(c), cmHotBytes)
	if c.ctr.stream != nil {
		if ctrEnc != 0 {
			// The rounds word and rounds+1 round keys (RFC 3711's AES-CM
			// keys are 128, 192 or 256 bits: 10, 12 or 14 rounds).
			rounds := keyLen/4 + 6
			w.add(c.ctr.obj, ctrEnc+uintptr(rounds+1)*aes.BlockSize)
		} else {
			w.collect(reflect.ValueOf(c.ctr.stream), 0)
		}
		w.add(c.ctr.counter())
	} else {
		w.collect(reflect.ValueOf(c.block), 0)
		w.add(unsafe.Pointer(&c.ks), keystreamChunk) // where the blocks' keystream goes
	}
	w.collect(reflect.ValueOf(c.mac), 0)
	return w
}

// prefetch starts the loads of the lines a packet reads: the warm set's
// and the last SSRC's state.
func (c *cmRTP) prefetch() {
	c.warm.prefetch()
	if c.last != nil {
		last := uintptr(unsafe.Pointer(c.last))
		prefetchLines(&last, 1)
	}
}

// sessionKey is the AES-CM PRF of RFC 3711 section 4.3.3: the keystream under the
// master key with IV = (master salt XOR label<<48) || 0x0000.
func sessionKey(label byte, key, salt []byte, n int) ([]byte, error) {
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	iv := make([]byte, aes.BlockSize)
	copy(iv, salt)
	iv[7] ^= label
	out := make([]byte, n)
	cipher.NewCTR(blk, iv).XORKeyStream(out, out)
	return out, nil
}

func newCMState(ssrc uint32) *cmState {
	return &cmState{ssrc: ssrc}
}

// state returns ssrc's state; keep says to record a new one at once (the
// sender side). Without keep a new SSRC gets the spare state, recorded by
// commit only once a packet of it authenticates, so forged packets with
// made-up SSRCs neither grow the map nor allocate.
func (c *cmRTP) state(ssrc uint32, keep bool) (*cmState, bool) {
	if s := c.last; s != nil && s.ssrc == ssrc {
		return s, true
	}
	if s, ok := c.states[ssrc]; ok {
		c.last = s
		return s, true
	}
	if keep {
		s := newCMState(ssrc)
		c.states[ssrc] = s
		c.last = s
		return s, false
	}
	if c.spare == nil {
		c.spare = newCMState(ssrc)
	}
	// The spare's replay window was never written: only accepted packets
	// write it, and an accepted spare is handed over to the map.
	s := c.spare
	s.ssrc, s.index, s.processed = ssrc, 0, false
	return s, false
}

func (c *cmRTP) commit(s *cmState) {
	c.states[s.ssrc] = s
	c.last = s
	c.spare = nil
}

// setROC makes ssrc's stream continue with rollover counter roc (pion's
// Context.SetROC).
func (c *cmRTP) setROC(ssrc, roc uint32) {
	s, _ := c.state(ssrc, true)
	s.index = uint64(roc) << 16
	s.processed = false
}

// nextROC guesses the packet's ROC from the highest index seen (RFC 3711
// section 3.3.1; pion's srtpSSRCState.nextRolloverCount, same arithmetic).
func (s *cmState) nextROC(seq uint16) (roc uint32, diff int64, overflow bool) {
	sq := int32(seq)
	localROC := uint32(s.index >> 16)
	localSeq := int32(s.index & (seqNumMax - 1))
	roc = localROC
	var d int32
	if s.processed {
		switch {
		case s.index <= seqNumMedian:
			d = sq - localSeq
		case localSeq < seqNumMedian:
			if sq-localSeq > seqNumMedian {
				roc, d = localROC-1, sq-localSeq-seqNumMax
			} else {
				d = sq - localSeq
			}
		default:
			if localSeq-seqNumMedian > sq {
				roc, d = localROC+1, sq-localSeq+seqNumMax
			} else {
				d = sq - localSeq
			}
		}
	}
	return roc, int64(d), roc == 0 && localROC == maxROC
}

func (s *cmState) update(seq uint16, diff int64) {
	switch {
	case !s.processed:
		s.index |= uint64(seq)
		s.processed = true
	case diff > 0:
		s.index += uint64(diff)
	}
}

// xorKeystream XORs the AES-CM keystream of the packet (ssrc, roc, seq) onto
// src into dst (which may be src).
func (c *cmRTP) xorKeystream(dst, src []byte, ssrc, roc uint32, seq uint16) {
	hi := c.saltHi ^ uint64(ssrc)
	lo := c.saltLo ^ (uint64(roc)<<16|uint64(seq))<<16
	if c.ctr.stream != nil {
		c.ctr.xor(dst, src, hi, lo)
		return
	}
	// The low 16 bits of lo are the block counter (zero in the IV); a
	// packet has far fewer than 2^16 blocks, so it never carries into
	// the index bits.
	for len(src) > 0 {
		n := min(len(src), keystreamChunk)
		for off := 0; off < n; off += aes.BlockSize {
			b := c.ks[off : off+aes.BlockSize]
			binary.BigEndian.PutUint64(b, hi)
			binary.BigEndian.PutUint64(b[8:], lo)
			c.block.Encrypt(b, b)
			lo++
		}
		subtle.XORBytes(dst[:n], src[:n], c.ks[:n])
		dst, src = dst[n:], src[n:]
	}
}

// tag computes the HMAC-SHA1 of authenticated||ROC into c.sum; with
// rocInPlace the caller has written the ROC after authenticated (in the
// packet's spare capacity), and the MAC takes both in one Write.
func (c *cmRTP) tag(authenticated []byte, roc uint32, rocInPlace bool) []byte {
	c.mac.Reset()
	if rocInPlace {
		c.mac.Write(authenticated[:len(authenticated)+4])
	} else {
		c.mac.Write(authenticated)
		// The MAC copies what it is given: sum is free until Sum.
		binary.BigEndian.PutUint32(c.sum[:4], roc)
		c.mac.Write(c.sum[:4])
	}
	return c.mac.Sum(c.sum[:0])[:int(c.tagLen)]
}

// encrypt protects the RTP packet src (header length hl) into dst, whose
// capacity the caller checked.
func (c *cmRTP) encrypt(dst, src []byte, hl int) ([]byte, error) {
	ssrc := binary.BigEndian.Uint32(src[8:])
	seq := binary.BigEndian.Uint16(src[2:])
	s, _ := c.state(ssrc, true)
	roc, diff, ovf := s.nextROC(seq)
	if ovf {
		return nil, ErrExhausted
	}
	s.update(seq, diff)
	n := len(src)
	out := dst[:n+len(c.mki)+int(c.tagLen)]
	copy(out[:hl], src[:hl])
	c.xorKeystream(out[hl:n], src[hl:], ssrc, roc, seq)
	// The ROC goes where the MKI and tag will: out has at least 4
	// bytes there (the shortest tag).
	binary.BigEndian.PutUint32(out[n:], roc)
	tag := c.tag(out[:n], roc, true)
	copy(out[n:], c.mki)
	copy(out[n+len(c.mki):], tag)
	return out, nil
}

// decrypt authenticates and decrypts the SRTP packet src (header length
// hl, length checked by the caller) into dst.
func (c *cmRTP) decrypt(dst, src []byte, hl int) ([]byte, error) {
	ssrc := binary.BigEndian.Uint32(src[8:])
	seq := binary.BigEndian.Uint16(src[2:])
	s, known := c.state(ssrc, false)
	roc, diff, _ := s.nextROC(seq)
	idx := uint64(roc)<<16 | uint64(seq)
	if !s.replay.check(idx) {
		return nil, ErrReplay
	}
	if isCryptex(src) {
		// pion refuses cryptex (RFC 9335) unless negotiated; neither
		// side negotiates it.
		return nil, ErrMalformed
	}
	n := len(src) - len(c.mki) - int(c.tagLen)
	if len(c.mki) > 0 && !hmac.Equal(src[n:n+len(c.mki)], c.mki) {
		return nil, ErrUnknownMKI
	}
	if !hmac.Equal(c.tag(src[:n], roc, false), src[len(src)-int(c.tagLen):]) {
		return nil, ErrAuth
	}
	out := dst[:n]
	copy(out[:hl], src[:hl])
	c.xorKeystream(out[hl:], src[hl:n], ssrc, roc, seq)
	s.replay.accept(idx)
	s.update(seq, diff)
	if !known {
		c.commit(s)
	}
	return out, nil
}

// isCryptex reports whether the RTP packet b (header checked) carries an
// RFC 9335 encrypted header extension.
func isCryptex(b []byte) bool {
	if b[0]&0x10 == 0 {
		return false
	}
	p := binary.BigEndian.Uint16(b[rtpHeaderLen+4*int(b[0]&0x0f):])
	return p == 0xc0de || p == 0xc2de
}
