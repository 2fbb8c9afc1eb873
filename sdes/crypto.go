package sdes

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"math/big"
	"math/bits"
	"strconv"
	"strings"
)

// Errors wrapped by Parse, Marshal, Generate and Supported; callers branch on
// them with errors.Is (an unknown suite in an offer is skipped, not fatal).
var (
	ErrSyntax        = errors.New("malformed crypto attribute")
	ErrUnknownSuite  = errors.New("unknown crypto-suite")
	ErrKeyLength     = errors.New("wrong key||salt length for the suite")
	ErrMultipleKeys  = errors.New("multiple key-params in one attribute are not supported")
	ErrLifetime      = errors.New("invalid key lifetime")
	ErrMKI           = errors.New("invalid MKI")
	ErrSessionParam  = errors.New("unsupported session parameter")
	errTagRange      = errors.New("tag must be 1 to 999999999")
	errMKILenRange   = errors.New("MKI length must be 1 to 128 bytes")
	errMKIValueRange = errors.New("MKI value does not fit its length")
)

// MaxMKILen is the longest MKI RFC 4568 allows, in bytes.
const MaxMKILen = 128

// Crypto is one a=crypto attribute. The zero value is not valid; build one
// with Parse or Generate, or fill every field but Lifetime, MKI and
// SessionParams. A Crypto is a plain value: safe to read from several
// goroutines, not to modify concurrently.
type Crypto struct {
	// Tag identifies the attribute in an offer/answer (1 to 999999999).
	Tag int
	// Suite is the crypto-suite.
	Suite Suite
	// Key and Salt are the master key and master salt, of exactly
	// Suite.KeyLen and Suite.SaltLen bytes.
	Key, Salt []byte
	// Lifetime is the master key lifetime in packets; 0 when the
	// attribute gives none (the suite maximum applies, 2^48).
	Lifetime uint64
	// MKI is the master key identifier exactly as it appears on the wire
	// (its value big-endian in the signalled length); nil when absent.
	MKI []byte
	// SessionParams are the session parameters (e.g. "KDR=0", "WSH=128"),
	// verbatim and in order; nil when absent.
	SessionParams []string
}

// Parse parses an a=crypto attribute. It accepts the whole SDP line
// ("a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:..."), the attribute without
// "a=" ("crypto:1 ..."), or just its value ("1 ..."); surrounding white space
// and a trailing CRLF are ignored.
func Parse(attr string) (*Crypto, error) {
	s := strings.TrimSpace(attr)
	s = strings.TrimPrefix(s, "a=")
	s = strings.TrimPrefix(s, "crypto:")
	f := strings.Fields(s)
	if len(f) < 3 {
		return nil, fmt.Errorf("need \"<tag> <suite> inline:<key>\", got %d fields: %w", len(f), ErrSyntax)
	}
	c := &Crypto{}
	tag, err := parseTag(f[0])
	if err != nil {
		return nil, err
	}
	c.Tag = tag
	if c.Suite, err = ParseSuite(f[1]); err != nil {
		return nil, err
	}
	if err := c.parseKeyParams(f[2]); err != nil {
		return nil, err
	}
	if len(f) > 3 {
		c.SessionParams = append([]string(nil), f[3:]...)
	}
	return c, nil
}

func parseTag(s string) (int, error) {
	if len(s) == 0 || len(s) > 9 || !allDigits(s) {
		return 0, fmt.Errorf("tag %q: %w: %w", truncate(s), ErrSyntax, errTagRange)
	}
	n, _ := strconv.Atoi(s) // at most 9 digits: cannot overflow
	if n == 0 {
		return 0, fmt.Errorf("tag %q: %w: %w", s, ErrSyntax, errTagRange)
	}
	return n, nil
}

func (c *Crypto) parseKeyParams(s string) error {
	if strings.Contains(s, ";") {
		return fmt.Errorf("key-params %q: %w", truncate(s), ErrMultipleKeys)
	}
	method, info, ok := strings.Cut(s, ":")
	if !ok || method != "inline" {
		return fmt.Errorf("key-params %q: key method must be \"inline\": %w", truncate(s), ErrSyntax)
	}
	parts := strings.Split(info, "|")
	if len(parts) > 3 {
		return fmt.Errorf("key-params %q: more than key|lifetime|MKI: %w", truncate(s), ErrSyntax)
	}
	keySalt, err := decodeBase64(parts[0])
	if err != nil {
		return fmt.Errorf("inline key: %w: %w", ErrSyntax, err)
	}
	if c.Key, c.Salt, err = SplitKeySalt(c.Suite, keySalt); err != nil {
		return err
	}
	sawLifetime, sawMKI := false, false
	for _, p := range parts[1:] {
		if strings.Contains(p, ":") {
			if sawMKI {
				return fmt.Errorf("key-params: two MKI fields: %w", ErrMKI)
			}
			sawMKI = true
			if c.MKI, err = parseMKI(p); err != nil {
				return err
			}
			continue
		}
		if sawLifetime || sawMKI {
			return fmt.Errorf("key-params: lifetime %q must come once, before the MKI: %w", truncate(p), ErrLifetime)
		}
		sawLifetime = true
		if c.Lifetime, err = parseLifetime(p, c.Suite); err != nil {
			return err
		}
	}
	return nil
}

// decodeBase64 accepts standard base64 with or without padding.
func decodeBase64(s string) ([]byte, error) {
	if s == "" {
		return nil, errors.New("empty")
	}
	if strings.HasSuffix(s, "=") {
		return base64.StdEncoding.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(s)
}

func parseLifetime(s string, suite Suite) (uint64, error) {
	var n uint64
	switch {
	case strings.HasPrefix(s, "2^"):
		e := s[2:]
		if e == "" || len(e) > 2 || !allDigits(e) {
			return 0, fmt.Errorf("lifetime %q: %w", truncate(s), ErrLifetime)
		}
		k, _ := strconv.Atoi(e)
		if k > 63 {
			return 0, fmt.Errorf("lifetime %q: exceeds %s maximum 2^48: %w", s, suite, ErrLifetime)
		}
		n = 1 << k
	case s != "" && len(s) <= 20 && allDigits(s):
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("lifetime %q: exceeds %s maximum 2^48: %w", s, suite, ErrLifetime)
		}
		n = v
	default:
		return 0, fmt.Errorf("lifetime %q: want decimal or 2^n: %w", truncate(s), ErrLifetime)
	}
	if n == 0 {
		return 0, fmt.Errorf("lifetime %q: must be positive: %w", s, ErrLifetime)
	}
	if n > suite.MaxLifetime() {
		return 0, fmt.Errorf("lifetime %q: exceeds %s maximum 2^48: %w", s, suite, ErrLifetime)
	}
	return n, nil
}

func parseMKI(s string) ([]byte, error) {
	v, l, _ := strings.Cut(s, ":")
	if v == "" || len(v) > 310 || !allDigits(v) || l == "" || len(l) > 3 || !allDigits(l) {
		return nil, fmt.Errorf("MKI %q: want <decimal value>:<length in bytes>: %w", truncate(s), ErrMKI)
	}
	n, _ := strconv.Atoi(l)
	if n < 1 || n > MaxMKILen {
		return nil, fmt.Errorf("MKI %q: %w: %w", truncate(s), ErrMKI, errMKILenRange)
	}
	val, ok := new(big.Int).SetString(v, 10)
	if !ok || val.BitLen() > 8*n {
		return nil, fmt.Errorf("MKI %q: %w: %w", truncate(s), ErrMKI, errMKIValueRange)
	}
	return val.FillBytes(make([]byte, n)), nil
}

// SplitKeySalt splits a decoded inline key (key||salt) into master key and
// master salt for suite, checking its length. The results alias keySalt.
func SplitKeySalt(suite Suite, keySalt []byte) (key, salt []byte, err error) {
	if !suite.Valid() {
		return nil, nil, fmt.Errorf("%s: %w", suite, ErrUnknownSuite)
	}
	kl, sl := suite.KeyLen(), suite.SaltLen()
	if len(keySalt) != kl+sl {
		return nil, nil, fmt.Errorf("inline key: %d bytes, %s needs %d (%d key + %d salt): %w",
			len(keySalt), suite, kl+sl, kl, sl, ErrKeyLength)
	}
	return keySalt[:kl:kl], keySalt[kl:], nil
}

// DecodeKey decodes a base64 key||salt (padded or not), as in an inline key
// or the admin API's "key" field, into master key and salt for suite.
func DecodeKey(suite Suite, b64 string) (key, salt []byte, err error) {
	b, err := decodeBase64(b64)
	if err != nil {
		return nil, nil, fmt.Errorf("key: %w: %w", ErrSyntax, err)
	}
	return SplitKeySalt(suite, b)
}

// Generate returns a Crypto for suite with a fresh master key and salt from
// crypto/rand, no lifetime, no MKI and no session parameters.
func Generate(tag int, suite Suite) (*Crypto, error) {
	if tag < 1 || tag > 999999999 {
		return nil, fmt.Errorf("tag %d: %w", tag, errTagRange)
	}
	if !suite.Valid() {
		return nil, fmt.Errorf("%s: %w", suite, ErrUnknownSuite)
	}
	b := make([]byte, suite.KeyLen()+suite.SaltLen())
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	key, salt, _ := SplitKeySalt(suite, b)
	return &Crypto{Tag: tag, Suite: suite, Key: key, Salt: salt}, nil
}

// InlineKey returns base64(key||salt) with padding, as written after
// "inline:" and accepted by DecodeKey.
func (c *Crypto) InlineKey() string {
	b := make([]byte, 0, len(c.Key)+len(c.Salt))
	b = append(append(b, c.Key...), c.Salt...)
	return base64.StdEncoding.EncodeToString(b)
}

// Validate checks that c can be marshalled: tag range, suite, key and salt
// lengths, lifetime and MKI length. It does not judge session parameters;
// see Supported.
func (c *Crypto) Validate() error {
	if c.Tag < 1 || c.Tag > 999999999 {
		return fmt.Errorf("tag %d: %w", c.Tag, errTagRange)
	}
	if !c.Suite.Valid() {
		return fmt.Errorf("%s: %w", c.Suite, ErrUnknownSuite)
	}
	if len(c.Key) != c.Suite.KeyLen() || len(c.Salt) != c.Suite.SaltLen() {
		return fmt.Errorf("key %d and salt %d bytes, %s needs %d and %d: %w",
			len(c.Key), len(c.Salt), c.Suite, c.Suite.KeyLen(), c.Suite.SaltLen(), ErrKeyLength)
	}
	if c.Lifetime > c.Suite.MaxLifetime() {
		return fmt.Errorf("lifetime %d: exceeds %s maximum 2^48: %w", c.Lifetime, c.Suite, ErrLifetime)
	}
	if c.MKI != nil && (len(c.MKI) < 1 || len(c.MKI) > MaxMKILen) {
		return fmt.Errorf("MKI of %d bytes: %w: %w", len(c.MKI), ErrMKI, errMKILenRange)
	}
	for _, p := range c.SessionParams {
		if p == "" || strings.ContainsAny(p, " \t\r\n") {
			return fmt.Errorf("session parameter %q: %w", truncate(p), ErrSyntax)
		}
	}
	return nil
}

// Marshal returns the attribute value, "<tag> <suite> inline:<key>[|lifetime]
// [|mki:len][ params]", without the "a=crypto:" prefix (SDP libraries keep the
// attribute name apart). A lifetime that is a power of two is written 2^n.
func (c *Crypto) Marshal() (string, error) {
	if err := c.Validate(); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(strconv.Itoa(c.Tag))
	b.WriteByte(' ')
	b.WriteString(c.Suite.String())
	b.WriteString(" inline:")
	b.WriteString(c.InlineKey())
	if c.Lifetime != 0 {
		b.WriteByte('|')
		if bits.OnesCount64(c.Lifetime) == 1 {
			b.WriteString("2^")
			b.WriteString(strconv.Itoa(bits.TrailingZeros64(c.Lifetime)))
		} else {
			b.WriteString(strconv.FormatUint(c.Lifetime, 10))
		}
	}
	if c.MKI != nil {
		b.WriteByte('|')
		b.WriteString(new(big.Int).SetBytes(c.MKI).String())
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(len(c.MKI)))
	}
	for _, p := range c.SessionParams {
		b.WriteByte(' ')
		b.WriteString(p)
	}
	return b.String(), nil
}

// String returns the whole SDP line "a=crypto:..." or, if c is invalid, a
// description of the error.
func (c *Crypto) String() string {
	v, err := c.Marshal()
	if err != nil {
		return "invalid crypto attribute: " + err.Error()
	}
	return "a=crypto:" + v
}

// Supported returns nil if relayd's SRTP data plane can honour every session
// parameter of c, or an error wrapping ErrSessionParam naming the first it
// cannot: KDR other than 0, UNENCRYPTED_SRTP, UNENCRYPTED_SRTCP,
// UNAUTHENTICATED_SRTP, FEC_KEY and unknown parameters. WSH and FEC_ORDER
// are accepted (advisory without FEC).
func (c *Crypto) Supported() error {
	for _, p := range c.SessionParams {
		name, val, _ := strings.Cut(p, "=")
		switch name {
		case "KDR":
			if val != "0" {
				return fmt.Errorf("%q: key derivation rate other than 0: %w", truncate(p), ErrSessionParam)
			}
		case "WSH", "FEC_ORDER":
		default:
			return fmt.Errorf("%q: %w", truncate(p), ErrSessionParam)
		}
	}
	return nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// truncate keeps error messages short whatever the input.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
