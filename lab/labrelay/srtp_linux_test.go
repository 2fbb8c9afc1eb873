package labrelay

import (
	"bytes"
	"encoding/base64"
	"net/netip"
	"testing"
	"time"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

// TestRelaySRTP: an SRTP caller and a plain callee. The relay decrypts
// what the caller sends and encrypts what goes back, in the userspace
// workers, for two suites; payloads are byte-exact after the round trip;
// forged, replayed and truncated SRTP is dropped and counted; the first
// suite's call is over IPv4, the second's over IPv6. The XDP program
// hands the flows' packets to the workers through the kernel's receive
// path (userspace_io socket), or redirects them into the workers' AF_XDP
// sockets (afxdp, with the program in native and in generic mode): every
// packet of the test then takes that way, as the program's and the
// workers' counters say.
func TestRelaySRTP(t *testing.T) {
	for _, c := range []struct{ name, io, xdpMode string }{
		{"socket", "socket", "native"}, {"afxdp", "afxdp", "native"}, {"afxdp-generic", "afxdp", "generic"},
	} {
		io := c.io
		t.Run(c.name, func(t *testing.T) {
			l := lab.NewT(t)
			r := startRelayIn(t, l, Options{XDPMode: c.xdpMode, UserspaceIO: io})
			testRelaySRTP(t, l, r)
			// The caller's 2,000 and 3 attack packets, the callee's 2,000,
			// per suite.
			const packets = 2 * (2*2000 + 3)
			// The workers' flows have no entry in the XDP program's
			// flow map: through the kernel, they pass as "no flow".
			m := metrics(t, r, `relayd_packets_total{reason="userspace_afxdp",verdict="punt"}`,
				`relayd_packets_total{reason="no_flow",verdict="pass"}`, "relayd_userspace_afxdp_packets_total")
			viaXSK, viaKernel, read := m[0], m[1], m[2]
			if io == "socket" && (viaXSK != 0 || viaKernel < packets || read != 0) ||
				io == "afxdp" && (viaXSK != packets || viaKernel >= packets || read != packets) {
				t.Errorf("XDP punted %.0f packets into AF_XDP sockets and passed %.0f of no XDP flow, the workers read %.0f from AF_XDP; "+
					"want all %d one way", viaXSK, viaKernel, read, packets)
			}
		})
	}
}

func testRelaySRTP(t *testing.T, l *lab.Lab, r *Relay) {
	for i, suite := range []sdes.Suite{sdes.AES_CM_128_HMAC_SHA1_80, sdes.AEAD_AES_128_GCM} {
		t.Run(suite.String(), func(t *testing.T) {
			up, err := sdes.Generate(1, suite) // caller -> relay
			if err != nil {
				t.Fatal(err)
			}
			down, err := sdes.Generate(2, suite) // relay -> caller
			if err != nil {
				t.Fatal(err)
			}
			b64 := func(c *sdes.Crypto) string {
				return base64.StdEncoding.EncodeToString(append(bytes.Clone(c.Key), c.Salt...))
			}
			port := uint16(32000 + 8*i)
			media, callerA, calleeA := l.RelayMedia4, l.CallerAddr4, l.CalleeAddr4
			if i == 1 {
				media, callerA, calleeA = l.RelayMedia6, l.CallerAddr6, l.CalleeAddr6
			}
			a, b := netip.AddrPortFrom(media, port), netip.AddrPortFrom(media, port+2)
			callerEP := netip.AddrPortFrom(callerA, 4100+port%1000)
			calleeEP := netip.AddrPortFrom(calleeA, 5100+port%1000)
			f0, err := r.AddFlow(admin.FlowRequest{Match: a.String(), ExpectSource: callerEP.String(), SendFrom: b.String(), SendTo: calleeEP.String(),
				Decrypt: &admin.Crypto{Suite: suite.String(), Key: b64(up)}})
			if err != nil {
				t.Fatal(err)
			}
			f1, err := r.AddFlow(admin.FlowRequest{Match: b.String(), ExpectSource: calleeEP.String(), SendFrom: a.String(), SendTo: callerEP.String(),
				Encrypt: &admin.Crypto{Suite: suite.String(), Key: b64(down)}})
			if err != nil {
				t.Fatal(err)
			}
			if f0.Path != "userspace" || f0.Decrypt == nil || f0.Decrypt.Key != "" || f0.Decrypt.Suite != suite.String() {
				t.Errorf("flow as returned: %+v (want userspace, the suite and no key)", f0)
			}
			caller := openLeg(t, l.Caller, callerEP, a)
			callee := openLeg(t, l.Callee, calleeEP, b)
			cfgOf := func(c *sdes.Crypto) srtpflow.Config {
				cfg, err := srtpflow.ConfigFromCrypto(c)
				if err != nil {
					t.Fatal(err)
				}
				return cfg
			}
			enc, err := srtpflow.NewEncrypter(cfgOf(up))
			if err != nil {
				t.Fatal(err)
			}
			dec, err := srtpflow.NewDecrypter(cfgOf(down))
			if err != nil {
				t.Fatal(err)
			}

			const n = 2000
			buf := make([]byte, 1500)
			var sent [][]byte
			for seq := range uint16(n) {
				pkt, err := enc.EncryptRTP(make([]byte, 0, 256), rtpFrame(buf, 1, seq))
				if err != nil {
					t.Fatal(err)
				}
				sent = append(sent, pkt)
				if _, err := caller.conn.WriteToUDPAddrPort(pkt, a); err != nil {
					t.Fatal(err)
				}
				if seq%100 == 99 {
					time.Sleep(time.Millisecond)
				}
			}
			if got, err := callee.recv(n, 1, 0, 2*time.Second); got != n || err != nil {
				t.Errorf("callee received %d of %d decrypted packets (%v)", got, n, err)
			}

			// Back: plain from the callee, SRTP to the caller.
			if err := callee.send(n, 20000, 2, 0); err != nil {
				t.Fatal(err)
			}
			rbuf := make([]byte, 2048)
			want := make([]byte, 1500)
			got := 0
			for got < n {
				caller.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				m, _, err := caller.conn.ReadFromUDPAddrPort(rbuf)
				if err != nil {
					break
				}
				plain, err := dec.DecryptRTP(make([]byte, 0, 2048), rbuf[:m])
				if err != nil {
					t.Fatalf("caller cannot decrypt packet %d: %v", got, err)
				}
				seq := uint16(plain[2])<<8 | uint16(plain[3])
				if !bytes.Equal(plain, rtpFrame(want, 2, seq)) {
					t.Fatalf("packet seq %d differs after decryption", seq)
				}
				got++
			}
			if got != n {
				t.Errorf("caller received %d of %d encrypted packets", got, n)
			}

			// Attacks: none reaches the callee, each is counted.
			forged := bytes.Clone(sent[n-1])
			forged[30] ^= 0x80
			forged[2], forged[3] = 0xff, 0x00 // a sequence number not seen yet
			replayed := sent[n-2]
			truncated := sent[n-1][:10]
			for _, p := range [][]byte{forged, replayed, truncated} {
				if _, err := caller.conn.WriteToUDPAddrPort(p, a); err != nil {
					t.Fatal(err)
				}
			}
			if got, _ := callee.recv(1, 1, 0, 300*time.Millisecond); got != 0 {
				t.Errorf("callee received %d attack packets", got)
			}
			st := flowByID(t, r, f0.ID)
			if st.Packets != n || st.Dropped != 3 || st.Received != n || st.Lost != 0 {
				t.Errorf("caller->callee flow: %+v, want %d packets, 3 dropped", st, n)
			}
			if st := flowByID(t, r, f1.ID); st.Packets != n || st.Dropped != 0 {
				t.Errorf("callee->caller flow: %+v, want %d packets", st, n)
			}
		})
	}
	for _, reason := range []string{"userspace_srtp_auth", "userspace_srtp_replay"} {
		v, err := r.Metric(`relayd_packets_total{reason="` + reason + `",verdict="drop"}`)
		if err != nil || v == 0 {
			t.Errorf("metric %s = %v (%v), want > 0", reason, v, err)
		}
	}
}

// metrics reads relayd's metrics by name (with labels), in order.
func metrics(t *testing.T, r *Relay, names ...string) []float64 {
	t.Helper()
	vs := make([]float64, len(names))
	for i, name := range names {
		v, err := r.Metric(name)
		if err != nil {
			t.Fatal(err)
		}
		vs[i] = v
	}
	return vs
}
