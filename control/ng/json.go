package ng

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/relayd/relayd/control/ng/bencode"
)

// maxJSONDepth bounds the nesting of a JSON request, as the bencode
// decoder's limit does.
const maxJSONDepth = bencode.DefaultMaxDepth

// decodeJSON converts a JSON document to a bencode Value as rtpengine's
// bencode_convert_json does: strings stay strings, numbers and booleans
// become integers (true is 1), arrays lists and objects dictionaries.
// null members are dropped. A duplicate key is an error.
func decodeJSON(data []byte) (bencode.Value, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := jsonValue(d, 0)
	if err != nil {
		return bencode.Value{}, err
	}
	if _, err := d.Token(); err != io.EOF {
		return bencode.Value{}, errors.New("trailing data after the JSON document")
	}
	return v, nil
}

var errJSONNull = errors.New("null")

func jsonValue(d *json.Decoder, depth int) (bencode.Value, error) {
	tok, err := d.Token()
	if err != nil {
		return bencode.Value{}, err
	}
	switch t := tok.(type) {
	case string:
		return bencode.String(t), nil
	case json.Number:
		if n, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return bencode.Int(n), nil
		}
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil || math.IsNaN(f) || f > math.MaxInt64 || f < math.MinInt64 {
			return bencode.Value{}, fmt.Errorf("number %s out of range", t)
		}
		return bencode.Int(int64(f)), nil
	case bool:
		if t {
			return bencode.Int(1), nil
		}
		return bencode.Int(0), nil
	case nil:
		return bencode.Value{}, errJSONNull
	case json.Delim:
		if depth >= maxJSONDepth {
			return bencode.Value{}, fmt.Errorf("nesting deeper than %d", maxJSONDepth)
		}
		switch t {
		case '[':
			var l []bencode.Value
			for d.More() {
				v, err := jsonValue(d, depth+1)
				if errors.Is(err, errJSONNull) {
					continue
				}
				if err != nil {
					return bencode.Value{}, err
				}
				l = append(l, v)
			}
			if _, err := d.Token(); err != nil {
				return bencode.Value{}, err
			}
			return bencode.List(l...), nil
		case '{':
			var entries []bencode.Entry
			seen := map[string]bool{}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return bencode.Value{}, err
				}
				k, _ := kt.(string)
				if seen[k] {
					return bencode.Value{}, fmt.Errorf("duplicate key %q", k)
				}
				seen[k] = true
				v, err := jsonValue(d, depth+1)
				if errors.Is(err, errJSONNull) {
					continue
				}
				if err != nil {
					return bencode.Value{}, err
				}
				entries = append(entries, bencode.Entry{Key: k, Value: v})
			}
			if _, err := d.Token(); err != nil {
				return bencode.Value{}, err
			}
			return bencode.Dict(entries...), nil
		}
	}
	return bencode.Value{}, fmt.Errorf("unexpected JSON token %v", tok)
}

// appendJSON appends v as JSON (rtpengine answers a JSON request in
// JSON), dictionaries in entry order.
func appendJSON(dst []byte, v bencode.Value) []byte {
	switch v.Kind() {
	case bencode.KindString:
		s, _ := v.AsString()
		b, _ := json.Marshal(s) // invalid UTF-8 becomes U+FFFD
		return append(dst, b...)
	case bencode.KindInt:
		n, _ := v.AsInt()
		return strconv.AppendInt(dst, n, 10)
	case bencode.KindList:
		l, _ := v.AsList()
		dst = append(dst, '[')
		for i, e := range l {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSON(dst, e)
		}
		return append(dst, ']')
	case bencode.KindDict:
		dst = append(dst, '{')
		first := true
		for k, e := range v.Entries() {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			dst = appendJSON(dst, bencode.String(k))
			dst = append(dst, ':')
			dst = appendJSON(dst, e)
		}
		return append(dst, '}')
	}
	return append(dst, "null"...)
}
