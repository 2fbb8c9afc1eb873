package kamailio

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// proxy is Kamailio in the relay namespace in front of relays, with the
// SIPp parties on either side.
type proxy struct {
	l      *lab.Lab
	k      *Kamailio
	relays []mediaRelay
	wav    string
}

// newProxy starts Kamailio in front of relays (weights as given, 0 is
// 1), routing to the callee's SIPp at 198.18.2.2:5060.
func newProxy(t testing.TB, l *lab.Lab, o Options, relays []mediaRelay, weights ...int) *proxy {
	t.Helper()
	needSIPp(t)
	for i, r := range relays {
		n := Node{Addr: r.NGAddr()}
		if i < len(weights) {
			n.Weight = weights[i]
		}
		o.RTPEngines = append(o.RTPEngines, n)
	}
	o.Destination = netip.AddrPortFrom(l.CalleeAddr4, 5060)
	k := StartT(t, l, l.Relay, o)
	return &proxy{l: l, k: k, relays: relays, wav: pcmuWAV(t, 2*time.Second)}
}

// call describes a batch of calls from the caller's SIPp.
type call struct {
	n      int           // calls
	hold   time.Duration // from the ACK to the BYE; default 2.5 s
	late   bool          // offer in the 200, answer in the ACK
	cidTag string        // starts the Call-IDs
	port   int           // the caller's SIP port; default 5080
	sdes   bool          // the callee answers RTP/SAVP with the offer's SDES key
	noUAS  bool          // a callee already runs (whileUp)
	rate   int           // calls per second; default 20
}

// runUAS runs the callee's SIPp for n calls of scenario s in the
// background; wait returns its run. Its media port, where it echoes the
// RTP, is 7000.
func (p *proxy) runUAS(t testing.TB, ctx context.Context, n int, s scenario) (wait func() sippRun) {
	t.Helper()
	args := append(s.write(t), "-i", p.l.CalleeAddr4.String(), "-p", "5060",
		"-mp", "7000", "-rtp_echo", "-m", strconv.Itoa(n), "-timeout", "40", "-timeout_error")
	var r sippRun
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r = runSIPp(t, ctx, p.l.Callee, args...)
	}()
	time.Sleep(300 * time.Millisecond) // SIPp binds its port
	return func() sippRun { wg.Wait(); return r }
}

// runUAC places c's calls through Kamailio and returns the caller's run.
func (p *proxy) runUAC(t testing.TB, ctx context.Context, c call) sippRun {
	t.Helper()
	if c.hold == 0 {
		c.hold = 2500 * time.Millisecond
	}
	if c.port == 0 {
		c.port = 5080
	}
	if c.cidTag == "" {
		c.cidTag = "kam"
	}
	if c.rate == 0 {
		c.rate = 20
	}
	uac := scenario{name: "uac.xml", args: []string{"-key", "audio", p.wav + ",1,0", "-d", strconv.FormatInt(c.hold.Milliseconds(), 10)}}
	if c.late {
		uac.args = append(uac.args, "-set", "late_offer", "1")
	}
	args := append([]string{p.k.Listen.String()}, uac.write(t)...)
	args = append(args, "-s", "15551234",
		"-i", p.l.CallerAddr4.String(), "-p", strconv.Itoa(c.port), "-mp", strconv.Itoa(6000+50*(c.port-5080)),
		"-cid_str", c.cidTag+"-%u-%p@%s",
		"-m", strconv.Itoa(c.n), "-r", strconv.Itoa(c.rate), "-l", strconv.Itoa(c.n), "-recv_timeout", "8000", "-timeout", "40", "-timeout_error")
	return runSIPp(t, ctx, p.l.Caller, args...)
}

// uasBody is the callee's scenario for c's calls: uas.xml, its answers
// naming the port runUAS echoes on.
func (p *proxy) uasBody(c call) scenario {
	s := scenario{name: "uas.xml", args: []string{"-key", "sdp_port", "7000"}}
	if c.sdes {
		s.args = append(s.args, "-set", "sdes", "1")
	}
	return s
}

// placeCalls runs c against a fresh callee and checks that every call
// completed on both sides.
func (p *proxy) placeCalls(t testing.TB, c call) (uac, uas sippRun) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	wait := p.runUAS(t, ctx, c.n, p.uasBody(c))
	uac = p.runUAC(t, ctx, c)
	uas = wait()
	want := strconv.Itoa(c.n)
	if ok, _ := uac.calls(); ok != want {
		t.Fatalf("caller: %s successful calls, want %s: %v", ok, want, uac)
	}
	if ok, _ := uas.calls(); ok != want {
		t.Fatalf("callee: %s successful calls, want %s: %v", ok, want, uas)
	}
	return uac, uas
}

// mediaPackets is the least RTP a call of 2 s of audio echoed by the
// callee shows in the relay's totals: 100 packets each way, some slack.
const mediaPackets = 160

// checkSDPs checks that each SDP names one of the relays' media address
// and a port, and returns them by Call-ID.
func checkSDPs(t testing.TB, what string, sdps []receivedSDP, n int, media ...netip.Addr) map[string]receivedSDP {
	t.Helper()
	if len(sdps) != n {
		t.Fatalf("%s: %d SDPs logged, want %d: %+v", what, len(sdps), n, sdps)
	}
	out := map[string]receivedSDP{}
	for _, s := range sdps {
		ok := false
		for _, m := range media {
			ok = ok || s.Conn == m.String()
		}
		if port, err := strconv.Atoi(s.Port); !ok || err != nil || port < 30000 || port > 30999 {
			t.Errorf("%s: SDP of %s names %s:%s, want a relay media address (%v) and port 30000-30999", what, s.CallID, s.Conn, s.Port, media)
		}
		out[s.CallID] = s
	}
	return out
}

// checkRTPStats checks the $rtpstat lines of the calls whose Call-IDs
// start with tag: n of them, each with at least packets RTP packets and
// no errors.
func checkRTPStats(t testing.TB, k *Kamailio, tag string, n int, packets int64) map[string]RTPStat {
	t.Helper()
	out := map[string]RTPStat{}
	for _, s := range k.RTPStats() {
		if strings.HasPrefix(s.CallID, tag+"-") {
			out[s.CallID] = s
		}
	}
	if len(out) != n {
		t.Fatalf("%d $rtpstat lines for %s-*, want %d: %+v", len(out), tag, n, out)
	}
	for id, s := range out {
		if !s.OK || s.RTP.Packets < packets || s.RTP.Errors != 0 || s.RTP.Bytes < 172*s.RTP.Packets {
			t.Errorf("call %s: $rtpstat %+v, want >= %d RTP packets of 172 bytes and no errors", id, s, packets)
		}
	}
	return out
}

// TestCalls: early-offer calls through Kamailio and the relay: both
// parties see the relay's media address, RTP goes both ways through it
// (the callee echoes), the BYE logs the relay's counts and deletes the
// call.
func TestCalls(t *testing.T) {
	eachRelay(t, func(t *testing.T, k relayKind) {
		l := lab.NewT(t)
		r := k.start(t, l, relayA(l))
		p := newProxy(t, l, Options{}, []mediaRelay{r})
		const n = 3
		uac, uas := p.placeCalls(t, call{n: n})
		checkSDPs(t, "caller, 200", uac.sdps("200"), n, r.Media4())
		checkSDPs(t, "callee, INVITE", uas.sdps("INVITE"), n, r.Media4())
		checkRTPStats(t, p.k, "kam", n, mediaPackets)
		checkFastPath(t, r, n*mediaPackets)
		if got := len(p.k.Lines("MOS ci=kam-")); got != n {
			t.Errorf("%d MOS lines, want %d", got, n)
		}
		waitNoCalls(t, r)
	})
}

// TestLateOffer: the INVITE has no SDP; the callee's 200 carries the
// offer, the caller's ACK the answer, both rewritten by the relay.
func TestLateOffer(t *testing.T) {
	eachRelay(t, func(t *testing.T, k relayKind) {
		l := lab.NewT(t)
		r := k.start(t, l, relayA(l))
		p := newProxy(t, l, Options{}, []mediaRelay{r})
		const n = 2
		uac, uas := p.placeCalls(t, call{n: n, late: true})
		checkSDPs(t, "caller, 200 (offer)", uac.sdps("200"), n, r.Media4())
		var acks []receivedSDP
		for _, s := range uas.sdps("ACK") {
			if s.Conn != "" {
				acks = append(acks, s)
			}
		}
		checkSDPs(t, "callee, ACK (answer)", acks, n, r.Media4())
		checkFastPath(t, r, n*mediaPackets)
		if got := len(p.k.Lines("OFFER ci=kam-")); got != n || len(p.k.Lines("in=ACK")) != n {
			t.Errorf("Kamailio logged %d offers, %d answers in ACKs; want %d each:\n%s", got, len(p.k.Lines("in=ACK")), n, p.k.Log())
		}
		checkRTPStats(t, p.k, "kam", n, mediaPackets)
		waitNoCalls(t, r)
	})
}

// TestSDESTowardCallee: RTP/SAVP with SDES toward the callee, plain RTP
// toward the caller. The callee answers with the relay's own key, so its
// echo of the relay's SRTP is valid SRTP for the relay to decrypt: RTP
// flows both ways without errors.
func TestSDESTowardCallee(t *testing.T) {
	eachRelay(t, func(t *testing.T, k relayKind) {
		l := lab.NewT(t)
		r := k.start(t, l, relayA(l))
		p := newProxy(t, l, Options{
			CalleeFlags: []string{"transport-protocol=RTP/SAVP"},
			CallerFlags: []string{"transport-protocol=RTP/AVP"},
		}, []mediaRelay{r})
		const n = 2
		uac, uas := p.placeCalls(t, call{n: n, sdes: true})
		for _, s := range checkSDPs(t, "callee, INVITE", uas.sdps("INVITE"), n, r.Media4()) {
			if s.Proto != "RTP/SAVP" || !strings.Contains(s.Crypto, "inline:") {
				t.Errorf("callee got %s with crypto %q, want RTP/SAVP with an SDES key", s.Proto, s.Crypto)
			}
		}
		for _, s := range checkSDPs(t, "caller, 200", uac.sdps("200"), n, r.Media4()) {
			if s.Proto != "RTP/AVP" || s.Crypto != "" {
				t.Errorf("caller got %s with crypto %q, want plain RTP/AVP", s.Proto, s.Crypto)
			}
		}
		checkRTPStats(t, p.k, "kam", n, mediaPackets)
		waitNoCalls(t, r)
	})
}

// TestCallEnds: a canceled call and a rejected one (486) leave nothing on
// the relay.
func TestCallEnds(t *testing.T) {
	eachRelay(t, func(t *testing.T, k relayKind) {
		l := lab.NewT(t)
		r := k.start(t, l, relayA(l))
		p := newProxy(t, l, Options{}, []mediaRelay{r})
		for _, tc := range []struct {
			name     string
			uac, uas scenario
			cause    string
		}{
			{"cancel", scenario{name: "uac_cancel.xml"}, scenario{name: "uas_ring.xml"}, "cause=CANCEL"},
			{"486", scenario{name: "uac_rejected.xml"}, scenario{name: "reject.xml", vars: map[string]string{"code": "486"}}, "cause=486"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				wait := p.runUAS(t, ctx, 1, tc.uas)
				args := append([]string{p.k.Listen.String()}, tc.uac.write(t)...)
				args = append(args, "-s", "100",
					"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-cid_str", tc.name+"-%u-%p@%s", "-m", "1",
					"-recv_timeout", "8000", "-timeout", "20", "-timeout_error")
				uac := runSIPp(t, ctx, l.Caller, args...)
				uas := wait()
				if ok, _ := uac.calls(); ok != "1" {
					t.Fatalf("caller: %v", uac)
				}
				if ok, _ := uas.calls(); ok != "1" {
					t.Fatalf("callee: %v", uas)
				}
				if len(p.k.Lines("OFFER ci="+tc.name+"-")) != 1 {
					t.Errorf("no offer for the call in Kamailio's log:\n%s", p.k.Log())
				}
				if len(p.k.Lines(tc.cause)) == 0 {
					t.Errorf("no delete with %s in Kamailio's log", tc.cause)
				}
				waitNoCalls(t, r)
			})
		}
	})
}
