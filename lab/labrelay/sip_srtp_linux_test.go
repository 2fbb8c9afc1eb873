package labrelay

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	callpkg "github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

// miniUAC is just enough of a SIP caller over UDP to place one call with
// an SDES offer: SIPp cannot do SRTP.
type miniUAC struct {
	t      *testing.T
	conn   *net.UDPConn
	local  netip.AddrPort
	relay  netip.AddrPort
	callID string
	toTag  string
}

func (u *miniUAC) send(method, uri string, cseq int, toTag, body string) {
	u.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s SIP/2.0\r\n", method, uri)
	fmt.Fprintf(&b, "Via: SIP/2.0/UDP %s;branch=z9hG4bK-%d-%d;rport\r\n", u.local, time.Now().UnixNano(), cseq)
	fmt.Fprintf(&b, "From: <sip:srtp@%s>;tag=mini1\r\n", u.local.Addr())
	fmt.Fprintf(&b, "To: <sip:100@%s>%s\r\n", u.relay.Addr(), toTag)
	fmt.Fprintf(&b, "Call-ID: %s\r\nCSeq: %d %s\r\nMax-Forwards: 70\r\n", u.callID, cseq, method)
	fmt.Fprintf(&b, "Contact: <sip:srtp@%s>\r\n", u.local)
	if body != "" {
		b.WriteString("Content-Type: application/sdp\r\n")
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	if _, err := u.conn.WriteToUDPAddrPort([]byte(b.String()), u.relay); err != nil {
		u.t.Fatal(err)
	}
}

// await reads until a final response to method, answering nothing else.
func (u *miniUAC) await(method string) (code int, headers, body string) {
	u.t.Helper()
	buf := make([]byte, 65536)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		u.conn.SetReadDeadline(deadline)
		n, _, err := u.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			u.t.Fatalf("waiting for the answer to %s: %v", method, err)
		}
		msg := string(buf[:n])
		head, body, _ := strings.Cut(msg, "\r\n\r\n")
		var c int
		if _, err := fmt.Sscanf(head, "SIP/2.0 %d", &c); err != nil || !strings.Contains(head, " "+method+"\r\n") {
			continue // a request or another transaction's response
		}
		if c >= 200 {
			return c, head, body
		}
	}
	u.t.Fatalf("no final response to %s", method)
	return 0, "", ""
}

func header(head, name string) string {
	for _, line := range strings.Split(head, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(strings.TrimSpace(k), name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestSIPSRTPCallerPlainCallee: the caller offers SRTP (SDES), the route
// says srtp = "off": relayd answers the caller with its own key, decrypts
// the caller's SRTP and encrypts what the plain callee (SIPp, echoing)
// sends back, in the userspace data plane.
func TestSIPSRTPCallerPlainCallee(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	_, cdrPath := startSIPRelay(t, l, "", "sip:"+uas+":5060")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "1")
	time.Sleep(500 * time.Millisecond)

	sipAddr := netip.AddrPortFrom(l.CallerAddr4, 5090)
	rtpAddr := netip.AddrPortFrom(l.CallerAddr4, 4200)
	sipConn, err := l.Caller.ListenUDP("udp4", sipAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer sipConn.Close()
	u := &miniUAC{t: t, conn: sipConn, local: sipAddr, relay: netip.AddrPortFrom(l.RelayMedia4, 5060), callID: fmt.Sprintf("srtp-%d@lab", time.Now().UnixNano())}
	up, err := sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80)
	if err != nil {
		t.Fatal(err)
	}
	offer := strings.Join([]string{"v=0", "o=mini 1 1 IN IP4 " + l.CallerAddr4.String(), "s=-", "c=IN IP4 " + l.CallerAddr4.String(), "t=0 0",
		fmt.Sprintf("m=audio %d RTP/SAVP 0", rtpAddr.Port()), "a=rtpmap:0 PCMU/8000", up.String(), ""}, "\r\n")
	ruri := "sip:100@" + u.relay.String()
	u.send("INVITE", ruri, 1, "", offer)
	code, head, body := u.await("INVITE")
	if code != 200 {
		t.Fatalf("INVITE: %d\n%s", code, head)
	}
	to := header(head, "To")
	_, tag, _ := strings.Cut(to, ";tag=")
	u.toTag = ";tag=" + tag
	u.send("ACK", ruri, 1, u.toTag, "")
	ans, err := sdp.Parse([]byte(body))
	if err != nil {
		t.Fatalf("answer SDP: %v\n%s", err, body)
	}
	st := ans.Streams[0]
	if !st.SRTP() || len(st.Crypto) != 1 || st.Crypto[0].Tag != 1 || bytes.Equal(st.Crypto[0].Key, up.Key) {
		t.Fatalf("answer must be RTP/SAVP with relayd's own key for tag 1:\n%s", body)
	}
	relayRTP := st.RTP()

	cfg := func(c *sdes.Crypto) srtpflow.Config {
		cf, err := srtpflow.ConfigFromCrypto(c)
		if err != nil {
			t.Fatal(err)
		}
		return cf
	}
	enc, err := srtpflow.NewEncrypter(cfg(up))
	if err != nil {
		t.Fatal(err)
	}
	dec, err := srtpflow.NewDecrypter(cfg(st.Crypto[0]))
	if err != nil {
		t.Fatal(err)
	}
	rtpConn, err := l.Caller.ListenUDP("udp4", rtpAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer rtpConn.Close()
	const n = 100
	got := make(chan int, 1)
	go func() {
		buf := make([]byte, 2048)
		out := make([]byte, 2048)
		ok := 0
		for ok < n {
			rtpConn.SetReadDeadline(time.Now().Add(2 * time.Second))
			m, from, err := rtpConn.ReadFromUDPAddrPort(buf)
			if err != nil {
				break
			}
			if from != relayRTP {
				continue
			}
			plain, err := dec.DecryptRTP(out[:0], buf[:m])
			if err != nil || len(plain) != 172 || plain[12] != byte(binary.BigEndian.Uint16(plain[2:])) {
				continue
			}
			ok++
		}
		got <- ok
	}()
	pkt := make([]byte, 172)
	wire := make([]byte, 0, 256)
	for i := range n {
		pkt[0], pkt[1] = 0x80, 0
		binary.BigEndian.PutUint16(pkt[2:], uint16(i))
		binary.BigEndian.PutUint32(pkt[4:], uint32(i*160))
		binary.BigEndian.PutUint32(pkt[8:], 0x5eed)
		for j := 12; j < len(pkt); j++ {
			pkt[j] = byte(i)
		}
		w, err := enc.EncryptRTP(wire[:0], pkt)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rtpConn.WriteToUDPAddrPort(w, relayRTP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	echoed := <-got
	u.send("BYE", ruri, 2, u.toTag, "")
	if code, head, _ := u.await("BYE"); code != 200 {
		t.Errorf("BYE: %d\n%s", code, head)
	}
	if echoed < n*9/10 {
		t.Errorf("%d of %d packets came back through the callee's echo and decrypted with relayd's key", echoed, n)
	}
	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 {
		t.Fatalf("%d CDRs", len(cdrs))
	}
	a, b := cdrs[0].Media[callpkg.A], cdrs[0].Media[callpkg.B]
	if a.SRTP != "AES_CM_128_HMAC_SHA1_80" || a.Path != "userspace" || b.SRTP != "" || a.Packets < n*9/10 || b.Packets < n*9/10 {
		t.Errorf("CDR media: caller leg %+v, callee leg %+v", a, b)
	}
}
