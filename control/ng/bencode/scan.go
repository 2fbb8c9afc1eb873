package bencode

import "errors"

// ErrShort is returned by ValueLen when data ends inside the first value.
var ErrShort = errors.New("bencode: input ends inside the value")

// ValueLen returns the length of the first bencode value in data, which
// may be followed by anything, for reading values from a stream without
// framing (rtpengine's ng over TCP). It returns ErrShort when more input
// is needed and an *Error when data cannot start a valid value. It checks
// the syntax only (as far as the framing needs, not the strictness of
// Decode) and nests at most DefaultMaxDepth deep.
func ValueLen(data []byte) (int, error) {
	pos, depth := 0, 0
	for {
		if pos >= len(data) {
			return 0, ErrShort
		}
		switch c := data[pos]; {
		case c == 'i':
			end := pos + 1
			for end < len(data) && data[end] != 'e' {
				if b := data[end]; (b < '0' || b > '9') && b != '-' {
					return 0, &Error{Offset: end, Msg: "unexpected byte in integer"}
				}
				end++
			}
			if end >= len(data) {
				return 0, ErrShort
			}
			pos = end + 1
		case c >= '0' && c <= '9':
			n, p := 0, pos
			for p < len(data) && data[p] >= '0' && data[p] <= '9' {
				if n > (1<<31)/10 {
					return 0, &Error{Offset: pos, Msg: "string length too large"}
				}
				n = n*10 + int(data[p]-'0')
				p++
			}
			if p >= len(data) {
				return 0, ErrShort
			}
			if data[p] != ':' {
				return 0, &Error{Offset: p, Msg: "unexpected byte in string length"}
			}
			p++
			if n > len(data)-p {
				return 0, ErrShort
			}
			pos = p + n
		case c == 'l' || c == 'd':
			depth++
			if depth > DefaultMaxDepth {
				return 0, &Error{Offset: pos, Msg: "nesting too deep"}
			}
			pos++
			continue
		case c == 'e' && depth > 0:
			depth--
			pos++
		default:
			return 0, &Error{Offset: pos, Msg: "unexpected byte"}
		}
		if depth == 0 {
			return pos, nil
		}
	}
}
