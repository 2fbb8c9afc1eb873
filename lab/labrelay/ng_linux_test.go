package labrelay

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/relayd/relayd/control/ng/bencode"
	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/rtpengine/ngclient"
)

// ngClient returns an ng client of relayd's ng listener, made in the
// relay namespace.
func ngClient(t *testing.T, l *lab.Lab, addr string) *ngclient.Client {
	t.Helper()
	conn, err := l.Relay.DialUDP("udp4", "", addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ngclient.New(conn, ngclient.Config{})
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func audioSDP(ep netip.AddrPort) string {
	fam := "IP4"
	if ep.Addr().Is6() {
		fam = "IP6"
	}
	return fmt.Sprintf("v=0\r\no=- 1 1 IN %s %s\r\ns=-\r\nc=IN %s %s\r\nt=0 0\r\nm=audio %d RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=sendrecv\r\n",
		fam, ep.Addr(), fam, ep.Addr(), ep.Port())
}

// mediaOf returns the address and port of an SDP's first stream.
func mediaOf(t *testing.T, body string) netip.AddrPort {
	t.Helper()
	d, err := sdp.Parse([]byte(body))
	if err != nil || len(d.Streams) == 0 {
		t.Fatalf("SDP from relayd: %v\n%s", err, body)
	}
	return d.Streams[0].RTP()
}

// TestNGMedia: calls set up over ng, as Kamailio would, with RTP through
// relayd both ways: IPv4 on both sides, IPv6 on both sides, and IPv6 on
// the caller's side only (the callee's leg asked for IPv4 with
// address-family). Every packet arrives, from the address the SDP named;
// after delete nothing is left.
func TestNGMedia(t *testing.T) {
	l := lab.NewT(t)
	const ngAddr = "127.0.0.1:2223"
	r := startRelayIn(t, l, Options{Extra: "[ng]\nlisten = [\"udp:" + ngAddr + "\"]\n"})
	c := ngClient(t, l, ngAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, tc := range []struct {
		name           string
		caller, callee netip.Addr
		family         string // address-family of the offer: the callee's leg
		relayA, relayB netip.Addr
	}{
		{"ipv4", l.CallerAddr4, l.CalleeAddr4, "", l.RelayMedia4, l.RelayMedia4},
		{"ipv6", l.CallerAddr6, l.CalleeAddr6, "", l.RelayMedia6, l.RelayMedia6},
		{"ipv6-to-ipv4", l.CallerAddr6, l.CalleeAddr4, "IP4", l.RelayMedia6, l.RelayMedia4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			callerEP := netip.AddrPortFrom(tc.caller, uint16(4000+10*i))
			calleeEP := netip.AddrPortFrom(tc.callee, uint16(5000+10*i))
			req := ngclient.Request{CallID: "ng-" + tc.name, FromTag: "caller", SDP: audioSDP(callerEP),
				Replace: []string{"origin", "session-connection"}, ICE: "remove"}
			if tc.family != "" {
				req.Extra = append(req.Extra, bencode.Entry{Key: "address-family", Value: bencode.String(tc.family)})
			}
			off, err := c.Offer(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			towardCallee := mediaOf(t, off.SDP)
			req.ToTag, req.SDP, req.Extra = "callee", audioSDP(calleeEP), nil
			ans, err := c.Answer(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			towardCaller := mediaOf(t, ans.SDP)
			if towardCaller.Addr() != tc.relayA || towardCallee.Addr() != tc.relayB {
				t.Fatalf("relayd gave the caller %s and the callee %s, want %s and %s", towardCaller, towardCallee, tc.relayA, tc.relayB)
			}
			caller := openLeg(t, l.Caller, callerEP, towardCaller)
			callee := openLeg(t, l.Callee, calleeEP, towardCallee)
			const n = 300
			toCallee, toCaller := exchange(t, caller, callee, n, 5000)
			if toCallee != n || toCaller != n {
				t.Errorf("%d of %d packets reached the callee, %d the caller", toCallee, n, toCaller)
			}
			st, err := c.Query(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if st.RTP.Packets < 2*n {
				t.Errorf("query counts %d RTP packets, want at least %d", st.RTP.Packets, 2*n)
			}
			if _, err := c.Delete(ctx, req); err != nil {
				t.Fatal(err)
			}
		})
	}
	ids, err := c.List(ctx, 0)
	if err != nil || len(ids) != 0 {
		t.Errorf("ng list after the deletes: %v %v", ids, err)
	}
	if infos, err := r.Calls(); err != nil || len(infos) != 0 {
		t.Errorf("/v1/calls after the deletes: %v %v", infos, err)
	}
}

// TestNGMediaInterfaces: direction puts each leg of an ng call on its
// named media interface, and the media leaves from that interface's
// address: the callee hears the relay from the external address, the
// caller from the internal one, through XDP, both ways.
func TestNGMediaInterfaces(t *testing.T) {
	l := lab.NewT(t)
	external := netip.MustParseAddr("198.18.3.1")
	if out, err := l.Relay.Command("ip", "addr", "add", external.String()+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("add the external media address: %v\n%s", err, out)
	}
	const ngAddr = "127.0.0.1:2223"
	// A short latch window: the sources lock after the first exchange and
	// the second goes through XDP alone.
	r := startRelayIn(t, l, Options{ExtraMedia: `latch_window = "100ms"`, Extra: `[ng]
listen = ["udp:` + ngAddr + `"]
[[media.interface]]
name = "external"
address = "` + external.String() + `"
ports = "40000-40999"
`})
	c := ngClient(t, l, ngAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	callerEP := netip.AddrPortFrom(l.CallerAddr4, 4100)
	calleeEP := netip.AddrPortFrom(l.CalleeAddr4, 5100)
	// The unnamed [media] interface answers to "default", as rtpengine
	// names an interface given without a name.
	req := ngclient.Request{CallID: "ng-interfaces", FromTag: "caller", SDP: audioSDP(callerEP), Direction: []string{"default", "external"}}
	off, err := c.Offer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	towardCallee := mediaOf(t, off.SDP)
	req.ToTag, req.SDP = "callee", audioSDP(calleeEP)
	ans, err := c.Answer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	towardCaller := mediaOf(t, ans.SDP)
	if towardCallee.Addr() != external || towardCallee.Port() < 40000 || towardCaller.Addr() != l.RelayMedia4 {
		t.Fatalf("callee sends to %s, caller to %s; want %s:40000-40999 and %s", towardCallee, towardCaller, external, l.RelayMedia4)
	}
	caller := openLeg(t, l.Caller, callerEP, towardCaller)
	callee := openLeg(t, l.Callee, calleeEP, towardCallee)
	const n = 300
	// recv checks each packet comes from the address and port its leg
	// sends to: the callee hears the external interface. The first
	// exchange latches (in userspace), the second runs in XDP.
	for round := range 2 {
		toCallee, toCaller := exchange(t, caller, callee, n, 5000)
		if toCallee != n || toCaller != n {
			t.Errorf("round %d: %d of %d packets reached the callee, %d the caller", round, toCallee, n, toCaller)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if fwd, err := r.Metric(`relayd_packets_total{reason="redirect",verdict="forward"}`); err != nil || fwd == 0 {
		t.Errorf("XDP redirected %v packets (%v): the media did not take the fast path", fwd, err)
	}
	if _, err := c.Delete(ctx, req); err != nil {
		t.Fatal(err)
	}
}

// TestNGAllowList: ng on an address other parties reach answers only the
// proxies of its allow list; a command from anywhere else gets no reply
// and is counted.
func TestNGAllowList(t *testing.T) {
	l := lab.NewT(t)
	ngAddr := netip.AddrPortFrom(l.RelayMedia4, 2223)
	r := startRelayIn(t, l, Options{Extra: fmt.Sprintf("[ng]\nlisten = [\"udp:%s\"]\nallow = [%q]\n", ngAddr, l.CalleeAddr4)})
	dial := func(ns *lab.NS) *ngclient.Client {
		conn, err := ns.DialUDP("udp4", "", ngAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		c, err := ngclient.New(conn, ngclient.Config{Timeout: 300 * time.Millisecond, Retries: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx := context.Background()
	if err := dial(l.Callee).Ping(ctx); err != nil {
		t.Errorf("the allowed proxy: %v", err)
	}
	if err := dial(l.Caller).Ping(ctx); !errors.Is(err, ngclient.ErrTimeout) {
		t.Errorf("a party outside the allow list: %v, want no reply", err)
	}
	if v, err := r.Metric(`relayd_ng_ignored_total{reason="not_allowed"}`); err != nil || v < 1 {
		t.Errorf("ignored commands counted %v (%v), want at least 1", v, err)
	}
}
