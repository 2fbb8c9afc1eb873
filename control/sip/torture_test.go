package sip

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
)

// TestTortureAndGarbage throws the RFC 4475 torture messages (valid and
// invalid, testdata/torture) and random bytes at the B2BUA over UDP and
// TCP; afterwards a normal call must still complete and nothing may have
// crashed.
func TestTortureAndGarbage(t *testing.T) {
	ce := newCallee(t)
	// Calls the torture messages create are refused by the callee, so that
	// relayd never contacts the hosts they name.
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) { d.Respond(603, "Decline", nil) })
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	files, _ := filepath.Glob("testdata/torture/*/*.dat")
	if len(files) < 40 {
		t.Fatalf("%d torture messages, want the RFC 4475 set", len(files))
	}
	var msgs [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, b)
	}
	for range 50 {
		b := make([]byte, 1+len(msgs)%1400)
		rand.Read(b)
		msgs = append(msgs, b, append([]byte("INVITE sip:x@y SIP/2.0\r\nVia: "), b...))
	}
	udp, err := net.Dial("udp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	// TCP connections stay open until the B2BUA answered on them.
	var conns []net.Conn
	for _, m := range msgs {
		udp.Write(m)
		tcp, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		tcp.Write(m)
		conns = append(conns, tcp)
	}
	time.Sleep(time.Second)
	for _, c := range conns {
		c.Close()
	}

	ce.set(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatalf("call after the torture: %v", err)
	}
	d.Ack(ctx)
	d.Bye(ctx)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case info := <-h.ended:
			if info.Code == 200 {
				return
			}
		case <-deadline:
			t.Fatal("no CDR of the call after the torture")
		}
	}
}

// TestRateLimit: a flood of INVITEs from one source gets 503 past the
// limit while a call already up keeps going.
func TestRateLimit(t *testing.T) {
	ce := newCallee(t)
	// Flooding INVITEs the limiter lets through are refused at once (488:
	// PCMA only on a PCMU route), so that the test needs no ACKs.
	h := newHarness(t, opts{destinations: []string{ce.addr}, rateLimit: 2, rateBurst: 2, routeExtra: "codecs = [\"PCMU\"]\n"})
	flood := []byte(strings.Replace(string(offerSDP(4100)), "RTP/AVP 0 8 101", "RTP/AVP 8", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	limited := 0
	for range 10 {
		res, err := h.request(sip.INVITE, flood, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode == 503 && res.GetHeader("Retry-After") != nil {
			limited++
		}
	}
	if limited < 7 {
		t.Errorf("%d of 10 flooding INVITEs limited, want at least 7", limited)
	}
	// Another source is not limited.
	other, err := net.ListenPacket("udp4", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2: %v", err)
	}
	defer other.Close()
	oaddr := other.LocalAddr().String()
	inv := "INVITE sip:1@" + h.addr + " SIP/2.0\r\nVia: SIP/2.0/UDP " + oaddr + ";branch=z9hG4bK-other1\r\n" +
		"From: <sip:o@127.0.0.2>;tag=o1\r\nTo: <sip:1@127.0.0.1>\r\nCall-ID: other-1\r\nCSeq: 1 INVITE\r\nMax-Forwards: 70\r\n" +
		"Contact: <sip:o@" + oaddr + ">\r\nContent-Type: application/sdp\r\nContent-Length: " + strconv.Itoa(len(flood)) + "\r\n\r\n" + string(flood)
	raddr, _ := net.ResolveUDPAddr("udp4", h.addr)
	other.WriteTo([]byte(inv), raddr)
	buf := make([]byte, 4096)
	final := 0
	for final < 200 {
		other.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := other.ReadFrom(buf)
		if err != nil {
			t.Fatalf("no answer to the other source: %v", err)
		}
		fmt.Sscanf(string(buf[:n]), "SIP/2.0 %d", &final)
	}
	if final == 503 {
		t.Error("another source was rate limited too")
	}
	if d.LoadState() != sip.DialogStateConfirmed || h.xdp.Len() < 4 {
		t.Errorf("established call disturbed: state %v, %d flows", d.LoadState(), h.xdp.Len())
	}
	d.Bye(ctx)
}
