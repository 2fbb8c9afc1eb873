package sipua

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/voipgen/payload"

	"github.com/relayd/relayd/lab"
)

func TestSDP(t *testing.T) {
	for _, name := range []string{"pcmu", "pcma", "g729", "opus"} {
		c, _ := payload.LookupAny(name, 20*time.Millisecond)
		for _, ap := range []string{"198.18.0.2:20000", "[2001:2::2]:20002"} {
			a := netip.MustParseAddrPort(ap)
			m, err := ParseSDP(SDPBody(a, c, 20*time.Millisecond, 1))
			if err != nil || m.Addr != a || len(m.PTs) != 1 || m.PTs[0] != int(c.PayloadType) {
				t.Errorf("%s %s: %+v %v", name, ap, m, err)
			}
		}
	}
	// A media-level c= wins over the session's; the first audio stream counts.
	sdp := "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 198.18.0.9\r\nt=0 0\r\n" +
		"m=video 5000 RTP/AVP 96\r\nc=IN IP4 198.18.0.7\r\nm=audio 6000 RTP/AVP 8 0 101\r\nc=IN IP4 198.18.0.8\r\nm=audio 7000 RTP/AVP 0\r\n"
	m, err := ParseSDP([]byte(sdp))
	if err != nil || m.Addr != netip.MustParseAddrPort("198.18.0.8:6000") || len(m.PTs) != 3 {
		t.Fatalf("%+v %v", m, err)
	}
	for _, bad := range []string{"", "v=0\r\nm=video 1 RTP/AVP 0\r\n", "v=0\r\nm=audio 6000 RTP/AVP 0\r\n", "c=IN IP4 x\r\nm=audio 1 RTP/AVP 0\r\n", "m=audio 99999 RTP/AVP 0\r\n"} {
		if _, err := ParseSDP([]byte(bad)); err == nil {
			t.Errorf("parseSDP(%q) succeeded", bad)
		}
	}
}

func FuzzParseSDP(f *testing.F) {
	c, _ := payload.Lookup("pcmu", 20*time.Millisecond)
	f.Add(SDPBody(netip.MustParseAddrPort("198.18.0.2:20000"), c, 20*time.Millisecond, 1))
	f.Add([]byte("m=audio 6000/2 RTP/AVP 0\nc=IN IP6 2001:2::1/64\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseSDP(b)
		if err == nil && !m.Addr.Addr().IsValid() {
			t.Fatalf("no address without error: %+v", m)
		}
	})
}

// callAnswer runs voipgen answer with personality and voipgen call against
// it on loopback.
func callAnswer(t *testing.T, personality string, calls int, callArgs ...string) ([]CallReport, []CallReport) {
	t.Helper()
	return callAnswerWith(t, personality, calls, nil, callArgs...)
}

// callAnswerWith is callAnswer with a function that may change the call
// side's configuration before the calls are placed.
func callAnswerWith(t *testing.T, personality string, calls int, set func(*CallConfig), callArgs ...string) ([]CallReport, []CallReport) {
	t.Helper()
	// The media ports are below the kernel's ephemeral range
	// (ip_local_port_range, 32768-60999 by default), where any socket
	// of any process on the machine, the SIP sockets' free ports
	// picked below included, may hold one: a CI run lost a test to an
	// "address already in use" on 44000.
	acfg, err := ParseAnswer([]string{"--sip", "127.0.0.1:0", "--personality", personality, "--rtp-port", "24000", "--ring", "100ms",
		"--duration", "20s", "--max-calls", strconv.Itoa(calls)}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Port 0 would not do in SDP and Contact: pick a free port.
	acfg.Listen = netip.AddrPortFrom(acfg.Listen.Addr(), uint16(freeUDPPort(t)))
	ready := make(chan struct{})
	ansDone := make(chan []CallReport)
	go func() {
		r, err := AnswerCalls(context.Background(), acfg, ready)
		if err != nil {
			t.Error(err)
		}
		ansDone <- r
	}()
	<-ready
	ccfg, err := ParseCall(append([]string{"--sip", fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t)), "--target", fmt.Sprintf("sip:answer@%s", acfg.Listen),
		"--calls", strconv.Itoa(calls), "--rate", "20", "--rtp-port", "25000"}, callArgs...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if set != nil {
		set(&ccfg)
	}
	got, err := PlaceCalls(context.Background(), ccfg)
	if err != nil {
		t.Fatal(err)
	}
	return got, <-ansDone
}

func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

func TestCallAnswerPersonalities(t *testing.T) {
	t.Run("answer", func(t *testing.T) {
		calls, answered := callAnswer(t, "answer", 3, "--call-duration", "1s")
		for _, set := range [][]CallReport{calls, answered} {
			if len(set) != 3 {
				t.Fatalf("%d calls reported, want 3", len(set))
			}
			for _, c := range set {
				if !c.Success || c.Status != 200 || c.Received == nil || c.Received.Packets < 40 || c.Received.Lost != 0 || c.SentPackets < 45 {
					t.Errorf("call %+v, received %+v", c, c.Received)
				}
			}
		}
		for _, c := range calls {
			if c.T180Ms <= 0 || c.T200Ms < c.T180Ms || c.T200Ms < 90 || c.ByeFrom != "local" {
				t.Errorf("setup times %+v", c)
			}
		}
	})
	t.Run("hangup", func(t *testing.T) {
		// Four calls of an hour, one a second, hung up 1.5 s after the
		// first was placed: the two placed by then end with the caller's
		// BYE, answered by the callee, with their media, and the other
		// two are never placed.
		t0 := time.Now()
		hangup := make(chan struct{})
		time.AfterFunc(1500*time.Millisecond, func() { close(hangup) })
		calls, answered := callAnswerWith(t, "answer", 2, func(c *CallConfig) { c.Hangup = hangup; c.Calls = 4; c.Rate = 1 },
			"--call-duration", "1h")
		if d := time.Since(t0); d > 10*time.Second {
			t.Errorf("the calls took %v to end after the hangup at 1.5 s", d)
		}
		if len(calls) != 2 {
			t.Fatalf("%d calls reported, want the 2 placed before the hangup: %+v", len(calls), calls)
		}
		for _, c := range calls {
			if !c.Success || c.ByeFrom != "local" || c.Duration > 2 || c.Received == nil || c.Received.Packets == 0 || c.Received.Lost != 0 {
				t.Errorf("call %+v, received %+v: want success, its own BYE within 2 s, media", c, c.Received)
			}
		}
		for _, c := range answered {
			if !c.Success || c.ByeFrom != "remote" {
				t.Errorf("answer side %+v: want the caller's BYE", c)
			}
		}
	})
	for _, code := range []int{404, 480, 503, 603} {
		t.Run(fmt.Sprintf("reject %d", code), func(t *testing.T) {
			calls, answered := callAnswer(t, fmt.Sprintf("reject:%d", code), 2)
			for _, c := range calls {
				if c.Success || c.Status != code {
					t.Errorf("call %+v, want status %d", c, code)
				}
			}
			if len(answered) != 2 || answered[0].Status != code {
				t.Errorf("answer side %+v", answered)
			}
		})
	}
	t.Run("signal", func(t *testing.T) {
		// Signalling only: Peer for the calls answered, Failed for those
		// refused, with their status, while they happen.
		for _, personality := range []string{"answer", "reject:486"} {
			var mu sync.Mutex
			peers, failures := map[int]bool{}, map[int]int{}
			sig := &Signal{
				Media: func(i int) netip.AddrPort { return netip.MustParseAddrPort("127.0.0.1:9") },
				Peer:  func(i int, _ netip.AddrPort) { mu.Lock(); peers[i] = true; mu.Unlock() },
				Failed: func(i, status int, reason string) {
					mu.Lock()
					failures[i] = status
					mu.Unlock()
				},
			}
			callAnswerWith(t, personality, 2, func(c *CallConfig) { c.Signal = sig }, "--call-duration", "200ms")
			mu.Lock()
			if personality == "answer" && (len(peers) != 2 || len(failures) != 0) {
				t.Errorf("answer: peers %v, failures %v; want both calls peered, none failed", peers, failures)
			}
			if personality != "answer" && (len(peers) != 0 || len(failures) != 2 || failures[0] != 486 || failures[1] != 486) {
				t.Errorf("%s: peers %v, failures %v; want both calls failed with 486", personality, peers, failures)
			}
			mu.Unlock()
		}
	})
	t.Run("ring", func(t *testing.T) {
		calls, _ := callAnswer(t, "ring", 1, "--answer-timeout", "500ms")
		if c := calls[0]; c.Success || c.T180Ms <= 0 || c.T200Ms != 0 {
			t.Errorf("call %+v, want 180 and no answer", c)
		}
	})
	t.Run("silent", func(t *testing.T) {
		t0 := time.Now()
		calls, _ := callAnswer(t, "silent", 1, "--answer-timeout", "500ms")
		if c := calls[0]; c.Success || c.T180Ms != 0 || c.Status != 0 || c.Error == "" {
			t.Errorf("call %+v, want no response at all", c)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("an unanswered call took %v to give up, want the 500 ms answer timeout", d)
		}
	})
}

// sipp runs SIPp in ns until it exits (after its -m calls) or ctx ends,
// with statistics in a CSV file, and returns the last statistics row.
func sipp(t *testing.T, ctx context.Context, ns *lab.NS, args ...string) map[string]string {
	t.Helper()
	stat := filepath.Join(t.TempDir(), "stat.csv")
	args = append(args, "-nostdin", "-trace_stat", "-stf", stat, "-fd", "1")
	cmd := ns.CommandContext(ctx, "sipp", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	f, ferr := os.Open(stat)
	if ferr != nil {
		t.Fatalf("sipp %q: %v, no statistics: %v\n%s", args, err, ferr, lastBytes(out.Bytes(), 2000))
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comma, r.FieldsPerRecord = ';', -1
	rows, rerr := r.ReadAll()
	if rerr != nil || len(rows) < 2 {
		t.Fatalf("sipp statistics: %v (%d rows)", rerr, len(rows))
	}
	m := map[string]string{}
	for i, k := range rows[0] {
		if i < len(rows[len(rows)-1]) {
			m[k] = rows[len(rows)-1][i]
		}
	}
	return m
}

func lastBytes(b []byte, n int) []byte { return b[max(0, len(b)-n):] }

// TestLabSIPp runs voipgen call against SIPp's UAS and SIPp's UAC against
// voipgen answer in the lab, across the forwarding namespace. SIPp echoes
// RTP (-rtp_echo), so media flowing back proves it arrived both ways.
func TestLabSIPp(t *testing.T) {
	testenv.NeedCommand(t, "sipp", "sip-tester")
	l := lab.NewT(t)
	// Resolve the neighbours first: the first INVITE's 180 and 200 would
	// otherwise wait for ARP on the way back and arrive back to back, and
	// sipgo, which handles each datagram in its own goroutine, may see the
	// 200 first and drop the 180 (that call would have no time to 180).
	for _, p := range []struct {
		ns  *lab.NS
		dst netip.Addr
	}{{l.Caller, l.CalleeAddr4}, {l.Callee, l.CallerAddr4}} {
		c, err := p.ns.DialUDP("udp4", "", netip.AddrPortFrom(p.dst, 9).String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("arp"))
		c.Close()
		time.Sleep(50 * time.Millisecond)
	}
	const n = 10
	t.Run("voipgen call to sipp uas", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		statc := make(chan map[string]string, 1)
		go func() {
			statc <- sipp(t, ctx, l.Callee, "-sn", "uas", "-i", l.CalleeAddr4.String(), "-p", "5060",
				"-rtp_echo", "-mp", "6000", "-m", strconv.Itoa(n))
		}()
		time.Sleep(500 * time.Millisecond)
		cfg, err := ParseCall([]string{"--sip", l.CallerAddr4.String() + ":5070", "--target", "sip:uas@" + l.CalleeAddr4.String() + ":5060",
			"--calls", strconv.Itoa(n), "--rate", "20", "--call-duration", "2s"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		cfg.NS = l.Caller.Do
		calls, err := PlaceCalls(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		sum := Summarize(calls)
		var b bytes.Buffer
		sum.WriteText(&b, "voipgen call -> sipp uas")
		t.Log(b.String())
		if sum.Succeeded != n || sum.WithMedia != n || sum.Lost != 0 || sum.T200Ms.N != n || sum.T180Ms.N != n {
			t.Errorf("summary %+v", sum)
		}
		for _, c := range calls {
			if c.T180Ms <= 0 || c.T200Ms < c.T180Ms {
				t.Errorf("call %d: t180 %.2f ms t200 %.2f ms", c.Call, c.T180Ms, c.T200Ms)
			}
			if c.Received == nil || c.Received.Packets < 90 || c.SentPackets < 95 {
				t.Errorf("call %d: sent %d, received %+v", c.Call, c.SentPackets, c.Received)
			}
		}
		st := <-statc
		if st["SuccessfulCall(C)"] != strconv.Itoa(n) {
			t.Errorf("sipp uas: %s successful calls, %s failed", st["SuccessfulCall(C)"], st["FailedCall(C)"])
		}
	})
	t.Run("sipp uac to voipgen answer", func(t *testing.T) {
		cfg, err := ParseAnswer([]string{"--sip", l.CalleeAddr4.String() + ":5060", "--rtp-port", "40000",
			"--duration", "60s", "--max-calls", strconv.Itoa(n)}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		ready := make(chan struct{})
		done := make(chan []CallReport, 1)
		cfg.NS = l.Callee.Do
		go func() {
			calls, err := AnswerCalls(context.Background(), cfg, ready)
			if err != nil {
				t.Error(err)
				close(ready)
			}
			done <- calls
		}()
		<-ready
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		st := sipp(t, ctx, l.Caller, "-sn", "uac", l.CalleeAddr4.String()+":5060", "-i", l.CallerAddr4.String(), "-p", "5080",
			"-rtp_echo", "-mp", "6000", "-m", strconv.Itoa(n), "-r", "20", "-d", "2000")
		if st["SuccessfulCall(C)"] != strconv.Itoa(n) {
			t.Errorf("sipp uac: %s successful calls, %s failed", st["SuccessfulCall(C)"], st["FailedCall(C)"])
		}
		calls := <-done
		sum := Summarize(calls)
		var b bytes.Buffer
		sum.WriteText(&b, "sipp uac -> voipgen answer")
		t.Log(b.String())
		if sum.Succeeded != n || sum.WithMedia != n || sum.Lost != 0 {
			t.Errorf("summary %+v", sum)
		}
		for _, c := range calls {
			if c.ByeFrom != "remote" || c.Received == nil || c.Received.Packets < 80 {
				t.Errorf("call %d: bye from %q, sent %d, received %+v", c.Call, c.ByeFrom, c.SentPackets, c.Received)
			}
		}
	})
}

func TestResponseTimes(t *testing.T) {
	rt := &responseTimes{first: map[string]*[2]time.Time{}}
	t0 := time.Unix(100, 0)
	msg := func(status, id string) []byte {
		return []byte("SIP/2.0 " + status + "\r\nVia: SIP/2.0/UDP 1.2.3.4\r\ncall-id:  " + id + " \r\nCSeq: 1 INVITE\r\n\r\nbody\r\ni: nope\r\n")
	}
	rt.note(msg("100 Trying", "a"), t0)
	rt.note(msg("200 OK", "a"), t0.Add(3*time.Millisecond))
	rt.note(msg("180 Ringing", "a"), t0.Add(4*time.Millisecond)) // processed after the 200: still counted
	rt.note(msg("183 Session Progress", "a"), t0.Add(5*time.Millisecond))
	rt.note(msg("200 OK", "a"), t0.Add(9*time.Millisecond)) // retransmission
	rt.note([]byte("INVITE sip:x SIP/2.0\r\nCall-ID: b\r\n\r\n"), t0)
	t180, t200 := rt.get("a")
	if t180 != t0.Add(4*time.Millisecond) || t200 != t0.Add(3*time.Millisecond) {
		t.Fatalf("t180 %v t200 %v", t180, t200)
	}
	if a, b := rt.get("b"); !a.IsZero() || !b.IsZero() {
		t.Fatal("a request was taken for a response")
	}
	if id := sipCallID([]byte("SIP/2.0 200 OK\r\ni: compact@x\r\n\r\n")); id != "compact@x" {
		t.Fatalf("compact Call-ID %q", id)
	}
}
