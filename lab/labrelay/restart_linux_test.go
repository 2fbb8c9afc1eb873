package labrelay

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	callpkg "github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

// labCall is a call placed by a miniUAC, with its media socket.
type labCall struct {
	u        *miniUAC
	ruri     string
	rtp      *net.UDPConn
	relayRTP netip.AddrPort
	enc      *srtpflow.Encrypter // nil for plain RTP
	dec      *srtpflow.Decrypter
}

func placeLabCall(t *testing.T, l *lab.Lab, sipPort, rtpPort uint16, srtp bool) *labCall {
	t.Helper()
	sipAddr := netip.AddrPortFrom(l.CallerAddr4, sipPort)
	rtpAddr := netip.AddrPortFrom(l.CallerAddr4, rtpPort)
	sipConn, err := l.Caller.ListenUDP("udp4", sipAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sipConn.Close() })
	u := &miniUAC{t: t, conn: sipConn, local: sipAddr, relay: netip.AddrPortFrom(l.RelayMedia4, 5060),
		callID: fmt.Sprintf("restart-%d-%d@lab", sipPort, time.Now().UnixNano())}
	proto, crypto := "RTP/AVP", ""
	var up *sdes.Crypto
	if srtp {
		if up, err = sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80); err != nil {
			t.Fatal(err)
		}
		proto, crypto = "RTP/SAVP", up.String()
	}
	lines := []string{"v=0", "o=mini 1 1 IN IP4 " + l.CallerAddr4.String(), "s=-", "c=IN IP4 " + l.CallerAddr4.String(), "t=0 0",
		fmt.Sprintf("m=audio %d %s 0", rtpAddr.Port(), proto), "a=rtpmap:0 PCMU/8000"}
	if crypto != "" {
		lines = append(lines, crypto)
	}
	c := &labCall{u: u, ruri: "sip:100@" + u.relay.String()}
	u.send("INVITE", c.ruri, 1, "", strings.Join(append(lines, ""), "\r\n"))
	code, head, body := u.await("INVITE")
	if code != 200 {
		t.Fatalf("INVITE: %d\n%s", code, head)
	}
	_, tag, _ := strings.Cut(header(head, "To"), ";tag=")
	u.toTag = ";tag=" + tag
	u.send("ACK", c.ruri, 1, u.toTag, "")
	ans, err := sdp.Parse([]byte(body))
	if err != nil {
		t.Fatalf("answer SDP: %v\n%s", err, body)
	}
	c.relayRTP = ans.Streams[0].RTP()
	if srtp {
		cfg := func(k *sdes.Crypto) srtpflow.Config {
			cf, err := srtpflow.ConfigFromCrypto(k)
			if err != nil {
				t.Fatal(err)
			}
			return cf
		}
		if c.enc, err = srtpflow.NewEncrypter(cfg(up)); err != nil {
			t.Fatal(err)
		}
		if len(ans.Streams[0].Crypto) != 1 {
			t.Fatalf("SRTP answer without one key:\n%s", body)
		}
		if c.dec, err = srtpflow.NewDecrypter(cfg(ans.Streams[0].Crypto[0])); err != nil {
			t.Fatal(err)
		}
	}
	if c.rtp, err = l.Caller.ListenUDP("udp4", rtpAddr.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.rtp.Close() })
	return c
}

func (c *labCall) bye(t *testing.T) {
	t.Helper()
	c.u.send("BYE", c.ruri, 2, c.u.toTag, "")
	if code, head, _ := c.u.await("BYE"); code != 200 {
		t.Errorf("BYE: %d\n%s", code, head)
	}
}

// echoStats is what the caller saw come back from the callee's echo.
type echoStats struct {
	sent, received int
	maxGap         time.Duration // largest inter-arrival gap
}

// stream sends 20 ms packets (SRTP when keyed) until stop closes and
// counts the echoed ones, decrypted, by sequence number.
func (c *labCall) stream(stop <-chan struct{}) <-chan echoStats {
	out := make(chan echoStats, 1)
	var mu sync.Mutex
	seen := map[uint16]bool{}
	var maxGap time.Duration
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		buf, plain := make([]byte, 2048), make([]byte, 2048)
		var last time.Time
		for {
			c.rtp.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, from, err := c.rtp.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if from != c.relayRTP {
				continue
			}
			p := buf[:n]
			if c.dec != nil {
				if p, err = c.dec.DecryptRTP(plain[:0], p); err != nil {
					continue
				}
			}
			if len(p) != 172 {
				continue
			}
			now := time.Now()
			mu.Lock()
			seen[binary.BigEndian.Uint16(p[2:])] = true
			if !last.IsZero() && now.Sub(last) > maxGap {
				maxGap = now.Sub(last)
			}
			mu.Unlock()
			last = now
		}
	}()
	go func() {
		pkt, wire := make([]byte, 172), make([]byte, 0, 256)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		sent := 0
		for i := 0; ; i++ {
			select {
			case <-stop:
				time.Sleep(500 * time.Millisecond) // the last echoes
				c.rtp.SetReadDeadline(time.Now())
				<-recvDone
				mu.Lock()
				out <- echoStats{sent: sent, received: len(seen), maxGap: maxGap}
				mu.Unlock()
				return
			case <-tick.C:
			}
			pkt[0], pkt[1] = 0x80, 0
			binary.BigEndian.PutUint16(pkt[2:], uint16(i))
			binary.BigEndian.PutUint32(pkt[4:], uint32(i*160))
			binary.BigEndian.PutUint32(pkt[8:], 0x5eed0000+uint32(c.u.local.Port()))
			p := pkt
			if c.enc != nil {
				var err error
				if p, err = c.enc.EncryptRTP(wire[:0], pkt); err != nil {
					continue
				}
			}
			if _, err := c.rtp.WriteToUDPAddrPort(p, c.relayRTP); err == nil {
				sent++
			}
		}
	}()
	return out
}

// TestSIPCallsSurviveRestart: two calls through a real relayd with a
// state file, one plain (XDP both ways) and one with SRTP terminated on
// the caller's leg (userspace both ways), media echoed by SIPp, while
// relayd is stopped with SIGTERM and started again, then killed with
// SIGKILL and started again. Both calls stay up; the caller's BYE after
// the restarts ends each with a complete CDR; XDP loses no packet; SRTP
// resumes under the same keys. The SRTP call's packets reach the workers
// through the kernel (userspace_io socket) or, redirected by the XDP
// program, through their AF_XDP sockets (afxdp), before and after each
// restart.
func TestSIPCallsSurviveRestart(t *testing.T) {
	needSIPp(t)
	for _, io := range []string{"socket", "afxdp"} {
		t.Run(io, func(t *testing.T) { testSIPCallsSurviveRestart(t, io) })
	}
}

func testSIPCallsSurviveRestart(t *testing.T, io string) {
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	dir := t.TempDir()
	cdrPath := filepath.Join(dir, "cdr.jsonl")
	extra := fmt.Sprintf(`[sip]
listen = ["udp:%s:5060"]
[[route]]
name = "lab"
match = "."
attempt_timeout = "500ms"
srtp = "off"
destinations = ["sip:%s:5060"]
[cdr]
path = %q
fsync_interval = "100ms"
[state]
path = %q
`, l.RelayMedia4, uas, cdrPath, filepath.Join(dir, "state", "state.db"))
	r := startRelayIn(t, l, Options{Dir: dir, ExtraMedia: extra, LogLevel: "debug", UserspaceIO: io})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "2")
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	plain := placeLabCall(t, l, 5090, 4200, false)
	keyed := placeLabCall(t, l, 5092, 4210, true)
	stop := make(chan struct{})
	plainStats, keyedStats := plain.stream(stop), keyed.stream(stop)
	// Past the latch window (3 s): the plain call's flows are locked and
	// in XDP.
	time.Sleep(4 * time.Second)
	for _, step := range []struct {
		name string
		do   func() error
	}{{"SIGTERM", r.Stop}, {"SIGKILL", r.Kill}} {
		t0 := time.Now()
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if err := r.Start(); err != nil {
			t.Fatalf("start after %s: %v", step.name, err)
		}
		t.Logf("%s: relayd back (admin API answering) after %v", step.name, time.Since(t0))
		if !strings.Contains(r.Log(), `"calls restored"`) {
			t.Errorf("after %s: no calls restored", step.name)
		}
		time.Sleep(2 * time.Second)
		// 2 s of the SRTP call both ways since the start: 200 packets.
		viaXSK := metrics(t, r, "relayd_userspace_afxdp_packets_total")[0]
		if io == "socket" && viaXSK != 0 || io == "afxdp" && viaXSK < 150 {
			t.Errorf("after %s: the workers read %.0f packets from AF_XDP sockets (io %s)", step.name, viaXSK, io)
		}
	}
	close(stop)
	ps, ks := <-plainStats, <-keyedStats
	plain.bye(t)
	keyed.bye(t)
	t.Logf("plain (XDP): %d sent, %d echoed back, %d lost, largest gap %v", ps.sent, ps.received, ps.sent-ps.received, ps.maxGap)
	t.Logf("SRTP (userspace): %d sent, %d echoed back, %d lost, largest gap %v", ks.sent, ks.received, ks.sent-ks.received, ks.maxGap)
	if ps.sent < 300 || ps.received != ps.sent {
		t.Errorf("plain call through XDP lost %d of %d packets across the restarts", ps.sent-ps.received, ps.sent)
	}
	if ks.received < ks.sent*8/10 || ks.maxGap > time.Second {
		t.Errorf("SRTP call: %d of %d packets back, largest gap %v (want under 1 s)", ks.received, ks.sent, ks.maxGap)
	}
	if st := <-uasDone; st == nil || st["SuccessfulCall(C)"] != "2" {
		t.Errorf("sipp uas: %v", st)
	}
	cdrs := readCDRs(t, cdrPath, 2)
	if len(cdrs) != 2 {
		t.Fatalf("%d CDRs, want 2: %+v", len(cdrs), cdrs)
	}
	for _, c := range cdrs {
		a, b := c.Media[callpkg.A], c.Media[callpkg.B]
		if c.Disposition != callpkg.Answered || c.Reason != "caller hung up" || len(c.Attempts) != 1 || c.Answer == nil ||
			c.DurationS < 7 || c.Legs[callpkg.A].CallID == "" || c.Legs[callpkg.B].ToTag == "" {
			t.Errorf("CDR %+v", c)
		}
		switch c.Legs[callpkg.A].CallID {
		case plain.u.callID:
			if a.Path != "xdp" || b.Path != "xdp" || a.Packets < uint64(ps.sent) || a.Lost != 0 || b.Lost != 0 {
				t.Errorf("plain call media in the CDR: caller leg %+v, callee leg %+v (sent %d)", a, b, ps.sent)
			}
		case keyed.u.callID:
			// Userspace counters since the last record die with a kill -9
			// (written every 10 s and at every change: docs/state.md).
			if a.SRTP != "AES_CM_128_HMAC_SHA1_80" || a.Path != "userspace" || a.Packets+150 < uint64(ks.received) {
				t.Errorf("SRTP call media in the CDR: caller leg %+v, callee leg %+v (echoed %d)", a, b, ks.received)
			}
		default:
			t.Errorf("CDR of an unknown call %+v", c)
		}
	}
	if v, err := r.Metric(`relayd_sip_calls_total{disposition="answered"}`); err != nil || v != 2 {
		t.Errorf("relayd_sip_calls_total answered = %v, %v", v, err)
	}
}
