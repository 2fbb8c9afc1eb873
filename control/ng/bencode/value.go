// Package bencode encodes and decodes bencode, the encoding of BitTorrent
// metainfo (BEP 3) and of the rtpengine ng control protocol: byte strings,
// integers, lists and dictionaries with byte-string keys.
//
// A decoded or constructed message is a Value, an immutable tree. Decoding
// is strict (no leading zeros, no "-0", no trailing data, no duplicate
// keys, integers within int64) and bounded (nesting depth, number of
// items, input size; see Decoder). It costs three allocations however many
// strings and integers a message holds: the decoder's state, one copy of
// the input that all byte strings share, and one array for all list
// elements and dictionary entries. Encoding writes dictionaries with their
// keys in sorted order, as the specification requires, so equal Values
// encode to equal bytes; it allocates nothing beyond the output buffer
// when the keys are already sorted.
//
// Dictionary keys in received messages need not be sorted: rtpengine and
// its SIP proxies write them in insertion order. Decoder.SortedKeys asks
// for the canonical order.
package bencode

import (
	"iter"
	"strconv"
	"strings"
)

// Kind is the type of a Value.
type Kind uint8

// The kinds of Values. KindInvalid is the zero Value's, which does not
// encode.
const (
	KindInvalid Kind = iota
	KindString
	KindInt
	KindList
	KindDict
)

var kindNames = [...]string{"invalid", "string", "integer", "list", "dictionary"}

// String returns the kind's name: invalid, string, integer, list or
// dictionary.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Value is a bencode value: a byte string, an integer, a list or a
// dictionary. Values are immutable once made and safe for concurrent use;
// the zero Value is invalid (Kind returns KindInvalid) and does not encode.
type Value struct {
	kind Kind
	n    int64   // KindInt
	s    string  // KindString: the bytes
	l    []Value // KindList: the elements; KindDict: keys and values alternating, keys of KindString
}

// Entry is a dictionary entry, for Dict.
type Entry struct {
	Key   string
	Value Value
}

// String returns a byte string Value holding s.
func String(s string) Value { return Value{kind: KindString, s: s} }

// Bytes returns a byte string Value holding a copy of b.
func Bytes(b []byte) Value { return Value{kind: KindString, s: string(b)} }

// Int returns an integer Value.
func Int(n int64) Value { return Value{kind: KindInt, n: n} }

// List returns a list Value of elems. It keeps elems: the caller must not
// change it afterwards.
func List(elems ...Value) Value { return Value{kind: KindList, l: elems} }

// Strings returns a list Value of byte strings.
func Strings(ss ...string) Value {
	l := make([]Value, len(ss))
	for i, s := range ss {
		l[i] = String(s)
	}
	return Value{kind: KindList, l: l}
}

// Dict returns a dictionary Value with entries in the given order (they
// are sorted when encoded). Duplicate keys make the Value fail to encode.
func Dict(entries ...Entry) Value {
	l := make([]Value, 2*len(entries))
	for i, e := range entries {
		l[2*i] = String(e.Key)
		l[2*i+1] = e.Value
	}
	return Value{kind: KindDict, l: l}
}

// DictOf returns a dictionary Value of kv, keys (byte strings) and values
// alternating, in any order (they are sorted when encoded). It keeps kv:
// the caller must not change it afterwards. An odd length, a key that is
// not a byte string or a duplicate key makes the Value fail to encode.
// It is Dict without the copy, for replies built entry by entry.
func DictOf(kv []Value) Value { return Value{kind: KindDict, l: kv} }

// Kind returns v's kind.
func (v Value) Kind() Kind { return v.kind }

// IsValid reports whether v is not the zero Value.
func (v Value) IsValid() bool { return v.kind != KindInvalid }

// AsString returns the bytes of a byte string, and whether v is one.
func (v Value) AsString() (string, bool) { return v.s, v.kind == KindString }

// AsInt returns the value of an integer, and whether v is one.
func (v Value) AsInt() (int64, bool) { return v.n, v.kind == KindInt }

// AsList returns the elements of a list, and whether v is one. The slice
// belongs to v: do not change it.
func (v Value) AsList() ([]Value, bool) {
	if v.kind != KindList {
		return nil, false
	}
	return v.l, true
}

// Len returns the length of a byte string, the number of elements of a
// list or of entries of a dictionary, and 0 for other kinds.
func (v Value) Len() int {
	switch v.kind {
	case KindString:
		return len(v.s)
	case KindList:
		return len(v.l)
	case KindDict:
		return len(v.l) / 2
	}
	return 0
}

// Entry returns the i'th entry of a dictionary, in input order for a
// decoded Value and construction order for one made by Dict. It panics if
// v is not a dictionary or i is out of range.
func (v Value) Entry(i int) (key string, val Value) {
	if v.kind != KindDict {
		panic("bencode: Entry of " + v.kind.String())
	}
	return v.l[2*i].s, v.l[2*i+1]
}

// Entries iterates over a dictionary's entries in the order of Entry; it
// yields nothing for other kinds.
func (v Value) Entries() iter.Seq2[string, Value] {
	return func(yield func(string, Value) bool) {
		if v.kind != KindDict {
			return
		}
		for i := 0; i+1 < len(v.l); i += 2 {
			if !yield(v.l[i].s, v.l[i+1]) {
				return
			}
		}
	}
}

// Get returns the value of key in a dictionary, and whether it is there.
// It scans the entries: ng messages have few.
func (v Value) Get(key string) (Value, bool) {
	if v.kind != KindDict {
		return Value{}, false
	}
	for i := 0; i+1 < len(v.l); i += 2 {
		if v.l[i].s == key {
			return v.l[i+1], true
		}
	}
	return Value{}, false
}

// GetString returns the byte string under key in a dictionary, or "" when
// it is missing or not a byte string.
func (v Value) GetString(key string) string {
	e, _ := v.Get(key)
	s, _ := e.AsString()
	return s
}

// GetInt returns the integer under key in a dictionary, and whether there
// is one.
func (v Value) GetInt(key string) (int64, bool) {
	e, _ := v.Get(key)
	return e.AsInt()
}

// Equal reports whether v and w are the same value. Dictionaries are equal
// when they hold the same keys with equal values, in any order.
func (v Value) Equal(w Value) bool {
	if v.kind != w.kind {
		return false
	}
	switch v.kind {
	case KindInvalid:
		return true
	case KindString:
		return v.s == w.s
	case KindInt:
		return v.n == w.n
	case KindList:
		if len(v.l) != len(w.l) {
			return false
		}
		for i := range v.l {
			if !v.l[i].Equal(w.l[i]) {
				return false
			}
		}
		return true
	case KindDict:
		if len(v.l) != len(w.l) {
			return false
		}
		for i := 0; i+1 < len(v.l); i += 2 {
			var o Value
			var ok bool
			if w.l[i].s == v.l[i].s { // same order: the common case
				o, ok = w.l[i+1], true
			} else {
				o, ok = w.Get(v.l[i].s)
			}
			if !ok || !v.l[i+1].Equal(o) {
				return false
			}
		}
		return true
	}
	return false
}

// String returns a readable form of v for logs and test failures: byte
// strings quoted as in Go, integers in decimal, lists in brackets and
// dictionaries in braces, in entry order. It is not bencode; see Append.
func (v Value) String() string {
	var b strings.Builder
	v.format(&b)
	return b.String()
}

func (v Value) format(b *strings.Builder) {
	switch v.kind {
	case KindInvalid:
		b.WriteString("<invalid>")
	case KindString:
		b.WriteString(strconv.Quote(v.s))
	case KindInt:
		b.WriteString(strconv.FormatInt(v.n, 10))
	case KindList:
		b.WriteByte('[')
		for i, e := range v.l {
			if i > 0 {
				b.WriteString(", ")
			}
			e.format(b)
		}
		b.WriteByte(']')
	case KindDict:
		b.WriteByte('{')
		for i := 0; i+1 < len(v.l); i += 2 {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.Quote(v.l[i].s))
			b.WriteString(": ")
			v.l[i+1].format(b)
		}
		b.WriteByte('}')
	}
}

// Interface returns v as plain Go values: string, int64, []any and
// map[string]any; nil for the zero Value.
func (v Value) Interface() any {
	switch v.kind {
	case KindString:
		return v.s
	case KindInt:
		return v.n
	case KindList:
		l := make([]any, len(v.l))
		for i, e := range v.l {
			l[i] = e.Interface()
		}
		return l
	case KindDict:
		m := make(map[string]any, len(v.l)/2)
		for i := 0; i+1 < len(v.l); i += 2 {
			m[v.l[i].s] = v.l[i+1].Interface()
		}
		return m
	}
	return nil
}
