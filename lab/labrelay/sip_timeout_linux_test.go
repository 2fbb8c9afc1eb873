package labrelay

import (
	"context"
	"testing"
	"time"

	callpkg "github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/lab"
)

// TestSIPMediaTimeout: a call whose media stops is ended by relayd after
// media.timeout with a BYE to both legs, and its CDR says why.
func TestSIPMediaTimeout(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	_, cdrPath := startSIPRelayWith(t, l, Options{Timeout: "2s"}, "sip:"+uas+":5060")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	uasDone := make(chan map[string]string, 1)
	go func() {
		// SIPp's built-in UAS answers, echoes media, and waits for a BYE.
		st, out := runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "1")
		if st == nil || st["SuccessfulCall(C)"] != "1" {
			t.Errorf("sipp uas: %v\n%s", st, out)
		}
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	// The caller streams one second of media, then waits for the BYE.
	uac := scenarioArgs(t, "uac_wait_bye.xml", nil, audioArgs(t, time.Second)...)
	began := time.Now()
	st, out := runSIPp(t, ctx, l.Caller, append(uac, l.RelayMedia4.String()+":5060", "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")...)
	if st == nil || st["SuccessfulCall(C)"] != "1" {
		t.Fatalf("sipp uac: %v\n%s", st, out)
	}
	<-uasDone
	took := time.Since(began)
	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 || cdrs[0].Disposition != callpkg.MediaTimeout || cdrs[0].Media[callpkg.A].Packets < 40 {
		t.Fatalf("CDRs %+v, want one media_timeout call that carried media", cdrs)
	}
	// One second of media, then two of silence and at most a sweep
	// interval before relayd notices.
	if took < 2500*time.Millisecond {
		t.Errorf("call ended after %v: before the media timeout", took)
	}
}
