// Package ngdiff replays the same sequence of rtpengine ng commands to
// two ng servers (rtpengine, relayd's ng front end) and compares their
// replies: the same result words and error reasons, the same keys at
// every level (apart from keys named as implementation-specific), values
// of the same kind, list lengths, and SDP bodies that are equal once
// addresses, ports, session ids, keys and ICE credentials are normalised.
//
// Steps are read from JSON files (LoadSteps): a list of objects with a
// name, a request (a JSON object turned into a bencode dictionary; strings
// stay strings, integers become integers) or a raw datagram body, and the
// result word expected from both servers, so that a sequence both servers
// fail alike cannot pass.
package ngdiff

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/relayd/relayd/control/ng/bencode"
)

// Step is one command of a sequence.
type Step struct {
	Name string `json:"name"`
	// Request is the command's dictionary. The string "$CALLID" inside
	// any string value is replaced by the run's Call-ID prefix.
	Request map[string]any `json:"request,omitempty"`
	// Raw, if set instead of Request, is sent as the body after the
	// cookie as it is: for malformed messages.
	Raw string `json:"raw,omitempty"`
	// Expect is the result word both servers must reply ("ok", "pong",
	// "error"), or "none" for no reply at all.
	Expect string `json:"expect"`
}

// LoadSteps reads a JSON list of steps.
func LoadSteps(path string) ([]Step, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	d.DisallowUnknownFields()
	var steps []Step
	if err := d.Decode(&steps); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, s := range steps {
		if s.Name == "" || (s.Request == nil) == (s.Raw == "") || s.Expect == "" {
			return nil, fmt.Errorf("%s: step %d (%q): want a name, one of request and raw, and expect", path, i, s.Name)
		}
	}
	return steps, nil
}

// Server is an ng server under comparison.
type Server struct {
	Name string
	// Conn is a UDP socket connected to the server's ng listener. The
	// harness owns it while Run runs.
	Conn net.Conn
}

// Options configure Run. The zero value is valid.
type Options struct {
	// Ignore names keys (at any depth) whose presence and value are
	// implementation-specific: they are left out of the comparison.
	Ignore []string
	// CallIDPrefix replaces "$CALLID" in the requests; default random,
	// so that a run does not meet an earlier run's calls.
	CallIDPrefix string
	// Timeout is how long to wait for each reply; default 1 s. A server
	// that does not answer in time has "none" as its result.
	Timeout time.Duration
}

// Difference is one way the two replies to a step differ, or a reply
// that is not the step's expected result.
type Difference struct {
	Step string
	Path string // where in the reply, such as "totals/RTP/packets"; "" for the whole reply
	What string
}

func (d Difference) String() string {
	if d.Path == "" {
		return d.Step + ": " + d.What
	}
	return d.Step + ": " + d.Path + ": " + d.What
}

// Reply is one server's reply to a step.
type Reply struct {
	Result string        // result word, "none" without a reply
	Value  bencode.Value // the reply dictionary; invalid without one
}

// Result is the outcome of a step.
type Result struct {
	Step Step
	A, B Reply
}

// Run sends each step to a then to b and returns every reply and every
// difference. It returns an error only when it cannot run (a socket
// error).
func Run(ctx context.Context, steps []Step, a, b Server, o Options) ([]Result, []Difference, error) {
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
	if o.CallIDPrefix == "" {
		var r [6]byte
		rand.Read(r[:])
		o.CallIDPrefix = "ngdiff-" + hex.EncodeToString(r[:])
	}
	ignore := map[string]bool{}
	for _, k := range o.Ignore {
		ignore[k] = true
	}
	var results []Result
	var diffs []Difference
	for i, s := range steps {
		body, err := s.body(o.CallIDPrefix)
		if err != nil {
			return results, diffs, fmt.Errorf("step %d (%s): %w", i, s.Name, err)
		}
		cookie := fmt.Sprintf("%s_%d", o.CallIDPrefix, i)
		ra, err := exchange(ctx, a.Conn, cookie, body, o.Timeout)
		if err != nil {
			return results, diffs, fmt.Errorf("step %s, %s: %w", s.Name, a.Name, err)
		}
		rb, err := exchange(ctx, b.Conn, cookie, body, o.Timeout)
		if err != nil {
			return results, diffs, fmt.Errorf("step %s, %s: %w", s.Name, b.Name, err)
		}
		results = append(results, Result{Step: s, A: ra, B: rb})
		for _, x := range []struct {
			name string
			r    Reply
		}{{a.Name, ra}, {b.Name, rb}} {
			if x.r.Result != s.Expect {
				diffs = append(diffs, Difference{Step: s.Name, What: fmt.Sprintf("%s replied %q (%s), want %q", x.name, x.r.Result, x.r.Value.GetString("error-reason"), s.Expect)})
			}
		}
		for _, d := range Compare(ra.Value, rb.Value, ignore) {
			d.Step = s.Name
			diffs = append(diffs, d)
		}
	}
	return results, diffs, nil
}

// body returns the step's message body after the cookie.
func (s Step) body(prefix string) ([]byte, error) {
	if s.Raw != "" {
		return []byte(strings.ReplaceAll(s.Raw, "$CALLID", prefix)), nil
	}
	v, err := fromJSON(s.Request, prefix)
	if err != nil {
		return nil, err
	}
	return bencode.Append(nil, v)
}

// fromJSON turns a decoded JSON value into bencode.
func fromJSON(x any, prefix string) (bencode.Value, error) {
	switch x := x.(type) {
	case string:
		return bencode.String(strings.ReplaceAll(x, "$CALLID", prefix)), nil
	case json.Number:
		n, err := x.Int64()
		if err != nil {
			return bencode.Value{}, fmt.Errorf("number %s: bencode has integers only", x)
		}
		return bencode.Int(n), nil
	case []any:
		l := make([]bencode.Value, len(x))
		for i, e := range x {
			v, err := fromJSON(e, prefix)
			if err != nil {
				return bencode.Value{}, err
			}
			l[i] = v
		}
		return bencode.List(l...), nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		e := make([]bencode.Entry, len(keys))
		for i, k := range keys {
			v, err := fromJSON(x[k], prefix)
			if err != nil {
				return bencode.Value{}, fmt.Errorf("%s: %w", k, err)
			}
			e[i] = bencode.Entry{Key: k, Value: v}
		}
		return bencode.Dict(e...), nil
	default:
		return bencode.Value{}, fmt.Errorf("JSON value %v (%T): not a string, integer, list or object", x, x)
	}
}

// exchange sends one datagram and waits for the reply with the cookie.
func exchange(ctx context.Context, conn net.Conn, cookie string, body []byte, timeout time.Duration) (Reply, error) {
	msg := append([]byte(cookie+" "), body...)
	if _, err := conn.Write(msg); err != nil {
		return Reply{}, err
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	buf := make([]byte, 65536)
	for {
		conn.SetReadDeadline(deadline)
		n, err := conn.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return Reply{Result: "none"}, nil
			}
			return Reply{}, err
		}
		got, rest, ok := bytes.Cut(buf[:n], []byte(" "))
		if !ok || string(got) != cookie {
			continue // a late reply to an earlier step
		}
		v, err := bencode.Unmarshal(rest)
		if err != nil || v.Kind() != bencode.KindDict {
			return Reply{Result: "undecodable reply"}, nil
		}
		return Reply{Result: v.GetString("result"), Value: v}, nil
	}
}

// exactKeys are compared by value; other values only by kind.
var exactKeys = map[string]bool{"result": true, "error-reason": true}

// Compare returns the differences between two replies: keys present in
// one only, values of different kinds, lists of different lengths,
// different result words or error reasons, and SDP bodies (key "sdp")
// that differ after NormalizeSDP. Keys in ignore are skipped at any
// depth.
func Compare(a, b bencode.Value, ignore map[string]bool) []Difference {
	var out []Difference
	compare(&out, "", "", a, b, ignore)
	return out
}

func compare(out *[]Difference, path, key string, a, b bencode.Value, ignore map[string]bool) {
	add := func(format string, args ...any) {
		*out = append(*out, Difference{Path: path, What: fmt.Sprintf(format, args...)})
	}
	if a.Kind() != b.Kind() {
		add("%v against %v", a.Kind(), b.Kind())
		return
	}
	switch a.Kind() {
	case bencode.KindDict:
		keys := map[string]int{}
		for k := range a.Entries() {
			keys[k] |= 1
		}
		for k := range b.Entries() {
			keys[k] |= 2
		}
		names := make([]string, 0, len(keys))
		for k := range keys {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			if ignore[k] {
				continue
			}
			p := k
			if path != "" {
				p = path + "/" + k
			}
			switch keys[k] {
			case 1:
				*out = append(*out, Difference{Path: p, What: "only in A"})
			case 2:
				*out = append(*out, Difference{Path: p, What: "only in B"})
			default:
				va, _ := a.Get(k)
				vb, _ := b.Get(k)
				compare(out, p, k, va, vb, ignore)
			}
		}
	case bencode.KindList:
		la, _ := a.AsList()
		lb, _ := b.AsList()
		if len(la) != len(lb) {
			add("list of %d against %d", len(la), len(lb))
			return
		}
		for i := range la {
			compare(out, fmt.Sprintf("%s[%d]", path, i), key, la[i], lb[i], ignore)
		}
	case bencode.KindString:
		sa, _ := a.AsString()
		sb, _ := b.AsString()
		switch {
		case key == "sdp":
			na, nb := NormalizeSDP(sa), NormalizeSDP(sb)
			if na != nb {
				add("SDP differs after normalising:\n%s", lineDiff(na, nb))
			}
		case exactKeys[key] && sa != sb:
			add("%q against %q", sa, sb)
		}
	}
}

// lineDiff lists the lines of a and b that the other lacks.
func lineDiff(a, b string) string {
	la, lb := strings.Split(a, "\r\n"), strings.Split(b, "\r\n")
	var s strings.Builder
	for i := 0; i < max(len(la), len(lb)); i++ {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			fmt.Fprintf(&s, "  line %d: A %q, B %q\n", i+1, x, y)
		}
	}
	return s.String()
}

var sdpRules = []struct {
	re   *regexp.Regexp
	with string
}{
	// Session id and version.
	{regexp.MustCompile(`^o=(\S+) \d+ \d+ `), "o=$1 ID VERSION "},
	// Ports of m= lines and a=rtcp.
	{regexp.MustCompile(`^m=(\S+) \d+(/\d+)? `), "m=$1 PORT "},
	{regexp.MustCompile(`^a=rtcp:\d+`), "a=rtcp:PORT"},
	// SDES keys, DTLS fingerprints, ICE credentials and candidates.
	{regexp.MustCompile(`inline:[A-Za-z0-9+/=]+`), "inline:KEY"},
	{regexp.MustCompile(`^a=fingerprint:(\S+) \S+`), "a=fingerprint:$1 FINGERPRINT"},
	{regexp.MustCompile(`^a=ice-(ufrag|pwd):\S+`), "a=ice-$1:X"},
	{regexp.MustCompile(`^a=candidate:.*`), "a=candidate:X"},
	// Addresses last: IPv6 first, as it may hold an IPv4 tail.
	{regexp.MustCompile(`\b(IN IP6) \S+`), "$1 ADDR6"},
	{regexp.MustCompile(`\b(IN IP4) \S+`), "$1 ADDR4"},
}

// NormalizeSDP rewrites what legitimately differs between two relays'
// SDP for the same call: session ids and versions, addresses, ports, SDES
// keys, DTLS fingerprints and ICE credentials and candidates. Line ends
// become CRLF.
func NormalizeSDP(sdp string) string {
	lines := strings.Split(strings.ReplaceAll(strings.TrimRight(sdp, "\r\n"), "\r\n", "\n"), "\n")
	for i, l := range lines {
		for _, r := range sdpRules {
			l = r.re.ReplaceAllString(l, r.with)
		}
		lines[i] = l
	}
	return strings.Join(lines, "\r\n")
}
