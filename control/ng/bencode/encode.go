package bencode

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
)

// errInvalid is returned when encoding the zero Value.
var errInvalid = errors.New("bencode: cannot encode the zero Value")

// Append appends the encoding of v to dst and returns the extended
// buffer. Dictionary keys are written in sorted order (byte-wise); a
// dictionary with a duplicate key, or a zero Value anywhere in v, is an
// error, and dst is then returned unchanged. Appending a Value whose
// dictionaries are already sorted allocates nothing beyond dst's growth.
func Append(dst []byte, v Value) ([]byte, error) {
	out, err := appendValue(dst, v)
	if err != nil {
		return dst, err
	}
	return out, nil
}

// Marshal encodes x, which is a Value or a Go value that ValueOf accepts.
func Marshal(x any) ([]byte, error) {
	v, err := ValueOf(x)
	if err != nil {
		return nil, err
	}
	return Append(nil, v)
}

// AppendString appends the encoding of the byte string s to dst.
func AppendString(dst []byte, s string) []byte {
	dst = strconv.AppendInt(dst, int64(len(s)), 10)
	dst = append(dst, ':')
	return append(dst, s...)
}

// AppendInt appends the encoding of the integer n to dst.
func AppendInt(dst []byte, n int64) []byte {
	dst = append(dst, 'i')
	dst = strconv.AppendInt(dst, n, 10)
	return append(dst, 'e')
}

func appendValue(dst []byte, v Value) ([]byte, error) {
	switch v.kind {
	case KindString:
		return AppendString(dst, v.s), nil
	case KindInt:
		return AppendInt(dst, v.n), nil
	case KindList:
		dst = append(dst, 'l')
		for _, e := range v.l {
			var err error
			if dst, err = appendValue(dst, e); err != nil {
				return dst, err
			}
		}
		return append(dst, 'e'), nil
	case KindDict:
		return appendDict(dst, v.l)
	}
	return dst, errInvalid
}

// appendDict writes the dictionary whose keys and values alternate in kv.
func appendDict(dst []byte, kv []Value) ([]byte, error) {
	if len(kv)%2 != 0 {
		return dst, errors.New("bencode: dictionary key without a value")
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i].kind != KindString {
			return dst, errors.New("bencode: dictionary key not a byte string")
		}
	}
	dst = append(dst, 'd')
	sorted := true
	for i := 2; i < len(kv); i += 2 {
		if kv[i-2].s >= kv[i].s {
			sorted = false
			break
		}
	}
	if sorted {
		for i := 0; i+1 < len(kv); i += 2 {
			dst = AppendString(dst, kv[i].s)
			var err error
			if dst, err = appendValue(dst, kv[i+1]); err != nil {
				return dst, err
			}
		}
		return append(dst, 'e'), nil
	}
	// Sort an index rather than the caller's entries.
	var small [32]int
	idx := small[:0]
	for i := 0; i+1 < len(kv); i += 2 {
		idx = append(idx, i)
	}
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case kv[a].s < kv[b].s:
			return -1
		case kv[a].s > kv[b].s:
			return 1
		}
		return 0
	})
	for j, i := range idx {
		if j > 0 && kv[idx[j-1]].s == kv[i].s {
			return dst, fmt.Errorf("bencode: duplicate dictionary key %q", kv[i].s)
		}
		dst = AppendString(dst, kv[i].s)
		var err error
		if dst, err = appendValue(dst, kv[i+1]); err != nil {
			return dst, err
		}
	}
	return append(dst, 'e'), nil
}

// ValueOf converts x to a Value. It accepts a Value; string and []byte
// (byte strings); signed and unsigned integers up to math.MaxInt64;
// slices and arrays (lists) of accepted types; maps with string keys
// (dictionaries) of accepted types; and pointers and interfaces holding
// them. Anything else, such as a bool, a float or a nil pointer, is an
// error: bencode has no such types.
func ValueOf(x any) (Value, error) {
	switch x := x.(type) {
	case Value:
		if x.kind == KindInvalid {
			return Value{}, errInvalid
		}
		return x, nil
	case string:
		return String(x), nil
	case []byte:
		return Bytes(x), nil
	case int:
		return Int(int64(x)), nil
	case int64:
		return Int(x), nil
	case int32:
		return Int(int64(x)), nil
	case uint16:
		return Int(int64(x)), nil
	case []string:
		return Strings(x...), nil
	case []Value:
		l := make([]Value, len(x))
		copy(l, x)
		return List(l...), nil
	case []any:
		l := make([]Value, len(x))
		for i, e := range x {
			v, err := ValueOf(e)
			if err != nil {
				return Value{}, err
			}
			l[i] = v
		}
		return List(l...), nil
	case map[string]any:
		entries := make([]Entry, 0, len(x))
		for k, e := range x {
			v, err := ValueOf(e)
			if err != nil {
				return Value{}, fmt.Errorf("%w (key %q)", err, k)
			}
			entries = append(entries, Entry{k, v})
		}
		return Dict(entries...), nil
	case map[string]string:
		entries := make([]Entry, 0, len(x))
		for k, e := range x {
			entries = append(entries, Entry{k, String(e)})
		}
		return Dict(entries...), nil
	case nil:
		return Value{}, errors.New("bencode: cannot encode nil")
	}
	return valueOfReflect(reflect.ValueOf(x))
}

func valueOfReflect(rv reflect.Value) (Value, error) {
	switch rv.Kind() {
	case reflect.String:
		return String(rv.String()), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return Int(rv.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return Value{}, fmt.Errorf("bencode: integer %d out of range", u)
		}
		return Int(int64(u)), nil
	case reflect.Slice, reflect.Array:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			b := make([]byte, rv.Len())
			reflect.Copy(reflect.ValueOf(b), rv)
			return Value{kind: KindString, s: string(b)}, nil
		}
		l := make([]Value, rv.Len())
		for i := range l {
			v, err := valueOfElem(rv.Index(i))
			if err != nil {
				return Value{}, err
			}
			l[i] = v
		}
		return List(l...), nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return Value{}, fmt.Errorf("bencode: cannot encode %s: keys must be strings", rv.Type())
		}
		entries := make([]Entry, 0, rv.Len())
		it := rv.MapRange()
		for it.Next() {
			v, err := valueOfElem(it.Value())
			if err != nil {
				return Value{}, fmt.Errorf("%w (key %q)", err, it.Key().String())
			}
			entries = append(entries, Entry{it.Key().String(), v})
		}
		return Dict(entries...), nil
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return Value{}, fmt.Errorf("bencode: cannot encode nil %s", rv.Type())
		}
		return valueOfElem(rv.Elem())
	case reflect.Invalid:
		return Value{}, errors.New("bencode: cannot encode nil")
	}
	return Value{}, fmt.Errorf("bencode: cannot encode %s", rv.Type())
}

// valueOfElem converts an element found by reflection, which may be a
// Value or any other accepted type.
func valueOfElem(rv reflect.Value) (Value, error) {
	if rv.CanInterface() {
		return ValueOf(rv.Interface())
	}
	return valueOfReflect(rv)
}
