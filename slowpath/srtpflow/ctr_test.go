package srtpflow

import (
	"bytes"
	"crypto/aes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/relayd/relayd/sdes"
)

// TestCTRStream: on this toolchain the standard library's CTR can be moved
// to a packet's counter (the fast keystream is in use, not the fallback),
// and a context's keystream through it equals the one made a block at a
// time, for random counters and lengths, with no allocation.
func TestCTRStream(t *testing.T) {
	if _, ok := ctrFields(); !ok {
		t.Fatal("aes.CTR's counter and offset not found or not checked: every AES-CM packet would take the block-at-a-time keystream")
	}
	for _, suite := range []sdes.Suite{sdes.AES_CM_128_HMAC_SHA1_80, sdes.AES_256_CM_HMAC_SHA1_80} {
		key := make([]byte, suite.KeyLen())
		for i := range key {
			key[i] = byte(i + 3)
		}
		fast := &cmRTP{}
		if err := fast.init(Config{Suite: suite, Key: key, Salt: make([]byte, 14)}); err != nil {
			t.Fatal(err)
		}
		if fast.ctr.stream == nil {
			t.Fatalf("%s: the context has no CTR stream", suite)
		}
		slow := *fast
		slow.ctr = ctrStream{}
		r := rand.New(rand.NewPCG(7, 8))
		buf := make([]byte, 1500)
		for range 2000 {
			n := r.IntN(len(buf) + 1)
			src := buf[:n]
			for i := range src {
				src[i] = byte(r.Uint32())
			}
			ssrc, roc, seq := r.Uint32(), r.Uint32(), uint16(r.Uint32())
			want := make([]byte, n)
			slow.xorKeystream(want, src, ssrc, roc, seq)
			got := make([]byte, n)
			fast.xorKeystream(got, src, ssrc, roc, seq)
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: ssrc %#x roc %d seq %d, %d bytes: the CTR stream's keystream differs from the blocks'", suite, ssrc, roc, seq, n)
			}
			// In place, as packets are decrypted.
			fast.xorKeystream(src, src, ssrc, roc, seq)
			if !bytes.Equal(src, want) {
				t.Fatalf("%s: in place: the keystream differs", suite)
			}
		}
		p := make([]byte, 160)
		if a := testing.AllocsPerRun(1000, func() { fast.xorKeystream(p, p, 1, 2, 3) }); a != 0 {
			t.Errorf("%s: %v allocations per keystream", suite, a)
		}
	}
	// A layout with the counter's halves swapped gives another keystream:
	// findCTRLayout's comparison with cipher.NewCTR tells a wrong layout.
	blk, err := aes.NewCipher(make([]byte, 16))
	if err != nil {
		t.Fatal(err)
	}
	l, _ := ctrFields()
	l.lo, l.hi = l.hi, l.lo
	s, ok := newCTRStream(blk, l)
	if !ok {
		t.Fatal("newCTRStream refused a layout inside the object")
	}
	var iv [16]byte
	binary.BigEndian.PutUint64(iv[8:], 5)
	got := make([]byte, 32)
	s.xor(got, got, 0, 5)
	want := make([]byte, 32)
	slowBlocks(blk, iv, want)
	if bytes.Equal(got, want) {
		t.Error("swapped counter halves gave the right keystream: the check could not tell a wrong layout")
	}
}

// slowBlocks XORs the CTR keystream from iv onto b, a block at a time.
func slowBlocks(blk interface{ Encrypt(dst, src []byte) }, iv [16]byte, b []byte) {
	ctr := iv
	var ks [aes.BlockSize]byte
	for off := 0; off < len(b); off += aes.BlockSize {
		blk.Encrypt(ks[:], ctr[:])
		for i := 0; i < aes.BlockSize && off+i < len(b); i++ {
			b[off+i] ^= ks[i]
		}
		for i := len(ctr) - 1; i >= 0; i-- {
			ctr[i]++
			if ctr[i] != 0 {
				break
			}
		}
	}
}
