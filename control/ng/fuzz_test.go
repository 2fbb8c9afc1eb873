package ng

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/ng/bencode"
)

// fuzzEngine answers every command with a full reply, or an error.
func fuzzEngine() *fakeEngine {
	now := time.Unix(1796017321, 0)
	return &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) {
		switch {
		case strings.HasPrefix(r.CallID, "err"):
			return nil, errors.New("failed: " + r.CallID)
		case strings.HasPrefix(r.CallID, "limit"):
			return nil, ErrSessionLimit
		}
		return &Reply{SDP: r.SDP, Warning: r.Label, Calls: []string{r.CallID, "\xff"},
			Call:       &CallStats{Created: now, Tags: []TagStats{{Tag: r.FromTag, Medias: []MediaStats{{Index: 1, Streams: []StreamStats{{Flags: []string{"RTP"}}}}}}, {Tag: r.FromTag}}},
			Statistics: &Statistics{}}, nil
	}}
}

func fuzzSeeds() [][]byte {
	return [][]byte{
		append([]byte("k1 "), kamailioOffer("call-1")...),
		append([]byte("k2 "), kdict("supports", []string{"load limit"}, "sdp", testSDP, "flags", []string{"trust-address"},
			"replace", []string{"origin"}, "call-id", "call-1", "received-from", []string{"IP4", "198.18.0.20"},
			"from-tag", "ftag1", "to-tag", "ttag1", "command", "answer")...),
		append([]byte("k3 "), kdict("supports", []string{"load limit"}, "call-id", "call-1", "received-from", []string{"IP4", "198.18.0.10"},
			"from-tag", "ftag1", "command", "delete")...),
		append([]byte("k4 "), kdict("call-id", "call-1", "from-tag", "ftag1", "command", "query")...),
		append([]byte("k5 "), kdict("command", "list", "limit", 5)...),
		append([]byte("k6 "), kdict("command", "statistics")...),
		append([]byte("k7 "), kdict("command", "offer", "call-id", "c", "from-tag", "f", "sdp", "v=0",
			"rtpp-flags", "replace-origin codec-strip=PCMA ICE=remove RTP/AVP internal external to-tag=t")...),
		append([]byte("k8 "), kdict("command", "offer", "call-id", "limit-1", "from-tag", "f", "sdp", "v=0", "codec",
			kdict("strip", []string{"all"}, "offer", []string{"PCMU"}))...),
		[]byte(`j1 {"command":"offer","call-id":"c","from-tag":"f","sdp":"v=0","flags":["trust-address"],"trust-address":true}`),
		[]byte("p1 d7:command4:pinge"),
		[]byte("x1 d7:command4:ping"),
		[]byte("x2 hello"),
		[]byte("x3 "),
		[]byte("nocookie"),
		[]byte("x4 dl4:pinge"),
		[]byte("x5 d7:command5:queryi1ei2ee"),
		[]byte(`x6 {"command":`),
	}
}

// FuzzServeDatagram feeds arbitrary datagrams to the handler: it never
// panics, and every reply is the cookie, a space and a bencode (or, for a
// JSON request, JSON) dictionary with a result.
func FuzzServeDatagram(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	e := fuzzEngine()
	// One server for all inputs (the fuzz workers share it), logging
	// nowhere: a test's logger would outlive its test.
	s, err := New(Config{Listen: []string{"udp:127.0.0.1:0"}}, e, zap.NewNop())
	if err != nil {
		f.Fatal(err)
	}
	from := netip.MustParseAddrPort("127.0.0.1:5060")
	f.Fuzz(func(t *testing.T, msg []byte) {
		var replies [][]byte
		s.handle(context.Background(), from, msg, func(b []byte) { replies = append(replies, b) })
		sp := strings.IndexByte(string(msg), ' ')
		if sp <= 0 {
			if len(replies) != 0 {
				t.Fatalf("no cookie, but replies %q", replies)
			}
			return
		}
		if len(replies) != 1 {
			t.Fatalf("%d replies", len(replies))
		}
		r := replies[0]
		if !strings.HasPrefix(string(r), string(msg[:sp+1])) {
			t.Fatalf("reply %q does not repeat the cookie", r)
		}
		body := r[sp+1:]
		var v bencode.Value
		var err error
		if len(body) > 0 && body[0] == '{' {
			v, err = decodeJSON(body)
		} else {
			v, err = bencode.Unmarshal(body)
		}
		if err != nil {
			t.Fatalf("reply %q does not decode: %v", r, err)
		}
		if v.Kind() != bencode.KindDict || v.GetString("result") == "" {
			t.Fatalf("reply %v has no result", v)
		}
	})
}

// FuzzParseRequest parses arbitrary bencode as a request: no panic, a
// parsed request has a command, and ValueLen agrees with Unmarshal on
// where the value ends.
func FuzzParseRequest(f *testing.F) {
	for _, s := range fuzzSeeds() {
		if sp := strings.IndexByte(string(s), ' '); sp > 0 {
			f.Add(s[sp+1:])
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := bencode.Unmarshal(data)
		if err == nil {
			if n, err := bencode.ValueLen(data); err != nil || n != len(data) {
				t.Fatalf("ValueLen %d, %v; Unmarshal took all %d bytes", n, err, len(data))
			}
			if n, err := bencode.ValueLen(append(data[:len(data):len(data)], "garbage"...)); err != nil || n != len(data) {
				t.Fatalf("ValueLen with trailing data %d, %v; want %d", n, err, len(data))
			}
		} else if len(data) > 0 && data[0] == '{' {
			v, err = decodeJSON(data)
		}
		if err != nil {
			return
		}
		r, err := ParseRequest(v)
		if err != nil {
			return
		}
		if r.Command == "" {
			t.Fatal("parsed request without a command")
		}
		for i := 1; i < len(r.Flags); i++ {
			if r.Flags[i-1] >= r.Flags[i] {
				t.Fatalf("flags not a sorted set: %v", r.Flags)
			}
		}
	})
}
