// Package srtpflow holds the per-flow SRTP transforms of the userspace data
// plane: a one-way Decrypter (SRTP->RTP, SRTCP->RTCP) and a one-way Encrypter
// (RTP->SRTP, RTCP->SRTCP), built from an SDES suite, master key and master
// salt.
//
// SRTCP, and SRTP of the AEAD_AES_*_GCM suites, go through
// github.com/pion/srtp/v3. SRTP of the AES_CM suites, the packets that
// carry the media, goes through this package's own transform (cm.go) on
// crypto/aes, crypto/hmac and crypto/subtle: pion runs AES-CM through a
// pooled buffer, XORing 16 bytes at a time, and parses and tracks each
// packet behind interfaces, together about a sixth of the per-packet CPU.
// Both follow the same rollover-counter and replay rules; TestDifferential
// holds them to the same output.
//
// A flow's worker owns its transforms: they keep per-SSRC rollover counters
// and replay windows and take no locks, so a Decrypter or Encrypter must not
// be used from two goroutines at once. A flow that re-keys between legs holds
// a Decrypter for the inbound key and an Encrypter for the outbound one.
//
// The per-packet methods follow the dst/src convention of pion/rtp: the result
// is written from the start of dst's backing array (dst[:0:cap(dst)]) and
// returned; dst may be src itself (or src[:0]) to work in place. dst must not
// overlap src in any other way. They never allocate on the accept path: when
// cap(dst) is too small they return ErrShortBuffer instead of growing it.
// Rejections are pre-allocated sentinel errors (ErrAuth, ErrReplay, ErrShort,
// ErrMalformed, ErrShortBuffer, ErrUnknownMKI, ErrExhausted) for the worker to
// count by identity; the packet is then to be dropped. Pion allocates one
// small object per replayed packet and per packet with an unauthenticated new
// SSRC before rejecting it (SRTCP and the GCM suites); the AES_CM SRTP path
// allocates for neither, only for the state of an SSRC it keeps. Accepted
// packets cost no allocation once the SSRC is known.
//
// Replay protection is always on, for SRTP and SRTCP, with a window of
// ReplayWindow packets (libsrtp's default is 128 as well).
package srtpflow

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/srtp/v3"
	"github.com/pion/transport/v5/replaydetector"

	"github.com/relayd/relayd/sdes"
)

// Errors returned per packet. They are never wrapped on the packet path, so
// a worker may compare with == as well as errors.Is.
var (
	ErrAuth        = errors.New("srtp authentication failed")
	ErrReplay      = errors.New("srtp replayed packet")
	ErrShort       = errors.New("srtp packet too short")
	ErrMalformed   = errors.New("srtp packet malformed")
	ErrShortBuffer = errors.New("srtp destination buffer too small")
	ErrUnknownMKI  = errors.New("srtp unknown MKI")
	ErrExhausted   = errors.New("srtp key exhausted (2^48 SRTP or 2^31 SRTCP packets)")
)

// ReplayWindow is the size, in packets, of the SRTP and SRTCP replay windows.
const ReplayWindow = 128

const (
	rtpHeaderLen   = 12
	rtcpHeaderLen  = 8
	srtcpIndexLen  = 4
	rtpVersionBits = 0x80
)

// Config selects a flow's keys. The zero value is invalid.
type Config struct {
	// Suite is the SRTP crypto-suite.
	Suite sdes.Suite
	// Key and Salt are the master key and salt, Suite.KeyLen and
	// Suite.SaltLen bytes long. They are copied.
	Key, Salt []byte
	// MKI, if not empty, is the master key identifier carried by every
	// packet (RFC 3711 section 3.1): the Encrypter appends it, the
	// Decrypter requires it.
	MKI []byte
	// ROC, when not zero, is the rollover counter stream SSRC starts
	// with: a flow taken over after a restart continues its stream's
	// packet index (RFC 3711 section 3.3.1) instead of restarting at 0.
	SSRC, ROC uint32

	// pionRTP makes the AES-CM suites protect RTP with pion as the GCM
	// suites do, for the tests and benchmarks that compare the two.
	pionRTP bool
}

// ConfigFromCrypto returns the Config for an SDES attribute, refusing session
// parameters the transforms cannot honour (see sdes.Crypto.Supported).
func ConfigFromCrypto(c *sdes.Crypto) (Config, error) {
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	if err := c.Supported(); err != nil {
		return Config{}, err
	}
	return Config{Suite: c.Suite, Key: c.Key, Salt: c.Salt, MKI: c.MKI}, nil
}

func (c *Config) profile() (srtp.ProtectionProfile, error) {
	var p srtp.ProtectionProfile
	switch c.Suite {
	case sdes.AES_CM_128_HMAC_SHA1_80:
		p = srtp.ProtectionProfileAes128CmHmacSha1_80
	case sdes.AES_CM_128_HMAC_SHA1_32:
		p = srtp.ProtectionProfileAes128CmHmacSha1_32
	case sdes.AES_256_CM_HMAC_SHA1_80:
		p = srtp.ProtectionProfileAes256CmHmacSha1_80
	case sdes.AES_256_CM_HMAC_SHA1_32:
		p = srtp.ProtectionProfileAes256CmHmacSha1_32
	case sdes.AEAD_AES_128_GCM:
		p = srtp.ProtectionProfileAeadAes128Gcm
	case sdes.AEAD_AES_256_GCM:
		p = srtp.ProtectionProfileAeadAes256Gcm
	default:
		return 0, fmt.Errorf("suite %s: %w", c.Suite, sdes.ErrUnknownSuite)
	}
	if len(c.Key) != c.Suite.KeyLen() || len(c.Salt) != c.Suite.SaltLen() {
		return 0, fmt.Errorf("key %d and salt %d bytes, %s needs %d and %d: %w",
			len(c.Key), len(c.Salt), c.Suite, c.Suite.KeyLen(), c.Suite.SaltLen(), sdes.ErrKeyLength)
	}
	if len(c.MKI) > sdes.MaxMKILen {
		return 0, fmt.Errorf("MKI of %d bytes: %w", len(c.MKI), sdes.ErrMKI)
	}
	return p, nil
}

// transform is what Decrypter and Encrypter share.
type transform struct {
	// cm, the RTP transform of the AES-CM suites, comes first and is held
	// by value: a packet's walk through the context starts in the same
	// cache line as the Encrypter or Decrypter.
	cm       cmRTP
	ownRTP   bool // cm protects RTP; false: pion does RTP too
	rtpOver  int  // bytes SRTP adds to RTP: tag + MKI
	rtcpOver int  // bytes SRTCP adds to RTCP: tag + index + MKI
	ctx      *srtp.Context

	rtpHdr  rtp.Header  // reused per packet
	rtcpHdr rtcp.Header // reused per packet

	// replayed is set by the replay detectors when they refuse a packet,
	// so a pion error can be told apart without matching its text.
	replayed bool
}

// init builds the pion context. t must not move afterwards: the replay
// detectors keep a pointer to t.replayed.
func (t *transform) init(cfg Config) error {
	p, err := cfg.profile()
	if err != nil {
		return err
	}
	t.rtpOver = cfg.Suite.RTPTagLen() + len(cfg.MKI)
	t.rtcpOver = cfg.Suite.RTCPTagLen() + srtcpIndexLen + len(cfg.MKI)
	opts := []srtp.ContextOption{
		srtp.SRTPReplayDetectorFactory(func() replaydetector.ReplayDetector {
			return &flaggingDetector{inner: replaydetector.New(ReplayWindow, 1<<48-1), flag: &t.replayed}
		}),
		srtp.SRTCPReplayDetectorFactory(func() replaydetector.ReplayDetector {
			return &flaggingDetector{inner: replaydetector.New(ReplayWindow, 1<<31-1), flag: &t.replayed}
		}),
	}
	if len(cfg.MKI) > 0 {
		opts = append(opts, srtp.MasterKeyIndicator(cfg.MKI))
	}
	// pion copies key, salt and MKI into its derived state.
	ctx, err := srtp.CreateContext(cfg.Key, cfg.Salt, p, opts...)
	if err != nil {
		return fmt.Errorf("create SRTP context for %s: %w", cfg.Suite, err)
	}
	t.ctx = ctx
	// The GCM suites stay with pion: it seals with crypto/cipher's GCM,
	// whose assembly leaves little to gain.
	if !cfg.Suite.AEAD() && !cfg.pionRTP {
		if err = t.cm.init(cfg); err != nil {
			return fmt.Errorf("derive SRTP keys for %s: %w", cfg.Suite, err)
		}
		t.ownRTP = true
	}
	if cfg.ROC != 0 {
		t.setROC(cfg.SSRC, cfg.ROC)
	}
	return nil
}

// prefetch starts the loads of what the next RTP packet reads; the GCM
// suites (pion's) have none listed.
func (t *transform) prefetch() {
	if t.ownRTP {
		t.cm.prefetch()
	}
}

// setROC sets the rollover counter SRTP stream ssrc continues with.
func (t *transform) setROC(ssrc, roc uint32) {
	if t.ownRTP {
		t.cm.setROC(ssrc, roc)
		return
	}
	t.ctx.SetROC(ssrc, roc)
}

// flaggingDetector is pion's sliding-window detector that also records a
// refusal in *flag.
type flaggingDetector struct {
	inner replaydetector.ReplayDetector
	flag  *bool
}

func (d *flaggingDetector) Check(seq uint64) (func() bool, bool) {
	accept, ok := d.inner.Check(seq)
	if !ok {
		*d.flag = true
	}
	return accept, ok
}

func (d *flaggingDetector) CheckSeq(seq uint64) replaydetector.Token {
	tok := d.inner.(replaydetector.CheckAccepter).CheckSeq(seq)
	if !tok.Passed() {
		*d.flag = true
	}
	return tok
}

func (d *flaggingDetector) Accept(tok replaydetector.Token) bool {
	return d.inner.(replaydetector.CheckAccepter).Accept(tok)
}

// rtpHeaderLength returns the length of the RTP header at the start of b:
// fixed part, CSRCs and extension.
func rtpHeaderLength(b []byte) (int, error) {
	if len(b) < rtpHeaderLen {
		return 0, ErrShort
	}
	if b[0]&0xc0 != rtpVersionBits {
		return 0, ErrMalformed
	}
	n := rtpHeaderLen + 4*int(b[0]&0x0f)
	if b[0]&0x10 != 0 {
		if len(b) < n+4 {
			return 0, ErrShort
		}
		n += 4 + 4*int(binary.BigEndian.Uint16(b[n+2:]))
	}
	if len(b) < n {
		return 0, ErrShort
	}
	return n, nil
}

func checkRTCP(b []byte, min int) error {
	if len(b) < min {
		return ErrShort
	}
	if b[0]&0xc0 != rtpVersionBits {
		return ErrMalformed
	}
	return nil
}

// mapErr turns a pion error into one of the package's sentinels.
func (t *transform) mapErr(op string, err error) error {
	switch {
	case t.replayed:
		return ErrReplay
	case errors.Is(err, srtp.ErrFailedToVerifyAuthTag):
		return ErrAuth
	case errors.Is(err, srtp.ErrMKINotFound):
		return ErrUnknownMKI
	case isExhausted(err):
		return ErrExhausted
	default:
		// Rare (for example a cryptex header extension we do not
		// negotiate): keep pion's reason.
		return fmt.Errorf("%s: %w: %w", op, ErrMalformed, err)
	}
}

func isExhausted(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "exceeded the maximum number of packets" {
			return true
		}
	}
	return false
}
