package labrelay

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/srtp/v3"

	callpkg "github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/audio"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// sippSDP is what one of lab/sipp's scenarios logs about an SDP it
// received ("SDP ci=... in=... c=... port=... proto=... crypto=..." or
// "... pts=...").
var sippSDP = regexp.MustCompile(`SDP ci=\S* in=(\S*) c=(\S*) port=(\S*) proto=(\S*) (?:crypto|pts)=(.*)$`)

// awaitSIPpSDP polls the log SIPp writes with -trace_logs -log_file path
// until it holds an SDP received in where ("200", "INVITE") and returns
// its fields: c=, port, profile and the a=crypto value (or the payload
// types).
func awaitSIPpSDP(t *testing.T, ctx context.Context, path, where string) (conn, port, proto, rest string) {
	t.Helper()
	for {
		b, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(b), "\n") {
			if m := sippSDP.FindStringSubmatch(strings.TrimSpace(line)); m != nil && m[1] == where {
				return m[2], m[3], m[4], strings.TrimSpace(m[5])
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("SIPp logged no SDP received in %s (%s):\n%s", where, path, b)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// srtpContext is an SRTP context of pion/srtp (not relayd's srtpflow) for
// an SDES key: the test's own SRTP peer.
func srtpContext(t *testing.T, c *sdes.Crypto) *srtp.Context {
	t.Helper()
	if c.Suite != sdes.AES_CM_128_HMAC_SHA1_80 {
		t.Fatalf("suite %s, want AES_CM_128_HMAC_SHA1_80", c.Suite)
	}
	ctx, err := srtp.CreateContext(c.Key, c.Salt, srtp.ProtectionProfileAes128CmHmacSha1_80)
	if err != nil {
		t.Fatal(err)
	}
	return ctx
}

// datagram is one UDP datagram as a socket read it.
type datagram struct {
	from netip.AddrPort
	b    []byte
}

// TestSIPTranscodeSRTP: a caller speaking PCMU over SRTP (RTP/SAVP,
// SDES AES_CM_128_HMAC_SHA1_80) calls a callee speaking plain G.729 only
// (SIPp, playing 3 s of speech from a pcap); the route has relayd
// transcode to G.729 and terminate the caller's SRTP. SIPp cannot do
// SRTP media, so SIPp places the call (offering the test's key, logging
// the answer's) and the test is the caller's media: it encrypts 3 s of
// speech with pion/srtp and decrypts what comes back with the answer's
// key. The G.729 the callee gets (captured, read with tshark) is
// bit-exact with bcg729 encoding the caller's audio offline; every packet
// the caller gets authenticates with the answer's key and the PCMU in it
// is bit-exact with bcg729 decoding the callee's G.729; ffmpeg hears
// both; the CDR has both legs transcoded in userspace, SRTP on the
// caller's only.
func TestSIPTranscodeSRTP(t *testing.T) {
	needSIPp(t)
	if !g729.Available {
		lab.SkipOrFail(t, "relayd built without bcg729 (cgo and libbcg729-dev)")
	}
	l := lab.NewT(t)
	dir := t.TempDir()
	cdrPath := filepath.Join(dir, "cdr.jsonl")
	uas := l.CalleeAddr4.String()
	extra := fmt.Sprintf(`[sip]
listen = ["udp:%[1]s:5060"]
[[route]]
name = "transcoding"
match = "."
srtp = "off"
transcode = ["G729"]
destinations = ["sip:%[2]s:5060"]
[cdr]
path = %[3]q
fsync_interval = "100ms"
`, l.RelayMedia4, uas, cdrPath)
	startRelayIn(t, l, Options{Dir: dir, ExtraMedia: extra, LogLevel: "debug"})

	const packets = 150 // 3 s of 20 ms
	callerPCM := audio.Speech(11, packets*160)
	calleePCM := audio.Speech(3, packets*160)
	callerWire := codecWire(t, "PCMU", callerPCM)
	calleeWire := codecWire(t, "G729", calleePCM)
	calleePcap := filepath.Join(dir, "callee.pcap")
	if err := audio.WritePcap(calleePcap, audio.RTPPackets(audio.RTPStream{
		Src: netip.MustParseAddrPort("198.18.9.1:4000"), Dst: netip.MustParseAddrPort("198.18.9.2:4000"),
		SSRC: 0x63, PT: 18, Seq: 100, Timestamp: 1600, Samples: 160, Interval: 20 * time.Millisecond, Marker: true,
	}, audio.Chunk(calleeWire, 20))); err != nil {
		t.Fatal(err)
	}

	// The caller's media socket, at its SDP's address, open before the
	// call so that nothing relayd sends is lost. It keeps every datagram:
	// which address is relayd's is known from the answer.
	callerMedia := netip.AddrPortFrom(l.CallerAddr4, 6000)
	conn, err := l.Caller.ListenUDP("udp4", callerMedia.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	arrived := make(chan []datagram, 1)
	go func() {
		var got []datagram
		buf := make([]byte, 2048)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				break // closed once the call is over
			}
			got = append(got, datagram{from, bytes.Clone(buf[:n])})
		}
		arrived <- got
	}()

	offerKey, err := sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80)
	if err != nil {
		t.Fatal(err)
	}
	offerValue, _ := strings.CutPrefix(offerKey.String(), "a=crypto:")

	stopCallee := capture(t, l.Callee, lab.CalleeIfName)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	uasLog := filepath.Join(dir, "uas.log")
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, scenarioArgs(t, "uas_g729.xml", nil, "-key", "pcap", calleePcap, "-key", "sdp_port", "7000",
			"-i", uas, "-p", "5060", "-mp", "7000", "-m", "1", "-trace_logs", "-log_file", uasLog)...)
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	uacLog := filepath.Join(dir, "uac.log")
	type sippResult struct {
		st  map[string]string
		out string
	}
	uacDone := make(chan sippResult, 1)
	go func() {
		// The hold (5 s) outlasts the 3 s each side sends.
		st, out := runSIPp(t, ctx, l.Caller, scenarioArgs(t, "uac_pcmu_sdes.xml", nil, "-key", "sdp_port", "6000", "-key", "crypto", offerValue,
			"-d", "5000", l.RelayMedia4.String()+":5060", "-s", "+15551234",
			"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6100", "-m", "1", "-trace_logs", "-log_file", uacLog)...)
		uacDone <- sippResult{st, out}
	}()

	// relayd's answer to the caller: SRTP, with its own key for the tag
	// offered.
	answerCtx, answerCancel := context.WithTimeout(ctx, 15*time.Second)
	c, port, proto, cryptoValue := awaitSIPpSDP(t, answerCtx, uacLog, "200")
	answerCancel()
	relayA, err := netip.ParseAddrPort(c + ":" + port)
	if err != nil {
		t.Fatalf("answer's c= %q and port %q: %v", c, port, err)
	}
	answerKey, err := sdes.Parse(cryptoValue)
	if err != nil {
		t.Fatalf("answer's a=crypto %q: %v", cryptoValue, err)
	}
	if proto != "RTP/SAVP" || relayA.Addr() != l.RelayMedia4 || answerKey.Tag != offerKey.Tag || answerKey.Suite != offerKey.Suite ||
		bytes.Equal(answerKey.Key, offerKey.Key) {
		t.Fatalf("answer to the caller: %s %s a=crypto:%s; want RTP/SAVP at %s with relayd's own %s key for tag %d",
			relayA, proto, cryptoValue, l.RelayMedia4, offerKey.Suite, offerKey.Tag)
	}
	// relayd's offer to the callee: plain RTP (srtp = "off"), the
	// caller's PCMU and G.729, which it transcodes to.
	_, _, calleeProto, calleePTs := awaitSIPpSDP(t, ctx, uasLog, "INVITE")
	if calleeProto != "RTP/AVP" || !slices.Contains(strings.Fields(calleePTs), "18") {
		t.Errorf("offer to the callee: %s with payload types %q; want RTP/AVP with G.729 (18)", calleeProto, calleePTs)
	}

	// The caller's speech, encrypted with the offered key, a packet every
	// 20 ms.
	enc := srtpContext(t, offerKey)
	start := time.Now()
	for i, p := range audio.Chunk(callerWire, 160) {
		h := rtp.Header{Version: 2, PayloadType: 0, SequenceNumber: uint16(100 + i), Timestamp: uint32(1600 + 160*i), SSRC: 0x5eed, Marker: i == 0}
		plain, err := (&rtp.Packet{Header: h, Payload: p}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		w, err := enc.EncryptRTP(nil, plain, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.WriteToUDPAddrPort(w, relayA); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(start.Add(time.Duration(i+1) * 20 * time.Millisecond)))
	}

	res := <-uacDone
	if res.st == nil || res.st["SuccessfulCall(C)"] != "1" {
		t.Fatalf("sipp uac: %v\n%s", res.st, res.out)
	}
	if ust := <-uasDone; ust == nil || ust["SuccessfulCall(C)"] != "1" {
		t.Errorf("sipp uas: %v", ust)
	}
	conn.Close()
	datagrams := <-arrived
	calleeCap := stopCallee()

	// To the callee: plain G.729, bit-exact with bcg729 encoding the
	// caller's audio offline.
	pkts, err := audio.RTPFromPcap(ctx, calleeCap, fmt.Sprintf("ip.src==%s && udp.dstport==7000", l.RelayMedia4))
	if err != nil {
		t.Fatal(err)
	}
	var toCallee []byte
	payloads := audio.Payloads(pkts, 18)
	for _, p := range payloads {
		toCallee = append(toCallee, p...)
	}
	want := codecWire(t, "G729", codecPCM(t, "PCMU", callerWire))
	if len(pkts) != packets || len(payloads) != packets || !bytes.Equal(toCallee, want) {
		t.Errorf("callee got %d packets (%d of them G.729), %d bytes; want %d packets bit-exact with bcg729 offline (%d bytes)",
			len(pkts), len(payloads), len(toCallee), packets, len(want))
	}

	// To the caller: SRTP that authenticates with the answer's key, PCMU
	// bit-exact with bcg729 decoding the callee's G.729.
	dec := srtpContext(t, answerKey)
	var toCaller []byte
	var fromRelay, authFailed, otherPT int
	for _, d := range datagrams {
		if d.from != relayA {
			continue
		}
		fromRelay++
		plain, err := dec.DecryptRTP(nil, d.b, nil)
		if err != nil {
			authFailed++
			continue
		}
		var p rtp.Packet
		if err := p.Unmarshal(plain); err != nil || p.PayloadType != 0 {
			otherPT++
			continue
		}
		toCaller = append(toCaller, p.Payload...)
	}
	wantULaw := codecWire(t, "PCMU", codecPCM(t, "G729", calleeWire))
	if fromRelay != packets || authFailed != 0 || otherPT != 0 || !bytes.Equal(toCaller, wantULaw) {
		t.Errorf("caller got %d datagrams from relayd (of %d at its socket): %d failed SRTP authentication with the answer's key, %d not PCMU, "+
			"%d bytes of PCMU; want %d packets bit-exact with bcg729 offline (%d bytes)",
			fromRelay, len(datagrams), authFailed, otherPT, len(toCaller), packets, len(wantULaw))
	}

	for _, leg := range []struct {
		name, codec string
		got         []byte
		source      []int16
	}{{"callee", "G729", toCallee, callerPCM}, {"caller", "PCMU", toCaller, calleePCM}} {
		heard, err := ffmpegPCM(ctx, leg.codec, leg.got)
		if err != nil {
			t.Errorf("ffmpeg cannot decode what the %s got: %v", leg.name, err)
			continue
		}
		// Not seg >= 4: SegSNR of nothing is NaN.
		if seg := audio.SegSNR(leg.source, heard, 80); !(seg >= 4) {
			t.Errorf("the %s hears the other leg at segmental SNR %.1f dB (ffmpeg %s), want >= 4", leg.name, seg, leg.codec)
		} else {
			t.Logf("figure %s_segsnr_db=%.1f (ffmpeg %s)", leg.name, seg, leg.codec)
		}
	}

	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 {
		t.Fatalf("%d CDRs, want 1", len(cdrs))
	}
	cd := cdrs[0]
	a, b := cd.Media[callpkg.A], cd.Media[callpkg.B]
	if cd.Disposition != callpkg.Answered || a.Path != "userspace" || b.Path != "userspace" || a.Packets < packets || b.Packets < packets ||
		a.Transcode != "PCMU>G729" || b.Transcode != "G729>PCMU" || a.Concealed != 0 || b.Concealed != 0 ||
		a.SRTP != "AES_CM_128_HMAC_SHA1_80" || b.SRTP != "" {
		t.Errorf("CDR: %s, caller leg %+v, callee leg %+v; want answered, %d packets each way in userspace, transcoded, none concealed, "+
			"SRTP on the caller's leg only", cd.Disposition, a, b, packets)
	}
}
