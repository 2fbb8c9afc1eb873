package ng

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/control/ng/bencode"
	"github.com/relayd/relayd/lab/rtpengine/ngclient"
)

// startServer runs a server on the given listeners with a fake engine
// that answers offers with an SDP naming the call.
func startServer(t *testing.T, listen ...string) (*Server, *fakeEngine) {
	t.Helper()
	e := &fakeEngine{fn: func(ctx context.Context, r *Request) (*Reply, error) {
		return &Reply{SDP: "v=0 " + r.CallID}, nil
	}}
	s := newTestServer(t, e, func(c *Config) { c.Listen = listen })
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return s, e
}

func hostPort(t *testing.T, s *Server, i int) string {
	t.Helper()
	_, hp, _ := strings.Cut(s.Addrs()[i], ":")
	return hp
}

func TestUDPRoundTrip(t *testing.T) {
	s, e := startServer(t, "udp:127.0.0.1:0", "udp:[::1]:0")
	for i := range 2 {
		c, err := ngclient.Dial(context.Background(), hostPort(t, s, i), ngclient.Config{Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		v, err := c.Do(context.Background(), bencode.Dict(
			bencode.Entry{Key: "command", Value: bencode.String("offer")},
			bencode.Entry{Key: "call-id", Value: bencode.String("udp-call")},
			bencode.Entry{Key: "from-tag", Value: bencode.String("f")},
			bencode.Entry{Key: "sdp", Value: bencode.String(testSDP)},
		))
		if err != nil {
			t.Fatal(err)
		}
		if v.GetString("sdp") != "v=0 udp-call" {
			t.Errorf("%s: reply %v", s.Addrs()[i], v)
		}
		if _, err := c.Do(context.Background(), bencode.Dict(bencode.Entry{Key: "command", Value: bencode.String("ping")})); err != nil {
			t.Errorf("ping: %v", err)
		}
	}
	if e.count() != 2 {
		t.Errorf("engine calls %d, want 2", e.count())
	}
}

func TestTCPRoundTrip(t *testing.T) {
	s, _ := startServer(t, "tcp:127.0.0.1:0")
	c, err := net.Dial("tcp", hostPort(t, s, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Two messages in one write, then one split in three writes.
	two := append(append([]byte("t1 "), kdict("command", "ping")...), append([]byte("t2 "), kdict("command", "offer", "call-id", "tcp1", "from-tag", "f", "sdp", testSDP)...)...)
	if _, err := c.Write(two); err != nil {
		t.Fatal(err)
	}
	split := append([]byte("t3 "), kdict("command", "offer", "call-id", "tcp2", "from-tag", "f", "sdp", testSDP)...)
	for _, part := range [][]byte{split[:2], split[2:20], split[20:]} {
		time.Sleep(20 * time.Millisecond)
		if _, err := c.Write(part); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got []byte
	buf := make([]byte, 4096)
	want := map[string]string{"t1": "pong", "t2": "v=0 tcp1", "t3": "v=0 tcp2"}
	seen := map[string]bool{}
	for len(seen) < 3 {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("read after %q: %v", got, err)
		}
		got = append(got, buf[:n]...)
		for {
			sp := bytes.IndexByte(got, ' ')
			if sp < 0 {
				break
			}
			l, err := bencode.ValueLen(got[sp+1:])
			if err != nil {
				break
			}
			cookie := string(got[:sp])
			v := decodeReply(t, got[sp+1:sp+1+l])
			if v.GetString("result") != want[cookie] && v.GetString("sdp") != want[cookie] {
				t.Errorf("%s: reply %v", cookie, v)
			}
			seen[cookie] = true
			got = got[sp+1+l:]
		}
	}
}

// A stream that is not bencode after the cookie gets rtpengine's error
// reply and is closed.
func TestTCPGarbage(t *testing.T) {
	s, _ := startServer(t, "tcp:127.0.0.1:0")
	c, err := net.Dial("tcp", hostPort(t, s, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("g1 hello")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	body, ok := strings.CutPrefix(string(got), "g1 ")
	if !ok {
		t.Fatalf("reply %q without the cookie", got)
	}
	if v := decodeReply(t, []byte(body)); !v.Equal(captured(t, "invalid-format-reply")) {
		t.Errorf("reply %v", v)
	}
}

func TestHTTPRoundTrip(t *testing.T) {
	s, _ := startServer(t, "http:127.0.0.1:0")
	url := "http://" + hostPort(t, s, 0)
	post := func(path, ctype, body string) (int, string, string) {
		t.Helper()
		resp, err := http.Post(url+path, ctype, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	if code, ct, body := post("/ng", ngContentType, "h1 "+string(kdict("command", "ping"))); code != 200 || ct != ngContentType || body != "h1 d6:result4:ponge" {
		t.Errorf("bencode: %d %q %q", code, ct, body)
	}
	if code, _, body := post("/ng", ngContentType, `h2 {"command":"ping"}`); code != 200 || body != `h2 {"result":"pong"}` {
		t.Errorf("JSON: %d %q", code, body)
	}
	if code, _, body := post("/ng", ngContentType, "nocookie"); code != 600 || body != "error\n" {
		t.Errorf("no cookie: %d %q", code, body)
	}
	if code, _, _ := post("/ng", "text/plain", "h3 "+string(kdict("command", "ping"))); code != 404 {
		t.Errorf("wrong content type: %d", code)
	}
	if code, _, _ := post("/other", ngContentType, "h4 "+string(kdict("command", "ping"))); code != 404 {
		t.Errorf("wrong path: %d", code)
	}
}

func TestListenFailureNamesAddress(t *testing.T) {
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.LocalAddr().String()
	s := newTestServer(t, &fakeEngine{}, func(c *Config) { c.Listen = []string{"tcp:127.0.0.1:0", "udp:" + taken} })
	err = s.Listen()
	if err == nil || !strings.Contains(err.Error(), taken) {
		t.Fatalf("Listen on a taken port: %v", err)
	}
	if len(s.Addrs()) != 0 {
		t.Errorf("listeners kept after a failed Listen: %v", s.Addrs())
	}
}
