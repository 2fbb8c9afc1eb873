package pktio

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// sumRef is RFC 1071's checksum, one 16-bit word at a time.
func sumRef(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

func TestSumMatchesRFC1071(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 300 {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if n%7 == 0 {
			for i := range b {
				b[i] = 0xff // worst case for carries
			}
		}
		if got, want := Fold(Sum(0, b)), sumRef(b); got != want {
			t.Fatalf("len %d: Fold(Sum) = %#04x, want %#04x", n, got, want)
		}
	}
}

func TestChecksumVerifies(t *testing.T) {
	// An IPv4 header from RFC 1071's example style: the checksum written
	// into it makes the header sum to 0xffff.
	h := []byte{0x45, 0, 0, 0x54, 0, 0, 0x40, 0, 0x40, 0x11, 0, 0, 198, 18, 0, 2, 198, 18, 1, 1}
	binary.BigEndian.PutUint16(h[10:], Checksum(Sum(0, h)))
	if got := Fold(Sum(0, h)); got != 0xffff {
		t.Fatalf("header sums to %#04x with its checksum, want 0xffff", got)
	}
	if got := Checksum(0xffff); got != 0xffff {
		t.Fatalf("Checksum(0xffff) = %#04x, want 0xffff (a computed 0 is sent as 0xffff)", got)
	}
}

func TestSumNoAlloc(t *testing.T) {
	b := make([]byte, 200)
	if n := testing.AllocsPerRun(100, func() { _ = Checksum(Sum(0, b)) }); n != 0 {
		t.Fatalf("%v allocations per checksum, want 0", n)
	}
}

func BenchmarkSum200(b *testing.B) {
	p := make([]byte, 200)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		_ = Checksum(Sum(0, p))
	}
}

// TestSumComposes: a datagram summed in pieces (each but the last of
// even length, as Sum requires), with a pseudo-header's small words
// added, folds to the sum of the whole.
func TestSumComposes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := range 400 {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if n%5 == 0 {
			for i := range b {
				b[i] = 0xff
			}
		}
		cut := rng.IntN(n+1) &^ 1
		got := Fold(Sum(Sum(0, b[:cut])+17+uint64(n), b[cut:]))
		want := Fold(Sum(0, b) + 17 + uint64(n))
		if ref := Fold(uint64(sumRef(b)) + 17 + uint64(n)); got != want || want != ref {
			t.Fatalf("len %d cut %d: pieces %#04x, whole %#04x, RFC 1071 %#04x", n, cut, got, want, ref)
		}
	}
}

func FuzzSum(f *testing.F) {
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Fold(Sum(0, b)), sumRef(b); got != want {
			t.Fatalf("Fold(Sum(%x)) = %#04x, want %#04x", b, got, want)
		}
	})
}
