package bencode

import (
	"errors"
	"testing"
)

func TestValueLen(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		err  error
		fail bool // an *Error
	}{
		{in: "d7:command4:pinge", n: 17},
		{in: "d7:command4:pingetc2 d", n: 17},
		{in: "i42e rest", n: 4},
		{in: "4:spam", n: 6},
		{in: "le", n: 2},
		{in: "lli1eeei2e", n: 7},
		{in: "d7:command4:ping", err: ErrShort},
		{in: "d7:comm", err: ErrShort},
		{in: "d7", err: ErrShort},
		{in: "i12", err: ErrShort},
		{in: "", err: ErrShort},
		{in: "x", fail: true},
		{in: "e", fail: true},
		{in: "i1xe", fail: true},
		{in: "3x", fail: true},
	} {
		n, err := ValueLen([]byte(tc.in))
		var be *Error
		switch {
		case tc.fail:
			if !errors.As(err, &be) {
				t.Errorf("%q: %d, %v; want a syntax error", tc.in, n, err)
			}
		case tc.err != nil:
			if !errors.Is(err, tc.err) {
				t.Errorf("%q: %d, %v; want %v", tc.in, n, err, tc.err)
			}
		case err != nil || n != tc.n:
			t.Errorf("%q: %d, %v; want %d", tc.in, n, err, tc.n)
		}
	}
	deep := make([]byte, 0, 80)
	for range DefaultMaxDepth + 1 {
		deep = append(deep, 'l')
	}
	if _, err := ValueLen(deep); err == nil || errors.Is(err, ErrShort) {
		t.Errorf("nesting %d deep: %v", DefaultMaxDepth+1, err)
	}
}
