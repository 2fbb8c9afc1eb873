package sdes

import "fmt"

// Suite is an SRTP crypto-suite that can be negotiated with SDES. The zero
// value is not a valid suite.
type Suite uint8

// The suites relayd supports, named as in SDP.
const (
	// AES_CM_128_HMAC_SHA1_80 is the RFC 4568 default suite.
	AES_CM_128_HMAC_SHA1_80 Suite = iota + 1 //nolint:revive // SDP spelling
	// AES_CM_128_HMAC_SHA1_32 is AES_CM_128 with a 32-bit SRTP tag (RFC 4568).
	AES_CM_128_HMAC_SHA1_32 //nolint:revive
	// AES_256_CM_HMAC_SHA1_80 is AES-256 counter mode (RFC 6188).
	AES_256_CM_HMAC_SHA1_80 //nolint:revive
	// AES_256_CM_HMAC_SHA1_32 is AES-256 counter mode with a 32-bit tag (RFC 6188).
	AES_256_CM_HMAC_SHA1_32 //nolint:revive
	// AEAD_AES_128_GCM is AES-128 GCM with a 16-byte tag (RFC 7714).
	AEAD_AES_128_GCM //nolint:revive
	// AEAD_AES_256_GCM is AES-256 GCM with a 16-byte tag (RFC 7714).
	AEAD_AES_256_GCM //nolint:revive
)

type suiteInfo struct {
	name    string
	keyLen  int
	saltLen int
	rtpTag  int // SRTP auth tag, or GCM tag
	rtcpTag int // SRTCP auth tag, or GCM tag
	aead    bool
	maxLife uint64 // maximum master key lifetime in SRTP packets
}

var suites = [...]suiteInfo{
	AES_CM_128_HMAC_SHA1_80: {"AES_CM_128_HMAC_SHA1_80", 16, 14, 10, 10, false, 1 << 48},
	AES_CM_128_HMAC_SHA1_32: {"AES_CM_128_HMAC_SHA1_32", 16, 14, 4, 10, false, 1 << 48},
	AES_256_CM_HMAC_SHA1_80: {"AES_256_CM_HMAC_SHA1_80", 32, 14, 10, 10, false, 1 << 48},
	AES_256_CM_HMAC_SHA1_32: {"AES_256_CM_HMAC_SHA1_32", 32, 14, 4, 10, false, 1 << 48},
	AEAD_AES_128_GCM:        {"AEAD_AES_128_GCM", 16, 12, 16, 16, true, 1 << 48},
	AEAD_AES_256_GCM:        {"AEAD_AES_256_GCM", 32, 12, 16, 16, true, 1 << 48},
}

// Suites lists every supported suite, strongest last. Callers must not modify it.
var Suites = []Suite{
	AES_CM_128_HMAC_SHA1_80, AES_CM_128_HMAC_SHA1_32,
	AES_256_CM_HMAC_SHA1_80, AES_256_CM_HMAC_SHA1_32,
	AEAD_AES_128_GCM, AEAD_AES_256_GCM,
}

// ParseSuite returns the suite with the given SDP name (case-sensitive, as
// RFC 4568 registers them). It returns an error wrapping ErrUnknownSuite for
// any other name.
func ParseSuite(name string) (Suite, error) {
	for _, s := range Suites {
		if suites[s].name == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("suite %q: %w", truncate(name), ErrUnknownSuite)
}

// Valid reports whether s is one of the supported suites.
func (s Suite) Valid() bool { return s > 0 && int(s) < len(suites) }

func (s Suite) info() suiteInfo {
	if !s.Valid() {
		return suiteInfo{}
	}
	return suites[s]
}

// String returns the SDP name of s, or "Suite(n)" for an invalid value.
func (s Suite) String() string {
	if !s.Valid() {
		return fmt.Sprintf("Suite(%d)", uint8(s))
	}
	return suites[s].name
}

// KeyLen is the master key length in bytes (0 for an invalid suite).
func (s Suite) KeyLen() int { return s.info().keyLen }

// SaltLen is the master salt length in bytes (0 for an invalid suite).
func (s Suite) SaltLen() int { return s.info().saltLen }

// AEAD reports whether s is an AEAD (GCM) suite.
func (s Suite) AEAD() bool { return s.info().aead }

// RTPTagLen is the number of bytes the suite appends to an RTP packet
// (authentication tag or GCM tag), not counting any MKI.
func (s Suite) RTPTagLen() int { return s.info().rtpTag }

// RTCPTagLen is the number of bytes of authentication (or GCM) tag the suite
// appends to an RTCP packet, not counting the 4-byte SRTCP index or any MKI.
func (s Suite) RTCPTagLen() int { return s.info().rtcpTag }

// MaxLifetime is the largest key lifetime, in SRTP packets, the suite allows.
func (s Suite) MaxLifetime() uint64 { return s.info().maxLife }
