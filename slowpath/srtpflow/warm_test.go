package srtpflow

import (
	"encoding/binary"
	"reflect"
	"testing"
	"unsafe"

	"github.com/relayd/relayd/sdes"
)

// TestPrefetch: an AES-CM context's warm set names the AES key schedule,
// the HMAC and the HMAC's keyed states, the objects every packet reads;
// they stay the ones packets read (the HMAC keeps its marshalled states
// from its first Reset on, so a walk after many packets finds the same
// lines); Prefetch allocates nothing and changes nothing a packet sees.
// The GCM suites, which pion protects, have nothing to warm.
func TestPrefetch(t *testing.T) {
	for _, s := range sdes.Suites {
		t.Run(s.String(), func(t *testing.T) {
			e, d := newPair(t, s, nil)
			if s.AEAD() {
				e.Prefetch()
				d.Prefetch()
				if e.t.cm.warm.n != 0 {
					t.Fatalf("GCM: %d lines to warm, want none", e.t.cm.warm.n)
				}
				return
			}
			for name, c := range map[string]*cmRTP{"encrypter": &e.t.cm, "decrypter": &d.t.cm} {
				w := &c.warm
				if w.n < 14 {
					t.Errorf("%s: %d lines to warm, want the context's, the key schedule's and the HMAC's (14 or more)", name, w.n)
				}
				has := func(p unsafe.Pointer) bool {
					for _, l := range w.lines[:w.n] {
						if l == p {
							return true
						}
					}
					return false
				}
				// The key schedule packets read: the CTR stream's copy of
				// it, and the stream's counter.
				if c.ctr.stream == nil {
					t.Fatalf("%s: no CTR stream (TestCTRStream)", name)
				}
				sched, _, _ := ctrObject(c.ctr.stream)
				if !has(unsafe.Pointer(c)) || !has(sched) || !has(unsafe.Pointer(c.ctr.lo)) ||
					!has(reflect.ValueOf(c.mac).UnsafePointer()) {
					t.Errorf("%s: the context, the CTR stream's key schedule or counter, or the HMAC is not among the lines to warm", name)
				}
			}
			plain := rtpPacket(0, 42)
			buf := make([]byte, 0, 256)
			out := make([]byte, 0, 256)
			for seq := range uint16(20) {
				p := buf[:len(plain)]
				copy(p, plain)
				binary.BigEndian.PutUint16(p[2:], seq)
				e.Prefetch()
				enc, err := e.EncryptRTP(p, p)
				if err != nil {
					t.Fatal(err)
				}
				d.Prefetch()
				got, err := d.DecryptRTP(out, enc)
				if err != nil {
					t.Fatalf("packet %d after Prefetch: %v", seq, err)
				}
				binary.BigEndian.PutUint16(plain[2:], seq)
				if string(got) != string(plain) {
					t.Fatalf("packet %d: decrypted differs from the plain packet", seq)
				}
			}
			if again := e.t.cm.warmLines(); again != e.t.cm.warm {
				t.Errorf("after 20 packets the encrypter's objects are not the ones warmed: %v, warmed %v",
					again.lines[:again.n], e.t.cm.warm.lines[:e.t.cm.warm.n])
			}
			if n := testing.AllocsPerRun(1000, func() { e.Prefetch(); d.Prefetch() }); n != 0 {
				t.Errorf("Prefetch: %v allocs", n)
			}
		})
	}
}
