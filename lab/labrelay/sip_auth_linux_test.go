package labrelay

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"

	callpkg "github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/internal/testcert"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

// TestSIPStrangers: who may call through relayd, SIPp in the caller
// namespace against relayd's B2BUA and a SIPp callee that takes two calls.
// A route allows the caller's IPv6 address only: the caller's INVITE from
// its IPv4 address gets 403. A route with auth_users challenges a caller
// without credentials (401) and refuses a wrong password (403). Then the
// caller's IPv6 address, and the right password, are routed: the callee
// sees those two calls and nothing else, and only they have CDRs.
func TestSIPStrangers(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	dir := t.TempDir()
	users := filepath.Join(dir, "sip-users")
	if err := os.WriteFile(users, []byte("# the lab's PBX\npbx1:lab-pw-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cdrPath := filepath.Join(dir, "cdr.jsonl")
	uas := l.CalleeAddr4.String()
	// SIPp 3.6.1 answers only the first challenge and knows only MD5.
	extra := fmt.Sprintf(`[sip]
listen = ["udp:%[1]s:5060", "udp:[%[2]s]:5060"]
auth_file = %[3]q
auth_algorithms = ["MD5"]
[[route]]
name = "pbx"
match = "^1"
allow = [%[4]q]
attempt_timeout = "500ms"
destinations = ["sip:%[5]s:5060"]
[[route]]
name = "auth"
match = "^2"
auth_users = ["pbx1"]
attempt_timeout = "500ms"
destinations = ["sip:%[5]s:5060"]
[cdr]
path = %[6]q
fsync_interval = "100ms"
`, l.RelayMedia4, l.RelayMedia6, users, l.CallerAddr6.String(), uas, cdrPath)
	r := startRelayIn(t, l, Options{Dir: dir, ExtraMedia: extra, LogLevel: "debug"})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-m", "2")
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)

	relay4 := l.RelayMedia4.String() + ":5060"
	caller4 := []string{"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1"}
	for _, tc := range []struct {
		what string
		args []string
	}{
		{"from a source the route does not allow: 403", scenarioArgs(t, "uac_refused.xml", map[string]string{"code": "403"},
			append([]string{relay4, "-s", "15551234"}, caller4...)...)},
		{"without credentials: 401", scenarioArgs(t, "uac_refused.xml", map[string]string{"code": "401"},
			append([]string{relay4, "-s", "25551234"}, caller4...)...)},
		{"with a wrong password: 401, then 403", scenarioArgs(t, "uac_auth.xml", map[string]string{"final": "403"},
			append([]string{relay4, "-s", "25551234", "-au", "pbx1", "-ap", "guess", "-auth_uri", "25551234@" + relay4}, caller4...)...)},
		{"from the allowed IPv6 address: routed", []string{"-sn", "uac", "[" + l.RelayMedia6.String() + "]:5060", "-s", "15551234",
			"-i", l.CallerAddr6.String(), "-p", "5080", "-mp", "6000", "-m", "1", "-d", "500"}},
		{"with the right password: 401, then routed", scenarioArgs(t, "uac_auth.xml", map[string]string{"final": "200"},
			append([]string{relay4, "-s", "25551234", "-au", "pbx1", "-ap", "lab-pw-1", "-auth_uri", "25551234@" + relay4, "-d", "500"}, caller4...)...)},
	} {
		st, out := runSIPp(t, ctx, l.Caller, tc.args...)
		if st == nil || st["SuccessfulCall(C)"] != "1" {
			t.Fatalf("%s: sipp %v\n%s", tc.what, st, out)
		}
	}
	var ust map[string]string
	select {
	case ust = <-uasDone:
	case <-ctx.Done():
		t.Fatal("the callee SIPp did not end")
	}
	if ust == nil || ust["SuccessfulCall(C)"] != "2" || ust["IncomingCall(C)"] != "2" {
		t.Errorf("callee: %v; want 2 incoming calls, both successful: the refused INVITEs must not reach it", ust)
	}
	cdrs := readCDRs(t, cdrPath, 2)
	if len(cdrs) != 2 || cdrs[0].Route != "pbx" || cdrs[1].Route != "auth" {
		t.Fatalf("CDRs %+v, want the two routed calls (pbx, auth) only", cdrs)
	}
	for _, c := range cdrs {
		if c.Disposition != callpkg.Answered {
			t.Errorf("CDR %s: %s", c.Route, c.Disposition)
		}
	}
	for reason, want := range map[string]float64{"source": 1, "challenged": 3, "credentials": 1, "user": 0} {
		if v, err := r.Metric(`relayd_sip_refused_total{reason="` + reason + `"}`); err != nil || v != want {
			t.Errorf("relayd_sip_refused_total{reason=%q} = %v, %v; want %v", reason, v, err, want)
		}
	}
}

// TestSIPOverTLS: a caller over TLS offers SRTP with SDES keys; the route
// has sdes_tls_only and srtp = "off", so relayd terminates the caller's
// SRTP and the plain SIPp callee (echoing) never sees a key; the media
// goes both ways, encrypted on the caller's leg. The same offer over UDP
// gets 488 with a Warning and reaches no one. SIPp 3.6.1 as Debian builds
// it has no TLS ("To use a TLS transport you must compile SIPp with
// OpenSSL"): the caller is sipgo, its connection made in the caller
// namespace.
func TestSIPOverTLS(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	certFile, keyFile := ca.Issue(t, l.RelayMedia4.String()).WriteFiles(t, dir)
	cdrPath := filepath.Join(dir, "cdr.jsonl")
	uas := l.CalleeAddr4.String()
	extra := fmt.Sprintf(`[sip]
listen = ["udp:%[1]s:5060", "tls:%[1]s:5061"]
tls_cert = %[2]q
tls_key = %[3]q
[[route]]
name = "tls"
match = "."
allow = [%[4]q]
srtp = "off"
sdes_tls_only = true
attempt_timeout = "500ms"
destinations = ["sip:%[5]s:5060"]
[cdr]
path = %[6]q
fsync_interval = "100ms"
`, l.RelayMedia4, certFile, keyFile, l.CallerAddr4.String(), uas, cdrPath)
	startRelayIn(t, l, Options{Dir: dir, ExtraMedia: extra, LogLevel: "debug"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "1")
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)

	key, err := sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80)
	if err != nil {
		t.Fatal(err)
	}
	rtpAddr := netip.AddrPortFrom(l.CallerAddr4, 4300)
	offer := strings.Join([]string{"v=0", "o=tls 1 1 IN IP4 " + l.CallerAddr4.String(), "s=-", "c=IN IP4 " + l.CallerAddr4.String(), "t=0 0",
		fmt.Sprintf("m=audio %d RTP/SAVP 0", rtpAddr.Port()), "a=rtpmap:0 PCMU/8000", key.String(), ""}, "\r\n")

	// The same offer over UDP first: refused, the callee sees nothing.
	sipConn, err := l.Caller.ListenUDP("udp4", netip.AddrPortFrom(l.CallerAddr4, 5090).String())
	if err != nil {
		t.Fatal(err)
	}
	defer sipConn.Close()
	u := &miniUAC{t: t, conn: sipConn, local: netip.AddrPortFrom(l.CallerAddr4, 5090), relay: netip.AddrPortFrom(l.RelayMedia4, 5060),
		callID: fmt.Sprintf("sdes-udp-%d@lab", time.Now().UnixNano())}
	ruri := "sip:100@" + u.relay.String()
	u.send("INVITE", ruri, 1, "", offer)
	code, head, _ := u.await("INVITE")
	if w := header(head, "Warning"); code != 488 || !strings.Contains(w, "caller's leg over udp") {
		t.Errorf("SDES offer over UDP: %d, Warning %q; want 488 naming the caller's leg\n%s", code, w, head)
	}
	_, tag, _ := strings.Cut(header(head, "To"), ";tag=")
	u.send("ACK", ruri, 1, ";tag="+tag, "")

	// Over TLS.
	ua, err := sipgo.NewUA(sipgo.WithUserAgent("lab-tls-caller"), sipgo.WithUserAgenTLSConfig(&tls.Config{RootCAs: ca.Pool()}))
	if err != nil {
		t.Fatal(err)
	}
	defer ua.Close()
	cli, err := sipgo.NewClient(ua, sipgo.WithClientHostname(l.CallerAddr4.String()))
	if err != nil {
		t.Fatal(err)
	}
	tlsParam := sip.HeaderParams{{K: "transport", V: "tls"}}
	calls := sipgo.NewDialogClientCache(cli, sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "tls", Host: l.CallerAddr4.String(), Port: 5061, UriParams: tlsParam}})
	target := sip.Uri{Scheme: "sip", User: "100", Host: l.RelayMedia4.String(), Port: 5061, UriParams: tlsParam}
	var d *sipgo.DialogClientSession
	// The stack dials when it sends the INVITE: in the namespace, so
	// that the connection (which every later request reuses) is there.
	err = l.Caller.Do(func() error {
		var err error
		d, err = calls.Invite(ctx, target, []byte(offer), sip.NewHeader("Content-Type", "application/sdp"))
		return err
	})
	if err != nil {
		t.Fatalf("INVITE over TLS: %v", err)
	}
	if err := d.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
		t.Fatalf("call over TLS: %v", err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	ans, err := sdp.Parse(d.InviteResponse.Body())
	if err != nil {
		t.Fatalf("answer SDP: %v\n%s", err, d.InviteResponse.Body())
	}
	st := ans.Streams[0]
	if !st.SRTP() || len(st.Crypto) != 1 {
		t.Fatalf("answer over TLS must carry relayd's key:\n%s", d.InviteResponse.Body())
	}
	echoed := srtpEcho(t, l, rtpAddr, st.RTP(), key, st.Crypto[0], 100)
	if err := d.Bye(ctx); err != nil {
		t.Errorf("BYE over TLS: %v", err)
	}
	if echoed < 90 {
		t.Errorf("%d of 100 SRTP packets came back through the plain callee's echo", echoed)
	}
	if ust := <-uasDone; ust == nil || ust["SuccessfulCall(C)"] != "1" || ust["IncomingCall(C)"] != "1" {
		t.Errorf("callee: %v; want the TLS call only", ust)
	}
	cdrs := readCDRs(t, cdrPath, 2)
	if len(cdrs) != 2 {
		t.Fatalf("%d CDRs, want 2", len(cdrs))
	}
	if c := cdrs[0]; c.Disposition != callpkg.Rejected || c.Code != 488 || len(c.Attempts) != 0 {
		t.Errorf("CDR of the UDP offer: %s %d, attempts %+v; want rejected 488 without an attempt", c.Disposition, c.Code, c.Attempts)
	}
	c := cdrs[1]
	if a := c.Media[callpkg.A]; c.Disposition != callpkg.Answered || c.Legs[callpkg.A].Transport != "tls" || c.Legs[callpkg.B].Transport != "udp" ||
		a.SRTP != "AES_CM_128_HMAC_SHA1_80" || c.Media[callpkg.B].SRTP != "" {
		t.Errorf("CDR of the TLS call: %s, legs %+v, media %+v", c.Disposition, c.Legs, c.Media)
	}
}

// srtpEcho sends n SRTP packets from the caller's local address to relay,
// encrypted with up, and counts those that come back decrypted with down.
func srtpEcho(t *testing.T, l *lab.Lab, local, relay netip.AddrPort, up, down *sdes.Crypto, n int) int {
	t.Helper()
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
	dec, err := srtpflow.NewDecrypter(cfg(down))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := l.Caller.ListenUDP("udp4", local.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := make(chan int, 1)
	go func() {
		buf, out := make([]byte, 2048), make([]byte, 2048)
		ok := 0
		for ok < n {
			conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			m, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				break
			}
			if from != relay {
				continue
			}
			if plain, err := dec.DecryptRTP(out[:0], buf[:m]); err == nil && len(plain) == 172 && plain[12] == byte(binary.BigEndian.Uint16(plain[2:])) {
				ok++
			}
		}
		got <- ok
	}()
	pkt, wire := make([]byte, 172), make([]byte, 0, 256)
	for i := range n {
		pkt[0], pkt[1] = 0x80, 0
		binary.BigEndian.PutUint16(pkt[2:], uint16(i))
		binary.BigEndian.PutUint32(pkt[4:], uint32(i*160))
		binary.BigEndian.PutUint32(pkt[8:], 0x7115)
		for j := 12; j < len(pkt); j++ {
			pkt[j] = byte(i)
		}
		w, err := enc.EncryptRTP(wire[:0], pkt)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.WriteToUDPAddrPort(w, relay); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return <-got
}
