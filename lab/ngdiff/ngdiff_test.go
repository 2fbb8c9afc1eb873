package ngdiff

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/relayd/relayd/control/ng/bencode"
)

func TestNormalizeSDP(t *testing.T) {
	a := "v=0\r\no=- 1545997027 1 IN IP4 198.18.1.1\r\ns=-\r\nc=IN IP4 198.18.1.1\r\nt=0 0\r\nm=audio 30000 RTP/SAVP 0\r\na=rtcp:30001\r\n" +
		"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz\r\na=ice-ufrag:abcd\r\na=candidate:1 1 UDP 2130706431 198.18.1.1 30000 typ host\r\n"
	b := "v=0\no=- 99 2 IN IP4 198.18.7.1\ns=-\nc=IN IP4 198.18.7.1\nt=0 0\nm=audio 30522 RTP/SAVP 0\na=rtcp:30523\n" +
		"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNk\na=ice-ufrag:wxyz\na=candidate:9 1 UDP 1 198.18.7.1 30522 typ host\n"
	if diff := cmp.Diff(NormalizeSDP(a), NormalizeSDP(b)); diff != "" {
		t.Errorf("equal SDPs after normalising differ (-a +b):\n%s", diff)
	}
	for _, c := range []string{
		strings.Replace(b, "RTP/SAVP 0", "RTP/AVP 0", 1),
		strings.Replace(b, "a=rtcp:30523\n", "", 1),
		strings.Replace(b, "IN IP4 198.18.7.1\nt=", "IN IP6 2001:2::1\nt=", 1),
		strings.Replace(b, "HMAC_SHA1_80", "HMAC_SHA1_32", 1),
	} {
		if NormalizeSDP(a) == NormalizeSDP(c) {
			t.Errorf("different SDPs equal after normalising:\n%q\n%q", a, c)
		}
	}
}

func dict(kv ...any) bencode.Value {
	var e []bencode.Entry
	for i := 0; i < len(kv); i += 2 {
		v, ok := kv[i+1].(bencode.Value)
		if !ok {
			switch x := kv[i+1].(type) {
			case string:
				v = bencode.String(x)
			case int:
				v = bencode.Int(int64(x))
			}
		}
		e = append(e, bencode.Entry{Key: kv[i].(string), Value: v})
	}
	return bencode.Dict(e...)
}

func TestCompare(t *testing.T) {
	base := dict("result", "ok", "created", 5, "totals", dict("RTP", dict("packets", 3)), "calls", bencode.Strings("a", "b"), "sdp", "v=0\r\nc=IN IP4 198.18.1.1\r\n")
	for _, tc := range []struct {
		name  string
		b     bencode.Value
		paths []string
	}{
		{"same but values", dict("result", "ok", "created", 9, "totals", dict("RTP", dict("packets", 7)), "calls", bencode.Strings("c", "d"), "sdp", "v=0\r\nc=IN IP4 198.18.7.1\r\n"), nil},
		{"result", dict("result", "error", "created", 5, "totals", dict("RTP", dict("packets", 3)), "calls", bencode.Strings("a", "b"), "sdp", "v=0\r\nc=IN IP4 198.18.1.1\r\n"), []string{"result"}},
		{"missing nested key", dict("result", "ok", "created", 5, "totals", dict("RTP", dict()), "calls", bencode.Strings("a", "b"), "sdp", "v=0\r\nc=IN IP4 198.18.1.1\r\n"), []string{"totals/RTP/packets"}},
		{"kind and length", dict("result", "ok", "created", "5", "totals", dict("RTP", dict("packets", 3)), "calls", bencode.Strings("a"), "sdp", "v=0\r\nc=IN IP4 198.18.1.1\r\n"), []string{"calls", "created"}},
		{"extra key, sdp", dict("result", "ok", "created", 5, "x", 1, "totals", dict("RTP", dict("packets", 3)), "calls", bencode.Strings("a", "b"), "sdp", "v=0\r\nc=IN IP6 2001:2::1\r\n"), []string{"sdp", "x"}},
	} {
		var paths []string
		for _, d := range Compare(base, tc.b, nil) {
			paths = append(paths, d.Path)
		}
		if diff := cmp.Diff(tc.paths, paths); diff != "" {
			t.Errorf("%s: differences (-want +got):\n%s", tc.name, diff)
		}
	}
	if d := Compare(base, dict("result", "ok"), map[string]bool{"created": true, "totals": true, "calls": true, "sdp": true}); len(d) != 0 {
		t.Errorf("ignored keys compared: %v", d)
	}
}

// fakeServer answers every datagram with reply(body), or not at all if
// reply returns nil.
func fakeServer(t *testing.T, reply func(body []byte) []byte) net.Conn {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFromUDP(buf)
			if err != nil {
				return
			}
			cookie, body, _ := strings.Cut(string(buf[:n]), " ")
			if r := reply([]byte(body)); r != nil {
				pc.WriteToUDP(append([]byte(cookie+" "), r...), from)
			}
		}
	}()
	c, err := net.Dial("udp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRun: the harness reports a server that answers differently or not
// at all, and the expected result of each step.
func TestRun(t *testing.T) {
	steps, err := LoadSteps("testdata/steps.json")
	if err != nil {
		t.Fatal(err)
	}
	pong := func(body []byte) []byte {
		v, err := bencode.Unmarshal(body)
		if err != nil || v.GetString("command") != "ping" {
			return []byte("d12:error-reason3:bad6:result5:errore")
		}
		return []byte("d6:result4:ponge")
	}
	silent := func([]byte) []byte { return nil }
	ctx := context.Background()
	_, diffs, err := Run(ctx, steps[:1], Server{"a", fakeServer(t, pong)}, Server{"b", fakeServer(t, pong)}, Options{})
	if err != nil || len(diffs) != 0 {
		t.Errorf("two alike servers: %v, %v", diffs, err)
	}
	res, diffs, err := Run(ctx, steps[:2], Server{"a", fakeServer(t, pong)}, Server{"b", fakeServer(t, silent)}, Options{Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].B.Result != "none" || res[1].A.Result != "error" {
		t.Errorf("results %+v", res)
	}
	// ping: b silent (expect, kind); offer: a error, b silent (expect x2, kind).
	if len(diffs) != 5 {
		t.Errorf("%d differences, want 5: %v", len(diffs), diffs)
	}
}

func TestLoadStepsRejects(t *testing.T) {
	for _, body := range []string{
		`[{"name": "x", "expect": "ok"}]`,
		`[{"name": "x", "raw": "d", "request": {"command": "ping"}, "expect": "ok"}]`,
		`[{"request": {"command": "ping"}, "expect": "ok"}]`,
		`[{"name": "x", "request": {"command": "ping"}}]`,
		`[{"name": "x", "request": {"command": "ping"}, "expect": "ok", "other": 1}]`,
	} {
		path := t.TempDir() + "/s.json"
		if err := writeFile(path, body); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadSteps(path); err == nil {
			t.Errorf("loaded %s", body)
		}
	}
}

func writeFile(path, body string) error { return os.WriteFile(path, []byte(body), 0o644) }
