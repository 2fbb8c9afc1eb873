package labrelay

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/lab"
)

// rawSIP is a caller that speaks SIP over a plain UDP socket in the
// caller's namespace: relayd sees exactly the bytes the test writes. It
// places one INVITE after the other (miniUAC places one call).
type rawSIP struct {
	t     *testing.T
	conn  *net.UDPConn
	local netip.AddrPort
	relay netip.AddrPort
	n     int
}

func newRawSIP(t *testing.T, l *lab.Lab) *rawSIP {
	t.Helper()
	local := netip.AddrPortFrom(l.CallerAddr4, 5070)
	relay := netip.AddrPortFrom(l.RelayMedia4, 5060)
	c, err := l.Caller.DialUDP("udp4", local.String(), relay.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawSIP{t: t, conn: c, local: local, relay: relay}
}

// invite sends an INVITE with sdp and returns the final response (the
// 100 Trying skipped), which it acknowledges when it is a failure.
func (s *rawSIP) invite(sdp string) string {
	s.t.Helper()
	s.n++
	branch := fmt.Sprintf("z9hG4bK-refuse-%d", s.n)
	head := func(method string, cseq string, to string) string {
		return fmt.Sprintf("%s sip:lab@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\n"+
			"From: <sip:caller@%s>;tag=raw%d\r\nTo: %s\r\nCall-ID: refuse-%d@lab\r\nCSeq: %s\r\nContact: <sip:caller@%s>\r\n",
			method, s.relay, s.local, branch, s.local.Addr(), s.n, to, s.n, cseq, s.local)
	}
	req := head("INVITE", "1 INVITE", fmt.Sprintf("<sip:lab@%s>", s.relay.Addr())) +
		fmt.Sprintf("Content-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s", len(sdp), sdp)
	if _, err := s.conn.Write([]byte(req)); err != nil {
		s.t.Fatal(err)
	}
	buf := make([]byte, 65536)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.conn.SetReadDeadline(deadline)
		n, err := s.conn.Read(buf)
		if err != nil {
			s.t.Fatalf("no final response to the INVITE: %v", err)
		}
		res := string(buf[:n])
		if strings.HasPrefix(res, "SIP/2.0 1") || header(res, "Call-ID") != fmt.Sprintf("refuse-%d@lab", s.n) {
			continue
		}
		if !strings.HasPrefix(res, "SIP/2.0 2") {
			to := header(res, "To")
			ack := head("ACK", "1 ACK", to) + "Content-Length: 0\r\n\r\n"
			s.conn.Write([]byte(ack))
		}
		return res
	}
}

// TestSIPRefusesUnusableOffers: from the caller's namespace, INVITEs
// whose offer relayd cannot honour get 488 with a Warning naming why, and
// the callee (a SIPp UAS that would answer) never hears of them: media on
// relayd's own address with a guessed port (which made the relay send to
// itself), IPv6 media to a relay without an IPv6 media address (was a
// 500), RTP/SAVP without a key (was passed on without one). No call and
// no flow is left.
func TestSIPRefusesUnusableOffers(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	r, _ := startSIPRelayWith(t, l, Options{Media4: l.RelayMedia4}, "sip:"+uas+":5060")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-mp", "7000", "-timeout", "20s", "-timeout_error")
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	sdp := func(conn, media string) string {
		return "v=0\r\no=raw 1 1 IN IP4 " + l.CallerAddr4.String() + "\r\ns=-\r\n" + conn + "\r\nt=0 0\r\n" + media + "\r\na=rtpmap:0 PCMU/8000\r\n"
	}
	s := newRawSIP(t, l)
	for _, tc := range []struct{ name, sdp, why string }{
		{"relay media address", sdp("c=IN IP4 "+l.RelayMedia4.String(), "m=audio 30002 RTP/AVP 0"), "relayd itself"},
		{"IPv6 without an IPv6 media address", sdp("c=IN IP6 "+l.CallerAddr6.String(), "m=audio 6000 RTP/AVP 0"), "no IPv6 media address"},
		{"RTP/SAVP without a=crypto", sdp("c=IN IP4 "+l.CallerAddr4.String(), "m=audio 6000 RTP/SAVP 0"), "a=crypto"},
	} {
		res := s.invite(tc.sdp)
		status, _, _ := strings.Cut(res, "\r\n")
		if w := header(res, "Warning"); status != "SIP/2.0 488 Not Acceptable Here" || !strings.HasPrefix(w, `399 relayd "`) || !strings.Contains(w, tc.why) {
			t.Errorf("%s: %q with Warning %q; want 488 with a Warning saying %q", tc.name, status, w, tc.why)
		}
	}
	// relayd answers the caller first, then ends the call.
	deadline := time.Now().Add(3 * time.Second)
	for {
		calls, err := r.Calls()
		if err == nil && len(calls) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("calls after the refusals: %v %v", calls, err)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, path := range []string{"xdp", "userspace"} {
		if flows, err := r.Metric(`relayd_flows{path="` + path + `"}`); err != nil || flows != 0 {
			t.Errorf("%v %s flows after the refusals (%v)", flows, path, err)
		}
	}
	cancel()
	if st := <-uasDone; st != nil && st["IncomingCall(C)"] != "0" && st["IncomingCall(C)"] != "" {
		t.Errorf("the callee got %s calls", st["IncomingCall(C)"])
	}
}

// TestAdminRefusesLoopingFlow: relayd's admin API refuses a static flow
// whose send_to is its own match (which looped one packet at full speed
// until the flow was deleted) with 422, and one toward loopback.
func TestAdminRefusesLoopingFlow(t *testing.T) {
	l, r := startRelay(t, "native")
	match := netip.AddrPortFrom(l.RelayMedia4, 30200)
	for _, to := range []string{match.String(), "127.0.0.1:5000", "255.255.255.255:5000"} {
		_, err := r.AddFlow(admin.FlowRequest{Match: match.String(), SendFrom: netip.AddrPortFrom(l.RelayMedia4, 30202).String(), SendTo: to})
		if err == nil || !strings.Contains(err.Error(), "422") {
			t.Errorf("flow toward %s: %v, want 422", to, err)
		}
	}
	if flows, err := r.Flows(); err != nil || len(flows) != 0 {
		t.Errorf("flows after the refusals: %v %v", flows, err)
	}
}
