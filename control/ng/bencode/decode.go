package bencode

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// Default limits of a Decoder.
const (
	DefaultMaxDepth = 32      // ng messages nest four deep
	DefaultMaxItems = 1 << 16 // list elements and dictionary entries
	DefaultMaxSize  = 1 << 20 // bytes; an ng datagram has at most 64 KiB
)

// Decoder decodes bencode within limits. The zero value uses the default
// limits; a Decoder is not changed by decoding and is safe for concurrent
// use. It decodes whole messages, not streams.
type Decoder struct {
	// MaxDepth bounds the nesting of lists and dictionaries: 1 allows a
	// list of scalars. 0 means DefaultMaxDepth.
	MaxDepth int
	// MaxItems bounds the list elements plus dictionary entries in the
	// whole message. 0 means DefaultMaxItems.
	MaxItems int
	// MaxSize bounds the input in bytes. 0 means DefaultMaxSize.
	MaxSize int
	// SortedKeys requires dictionary keys in strictly ascending byte
	// order, the canonical form. Without it any order is accepted (ng
	// peers do not sort); duplicate keys are rejected either way.
	SortedKeys bool
}

// Error is a decoding error: malformed input or a limit exceeded.
type Error struct {
	Offset int    // byte offset in the input where decoding stopped
	Msg    string // what is wrong, such as "leading zero in integer"
}

func (e *Error) Error() string {
	return "bencode: " + e.Msg + " at offset " + strconv.Itoa(e.Offset)
}

// Unmarshal decodes data, which must hold exactly one value, with the
// default limits. See Decoder.Decode.
func Unmarshal(data []byte) (Value, error) {
	var d Decoder
	return d.Decode(data)
}

// Decode decodes data, which must hold exactly one value and nothing
// after it. The result does not refer to data: its byte strings share one
// copy of it.
func (d *Decoder) Decode(data []byte) (Value, error) {
	maxSize := d.MaxSize
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	if len(data) > maxSize {
		return Value{}, &Error{Offset: maxSize, Msg: fmt.Sprintf("input of %d bytes exceeds the limit of %d", len(data), maxSize)}
	}
	// The scratch stacks escape (the compiler cannot follow them through
	// the recursion), so they live in the state: one allocation for all.
	s := &decodeState{
		data:       data,
		maxDepth:   d.MaxDepth,
		maxItems:   d.MaxItems,
		sortedKeys: d.SortedKeys,
	}
	s.counts = s.countsBuf[:0]
	s.keys = s.keysBuf[:0]
	if s.maxDepth <= 0 {
		s.maxDepth = DefaultMaxDepth
	}
	if s.maxItems <= 0 {
		s.maxItems = DefaultMaxItems
	}
	s.maxItems = min(s.maxItems, math.MaxInt32) // counts are int32
	// Pass 1 validates and counts the children of each container.
	end, err := s.scan(0, 0)
	if err != nil {
		return Value{}, err
	}
	if end != len(data) {
		return Value{}, &Error{Offset: end, Msg: "trailing data after the value"}
	}
	// Pass 2 builds the tree in one array, with byte strings in one copy
	// of the input.
	s.str = string(data)
	s.arena = make([]Value, s.slots)
	v, _ := s.build(0)
	return v, nil
}

type decodeState struct {
	data       []byte
	maxDepth   int
	maxItems   int
	sortedKeys bool

	items  int       // list elements and dictionary entries seen
	slots  int       // arena Values needed: a list element takes one, an entry two
	counts []int32   // children of each container, in pre-order (pass 1)
	keys   []keySpan // keys of the dictionaries being scanned, innermost last (pass 1)

	str   string  // copy of data (pass 2)
	arena []Value // all list elements and dictionary keys and values (pass 2)
	ci    int     // next index into counts (pass 2)
	ai    int     // next free arena slot (pass 2)

	countsBuf [64]int32
	keysBuf   [32]keySpan
}

func (s *decodeState) errorf(off int, format string, args ...any) error {
	return &Error{Offset: off, Msg: fmt.Sprintf(format, args...)}
}

// scan validates the value at pos and returns the offset after it.
func (s *decodeState) scan(pos, depth int) (int, error) {
	if pos >= len(s.data) {
		return pos, s.errorf(pos, "unexpected end of input")
	}
	switch c := s.data[pos]; {
	case c == 'i':
		_, end, err := s.parseInt(pos)
		return end, err
	case c >= '0' && c <= '9':
		_, _, next, err := s.parseString(pos)
		return next, err
	case c == 'l' || c == 'd':
		if depth >= s.maxDepth {
			return pos, s.errorf(pos, "nesting deeper than %d", s.maxDepth)
		}
		if c == 'l' {
			return s.scanList(pos, depth+1)
		}
		return s.scanDict(pos, depth+1)
	default:
		return pos, s.errorf(pos, "unexpected byte %q", c)
	}
}

func (s *decodeState) item(pos int) error {
	s.items++
	if s.items > s.maxItems {
		return s.errorf(pos, "more than %d items", s.maxItems)
	}
	return nil
}

func (s *decodeState) scanList(pos, depth int) (int, error) {
	ci := len(s.counts)
	s.counts = append(s.counts, 0)
	pos++ // 'l'
	n := 0
	for {
		if pos >= len(s.data) {
			return pos, s.errorf(pos, "unexpected end of input in list")
		}
		if s.data[pos] == 'e' {
			break
		}
		if err := s.item(pos); err != nil {
			return pos, err
		}
		var err error
		if pos, err = s.scan(pos, depth); err != nil {
			return pos, err
		}
		n++
	}
	s.counts[ci] = int32(n)
	s.slots += n
	return pos + 1, nil
}

func (s *decodeState) scanDict(pos, depth int) (int, error) {
	ci := len(s.counts)
	s.counts = append(s.counts, 0)
	base := len(s.keys) // this dictionary's keys are s.keys[base:]
	pos++               // 'd'
	sorted := true
	for {
		if pos >= len(s.data) {
			return pos, s.errorf(pos, "unexpected end of input in dictionary")
		}
		c := s.data[pos]
		if c == 'e' {
			break
		}
		if err := s.item(pos); err != nil {
			return pos, err
		}
		if c < '0' || c > '9' {
			return pos, s.errorf(pos, "dictionary key is not a byte string")
		}
		k := keySpan{pos: pos}
		var err error
		if k.start, k.end, pos, err = s.parseString(pos); err != nil {
			return pos, err
		}
		if len(s.keys) > base && sorted {
			switch prev := s.keys[len(s.keys)-1]; s.compareKeys(prev, k) {
			case 0:
				return k.pos, s.errorf(k.pos, "duplicate dictionary key %q", s.data[k.start:k.end])
			case 1:
				if s.sortedKeys {
					return k.pos, s.errorf(k.pos, "dictionary key %q out of order", s.data[k.start:k.end])
				}
				sorted = false
			}
		}
		s.keys = append(s.keys, k)
		if pos, err = s.scan(pos, depth); err != nil {
			return pos, err
		}
	}
	keys := s.keys[base:]
	if !sorted {
		// Out of order: sort this dictionary's keys (in the scratch
		// stack, which is truncated on return) to find duplicates.
		slices.SortStableFunc(keys, s.compareKeys)
		for j := 1; j < len(keys); j++ {
			if s.compareKeys(keys[j-1], keys[j]) == 0 {
				k := keys[j]
				return k.pos, s.errorf(k.pos, "duplicate dictionary key %q", s.data[k.start:k.end])
			}
		}
	}
	s.counts[ci] = int32(len(keys))
	s.slots += 2 * len(keys)
	s.keys = s.keys[:base]
	return pos + 1, nil
}

// keySpan locates a dictionary key in the input during pass 1.
type keySpan struct {
	pos        int // where its encoding starts, for errors
	start, end int // its bytes
}

func (s *decodeState) compareKeys(a, b keySpan) int {
	return bytes.Compare(s.data[a.start:a.end], s.data[b.start:b.end])
}

// parseString parses a byte string at pos and returns the offsets of its
// bytes and the offset after it.
func (s *decodeState) parseString(pos int) (start, end, next int, err error) {
	begin := pos
	n := 0
	for pos < len(s.data) && s.data[pos] >= '0' && s.data[pos] <= '9' {
		if pos > begin && s.data[begin] == '0' {
			return 0, 0, begin, s.errorf(begin, "leading zero in string length")
		}
		if n > (math.MaxInt32-9)/10 {
			return 0, 0, begin, s.errorf(begin, "string length too large")
		}
		n = n*10 + int(s.data[pos]-'0')
		pos++
	}
	if pos >= len(s.data) {
		return 0, 0, pos, s.errorf(pos, "unexpected end of input in string length")
	}
	if s.data[pos] != ':' {
		return 0, 0, pos, s.errorf(pos, "unexpected byte %q in string length", s.data[pos])
	}
	pos++
	if n > len(s.data)-pos {
		return 0, 0, begin, s.errorf(begin, "string of %d bytes runs past the end of input", n)
	}
	return pos, pos + n, pos + n, nil
}

// parseInt parses an integer at pos ('i') and returns it and the offset
// after it.
func (s *decodeState) parseInt(pos int) (int64, int, error) {
	start := pos
	pos++ // 'i'
	neg := false
	if pos < len(s.data) && s.data[pos] == '-' {
		neg = true
		pos++
	}
	digits := pos
	var u uint64
	for pos < len(s.data) && s.data[pos] >= '0' && s.data[pos] <= '9' {
		if pos > digits && s.data[digits] == '0' {
			return 0, pos, s.errorf(start, "leading zero in integer")
		}
		d := uint64(s.data[pos] - '0')
		if u > (math.MaxUint64-d)/10 {
			return 0, pos, s.errorf(start, "integer out of range")
		}
		u = u*10 + d
		pos++
	}
	if pos >= len(s.data) {
		return 0, pos, s.errorf(pos, "unexpected end of input in integer")
	}
	if s.data[pos] != 'e' {
		return 0, pos, s.errorf(pos, "unexpected byte %q in integer", s.data[pos])
	}
	if pos == digits {
		return 0, pos, s.errorf(start, "integer without digits")
	}
	if neg {
		if u == 0 {
			return 0, pos, s.errorf(start, "negative zero")
		}
		if u > 1<<63 {
			return 0, pos, s.errorf(start, "integer out of range")
		}
		return -int64(u-1) - 1, pos + 1, nil
	}
	if u > math.MaxInt64 {
		return 0, pos, s.errorf(start, "integer out of range")
	}
	return int64(u), pos + 1, nil
}

// build makes the Value at pos, which scan validated, and returns the
// offset after it.
func (s *decodeState) build(pos int) (Value, int) {
	switch c := s.data[pos]; {
	case c == 'i':
		n, end, _ := s.parseInt(pos)
		return Value{kind: KindInt, n: n}, end
	case c == 'l' || c == 'd':
		n := int(s.counts[s.ci])
		s.ci++
		kind := KindList
		if c == 'd' {
			kind = KindDict
			n *= 2
		}
		l := s.arena[s.ai : s.ai+n : s.ai+n]
		s.ai += n
		pos++
		for i := range l {
			l[i], pos = s.build(pos)
		}
		return Value{kind: kind, l: l}, pos + 1 // 'e'
	default:
		start, end, next, _ := s.parseString(pos)
		return Value{kind: KindString, s: s.str[start:end]}, next
	}
}
