package sip

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
)

// rawCaller is a caller on a bare UDP socket: it sees every datagram
// relayd sends, retransmissions included, which a SIP stack absorbs.
type rawCaller struct {
	t      *testing.T
	conn   *net.UDPConn
	relay  *net.UDPAddr
	ruri   string // the INVITE's Request-URI
	callID string
	from   string // From, with its tag
	to     string // To, with relayd's tag once answered
	target string // relayd's Contact: where in-dialog requests go
	got    [][]byte
}

func newRawCaller(t *testing.T, h *harness) *rawCaller {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	relay, err := net.ResolveUDPAddr("udp4", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	return &rawCaller{
		t: t, conn: conn, relay: relay,
		ruri:   "sip:+15551234@" + h.addr,
		callID: fmt.Sprintf("raw-%d@127.0.0.1", rand.Uint64()),
		from:   fmt.Sprintf("<sip:caller@127.0.0.1>;tag=%d", rand.Uint32()),
		to:     "<sip:+15551234@127.0.0.1>",
	}
}

func (c *rawCaller) send(method, ruri string, cseq int, body []byte) {
	c.t.Helper()
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%d;rport\r\nMax-Forwards: 70\r\n", method, ruri, c.conn.LocalAddr(), rand.Uint64())
	fmt.Fprintf(&b, "From: %s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %d %s\r\nContact: <sip:caller@%s>\r\n", c.from, c.to, c.callID, cseq, method, c.conn.LocalAddr())
	if body != nil {
		b.WriteString("Content-Type: application/sdp\r\n")
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	if _, err := c.conn.WriteToUDP(b.Bytes(), c.relay); err != nil {
		c.t.Fatal(err)
	}
}

// listen keeps what relayd sends for d, or until stop returns true for
// a datagram.
func (c *rawCaller) listen(d time.Duration, stop func([]byte) bool) {
	c.t.Helper()
	buf := make([]byte, 65536)
	c.conn.SetReadDeadline(time.Now().Add(d))
	for {
		n, _, err := c.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		m := bytes.Clone(buf[:n])
		c.got = append(c.got, m)
		if stop != nil && stop(m) {
			return
		}
	}
}

// oks counts the 200s to the INVITE of CSeq cseq among got[from:].
func (c *rawCaller) oks(from, cseq int) int {
	n := 0
	for _, m := range c.got[from:] {
		if bytes.HasPrefix(m, []byte("SIP/2.0 200 ")) && hdr(m, "CSeq") == fmt.Sprintf("%d INVITE", cseq) {
			n++
		}
	}
	return n
}

// invite sends an INVITE (a re-INVITE once answered) and returns when
// its first 200 came.
func (c *rawCaller) invite(cseq int, body []byte) {
	c.t.Helper()
	ruri := c.ruri
	if c.target != "" {
		ruri = c.target
	}
	from := len(c.got)
	c.send("INVITE", ruri, cseq, body)
	c.listen(5*time.Second, func([]byte) bool { return c.oks(from, cseq) > 0 })
	if c.oks(from, cseq) == 0 {
		c.t.Fatalf("no 200 to INVITE %d; got %d datagrams", cseq, len(c.got)-from)
	}
	if c.target == "" {
		ok := c.got[len(c.got)-1]
		c.to = hdr(ok, "To")
		contact := hdr(ok, "Contact")
		c.target = strings.TrimSuffix(strings.TrimPrefix(contact[strings.Index(contact, "<"):], "<"), ">")
	}
}

func (c *rawCaller) ack(cseq int) { c.send("ACK", c.target, cseq, nil) }

// A 2xx to an INVITE is resent until the caller's ACK (RFC 3261 13.3.1.4,
// with T1 = 500 ms: at 0.5, 1.5, 3.5 s...) and no more after it: for
// the call's INVITE and for a re-INVITE, acknowledged at once or late.
func TestOKResentUntilAck(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for retransmission timers (about 7 s)")
	}
	ce := newCallee(t)
	var calleeDialog *sipgo.DialogServerSession
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		calleeDialog = d
		answerSDP(d, req, 6000)
		<-d.Context().Done()
	})
	ce.mu.Lock()
	ce.reinvite = func(req *sip.Request, tx sip.ServerTransaction) {
		calleeDialog.ReadRequest(req, tx)
		res := sip.NewResponseFromRequest(req, 200, "OK", offerSDP(6000))
		res.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
		res.AppendHeader(&sip.ContactHeader{Address: sip.Uri{Scheme: "sip", Host: "127.0.0.1"}})
		tx.Respond(res)
	}
	ce.mu.Unlock()
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	c := newRawCaller(t, h)

	quiet := func(what string, cseq int, d time.Duration) {
		t.Helper()
		from := len(c.got)
		c.listen(d, nil)
		if n := c.oks(from, cseq); n > 0 {
			t.Errorf("%s: %d more 200s in the %v after the ACK", what, n, d)
		}
	}
	// The call's INVITE, acknowledged at once.
	c.invite(1, offerSDP(4000))
	c.ack(1)
	waitFor(t, "flows", func() bool { return h.xdp.Len() == 4 })
	quiet("the call's 200", 1, 1200*time.Millisecond)

	// A re-INVITE acknowledged late: its 200 comes again meanwhile.
	hold := []byte(strings.ReplaceAll(string(offerSDP(4000)), "a=sendrecv", "a=sendonly"))
	c.invite(2, hold)
	from := len(c.got)
	c.listen(1700*time.Millisecond, nil)
	if n := c.oks(from, 2); n < 2 {
		t.Errorf("the re-INVITE's 200 came again %d times in 1.7 s without an ACK, want 2 (at 0.5 and 1.5 s)", n)
	}
	c.ack(2)
	// One may have crossed the ACK.
	c.listen(50*time.Millisecond, nil)
	quiet("the late-acknowledged re-INVITE's 200", 2, 2200*time.Millisecond)

	// A re-INVITE acknowledged at once.
	c.invite(3, offerSDP(4000))
	c.ack(3)
	quiet("the re-INVITE's 200", 3, 1200*time.Millisecond)

	c.send("BYE", c.target, 4, nil)
	h.cdr()
}
