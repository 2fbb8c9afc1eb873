package siptorture

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestLoad(t *testing.T) {
	msgs, err := Load("../../control/sip/testdata/torture")
	if err != nil {
		t.Fatal(err)
	}
	// RFC 4475's 49 messages and relayd's own.
	if len(msgs) < 49 {
		t.Fatalf("%d messages", len(msgs))
	}
	if _, err := Load(t.TempDir()); err == nil {
		t.Error("an empty directory loaded")
	}
}

// A seed names one sequence: the torture test's failures replay in the
// soak and the other way round.
func TestGarbageSeeded(t *testing.T) {
	base := [][]byte{[]byte("INVITE sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\n\r\n")}
	orig := bytes.Clone(base[0])
	a, b := rand.New(rand.NewPCG(7, 8)), rand.New(rand.NewPCG(7, 8))
	kinds := [3]int{}
	for i := range 300 {
		x, y := Garbage(a, base, i), Garbage(b, base, i)
		if !bytes.Equal(x, y) {
			t.Fatalf("datagram %d differs between two runs of one seed", i)
		}
		if len(x) == 0 && i%3 == 0 {
			t.Fatalf("datagram %d: random bytes, none", i)
		}
		if i%3 == 2 && !bytes.HasPrefix(x, []byte("INVITE sip:x@y SIP/2.0\r\nVia: ")) {
			t.Fatalf("datagram %d: %q", i, x)
		}
		if bytes.Equal(x, orig) {
			kinds[i%3]++
		}
	}
	if !bytes.Equal(base[0], orig) {
		t.Error("Mangle changed its input")
	}
	if kinds[1] > 10 {
		t.Errorf("%d of 100 mangled messages unchanged", kinds[1])
	}
}
