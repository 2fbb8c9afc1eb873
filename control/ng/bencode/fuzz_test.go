package bencode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// fuzzSeeds are added to the corpus in testdata/fuzz (ng messages as
// rtpengine and Kamailio send them, edge cases and malformed input).
var fuzzSeeds = []string{
	"0:", "4:spam", "i0e", "i-1e", "i9223372036854775807e", "i-9223372036854775808e",
	"le", "de", "l4:spami42ee", "d3:cow3:moo4:spam4:eggse", "d1:bi1e1:ai2ee",
	"d7:command4:pinge", "d6:result4:ponge", ngOffer,
	"i-0e", "i03e", "03:abc", "5:abc", "d1:ai1e1:ai2ee", "di1e1:ae", "l", "d", "i", "e", "lllllllllllllllllllllllllllllllllllllll",
	"99999999999999999999:", "i99999999999999999999e", "de\n",
}

// FuzzDecode checks that no input makes the decoder panic, that errors
// carry an offset within the input, and that every accepted input
// round-trips: decode(encode(decode(x))) equals decode(x), the encoding is
// canonical (sorted keys) and as long as x, and a canonical x encodes to
// itself.
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Unmarshal(data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v, want *Error", err, err)
			}
			if e.Offset < 0 || e.Offset > len(data) {
				t.Fatalf("error offset %d outside input of %d bytes: %v", e.Offset, len(data), err)
			}
			if v.IsValid() {
				t.Fatalf("value %v returned with error %v", v, err)
			}
		} else {
			enc, err := Append(nil, v)
			if err != nil {
				t.Fatalf("encode %v: %v", v, err)
			}
			if len(enc) != len(data) {
				t.Fatalf("encoding %q of input %q has another length", enc, data)
			}
			v2, err := (&Decoder{SortedKeys: true}).Decode(enc)
			if err != nil {
				t.Fatalf("decode encoding %q: %v", enc, err)
			}
			if !v2.Equal(v) || !v.Equal(v2) {
				t.Fatalf("round trip: %v became %v", v, v2)
			}
			if enc2, _ := Append(nil, v2); !bytes.Equal(enc2, enc) {
				t.Fatalf("encoding not stable: %q then %q", enc, enc2)
			}
			if _, err := (&Decoder{SortedKeys: true}).Decode(data); err == nil && !bytes.Equal(enc, data) {
				t.Fatalf("canonical input %q encoded as %q", data, enc)
			}
		}
		// Tight limits never accept what the defaults reject, and agree
		// on what both accept.
		lv, lerr := (&Decoder{MaxDepth: 2, MaxItems: 8, MaxSize: 64}).Decode(data)
		if lerr == nil && (err != nil || !lv.Equal(v)) {
			t.Fatalf("limited decoder gave %v, default %v (%v)", lv, v, err)
		}
	})
}

// FuzzRoundTrip builds a Value from the fuzzer's bytes, encodes it and
// checks that decoding gives it back.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 4, 's', 'p', 'a', 'm'})
	f.Add([]byte{3, 2, 0, 1, 'b', 1, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 1, 'a', 2, 1, 0, 0})
	f.Add([]byte{2, 3, 2, 1, 2, 0, 1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, data []byte) {
		g := gen{b: data}
		v := g.value(0)
		enc, err := Append(nil, v)
		if err != nil {
			t.Fatalf("encode %v: %v", v, err)
		}
		got, err := (&Decoder{SortedKeys: true}).Decode(enc)
		if err != nil {
			t.Fatalf("decode %q of %v: %v", enc, v, err)
		}
		if !got.Equal(v) {
			t.Fatalf("round trip of %v gave %v (%q)", v, got, enc)
		}
	})
}

// gen makes Values from bytes, nesting at most 8 deep.
type gen struct{ b []byte }

func (g *gen) next() byte {
	if len(g.b) == 0 {
		return 0
	}
	c := g.b[0]
	g.b = g.b[1:]
	return c
}

func (g *gen) bytes(n int) string {
	n = min(n, len(g.b))
	s := string(g.b[:n])
	g.b = g.b[n:]
	return s
}

func (g *gen) value(depth int) Value {
	op := g.next() % 4
	if depth >= 8 {
		op %= 2
	}
	switch op {
	case 0:
		return String(g.bytes(int(g.next() % 32)))
	case 1:
		var b [8]byte
		copy(b[:], g.bytes(8))
		return Int(int64(binary.LittleEndian.Uint64(b[:])))
	case 2:
		l := make([]Value, g.next()%6)
		for i := range l {
			l[i] = g.value(depth + 1)
		}
		return List(l...)
	default:
		n := int(g.next() % 6)
		var entries []Entry
		seen := map[string]bool{}
		for range n {
			k := g.bytes(int(g.next() % 8))
			v := g.value(depth + 1)
			if !seen[k] {
				seen[k] = true
				entries = append(entries, Entry{k, v})
			}
		}
		return Dict(entries...)
	}
}
