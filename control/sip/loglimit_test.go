package sip

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestLogsRateLimitedPerSource: a source flooding malformed requests and
// BYEs of unknown dialogs gets every one answered but only a few log
// lines, and a summary; another source still gets its lines; the
// counters count them all.
func TestLogsRateLimitedPerSource(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(zapcore.NewTee(core, testLogger(t, zap.WarnLevel).Core()))
	h, _, _ := tortureHarness(t, log)
	ncl, err := os.ReadFile("testdata/torture/invalid/ncl.dat")
	if err != nil {
		t.Fatal(err)
	}
	bye := func(i int) []byte {
		return fmt.Appendf(nil, "BYE sip:user@example.com SIP/2.0\r\nVia: SIP/2.0/UDP flood.example.com;branch=z9hG4bK-bye%d;rport\r\n"+
			"Max-Forwards: 70\r\nFrom: <sip:a@example.net>;tag=a%d\r\nTo: <sip:b@example.com>;tag=b%d\r\nCall-ID: bye%d.flood\r\n"+
			"CSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n", i, i, i, i)
	}
	flood, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 79, 0, 1), Port: 5060})
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	raddr := mustUDPAddr(h.addr)
	answers := map[string]int{}
	buf := make([]byte, 65536)
	for i := range 50 {
		for _, m := range [][]byte{ncl, bye(i)} {
			flood.WriteToUDP(m, raddr)
			flood.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, _, err := flood.ReadFromUDP(buf)
			if err != nil {
				t.Fatalf("request %d not answered: %v", i, err)
			}
			answers[firstLine(buf[:n])]++
		}
	}
	if answers["SIP/2.0 400 Bad Content-Length"] != 50 || answers["SIP/2.0 481 Call/Transaction Does Not Exist"] != 50 {
		t.Errorf("answers %v, want 50 of 400 and 50 of 481", answers)
	}
	// Another source.
	if got, _ := exchange(t, h, net.IPv4(127, 79, 0, 2), ncl, 5*time.Second); len(got) == 0 {
		t.Fatal("the other source got no answer")
	}
	malformed := logs.FilterMessage("malformed SIP request answered")
	if n := malformed.FilterField(zap.String("reason", "Bad Content-Length")).Len(); n != 6 {
		t.Errorf("%d lines for 51 malformed requests, want 5 from the flooder, 1 from the other", n)
	}
	if n := logs.FilterMessage("SIP request for an unknown dialog").Len(); n != 5 {
		t.Errorf("%d lines for 50 BYEs of unknown dialogs, want 5", n)
	}
	if v := testutil.ToFloat64(h.srv.vet.answered); v != 51 {
		t.Errorf("relayd_sip_malformed_total{outcome=\"answered\"} %v, want 51", v)
	}
	if v := testutil.ToFloat64(h.srv.loglim); v != 90 {
		t.Errorf("relayd_log_suppressed_total{component=\"sip\"} %v, want 90", v)
	}
	h.srv.loglim.Flush()
	for _, want := range []string{"malformed SIP request answered", "SIP request for an unknown dialog"} {
		s := logs.FilterMessage("45 similar lines from 127.79.0.1 suppressed").FilterField(zap.String("line", want))
		if s.Len() != 1 {
			t.Errorf("no summary of the suppressed %q lines: %v", want, logs.FilterFieldKey("suppressed").All())
		}
	}
	// Both counters are in the front end's metrics.
	for _, name := range []string{"relayd_sip_malformed_total", "relayd_log_suppressed_total"} {
		if n := testutil.CollectAndCount(h.srv.Metrics(), name); n == 0 {
			t.Errorf("Metrics() lacks %s", name)
		}
	}
}
