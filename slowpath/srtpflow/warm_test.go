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
				// has reports whether the lines of the size bytes at p
				// are all in the set.
				has := func(p unsafe.Pointer, size uintptr) bool {
					for l := uintptr(p) &^ (cacheLine - 1); l < uintptr(p)+size; l += cacheLine {
						if !w.has(l) {
							return false
						}
					}
					return true
				}
				// The context's hot fields are on two lines, both warmed.
				hot := uintptr(unsafe.Pointer(c))
				if lines := (hot+cmHotBytes-1)/cacheLine - hot/cacheLine + 1; lines != 2 || !has(unsafe.Pointer(c), cmHotBytes) {
					t.Errorf("%s: the context at %#x: its %d hot bytes are on %d lines, want 2 and all warmed", name, hot, cmHotBytes, lines)
				}
				// The key schedule packets read: the CTR stream's copy of
				// it, up to the key's last round key, and the stream's
				// counter.
				if c.ctr.stream == nil {
					t.Fatalf("%s: no CTR stream (TestCTRStream)", name)
				}
				if ctrEnc == 0 {
					t.Fatalf("%s: the CTR's round keys were not found", name)
				}
				sched, _, _ := ctrObject(c.ctr.stream)
				used := ctrEnc + uintptr(s.KeyLen()/4+7)*16
				if !has(sched, used) || !has(c.ctr.counter()) {
					t.Errorf("%s: the CTR stream's key schedule (%d bytes) or counter is not among the lines to warm", name, used)
				}
				// The line after the schedule's, unless it is the counter's.
				next := (uintptr(sched) + used + cacheLine - 1) &^ (cacheLine - 1)
				counterLine := (uintptr(sched) + uintptr(c.ctr.at.lo)) &^ (cacheLine - 1)
				if next < counterLine && w.has(next) {
					t.Errorf("%s: the line after the %d-bit key's round keys is warmed", name, 8*s.KeyLen())
				}
				// The HMAC and each of its keyed states, whole.
				mac := reflect.ValueOf(c.mac)
				if !has(mac.UnsafePointer(), mac.Type().Elem().Size()) {
					t.Errorf("%s: the HMAC is not among the lines to warm", name)
				}
				hm := mac.Elem()
				for _, f := range []string{"inner", "outer", "ipad", "opad"} {
					v := hm.FieldByName(f)
					var size uintptr
					switch v.Kind() {
					case reflect.Interface:
						v = v.Elem()
						size = v.Type().Elem().Size()
					case reflect.Slice:
						size = uintptr(v.Len())
					}
					if !has(v.UnsafePointer(), size) {
						t.Errorf("%s: the HMAC's %s (%d bytes) is not whole among the lines to warm", name, f, size)
					}
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
			if again := e.t.cm.warmLines(s.KeyLen()); again != e.t.cm.warm {
				t.Errorf("after 20 packets the encrypter's objects are not the ones warmed: %v, warmed %v",
					again.lines[:again.n], e.t.cm.warm.lines[:e.t.cm.warm.n])
			}
			if n := testing.AllocsPerRun(1000, func() { e.Prefetch(); d.Prefetch() }); n != 0 {
				t.Errorf("Prefetch: %v allocs", n)
			}
		})
	}
}
