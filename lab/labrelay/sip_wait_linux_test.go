package labrelay

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// rawUA is a SIP peer on a bare UDP socket: it sees every datagram,
// retransmissions included, and resends what a peer that lost an answer
// would.
type rawUA struct {
	t    *testing.T
	conn *net.UDPConn
	buf  []byte
}

// next returns the next datagram that starts with prefix, from whom, or
// fails the test after d.
func (u *rawUA) next(prefix string, d time.Duration) ([]byte, *net.UDPAddr) {
	u.t.Helper()
	u.conn.SetReadDeadline(time.Now().Add(d))
	for {
		n, a, err := u.conn.ReadFromUDP(u.buf)
		if err != nil {
			u.t.Fatalf("no %q: %v", prefix, err)
		}
		if bytes.HasPrefix(u.buf[:n], []byte(prefix)) {
			return bytes.Clone(u.buf[:n]), a
		}
	}
}

func (u *rawUA) send(msg string, to *net.UDPAddr) {
	u.t.Helper()
	if _, err := u.conn.WriteToUDP([]byte(msg), to); err != nil {
		u.t.Fatal(err)
	}
}

// sipHeader returns the value of a header of msg (header), failing the
// test when it has none.
func sipHeader(t *testing.T, msg []byte, name string) string {
	t.Helper()
	v := header(string(msg), name)
	if v == "" {
		t.Fatalf("no %s in:\n%s", name, msg)
	}
	return v
}

// answer is msg's response with code, the request's headers copied.
func answer(t *testing.T, msg []byte, code string, extra string) string {
	return fmt.Sprintf("SIP/2.0 %s\r\nVia: %s\r\nFrom: %s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %s\r\n%s",
		code, sipHeader(t, msg, "Via"), sipHeader(t, msg, "From"), sipHeader(t, msg, "To"), sipHeader(t, msg, "Call-ID"), sipHeader(t, msg, "CSeq"), extra)
}

// sip.wait_timer: the server transaction of a BYE relayd answered absorbs
// the caller's retransmitted BYE (the same 200 again) until the wait timer
// fires; after it the BYE is a new request, for a dialog that ended: 481.
func TestSIPWaitTimer(t *testing.T) {
	l := lab.NewT(t)
	extra := fmt.Sprintf(`[sip]
listen = ["udp:%[1]s:5060"]
wait_timer = "1s"
[[route]]
name = "raw"
match = "."
destinations = ["sip:%[2]s:5062"]
`, l.RelayMedia4, l.CalleeAddr4)
	startRelayIn(t, l, Options{ExtraMedia: extra})
	listen := func(ns *lab.NS, addr string) *rawUA {
		c, err := ns.ListenUDP("udp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return &rawUA{t: t, conn: c, buf: make([]byte, 65536)}
	}
	callee := listen(l.Callee, l.CalleeAddr4.String()+":5062")
	caller := listen(l.Caller, l.CallerAddr4.String()+":0")
	relay := &net.UDPAddr{IP: l.RelayMedia4.AsSlice(), Port: 5060}
	me := caller.conn.LocalAddr().String()
	sdp := func(addr fmt.Stringer, port int) string {
		return fmt.Sprintf("v=0\r\no=- 1 1 IN IP4 %[1]s\r\ns=-\r\nc=IN IP4 %[1]s\r\nt=0 0\r\nm=audio %[2]d RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n", addr, port)
	}
	offer := sdp(l.CallerAddr4, 6000)
	caller.send(fmt.Sprintf("INVITE sip:15551234@%[1]s SIP/2.0\r\nVia: SIP/2.0/UDP %[2]s;branch=z9hG4bK-wait-1;rport\r\nMax-Forwards: 70\r\n"+
		"From: <sip:caller@%[2]s>;tag=w1\r\nTo: <sip:15551234@%[1]s>\r\nCall-ID: wait-timer-1\r\nCSeq: 1 INVITE\r\nContact: <sip:caller@%[2]s>\r\n"+
		"Content-Type: application/sdp\r\nContent-Length: %[3]d\r\n\r\n%[4]s", relay, me, len(offer), offer), relay)

	// The callee answers relayd's INVITE, and its BYE.
	inv, relayB := callee.next("INVITE ", 5*time.Second)
	ans := sdp(l.CalleeAddr4, 7000)
	callee.send(strings.Replace(answer(t, inv, "200 OK", fmt.Sprintf("Contact: <sip:callee@%s:5062>\r\nContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s",
		l.CalleeAddr4, len(ans), ans)), "\r\nTo: "+sipHeader(t, inv, "To"), "\r\nTo: "+sipHeader(t, inv, "To")+";tag=callee", 1), relayB)
	callee.next("ACK ", 5*time.Second)

	ok, _ := caller.next("SIP/2.0 200 ", 5*time.Second)
	target := sipHeader(t, ok, "Contact")
	target = target[strings.Index(target, "<")+1 : strings.Index(target, ">")]
	inDialog := func(method string, cseq int, branch string) string {
		return fmt.Sprintf("%[1]s %[2]s SIP/2.0\r\nVia: SIP/2.0/UDP %[3]s;branch=z9hG4bK-%[4]s;rport\r\nMax-Forwards: 70\r\n"+
			"From: <sip:caller@%[3]s>;tag=w1\r\nTo: %[5]s\r\nCall-ID: wait-timer-1\r\nCSeq: %[6]d %[1]s\r\nContent-Length: 0\r\n\r\n",
			method, target, me, branch, sipHeader(t, ok, "To"), cseq)
	}
	caller.send(inDialog("ACK", 1, "wait-ack"), relay)
	time.Sleep(200 * time.Millisecond)

	bye := inDialog("BYE", 2, "wait-bye")
	caller.send(bye, relay)
	calleeBye, relayB := callee.next("BYE ", 5*time.Second)
	callee.send(answer(t, calleeBye, "200 OK", "Content-Length: 0\r\n\r\n"), relayB)
	first, _ := caller.next("SIP/2.0 ", 5*time.Second)
	if !bytes.HasPrefix(first, []byte("SIP/2.0 200 ")) {
		t.Fatalf("BYE answered %q", bytes.SplitN(first, []byte("\r\n"), 2)[0])
	}
	start := time.Now()
	// Within the wait timer: the transaction answers the retransmission.
	time.Sleep(300 * time.Millisecond)
	caller.send(bye, relay)
	if again, _ := caller.next("SIP/2.0 ", 2*time.Second); !bytes.Equal(again, first) {
		t.Errorf("the BYE resent 0.3 s later was answered %q, want the same 200 again", bytes.SplitN(again, []byte("\r\n"), 2)[0])
	}
	// After it (1 s): a new BYE, for a dialog that ended.
	time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
	caller.send(bye, relay)
	if late, _ := caller.next("SIP/2.0 ", 2*time.Second); !bytes.HasPrefix(late, []byte("SIP/2.0 481 ")) {
		t.Errorf("the BYE resent 1.5 s later was answered %q, want 481: sip.wait_timer is 1s", bytes.SplitN(late, []byte("\r\n"), 2)[0])
	}
}
