package sdes

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// FuzzParse checks that Parse never panics and that whatever it accepts
// marshals to an attribute that parses back to the same value.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR|2^20|1:32",
		"a=crypto:2 AES_CM_128_HMAC_SHA1_32 inline:NzB4d1BINUAvLEw6UzF3WSJ+PSdFcGdUJShpX1Zj|2^20|1:4 KDR=0",
		"1 AEAD_AES_128_GCM inline:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGw",
		"1 AES_CM_128_HMAC_SHA1_80 inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR;inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		c, err := Parse(in)
		if err != nil {
			return
		}
		out, err := c.Marshal()
		if err != nil {
			t.Fatalf("Parse(%q) accepted %+v but Marshal: %v", in, c, err)
		}
		c2, err := Parse(out)
		if err != nil {
			t.Fatalf("Marshal output %q does not parse: %v", out, err)
		}
		if d := cmp.Diff(c2, c); d != "" {
			t.Fatalf("round trip of %q via %q, -got +want:\n%s", in, out, d)
		}
		_ = c.Supported()
	})
}
