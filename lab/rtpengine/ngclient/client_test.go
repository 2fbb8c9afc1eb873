package ngclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relayd/relayd/control/ng/bencode"
)

// fakeServer is an ng server on 127.0.0.1 for tests. handle answers each
// datagram: it gets the cookie, the decoded request and how many times
// this cookie has been seen (1 for the first), and returns the
// datagrams to send back, if any, each after its delay.
type fakeServer struct {
	t      *testing.T
	conn   *net.UDPConn
	handle func(cookie string, req bencode.Value, seen int) []reply
	wg     sync.WaitGroup

	mu    sync.Mutex // guards the following
	seen  map[string]int
	raw   map[string][][]byte // datagrams per cookie
	total int
}

type reply struct {
	delay time.Duration
	data  []byte // whole datagram
}

// answer returns the datagram of a reply with cookie.
func answer(cookie string, v bencode.Value) []byte {
	b, err := bencode.Append([]byte(cookie+" "), v)
	if err != nil {
		panic(err)
	}
	return b
}

func newFakeServer(t *testing.T, handle func(cookie string, req bencode.Value, seen int) []reply) *fakeServer {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeServer{t: t, conn: conn, handle: handle, seen: map[string]int{}, raw: map[string][][]byte{}}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(func() {
		conn.Close()
		s.wg.Wait()
	})
	return s
}

func (s *fakeServer) addr() string { return s.conn.LocalAddr().String() }

func (s *fakeServer) serve() {
	defer s.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		msg := append([]byte(nil), buf[:n]...)
		cookie, body, ok := bytes.Cut(msg, []byte(" "))
		if !ok {
			s.t.Errorf("fake server: datagram without cookie: %q", msg)
			continue
		}
		req, err := bencode.Unmarshal(body)
		if err != nil {
			s.t.Errorf("fake server: request %q: %v", body, err)
			continue
		}
		s.mu.Lock()
		s.seen[string(cookie)]++
		seen := s.seen[string(cookie)]
		s.raw[string(cookie)] = append(s.raw[string(cookie)], msg)
		s.total++
		s.mu.Unlock()
		for _, r := range s.handle(string(cookie), req, seen) {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				time.Sleep(r.delay)
				s.conn.WriteToUDPAddrPort(r.data, from)
			}()
		}
	}
}

// rtpengineLike answers like rtpengine: pong, a rewritten SDP for offer
// and answer, statistics for query, ok for delete, errors for unknown
// commands.
func rtpengineLike(cookie string, req bencode.Value, _ int) []reply {
	var v bencode.Value
	switch cmd := req.GetString("command"); cmd {
	case "ping":
		v = bencode.Dict(bencode.Entry{Key: "result", Value: bencode.String("pong")})
	case "offer", "answer":
		sdp := strings.ReplaceAll(req.GetString("sdp"), "198.18.0.2", "198.18.1.1")
		v = bencode.Dict(
			bencode.Entry{Key: "sdp", Value: bencode.String(sdp)},
			bencode.Entry{Key: "result", Value: bencode.String("ok")},
		)
	case "query":
		b, err := os.ReadFile("testdata/rtpengine-10.5-query-reply.bencode")
		if err != nil {
			panic(err)
		}
		return []reply{{data: append([]byte(cookie+" "), b...)}}
	case "delete":
		v = bencode.Dict(bencode.Entry{Key: "result", Value: bencode.String("ok")})
	case "list":
		ids := []string{"a@x", "b@x", "c@x"}
		if n, ok := req.GetInt("limit"); ok && int(n) < len(ids) {
			ids = ids[:n]
		}
		v = bencode.Dict(
			bencode.Entry{Key: "calls", Value: bencode.Strings(ids...)},
			bencode.Entry{Key: "result", Value: bencode.String("ok")},
		)
	default:
		v = bencode.Dict(
			bencode.Entry{Key: "result", Value: bencode.String("error")},
			bencode.Entry{Key: "error-reason", Value: bencode.String("Unrecognized command")},
		)
	}
	return []reply{{data: answer(cookie, v)}}
}

func dialT(t *testing.T, addr string, cfg Config) *Client {
	t.Helper()
	c, err := Dial(context.Background(), addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestPing(t *testing.T) {
	s := newFakeServer(t, rtpengineLike)
	c := dialT(t, s.addr(), Config{})
	if err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for cookie, msgs := range s.raw {
		if want := cookie + " d7:command4:pinge"; len(msgs) != 1 || string(msgs[0]) != want {
			t.Errorf("server got %q, want %q", msgs, want)
		}
	}
}

func TestOfferAnswerQueryDelete(t *testing.T) {
	s := newFakeServer(t, rtpengineLike)
	c := dialT(t, s.addr(), Config{})
	ctx := context.Background()
	sdp := "v=0\r\no=- 1 1 IN IP4 198.18.0.2\r\ns=-\r\nc=IN IP4 198.18.0.2\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"
	r, err := c.Offer(ctx, Request{CallID: "c1", FromTag: "f1", SDP: sdp, Flags: []string{"trust-address"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.SDP, "c=IN IP4 198.18.1.1\r\n") || r.Raw.GetString("result") != "ok" {
		t.Errorf("offer reply %v", r.Raw)
	}
	if _, err := c.Answer(ctx, Request{CallID: "c1", FromTag: "f1", SDP: sdp}); err == nil || !strings.Contains(err.Error(), "to-tag is required") {
		t.Errorf("answer without to-tag: %v", err)
	}
	if _, err := c.Answer(ctx, Request{CallID: "c1", FromTag: "f1", ToTag: "t1", SDP: sdp}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Offer(ctx, Request{CallID: "c1", SDP: sdp}); err == nil {
		t.Error("offer without from-tag succeeded")
	}
	st, err := c.Query(ctx, Request{CallID: "a84b4c76e667"})
	if err != nil {
		t.Fatal(err)
	}
	if st.RTP != (Counters{Packets: 5, Bytes: 860}) {
		t.Errorf("query totals %+v", st.RTP)
	}
	if _, err := c.Delete(ctx, Request{CallID: "c1"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Do(ctx, bencode.Dict(bencode.Entry{Key: "command", Value: bencode.String("bogus")}))
	var re *ReplyError
	if !errors.As(err, &re) || re.Command != "bogus" || re.Result != "error" || re.Reason != "Unrecognized command" {
		t.Errorf("bogus command: %v", err)
	}
	if _, err := c.Do(ctx, bencode.Dict()); err == nil {
		t.Error("Do without command succeeded")
	}
}

// The statistics of a query reply captured from rtpengine 10.5 in the lab
// (one call, 3 packets from the caller, 2 from the callee).
func TestParseStats(t *testing.T) {
	b, err := os.ReadFile("testdata/rtpengine-10.5-query-reply.bencode")
	if err != nil {
		t.Fatal(err)
	}
	v, err := bencode.Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	st := parseStats(v)
	if got, want := st.Created, time.Unix(1796017321, 499683000); !got.Equal(want) {
		t.Errorf("created %v, want %v", got, want)
	}
	if st.RTP != (Counters{Packets: 5, Bytes: 860}) || st.RTCP != (Counters{}) {
		t.Errorf("totals RTP %+v RTCP %+v", st.RTP, st.RTCP)
	}
	ap := netip.MustParseAddrPort
	last := time.Unix(1796017321, 0)
	want := []StreamStats{
		{Tag: "19283014", Media: 1, Local: ap("198.18.1.1:30022"), Endpoint: ap("198.18.0.2:4000"), LastPacket: last, Counters: Counters{Packets: 3, Bytes: 516}},
		{Tag: "19283014", Media: 1, RTCP: true, Local: ap("198.18.1.1:30023"), Endpoint: ap("198.18.0.2:4001"), LastPacket: last},
		{Tag: "a6c85cf", Media: 1, Local: ap("198.18.1.1:30000"), Endpoint: ap("198.18.2.2:5000"), LastPacket: last, Counters: Counters{Packets: 2, Bytes: 344}},
		{Tag: "a6c85cf", Media: 1, RTCP: true, Local: ap("198.18.1.1:30001"), Endpoint: ap("198.18.2.2:5001"), LastPacket: last},
	}
	if diff := cmp.Diff(st.Streams, want, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) }), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("streams (-got +want):\n%s", diff)
	}
	if s, ok := st.Stream("a6c85cf", 1); !ok || s.Packets != 2 {
		t.Errorf("Stream(a6c85cf, 1) = %+v, %t", s, ok)
	}
	if _, ok := st.Stream("nobody", 1); ok {
		t.Error("Stream of an unknown tag")
	}
	// An error reply, also captured.
	b, err = os.ReadFile("testdata/rtpengine-10.5-error-reply.bencode")
	if err != nil {
		t.Fatal(err)
	}
	_, err = parseReply("query", b)
	var re *ReplyError
	if !errors.As(err, &re) || re.Reason != "Unknown call-id" || err.Error() != "ng query: error: Unknown call-id" {
		t.Errorf("error reply: %v", err)
	}
}

// A lost request or reply is sent again with the same cookie and the
// same bytes, so the server can answer from its cache.
func TestRetrySameCookie(t *testing.T) {
	s := newFakeServer(t, func(cookie string, req bencode.Value, seen int) []reply {
		if seen < 3 {
			return nil // lose the first two
		}
		return rtpengineLike(cookie, req, seen)
	})
	c := dialT(t, s.addr(), Config{Timeout: 30 * time.Millisecond, Retries: 2})
	if err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.raw) != 1 {
		t.Fatalf("%d cookies, want 1", len(s.raw))
	}
	for _, msgs := range s.raw {
		if len(msgs) != 3 || !bytes.Equal(msgs[0], msgs[1]) || !bytes.Equal(msgs[1], msgs[2]) {
			t.Errorf("attempts %q, want 3 identical", msgs)
		}
	}
}

func TestTimeout(t *testing.T) {
	s := newFakeServer(t, func(string, bencode.Value, int) []reply { return nil })
	for _, tc := range []struct {
		retries, attempts int
	}{{0, 1 + DefaultRetries}, {-1, 1}, {4, 5}} {
		c := dialT(t, s.addr(), Config{Timeout: 20 * time.Millisecond, Retries: tc.retries})
		start := time.Now()
		err := c.Ping(context.Background())
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), fmt.Sprintf("after %d attempts", tc.attempts)) {
			t.Errorf("retries %d: %v, want ErrTimeout after %d attempts", tc.retries, err, tc.attempts)
		}
		if d := time.Since(start); d < time.Duration(tc.attempts)*20*time.Millisecond {
			t.Errorf("retries %d: gave up after %v", tc.retries, d)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total != 3+1+5 {
		t.Errorf("server got %d datagrams, want %d", s.total, 3+1+5)
	}
}

func TestContextCanceled(t *testing.T) {
	s := newFakeServer(t, func(string, bencode.Value, int) []reply { return nil })
	c := dialT(t, s.addr(), Config{Timeout: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := c.Ping(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ping: %v, want deadline exceeded", err)
	}
}

// Nothing listens: the socket reports the ICMP error, the client keeps
// trying and says so when it gives up.
func TestConnectionRefused(t *testing.T) {
	l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	addr := l.LocalAddr().String()
	l.Close()
	c := dialT(t, addr, Config{Timeout: 20 * time.Millisecond})
	err = c.Ping(context.Background())
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("ping to a closed port: %v", err)
	}
}

// Many goroutines share a client; the server answers out of order, late
// duplicates and garbage in between, and each request gets its own reply.
func TestConcurrent(t *testing.T) {
	s := newFakeServer(t, func(cookie string, req bencode.Value, seen int) []reply {
		n, _ := req.GetInt("n")
		v := answer(cookie, bencode.Dict(
			bencode.Entry{Key: "result", Value: bencode.String("ok")},
			bencode.Entry{Key: "n", Value: bencode.Int(n)},
		))
		d := time.Duration(rand.IntN(5)) * time.Millisecond
		return []reply{
			{delay: d, data: v},
			{delay: d + time.Millisecond, data: v},                   // a duplicate: late
			{delay: d, data: []byte("nocookie")},                     // malformed
			{delay: d, data: answer("someone-else", bencode.Dict())}, // unknown cookie: late
			{delay: d, data: []byte(cookie + "x d6:result2:oke")},    // unknown cookie
		}
	})
	c := dialT(t, s.addr(), Config{Timeout: 2 * time.Second})
	const workers, each = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				n := int64(w*1000 + i)
				v, err := c.Do(context.Background(), bencode.Dict(
					bencode.Entry{Key: "command", Value: bencode.String("query")},
					bencode.Entry{Key: "n", Value: bencode.Int(n)},
				))
				if err != nil {
					errs <- err
					continue
				}
				if got, _ := v.GetInt("n"); got != n {
					errs <- fmt.Errorf("request %d got the reply of %d", n, got)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Let the late datagrams arrive.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if st := c.Stats(); st.Malformed >= workers*each && st.Late >= 3*workers*each {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := c.Stats(); st.Malformed != workers*each || st.Late != 3*workers*each {
		t.Errorf("stats %+v, want %d malformed and %d late", st, workers*each, 3*workers*each)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) != 0 {
		t.Errorf("%d requests still pending", len(c.pending))
	}
}

// Close ends a request in flight and later ones with net.ErrClosed.
func TestClose(t *testing.T) {
	s := newFakeServer(t, func(string, bencode.Value, int) []reply { return nil })
	c, err := Dial(context.Background(), s.addr(), Config{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- c.Ping(context.Background()) }()
	for {
		s.mu.Lock()
		n := s.total
		s.mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Errorf("ping in flight: %v, want net.ErrClosed", err)
	}
	if err := c.Ping(context.Background()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("ping after close: %v, want net.ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

func TestConfig(t *testing.T) {
	s := newFakeServer(t, rtpengineLike)
	if _, err := Dial(context.Background(), s.addr(), Config{Timeout: -time.Second}); err == nil {
		t.Error("negative timeout accepted")
	}
}

func TestRequestMessage(t *testing.T) {
	r := Request{
		CallID: "c", FromTag: "f", ToTag: "t", ViaBranch: "v", SDP: "s",
		Flags: []string{"trust-address"}, Replace: []string{"origin"}, Direction: []string{"internal", "external"},
		ICE: "remove", RTCPMux: []string{"demux"}, TransportProtocol: "RTP/AVP",
		Extra: []bencode.Entry{{Key: "record call", Value: bencode.String("no")}},
	}
	b, err := bencode.Append(nil, r.Message("offer"))
	if err != nil {
		t.Fatal(err)
	}
	want := "d3:ICE6:remove7:call-id1:c7:command5:offer9:directionl8:internal8:externale5:flagsl13:trust-addresse" +
		"8:from-tag1:f11:record call2:no7:replacel6:origine8:rtcp-muxl5:demuxe3:sdp1:s6:to-tag1:t" +
		"18:transport-protocol7:RTP/AVP10:via-branch1:ve"
	if string(b) != want {
		t.Errorf("message\n got %q\nwant %q", b, want)
	}
	// Empty fields are left out; an extra key clashing with a field is an
	// encoding error.
	b, _ = bencode.Append(nil, (&Request{CallID: "c"}).Message("query"))
	if string(b) != "d7:call-id1:c7:command5:querye" {
		t.Errorf("minimal message %q", b)
	}
	if _, err := bencode.Append(nil, (&Request{CallID: "c", Extra: []bencode.Entry{{Key: "call-id", Value: bencode.String("d")}}}).Message("query")); err == nil {
		t.Error("duplicate key encoded")
	}
}

func TestList(t *testing.T) {
	s := newFakeServer(t, rtpengineLike)
	c := dialT(t, s.addr(), Config{})
	for _, tc := range []struct {
		limit int
		want  []string
	}{{0, []string{"a@x", "b@x", "c@x"}}, {2, []string{"a@x", "b@x"}}} {
		got, err := c.List(context.Background(), tc.limit)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("list limit %d (-want +got):\n%s", tc.limit, diff)
		}
	}
}
