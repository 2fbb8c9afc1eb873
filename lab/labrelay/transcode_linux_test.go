package labrelay

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/audio"
	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/rtp/g711"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/codec/g729"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

// toneMix is a deterministic test signal: two tones and a slow envelope,
// so that every frame differs and the codecs have something to code.
func toneMix(samples int) []int16 {
	pcm := make([]int16, samples)
	for i := range pcm {
		t := float64(i) / 8000
		env := 0.55 + 0.45*math.Sin(2*math.Pi*1.3*t)
		pcm[i] = int16(8000 * env * (math.Sin(2*math.Pi*440*t) + 0.5*math.Sin(2*math.Pi*1230*t)))
	}
	return pcm
}

// rtpPacket builds an RTP packet of payload type pt.
func rtpPacket(pt uint8, ssrc uint32, seq uint16, ts uint32, payload []byte) []byte {
	b := make([]byte, 12+len(payload))
	b[0], b[1] = 0x80, pt
	binary.BigEndian.PutUint16(b[2:], seq)
	binary.BigEndian.PutUint32(b[4:], ts)
	binary.BigEndian.PutUint32(b[8:], ssrc)
	copy(b[12:], payload)
	return b
}

// received is one RTP packet as a leg got it.
type received struct {
	pt      uint8
	seq     uint16
	ts      uint32
	ssrc    uint32
	payload []byte
}

// recvRTP reads RTP packets on l until n arrived or idle passes.
func recvRTP(t *testing.T, l *leg, n int, idle time.Duration) []received {
	t.Helper()
	var out []received
	buf := make([]byte, 2048)
	for len(out) < n {
		l.conn.SetReadDeadline(time.Now().Add(idle))
		m, from, err := l.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			break
		}
		if from != l.relay {
			t.Errorf("packet from %s, want %s", from, l.relay)
			continue
		}
		var h rtp.Header
		off, err := h.Unmarshal(buf[:m])
		if err != nil {
			t.Errorf("not RTP: %v", err)
			continue
		}
		out = append(out, received{h.PayloadType, h.SequenceNumber, h.Timestamp, h.SSRC, bytes.Clone(buf[off:m])})
	}
	return out
}

// checkContinuous reports gaps in the sequence numbers and timestamps of
// pkts, and a foreign SSRC or payload type.
func checkContinuous(t *testing.T, what string, pkts []received, ssrc uint32, pt uint8, step uint32) {
	t.Helper()
	for i, p := range pkts {
		if p.ssrc != ssrc || p.pt != pt {
			t.Errorf("%s packet %d: ssrc %#x pt %d, want %#x and %d", what, i, p.ssrc, p.pt, ssrc, pt)
			return
		}
		if i > 0 && (p.seq != pkts[i-1].seq+1 || p.ts != pkts[i-1].ts+step) {
			t.Errorf("%s packet %d: seq %d ts %d after seq %d ts %d, want +1 and +%d", what, i, p.seq, p.ts, pkts[i-1].seq, pkts[i-1].ts, step)
			return
		}
	}
}

// TestRelayTranscodeStatic: two static flows of the admin API transcode
// a call between a PCMU caller and a G.729 callee in relayd's workers.
// Without loss the G.729 relayd sends is bit-exact with bcg729 encoding
// the caller's audio offline, and the PCMU it sends is bit-exact with
// bcg729 decoding the callee's; sequence numbers and timestamps are
// continuous under relayd's own SSRC; relayd's RTCP sender reports reach
// each leg's RTCP port and count what it sent there.
func TestRelayTranscodeStatic(t *testing.T) {
	if !g729.Available {
		testenv.Skip(t, "relayd built without bcg729 (cgo and libbcg729-dev)")
	}
	l := lab.NewT(t)
	r := startRelayIn(t, l, Options{ExtraMedia: `rtcp_interval = "200ms"`})

	a, b := netip.AddrPortFrom(l.RelayMedia4, 33000), netip.AddrPortFrom(l.RelayMedia4, 33002)
	rtcpA, rtcpB := netip.AddrPortFrom(l.RelayMedia4, 33001), netip.AddrPortFrom(l.RelayMedia4, 33003)
	callerEP := netip.AddrPortFrom(l.CallerAddr4, 4200)
	calleeEP := netip.AddrPortFrom(l.CalleeAddr4, 5200)
	callerRTCP := netip.AddrPortFrom(l.CallerAddr4, 4201)
	calleeRTCP := netip.AddrPortFrom(l.CalleeAddr4, 5201)
	const toCalleeSSRC, toCallerSSRC = 0x7a7a0001, 0x7a7a0002
	f0, err := r.AddFlow(admin.FlowRequest{Match: a.String(), ExpectSource: callerEP.String(), SendFrom: b.String(), SendTo: calleeEP.String(),
		Reverse: b.String(),
		Transcode: &admin.Transcode{From: "PCMU", To: "G729", SSRC: toCalleeSSRC,
			RTCPFrom: rtcpB.String(), RTCPTo: calleeRTCP.String()}})
	if err != nil {
		t.Fatal(err)
	}
	f1, err := r.AddFlow(admin.FlowRequest{Match: b.String(), ExpectSource: calleeEP.String(), SendFrom: a.String(), SendTo: callerEP.String(),
		Reverse: a.String(),
		Transcode: &admin.Transcode{From: "G729", To: "PCMU", SSRC: toCallerSSRC,
			RTCPFrom: rtcpA.String(), RTCPTo: callerRTCP.String()}})
	if err != nil {
		t.Fatal(err)
	}
	if f0.Path != "userspace" || f0.Transcode == nil || f0.Transcode.To != "G729" || *f0.Transcode.PTTo != 18 {
		t.Fatalf("flow as returned: %+v (want userspace, PCMU to G729 on PT 18)", f0)
	}
	caller := openLeg(t, l.Caller, callerEP, a)
	callee := openLeg(t, l.Callee, calleeEP, b)
	callerR := openLeg(t, l.Caller, callerRTCP, rtcpA)
	calleeR := openLeg(t, l.Callee, calleeRTCP, rtcpB)

	// 3 s of audio each way, a packet every 20 ms (sent 4 times faster:
	// order, not pace, is what the engine follows).
	const packets = 150
	pcm := audio.Speech(11, packets*160)
	ulaw := g711.AppendUlaw(nil, pcm)
	// Offline: what relayd must produce from it.
	wantG729 := codecWire(t, "G729", codecPCM(t, "PCMU", ulaw))
	for i, p := range audio.Chunk(ulaw, 160) {
		if _, err := caller.conn.WriteToUDPAddrPort(rtpPacket(0, 0x1234, uint16(1000+i), uint32(i*160), p), a); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := recvRTP(t, callee, packets, 2*time.Second)
	if len(got) != packets {
		t.Fatalf("callee received %d G.729 packets, want %d", len(got), packets)
	}
	checkContinuous(t, "to callee", got, toCalleeSSRC, 18, 160)
	var gotG729 []byte
	for _, p := range got {
		gotG729 = append(gotG729, p.payload...)
	}
	if !bytes.Equal(gotG729, wantG729) {
		first := 0
		for first < min(len(gotG729), len(wantG729)) && gotG729[first] == wantG729[first] {
			first++
		}
		t.Errorf("G.729 to the callee: %d bytes, not bit-exact with bcg729 offline (%d bytes); first difference at byte %d (frame %d)",
			len(gotG729), len(wantG729), first, first/10)
	}

	// An independent decoder: ffmpeg's own G.729 decoder hears the
	// caller's speech in what relayd sent (thresholds: lab/audio's
	// measured G.729 figures, SegSNR 5.9-6.4 dB for these signals, and
	// ffmpeg within 23 dB of bcg729).
	ctx := context.Background()
	heard, err := audio.DecodeG729FFmpeg(ctx, gotG729)
	if err != nil {
		t.Fatalf("ffmpeg cannot decode relayd's G.729: %v", err)
	}
	if seg := audio.SegSNR(pcm, heard, 80); seg < 4 {
		t.Errorf("ffmpeg decodes relayd's G.729 to segmental SNR %.1f dB against the caller's audio, want >= 4", seg)
	} else {
		t.Logf("figure ffmpeg_segsnr_to_callee_db=%.1f", seg)
	}

	// Back: the callee sends G.729 (encoded offline), the caller gets PCMU.
	g729Stream := codecWire(t, "G729", pcm)
	wantULaw := codecWire(t, "PCMU", codecPCM(t, "G729", g729Stream))
	for i, g := range audio.Chunk(g729Stream, 20) {
		if _, err := callee.conn.WriteToUDPAddrPort(rtpPacket(18, 0x5678, uint16(7000+i), uint32(90000+i*160), g), b); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	back := recvRTP(t, caller, packets, 2*time.Second)
	if len(back) != packets {
		t.Fatalf("caller received %d PCMU packets, want %d", len(back), packets)
	}
	checkContinuous(t, "to caller", back, toCallerSSRC, 0, 160)
	var gotULaw []byte
	for _, p := range back {
		gotULaw = append(gotULaw, p.payload...)
	}
	if !bytes.Equal(gotULaw, wantULaw) {
		t.Errorf("PCMU to the caller: %d bytes, not bit-exact with bcg729 decoding offline (%d bytes)", len(gotULaw), len(wantULaw))
	}
	heardBack, err := audio.DecodeG711FFmpeg(ctx, gotULaw, false)
	if err != nil {
		t.Fatal(err)
	}
	if seg := audio.SegSNR(pcm, heardBack, 80); seg < 4 {
		t.Errorf("the caller hears the callee's speech at segmental SNR %.1f dB (ffmpeg's G.711 decoder), want >= 4", seg)
	} else {
		t.Logf("figure ffmpeg_segsnr_to_caller_db=%.1f", seg)
	}

	// relayd's own reports: an SR on each leg's RTCP port, from relayd's
	// RTCP address, for its SSRC, counting what it sent there.
	for _, c := range []struct {
		name string
		leg  *leg
		ssrc uint32
		peer uint32 // the SSRC relayd received from that leg
	}{{"callee", calleeR, toCalleeSSRC, 0x5678}, {"caller", callerR, toCallerSSRC, 0x1234}} {
		sr, rr, ok := readSR(t, c.leg, c.ssrc, 3*time.Second)
		if !ok {
			t.Errorf("%s: no RTCP sender report from relayd with SSRC %#x", c.name, c.ssrc)
			continue
		}
		if sr.PacketCount != packets || sr.OctetCount != packets*map[string]uint32{"callee": 20, "caller": 160}[c.name] {
			t.Errorf("%s: SR counts %d packets, %d octets; want %d packets", c.name, sr.PacketCount, sr.OctetCount, packets)
		}
		if rr == nil || rr.SSRC != c.peer || rr.TotalLost != 0 {
			t.Errorf("%s: reception report %+v, want one for SSRC %#x with nothing lost", c.name, rr, c.peer)
		}
	}

	for _, f := range []admin.Flow{f0, f1} {
		st := flowByID(t, r, f.ID).TranscodeStats
		if st == nil || st.FramesIn != 2*packets || st.FramesOut != 2*packets || st.SentPackets != packets || st.Concealed != 0 {
			t.Errorf("flow %s: transcode stats %+v, want %d frames in and out, %d packets, none concealed", f.Match, st, 2*packets, packets)
		}
	}
}

// readSR waits for an RTCP compound on l that starts with a sender report
// from ssrc and returns its sender info and first reception report.
func readSR(t *testing.T, l *leg, ssrc uint32, wait time.Duration) (rtp.SenderInfo, *rtp.ReceptionReport, bool) {
	t.Helper()
	buf := make([]byte, 2048)
	deadline := time.Now().Add(wait)
	var last rtp.SenderInfo
	var lastRR *rtp.ReceptionReport
	found := false
	for time.Now().Before(deadline) {
		l.conn.SetReadDeadline(deadline)
		n, from, err := l.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			break
		}
		if from != l.relay {
			t.Errorf("RTCP from %s, want %s", from, l.relay)
			continue
		}
		var h rtp.RTCPHeader
		off, err := h.Unmarshal(buf[:n])
		if err != nil || h.Type != rtp.TypeSenderReport || h.SSRC != ssrc {
			t.Errorf("RTCP %x: not a sender report from %#x (%v)", buf[:min(n, 16)], ssrc, err)
			continue
		}
		var si rtp.SenderInfo
		if err := si.Unmarshal(buf[off:n]); err != nil {
			t.Errorf("sender info: %v", err)
			continue
		}
		last, found, lastRR = si, true, nil
		if h.Count > 0 {
			var rr rtp.ReceptionReport
			if rr.Unmarshal(buf[off+rtp.SenderInfoSize:n]) == nil {
				lastRR = &rr
			}
		}
		// Reports keep coming (some queued from before the other leg
		// sent anything): the one after both streams ended counts all.
		if si.PacketCount == 150 && lastRR != nil {
			break
		}
	}
	return last, lastRR, found
}

// TestRelayTranscodeSRTP: SRTP on the G.711 leg and transcoding in the
// same pass on one worker: the caller's SRTP PCMU is decrypted, decoded
// and sent to the callee as G.729 bit-exact with bcg729 offline; the
// callee's G.729 reaches the caller as SRTP PCMU that decrypts to what
// bcg729 decodes offline; relayd's report to the caller is SRTCP.
func TestRelayTranscodeSRTP(t *testing.T) {
	if !g729.Available {
		testenv.Skip(t, "relayd built without bcg729 (cgo and libbcg729-dev)")
	}
	l := lab.NewT(t)
	r := startRelayIn(t, l, Options{ExtraMedia: `rtcp_interval = "200ms"`})
	suite := sdes.AES_CM_128_HMAC_SHA1_80
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
	a, b := netip.AddrPortFrom(l.RelayMedia4, 33100), netip.AddrPortFrom(l.RelayMedia4, 33102)
	rtcpA := netip.AddrPortFrom(l.RelayMedia4, 33101)
	callerEP := netip.AddrPortFrom(l.CallerAddr4, 4300)
	calleeEP := netip.AddrPortFrom(l.CalleeAddr4, 5300)
	callerRTCP := netip.AddrPortFrom(l.CallerAddr4, 4301)
	const toCalleeSSRC, toCallerSSRC = 0x7b7b0001, 0x7b7b0002
	if _, err := r.AddFlow(admin.FlowRequest{Match: a.String(), ExpectSource: callerEP.String(), SendFrom: b.String(), SendTo: calleeEP.String(),
		Reverse: b.String(), Decrypt: &admin.Crypto{Suite: suite.String(), Key: b64(up)},
		Transcode: &admin.Transcode{From: "PCMU", To: "G729", SSRC: toCalleeSSRC}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddFlow(admin.FlowRequest{Match: b.String(), ExpectSource: calleeEP.String(), SendFrom: a.String(), SendTo: callerEP.String(),
		Reverse: a.String(), Encrypt: &admin.Crypto{Suite: suite.String(), Key: b64(down)},
		Transcode: &admin.Transcode{From: "G729", To: "PCMU", SSRC: toCallerSSRC,
			RTCPFrom: rtcpA.String(), RTCPTo: callerRTCP.String()}}); err != nil {
		t.Fatal(err)
	}
	caller := openLeg(t, l.Caller, callerEP, a)
	callee := openLeg(t, l.Callee, calleeEP, b)
	callerR := openLeg(t, l.Caller, callerRTCP, rtcpA)
	cfgOf := func(c *sdes.Crypto) srtpflow.Config {
		cfg, err := srtpflow.ConfigFromCrypto(c)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	senc, err := srtpflow.NewEncrypter(cfgOf(up))
	if err != nil {
		t.Fatal(err)
	}
	sdec, err := srtpflow.NewDecrypter(cfgOf(down))
	if err != nil {
		t.Fatal(err)
	}

	const packets = 100
	pcm := toneMix(packets * 160)
	ulawStream := g711.AppendUlaw(nil, pcm)
	wantG729 := codecWire(t, "G729", codecPCM(t, "PCMU", ulawStream))
	for i, ulaw := range audio.Chunk(ulawStream, 160) {
		pkt, err := senc.EncryptRTP(make([]byte, 0, 256), rtpPacket(0, 0x1234, uint16(i), uint32(i*160), ulaw))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := caller.conn.WriteToUDPAddrPort(pkt, a); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := recvRTP(t, callee, packets, 2*time.Second)
	var gotG729 []byte
	for _, p := range got {
		gotG729 = append(gotG729, p.payload...)
	}
	checkContinuous(t, "to callee", got, toCalleeSSRC, 18, 160)
	if len(got) != packets || !bytes.Equal(gotG729, wantG729) {
		t.Errorf("callee: %d G.729 packets, %d bytes; want %d packets bit-exact with bcg729 offline", len(got), len(gotG729), packets)
	}

	g729Stream := codecWire(t, "G729", pcm)
	wantULaw := codecWire(t, "PCMU", codecPCM(t, "G729", g729Stream))
	for i, g := range audio.Chunk(g729Stream, 20) {
		if _, err := callee.conn.WriteToUDPAddrPort(rtpPacket(18, 0x5678, uint16(i), uint32(i*160), g), b); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var gotULaw []byte
	n := 0
	buf := make([]byte, 2048)
	for n < packets {
		caller.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		m, _, err := caller.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			break
		}
		plain, err := sdec.DecryptRTP(make([]byte, 0, 2048), buf[:m])
		if err != nil {
			t.Fatalf("caller cannot decrypt packet %d: %v", n, err)
		}
		var h rtp.Header
		off, err := h.Unmarshal(plain)
		if err != nil || h.SSRC != toCallerSSRC || h.PayloadType != 0 {
			t.Fatalf("caller packet %d: %+v %v, want PCMU from %#x", n, h, err, toCallerSSRC)
		}
		gotULaw = append(gotULaw, plain[off:]...)
		n++
	}
	if n != packets || !bytes.Equal(gotULaw, wantULaw) {
		t.Errorf("caller: %d SRTP PCMU packets, %d bytes; want %d packets that decrypt to bcg729's offline decode", n, len(gotULaw), packets)
	}

	// relayd's report to the caller comes as SRTCP under relayd's key.
	callerR.conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	m, _, err := callerR.conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no RTCP at the caller: %v", err)
	}
	plain, err := sdec.DecryptRTCP(make([]byte, 0, 2048), buf[:m])
	if err != nil {
		t.Fatalf("relayd's RTCP to the caller is not SRTCP under its key: %v", err)
	}
	var h rtp.RTCPHeader
	if _, err := h.Unmarshal(plain); err != nil || h.Type != rtp.TypeSenderReport || h.SSRC != toCallerSSRC {
		t.Errorf("caller's RTCP: %+v %v, want a sender report from %#x", h, err, toCallerSSRC)
	}
}

// TestRelayTranscodeEvents: RFC 4733 telephone-events cross a transcoding
// flow with their payload type mapped (101 to 96), their payload intact,
// their timestamp translated as the audio's is, and sequence numbers
// taken from the output stream.
func TestRelayTranscodeEvents(t *testing.T) {
	if !g729.Available {
		testenv.Skip(t, "relayd built without bcg729 (cgo and libbcg729-dev)")
	}
	l := lab.NewT(t)
	r := startRelayIn(t, l, Options{})
	a, b := netip.AddrPortFrom(l.RelayMedia4, 33200), netip.AddrPortFrom(l.RelayMedia4, 33202)
	callerEP := netip.AddrPortFrom(l.CallerAddr4, 4400)
	calleeEP := netip.AddrPortFrom(l.CalleeAddr4, 5400)
	fl, err := r.AddFlow(admin.FlowRequest{Match: a.String(), ExpectSource: callerEP.String(), SendFrom: b.String(), SendTo: calleeEP.String(),
		Transcode: &admin.Transcode{From: "PCMU", To: "G729", EventFrom: 101, EventTo: 96, SSRC: 0x7c7c0001}})
	if err != nil {
		t.Fatal(err)
	}
	caller := openLeg(t, l.Caller, callerEP, a)
	callee := openLeg(t, l.Callee, calleeEP, b)
	pcm := audio.Speech(11, 40*160)
	send := func(p []byte) {
		t.Helper()
		if _, err := caller.conn.WriteToUDPAddrPort(p, a); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// 20 packets of audio, digit 5 for 60 ms (3 updates and 3 end
	// packets, all with the event's start timestamp), 20 more of audio.
	seq := uint16(500)
	for i := range 20 {
		send(rtpPacket(0, 0x99, seq, uint32(i*160), g711.AppendUlaw(nil, pcm[i*160:(i+1)*160])))
		seq++
	}
	const evTS = 20 * 160
	var events [][]byte
	for i, dur := range []uint16{160, 320, 480, 480, 480, 480} {
		ev := []byte{5, 10, byte(dur >> 8), byte(dur)}
		if i >= 3 {
			ev[1] |= 0x80 // end
		}
		p := rtpPacket(101, 0x99, seq, evTS, ev)
		if i == 0 {
			p[1] |= 0x80 // marker: the event's first packet
		}
		events = append(events, ev)
		send(p)
		seq++
	}
	for i := 23; i < 40; i++ {
		send(rtpPacket(0, 0x99, seq, uint32(i*160), g711.AppendUlaw(nil, pcm[i*160:(i+1)*160])))
		seq++
	}
	got := recvRTP(t, callee, 43, 2*time.Second)
	var audioPkts, evPkts []received
	for _, p := range got {
		switch p.pt {
		case 18:
			audioPkts = append(audioPkts, p)
		case 96:
			evPkts = append(evPkts, p)
		default:
			t.Errorf("packet with payload type %d, want 18 or 96", p.pt)
		}
	}
	if len(audioPkts) != 37 || len(evPkts) != 6 {
		t.Fatalf("callee got %d G.729 and %d event packets, want 37 and 6", len(audioPkts), len(evPkts))
	}
	for i, p := range got[1:] {
		if p.seq != got[i].seq+1 || p.ssrc != 0x7c7c0001 {
			t.Errorf("packet %d: seq %d after %d, ssrc %#x; want one output sequence under 0x7c7c0001", i+1, p.seq, got[i].seq, p.ssrc)
		}
	}
	// The audio's mapping: out = in + offset, the same for the events.
	offset := audioPkts[0].ts - 0
	for i, p := range evPkts {
		if p.ts != evTS+offset || !bytes.Equal(p.payload, events[i]) {
			t.Errorf("event %d: ts %d payload %x, want ts %d (the audio's mapping) and %x", i, p.ts, p.payload, evTS+offset, events[i])
		}
	}
	if st := flowByID(t, r, fl.ID).TranscodeStats; st == nil || st.Events != 6 {
		t.Errorf("transcode stats %+v, want 6 events", st)
	}
}
