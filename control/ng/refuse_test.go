package ng

import (
	"strings"
	"testing"
)

// TestEngineRefusesDestinations: an offer (or an answer) whose media is
// relayd's own address with a guessed port, loopback, broadcast or a
// family the interface has no address of is answered result=error with
// an error-reason saying why; no flow is installed and no call is left.
func TestEngineRefusesDestinations(t *testing.T) {
	r := newEngineRig(t, nil, relayInt, relayExt)
	for _, tc := range []struct{ name, sdp, why string }{
		{"relay address", sdpOf("198.18.1.1", "30002"), "relayd itself"},
		{"advertised address", sdpOf("198.19.0.1", "40002"), "relayd itself"},
		{"relay IPv6 address", sdpOf("2001:2:0:1::1", "30002"), "relayd itself"},
		{"loopback", sdpOf("127.0.0.1", "4000"), "loopback"},
		{"broadcast", sdpOf("255.255.255.255", "4000"), "broadcast"},
		{"relay address in a=rtcp", sdpOf("198.18.0.10", "4000", "a=rtcp:30003 IN IP4 198.18.1.1\r\n"), "relayd itself"},
		{"SAVP without a key", strings.Replace(sdpOf("198.18.0.10", "4000"), "RTP/AVP", "RTP/SAVP", 1), "a=crypto"},
	} {
		rep := r.do(t, "sdp", tc.sdp, "call-id", "refused-"+tc.name, "from-tag", "alice", "command", "offer")
		if rep.GetString("result") != "error" || !strings.Contains(rep.GetString("error-reason"), tc.why) {
			t.Errorf("%s: result %q, error-reason %q; want error saying %q", tc.name, rep.GetString("result"), rep.GetString("error-reason"), tc.why)
		}
	}
	// The external interface has no IPv6 address.
	rep := r.do(t, "sdp", sdpOf("2001:2::10", "4000"), "call-id", "v6", "from-tag", "alice", "interface", "external", "command", "offer")
	if rep.GetString("result") != "error" || !strings.Contains(rep.GetString("error-reason"), "no IPv6 media address") {
		t.Errorf("IPv6 offer on an IPv4 interface: %q %q", rep.GetString("result"), rep.GetString("error-reason"))
	}
	if n := r.xdp.Len() + r.us.Len(); n != 0 {
		t.Errorf("%d flows installed", n)
	}
	if n := r.calls.Len(); n != 0 {
		t.Errorf("%d calls left", n)
	}

	// An answer toward relayd's own address: refused, the offer's flows
	// stay as they were.
	wantOK(t, r.do(t, "sdp", sdpOf("198.18.0.10", "4000"), "call-id", "c1", "from-tag", "alice", "command", "offer"))
	before := r.xdp.Len()
	rep = r.do(t, "sdp", sdpOf("198.18.1.1", "30000"), "call-id", "c1", "from-tag", "alice", "to-tag", "bob", "command", "answer")
	if rep.GetString("result") != "error" || !strings.Contains(rep.GetString("error-reason"), "relayd itself") {
		t.Errorf("answer toward the relay: %q %q", rep.GetString("result"), rep.GetString("error-reason"))
	}
	if r.xdp.Len() != before {
		t.Errorf("flows %d after the refused answer, %d before", r.xdp.Len(), before)
	}
	list, _ := r.xdp.List()
	for _, fs := range list {
		if _, own := r.calls.Registry().InterfaceOf(fs.Flow.SendTo.Addr()); own {
			t.Errorf("flow %s sends to %s", fs.Flow.Match, fs.Flow.SendTo)
		}
	}
}
