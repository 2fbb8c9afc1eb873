package sdes

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func mustB64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseRFC4568Examples(t *testing.T) {
	// Key strings from RFC 4568 sections 4, 6.1 and 9.
	k1 := "PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR"
	k2 := "d0RmdmcmVCspeEc3QGZiNWpVLFJhQX1cfHAwJSoj"
	k3 := "NzB4d1BINUAvLEw6UzF3WSJ+PSdFcGdUJShpX1Zj"
	mki := func(v byte, n int) []byte { b := make([]byte, n); b[n-1] = v; return b }
	tests := []struct {
		in   string
		want Crypto
	}{
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k1 + "|2^20|1:32",
			Crypto{Tag: 1, Suite: AES_CM_128_HMAC_SHA1_80, Lifetime: 1 << 20, MKI: mki(1, 32)}},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k2 + "|2^20|1:32\r\n",
			Crypto{Tag: 1, Suite: AES_CM_128_HMAC_SHA1_80, Lifetime: 1 << 20, MKI: mki(1, 32)}},
		{"crypto:1 AES_CM_128_HMAC_SHA1_32 inline:" + k3 + "|2^20|1:32",
			Crypto{Tag: 1, Suite: AES_CM_128_HMAC_SHA1_32, Lifetime: 1 << 20, MKI: mki(1, 32)}},
		{"1 AES_CM_128_HMAC_SHA1_80 inline:" + k1 + "|2^20",
			Crypto{Tag: 1, Suite: AES_CM_128_HMAC_SHA1_80, Lifetime: 1 << 20}},
		{"2 AES_CM_128_HMAC_SHA1_80 inline:" + k1 + "|1048576|7:1 KDR=0 WSH=64",
			Crypto{Tag: 2, Suite: AES_CM_128_HMAC_SHA1_80, Lifetime: 1048576, MKI: []byte{7},
				SessionParams: []string{"KDR=0", "WSH=64"}}},
		{"3 AES_CM_128_HMAC_SHA1_80 inline:" + k1 + "|258:2",
			Crypto{Tag: 3, Suite: AES_CM_128_HMAC_SHA1_80, MKI: []byte{1, 2}}},
		{"  4   AES_CM_128_HMAC_SHA1_80   inline:" + k1 + "  ",
			Crypto{Tag: 4, Suite: AES_CM_128_HMAC_SHA1_80}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			ks := mustB64(t, strings.Fields(strings.SplitN(strings.TrimSpace(tt.in), "inline:", 2)[1])[0][:40])
			tt.want.Key, tt.want.Salt = ks[:16], ks[16:]
			if d := cmp.Diff(*got, tt.want); d != "" {
				t.Errorf("-got +want:\n%s", d)
			}
			if err := got.Supported(); err != nil {
				t.Errorf("Supported: %v", err)
			}
		})
	}
}

func TestParseSuitesAndPadding(t *testing.T) {
	for _, s := range Suites {
		c, err := Generate(5, s)
		if err != nil {
			t.Fatal(err)
		}
		padded := c.InlineKey()
		raw := strings.TrimRight(padded, "=")
		for _, k := range []string{padded, raw} {
			got, err := Parse("a=crypto:5 " + s.String() + " inline:" + k)
			if err != nil {
				t.Fatalf("%s %q: %v", s, k, err)
			}
			if !bytes.Equal(got.Key, c.Key) || !bytes.Equal(got.Salt, c.Salt) || got.Suite != s {
				t.Errorf("%s %q: got %+v", s, k, got)
			}
			if len(got.Key) != s.KeyLen() || len(got.Salt) != s.SaltLen() {
				t.Errorf("%s: key %d salt %d", s, len(got.Key), len(got.Salt))
			}
		}
		line := c.String()
		got, err := Parse(line)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(got, c); d != "" {
			t.Errorf("%s round trip -got +want:\n%s", line, d)
		}
		key, salt, err := DecodeKey(s, raw)
		if err != nil || !bytes.Equal(key, c.Key) || !bytes.Equal(salt, c.Salt) {
			t.Errorf("DecodeKey(%s): %v", s, err)
		}
	}
}

func TestGenerateIsRandom(t *testing.T) {
	a, _ := Generate(1, AEAD_AES_256_GCM)
	b, _ := Generate(1, AEAD_AES_256_GCM)
	if bytes.Equal(a.Key, b.Key) || bytes.Equal(a.Salt, b.Salt) {
		t.Fatal("two generated keys are equal")
	}
	if _, err := Generate(0, AEAD_AES_256_GCM); err == nil {
		t.Error("Generate accepted tag 0")
	}
	if _, err := Generate(1, 0); !errors.Is(err, ErrUnknownSuite) {
		t.Errorf("Generate(invalid suite) = %v", err)
	}
}

func TestMarshal(t *testing.T) {
	c := &Crypto{Tag: 9, Suite: AES_CM_128_HMAC_SHA1_80, Key: make([]byte, 16), Salt: make([]byte, 14),
		Lifetime: 1 << 31, MKI: []byte{0, 0, 1, 0}, SessionParams: []string{"WSH=128"}}
	got, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := "9 AES_CM_128_HMAC_SHA1_80 inline:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA|2^31|256:4 WSH=128"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	c.Lifetime = 1000
	if got, _ := c.Marshal(); !strings.Contains(got, "|1000|256:4") {
		t.Errorf("decimal lifetime: %s", got)
	}
	for name, bad := range map[string]func(*Crypto){
		"tag":      func(c *Crypto) { c.Tag = 0 },
		"suite":    func(c *Crypto) { c.Suite = 77 },
		"key":      func(c *Crypto) { c.Key = c.Key[:15] },
		"lifetime": func(c *Crypto) { c.Lifetime = 1<<48 + 1 },
		"mki":      func(c *Crypto) { c.MKI = []byte{} },
		"param":    func(c *Crypto) { c.SessionParams = []string{"a b"} },
	} {
		cc := *c
		bad(&cc)
		if _, err := cc.Marshal(); err == nil {
			t.Errorf("%s: Marshal accepted an invalid Crypto", name)
		}
	}
}

func TestParseErrors(t *testing.T) {
	k := "PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR"
	tests := []struct {
		in      string
		want    error
		mention string
	}{
		{"", ErrSyntax, "fields"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80", ErrSyntax, "fields"},
		{"a=crypto:x AES_CM_128_HMAC_SHA1_80 inline:" + k, ErrSyntax, "tag"},
		{"a=crypto:0 AES_CM_128_HMAC_SHA1_80 inline:" + k, ErrSyntax, "tag"},
		{"a=crypto:1234567890 AES_CM_128_HMAC_SHA1_80 inline:" + k, ErrSyntax, "tag"},
		{"a=crypto:1 AES_CM_192_HMAC_SHA1_80 inline:" + k, ErrUnknownSuite, "AES_CM_192"},
		{"a=crypto:1 aes_cm_128_hmac_sha1_80 inline:" + k, ErrUnknownSuite, "suite"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 uri:" + k, ErrSyntax, "inline"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + ";inline:" + k, ErrMultipleKeys, "key-params"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:%%%%", ErrSyntax, "inline key"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:", ErrSyntax, "inline key"},
		{"a=crypto:1 AES_256_CM_HMAC_SHA1_80 inline:" + k, ErrKeyLength, "46"},
		{"a=crypto:1 AEAD_AES_128_GCM inline:" + k, ErrKeyLength, "28"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|2^49", ErrLifetime, "2^48"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|2^99", ErrLifetime, "lifetime"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|0", ErrLifetime, "positive"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|99999999999999999999999", ErrLifetime, "lifetime"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|2^", ErrLifetime, "lifetime"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|1:0", ErrMKI, "length"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|1:129", ErrMKI, "length"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|256:1", ErrMKI, "fit"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|x:1", ErrMKI, "MKI"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|1:1|2^20", ErrLifetime, "before the MKI"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|1:1|2:1", ErrMKI, "two"},
		{"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + k + "|2^20|1:1|5", ErrSyntax, "more than"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.in)
		if !errors.Is(err, tt.want) {
			t.Errorf("Parse(%q) = %v, want %v", tt.in, err, tt.want)
			continue
		}
		if !strings.Contains(err.Error(), tt.mention) {
			t.Errorf("Parse(%q) = %q, should mention %q", tt.in, err, tt.mention)
		}
	}
}

func TestSupported(t *testing.T) {
	base := "1 AES_CM_128_HMAC_SHA1_80 inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR "
	for _, p := range []string{"KDR=23", "UNENCRYPTED_SRTP", "UNENCRYPTED_SRTCP", "UNAUTHENTICATED_SRTP",
		"FEC_KEY=inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR", "FOO=1"} {
		c, err := Parse(base + p)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Supported(); !errors.Is(err, ErrSessionParam) || !strings.Contains(err.Error(), p[:3]) {
			t.Errorf("%s: Supported() = %v", p, err)
		}
	}
}

func TestSuiteNames(t *testing.T) {
	for _, s := range Suites {
		got, err := ParseSuite(s.String())
		if err != nil || got != s {
			t.Errorf("ParseSuite(%s) = %v, %v", s, got, err)
		}
	}
	if Suite(0).Valid() || Suite(0).KeyLen() != 0 || Suite(200).String() != "Suite(200)" {
		t.Error("invalid suites must report zero lengths and a Suite(n) name")
	}
}
