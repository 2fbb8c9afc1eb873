package bencode

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ngOffer is an offer as Kamailio's rtpengine module sends it: keys in
// insertion order, not sorted.
const ngOffer = "d3:sdp130:v=0\r\no=- 1 1 IN IP4 198.18.0.2\r\ns=-\r\nc=IN IP4 198.18.0.2\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0 8 101\r\na=rtpmap:101 telephone-event/8000\r\n" +
	"5:flagsl13:trust-addresse7:replacel6:origin18:session-connectione" +
	"7:call-id12:a84b4c76e66710:via-branch6:z9hG4b8:from-tag8:1928301413:received-froml3:IP410:198.18.0.2e7:command5:offere"

func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want any // as Value.Interface returns it
	}{
		{"empty string", "0:", ""},
		{"string", "4:spam", "spam"},
		{"binary string", "3:\x00\xff:", "\x00\xff:"},
		{"zero", "i0e", int64(0)},
		{"integer", "i42e", int64(42)},
		{"negative", "i-42e", int64(-42)},
		{"max int64", "i9223372036854775807e", int64(math.MaxInt64)},
		{"min int64", "i-9223372036854775808e", int64(math.MinInt64)},
		{"empty list", "le", []any{}},
		{"list", "l4:spami42ee", []any{"spam", int64(42)}},
		{"nested lists", "lllleeee", []any{[]any{[]any{[]any{}}}}},
		{"empty dict", "de", map[string]any{}},
		{"dict", "d3:cow3:moo4:spam4:eggse", map[string]any{"cow": "moo", "spam": "eggs"}},
		{"dict of list", "d4:spaml1:a1:bee", map[string]any{"spam": []any{"a", "b"}}},
		{"unsorted keys", "d1:bi1e1:ai2ee", map[string]any{"a": int64(2), "b": int64(1)}},
		{"empty key", "d0:i1ee", map[string]any{"": int64(1)}},
		{"ng ping", "d7:command4:pinge", map[string]any{"command": "ping"}},
		{"ng pong", "d6:result4:ponge", map[string]any{"result": "pong"}},
		{"ng error", "d6:result5:error12:error-reason12:Unknown calle", map[string]any{"result": "error", "error-reason": "Unknown call"}},
		{"ng offer", ngOffer, map[string]any{
			"command":       "offer",
			"call-id":       "a84b4c76e667",
			"from-tag":      "19283014",
			"via-branch":    "z9hG4b",
			"flags":         []any{"trust-address"},
			"replace":       []any{"origin", "session-connection"},
			"received-from": []any{"IP4", "198.18.0.2"},
			"sdp":           "v=0\r\no=- 1 1 IN IP4 198.18.0.2\r\ns=-\r\nc=IN IP4 198.18.0.2\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0 8 101\r\na=rtpmap:101 telephone-event/8000\r\n",
		}},
		{"ng query reply", "d7:createdi1700000000e6:result2:ok6:totalsd3:RTPd7:packetsi100e5:bytesi17200e6:errorsi0ee4:RTCPd7:packetsi0e5:bytesi0e6:errorsi0eeee",
			map[string]any{"created": int64(1700000000), "result": "ok", "totals": map[string]any{
				"RTP":  map[string]any{"packets": int64(100), "bytes": int64(17200), "errors": int64(0)},
				"RTCP": map[string]any{"packets": int64(0), "bytes": int64(0), "errors": int64(0)},
			}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Unmarshal([]byte(tt.in))
			if err != nil {
				t.Fatalf("Unmarshal(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(v.Interface(), tt.want); diff != "" {
				t.Errorf("Unmarshal(%q) (-got +want):\n%s", tt.in, diff)
			}
			// Encoding gives the canonical form: sorted keys.
			enc, err := Append(nil, v)
			if err != nil {
				t.Fatalf("Append: %v", err)
			}
			v2, err := (&Decoder{SortedKeys: true}).Decode(enc)
			if err != nil {
				t.Fatalf("re-decode %q: %v", enc, err)
			}
			if !v2.Equal(v) {
				t.Errorf("round trip: got %v, want %v", v2, v)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		dec    Decoder
		offset int
		msg    string
	}{
		{"empty", "", Decoder{}, 0, "unexpected end of input"},
		{"bad byte", "x", Decoder{}, 0, "unexpected byte 'x'"},
		{"trailing data", "i1ei2e", Decoder{}, 3, "trailing data"},
		{"trailing newline", "de\n", Decoder{}, 2, "trailing data"},
		{"int no digits", "ie", Decoder{}, 0, "integer without digits"},
		{"int minus only", "i-e", Decoder{}, 0, "integer without digits"},
		{"int leading zero", "i03e", Decoder{}, 0, "leading zero in integer"},
		{"int negative leading zero", "i-03e", Decoder{}, 0, "leading zero in integer"},
		{"int negative zero", "i-0e", Decoder{}, 0, "negative zero"},
		{"int plus", "i+1e", Decoder{}, 1, "unexpected byte '+' in integer"},
		{"int space", "i 1e", Decoder{}, 1, "unexpected byte ' ' in integer"},
		{"int unterminated", "i12", Decoder{}, 3, "unexpected end of input in integer"},
		{"int overflow", "i9223372036854775808e", Decoder{}, 0, "integer out of range"},
		{"int underflow", "i-9223372036854775809e", Decoder{}, 0, "integer out of range"},
		{"int huge", "i99999999999999999999999e", Decoder{}, 0, "integer out of range"},
		{"int float", "i1.5e", Decoder{}, 2, "unexpected byte '.' in integer"},
		{"string short", "5:abc", Decoder{}, 0, "string of 5 bytes runs past the end"},
		{"string length leading zero", "03:abc", Decoder{}, 0, "leading zero in string length"},
		{"string length no colon", "3abc", Decoder{}, 1, "unexpected byte 'a' in string length"},
		{"string length unterminated", "12", Decoder{}, 2, "unexpected end of input in string length"},
		{"string length huge", "99999999999999999999:", Decoder{}, 0, "string length too large"},
		{"negative string length", "-1:a", Decoder{}, 0, "unexpected byte '-'"},
		{"list unterminated", "l1:a", Decoder{}, 4, "unexpected end of input in list"},
		{"dict unterminated", "d1:a1:b", Decoder{}, 7, "unexpected end of input in dictionary"},
		{"dict missing value", "d1:ae", Decoder{}, 4, "unexpected byte 'e'"},
		{"dict int key", "di1e1:ae", Decoder{}, 1, "dictionary key is not a byte string"},
		{"dict list key", "dle1:ae", Decoder{}, 1, "dictionary key is not a byte string"},
		{"dict duplicate key", "d1:ai1e1:ai2ee", Decoder{}, 7, `duplicate dictionary key "a"`},
		{"dict duplicate key unsorted", "d1:bi1e1:ai2e1:bi3ee", Decoder{}, 13, `duplicate dictionary key "b"`},
		{"dict unsorted strict", "d1:bi1e1:ai2ee", Decoder{SortedKeys: true}, 7, `dictionary key "a" out of order`},
		{"end only", "e", Decoder{}, 0, "unexpected byte 'e'"},
		{"too deep", "llllllleeeeeee", Decoder{MaxDepth: 3}, 3, "nesting deeper than 3"},
		{"too deep default", strings.Repeat("l", 33) + strings.Repeat("e", 33), Decoder{}, 32, "nesting deeper than 32"},
		{"too many items", "li1ei2ei3ee", Decoder{MaxItems: 2}, 7, "more than 2 items"},
		{"too many entries", "d1:ai1e1:bi2ee", Decoder{MaxItems: 1}, 7, "more than 1 items"},
		{"too large", "4:spam", Decoder{MaxSize: 5}, 5, "input of 6 bytes exceeds the limit of 5"},
		{"ng cookie not stripped", "5323_1 d7:command4:pinge", Decoder{}, 4, "unexpected byte '_' in string length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := tt.dec.Decode([]byte(tt.in))
			if err == nil {
				t.Fatalf("Decode(%q) = %v, want an error", tt.in, v)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Decode(%q) error %T %v, want *Error", tt.in, err, err)
			}
			if e.Offset != tt.offset || !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("Decode(%q) = %v, want %q at offset %d", tt.in, err, tt.msg, tt.offset)
			}
			if v.IsValid() {
				t.Errorf("Decode(%q) returned a value with its error: %v", tt.in, v)
			}
		})
	}
}

func TestEncode(t *testing.T) {
	tests := []struct {
		name string
		in   any
		want string
	}{
		{"string", String("spam"), "4:spam"},
		{"empty string", "", "0:"},
		{"bytes", []byte{0, 1}, "2:\x00\x01"},
		{"int", Int(-3), "i-3e"},
		{"go int", 7, "i7e"},
		{"uint8", uint8(200), "i200e"},
		{"min int64", int64(math.MinInt64), "i-9223372036854775808e"},
		{"list", List(String("a"), Int(1)), "l1:ai1ee"},
		{"empty list", List(), "le"},
		{"strings", []string{"origin", "session-connection"}, "l6:origin18:session-connectione"},
		{"dict sorts keys", Dict(Entry{"b", Int(1)}, Entry{"a", Int(2)}, Entry{"c", Int(3)}), "d1:ai2e1:bi1e1:ci3ee"},
		{"keys sort by bytes", Dict(Entry{"a", Int(1)}, Entry{"B", Int(2)}, Entry{"ab", Int(3)}, Entry{"", Int(4)}), "d0:i4e1:Bi2e1:ai1e2:abi3ee"},
		{"dict of pairs", DictOf([]Value{String("b"), Int(1), String("a"), List(Int(2))}), "d1:ali2ee1:bi1ee"},
		{"empty dict of pairs", DictOf(nil), "de"},
		{"go map", map[string]any{"command": "ping"}, "d7:command4:pinge"},
		{"go map nested", map[string]any{"z": []any{"x", 1, map[string]string{"k": "v"}}, "a": int32(1)}, "d1:ai1e1:zl1:xi1ed1:k1:veee"},
		{"typed slice", []int{1, 2}, "li1ei2ee"},
		{"pointer", func() *string { s := "p"; return &s }(), "1:p"},
		{"ng offer", Dict(
			Entry{"command", String("offer")},
			Entry{"call-id", String("c1")},
			Entry{"from-tag", String("t1")},
			Entry{"sdp", String("v=0\r\n")},
			Entry{"flags", Strings("trust-address")},
		), "d7:call-id2:c17:command5:offer5:flagsl13:trust-addresse8:from-tag2:t13:sdp5:v=0\r\ne"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Marshal(tt.in)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if string(got) != tt.want {
				t.Errorf("Marshal = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestEncodeErrors(t *testing.T) {
	tests := []struct {
		name string
		in   any
		msg  string
	}{
		{"zero value", Value{}, "zero Value"},
		{"zero in list", List(String("a"), Value{}), "zero Value"},
		{"duplicate key", Dict(Entry{"a", Int(1)}, Entry{"a", Int(2)}), `duplicate dictionary key "a"`},
		{"duplicate key unsorted", Dict(Entry{"b", Int(1)}, Entry{"a", Int(1)}, Entry{"b", Int(2)}), `duplicate dictionary key "b"`},
		{"nested duplicate", List(Dict(Entry{"x", Int(1)}, Entry{"x", Int(1)})), "duplicate"},
		{"pairs: key without a value", DictOf([]Value{String("a"), Int(1), String("b")}), "key without a value"},
		{"pairs: key not a string", DictOf([]Value{Int(1), Int(2)}), "key not a byte string"},
		{"pairs: duplicate key", DictOf([]Value{String("a"), Int(1), String("a"), Int(2)}), `duplicate dictionary key "a"`},
		{"bool", true, "cannot encode bool"},
		{"float", 1.5, "cannot encode float64"},
		{"nil", nil, "cannot encode nil"},
		{"nil pointer", (*int)(nil), "cannot encode nil"},
		{"nil in map", map[string]any{"k": nil}, `cannot encode nil (key "k")`},
		{"int keys", map[int]string{1: "a"}, "keys must be strings"},
		{"uint64 overflow", uint64(math.MaxUint64), "out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Marshal(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Marshal = %q, %v; want error containing %q", got, err, tt.msg)
			}
		})
	}
	// Append leaves dst as it was on error.
	dst := []byte("cookie ")
	out, err := Append(dst, List(Int(1), Value{}))
	if err == nil || string(out) != "cookie " {
		t.Errorf("Append with error = %q, %v; want %q and an error", out, err, "cookie ")
	}
}

func TestValueAccessors(t *testing.T) {
	v, err := Unmarshal([]byte(ngOffer))
	if err != nil {
		t.Fatal(err)
	}
	if v.Kind() != KindDict || v.Len() != 8 {
		t.Fatalf("kind %v len %d, want dictionary of 8", v.Kind(), v.Len())
	}
	if got := v.GetString("command"); got != "offer" {
		t.Errorf("command = %q", got)
	}
	if got := v.GetString("flags"); got != "" {
		t.Errorf("GetString of a list = %q, want empty", got)
	}
	if got := v.GetString("missing"); got != "" {
		t.Errorf("GetString of a missing key = %q, want empty", got)
	}
	flags, _ := v.Get("flags")
	l, ok := flags.AsList()
	if !ok || len(l) != 1 || l[0].GetString("x") != "" {
		t.Errorf("flags = %v", flags)
	}
	if s, _ := l[0].AsString(); s != "trust-address" {
		t.Errorf("flags[0] = %q", s)
	}
	// Entries keep the input order.
	var keys []string
	for k := range v.Entries() {
		keys = append(keys, k)
	}
	want := []string{"sdp", "flags", "replace", "call-id", "via-branch", "from-tag", "received-from", "command"}
	if diff := cmp.Diff(keys, want); diff != "" {
		t.Errorf("Entries keys (-got +want):\n%s", diff)
	}
	if k, e := v.Entry(7); k != "command" || e.GetString("") != "" {
		t.Errorf("Entry(7) = %q, %v", k, e)
	}
	if n, ok := Int(5).AsInt(); !ok || n != 5 {
		t.Errorf("AsInt = %d, %t", n, ok)
	}
	if _, ok := String("5").AsInt(); ok {
		t.Error("AsInt of a string succeeded")
	}
	if n, ok := Dict(Entry{"n", Int(3)}).GetInt("n"); !ok || n != 3 {
		t.Errorf("GetInt = %d, %t", n, ok)
	}
	if got := Dict(Entry{"a", Strings("x", "y")}, Entry{"b", Int(-1)}).String(); got != `{"a": ["x", "y"], "b": -1}` {
		t.Errorf("String() = %s", got)
	}
	if got := (Value{}).String(); got != "<invalid>" {
		t.Errorf("zero String() = %s", got)
	}
	if KindDict.String() != "dictionary" || Kind(9).String() != "Kind(9)" {
		t.Errorf("Kind names: %v %v", KindDict, Kind(9))
	}
}

func TestEqual(t *testing.T) {
	a := Dict(Entry{"a", Int(1)}, Entry{"b", Strings("x")})
	b := Dict(Entry{"b", Strings("x")}, Entry{"a", Int(1)})
	if !a.Equal(b) || !b.Equal(a) {
		t.Errorf("%v != %v", a, b)
	}
	for _, c := range []Value{
		Dict(Entry{"a", Int(1)}),
		Dict(Entry{"a", Int(1)}, Entry{"c", Strings("x")}),
		Dict(Entry{"a", Int(2)}, Entry{"b", Strings("x")}),
		List(Int(1)),
		String("a"),
		{},
	} {
		if a.Equal(c) || c.Equal(a) {
			t.Errorf("%v == %v", a, c)
		}
	}
	if !List(Int(1), String("x")).Equal(List(Int(1), String("x"))) || List(Int(1)).Equal(List(Int(2))) {
		t.Error("list equality")
	}
}

// The decoded Value does not refer to the input buffer, which the caller
// may reuse for the next datagram.
func TestDecodeCopiesInput(t *testing.T) {
	buf := []byte("d3:key5:valuee")
	v, err := Unmarshal(buf)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, "XXXXXXXXXXXXXX")
	if got := v.GetString("key"); got != "value" {
		t.Errorf("after reusing the buffer: %q", got)
	}
}

// Decoding costs three allocations whatever the number of strings and
// integers: the decoder's state, the shared copy of the input and the
// array of elements (the state's scratch stacks grow only for messages
// with over 64 containers or 32 keys in open dictionaries).
func TestDecodeAllocs(t *testing.T) {
	big := []byte("l" + strings.Repeat("4:spami42e", 1000) + "d1:bi1e1:ai2eee")
	for _, in := range [][]byte{[]byte(ngOffer), big} {
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := Unmarshal(in); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 3 {
			t.Errorf("Unmarshal of %d bytes: %v allocations, want at most 3", len(in), allocs)
		}
	}
	in := []byte(ngOffer)
	v, _ := Unmarshal(in)
	canon, _ := Append(nil, v)
	c, _ := Unmarshal(canon)
	buf := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Append(buf[:0], c); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Append of a sorted value: %v allocations, want 0", allocs)
	}
}

func BenchmarkUnmarshalOffer(b *testing.B) {
	in := []byte(ngOffer)
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := Unmarshal(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendOffer(b *testing.B) {
	v, err := Unmarshal([]byte(ngOffer))
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf, err = Append(buf[:0], v)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}
