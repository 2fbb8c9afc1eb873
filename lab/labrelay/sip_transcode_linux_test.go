package labrelay

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	callpkg "github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/audio"
	"github.com/relayd/relayd/rtp/g711"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// capture runs tcpdump on ifname in ns, writing UDP to a file, until the
// returned stop is called; stop returns the file.
func capture(t *testing.T, ns *lab.NS, ifname string) (stop func() string) {
	t.Helper()
	if _, err := exec.LookPath("tcpdump"); err != nil {
		lab.SkipOrFail(t, "tcpdump not installed (Debian package tcpdump)")
	}
	path := filepath.Join(t.TempDir(), ifname+".pcap")
	cmd := ns.Command("tcpdump", "-i", ifname, "-n", "-U", "-s", "0", "-w", path, "udp")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(stderr.String(), "listening on"); {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("tcpdump on %s did not start: %s", ifname, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	done := false
	stop = func() string {
		if !done {
			done = true
			cmd.Process.Signal(syscall.SIGINT)
			cmd.Wait()
		}
		return path
	}
	t.Cleanup(func() { stop() })
	return stop
}

// TestSIPTranscodeG729Callee: SIPp as both peers. The caller offers PCMU
// only; the route has relayd offer G.729 too; the callee (uas_g729.xml)
// answers G.729 only. Each plays 3 s of speech from a pcap. What relayd
// sends each leg is captured with tcpdump and read with tshark: the
// callee gets G.729 bit-exact with bcg729 encoding the caller's audio
// offline (and ffmpeg's own decoder hears the speech), the caller gets
// PCMU bit-exact with bcg729 decoding the callee's; the call's CDR has
// its media in userspace.
func TestSIPTranscodeG729Callee(t *testing.T) {
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
name = "g729-carrier"
match = "."
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
	callerULaw := g711.AppendUlaw(nil, callerPCM)
	enc, err := g729.NewEncoder(false)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	calleeG729, _, err := enc.Encode(make([]byte, 0, packets*20), calleePCM)
	if err != nil {
		t.Fatal(err)
	}
	pcapOf := func(name string, pt uint8, payloads [][]byte) string {
		path := filepath.Join(dir, name)
		s := audio.RTPStream{Src: netip.MustParseAddrPort("198.18.9.1:4000"), Dst: netip.MustParseAddrPort("198.18.9.2:4000"),
			SSRC: 0x51 + uint32(pt), PT: pt, Seq: 100, Timestamp: 1600, Samples: 160, Interval: 20 * time.Millisecond, Marker: true}
		if err := audio.WritePcap(path, audio.RTPPackets(s, payloads)); err != nil {
			t.Fatal(err)
		}
		return path
	}
	callerPcap := pcapOf("caller.pcap", 0, audio.Chunk(callerULaw, 160))
	calleePcap := pcapOf("callee.pcap", 18, audio.Chunk(calleeG729, 20))

	stopCaller := capture(t, l.Caller, lab.CallerIfName)
	stopCallee := capture(t, l.Callee, lab.CalleeIfName)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, scenarioArgs(t, "uas_g729.xml", nil, "-key", "pcap", calleePcap, "-key", "sdp_port", "7000",
			"-i", uas, "-p", "5060", "-mp", "7000", "-m", "1")...)
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	st, out := runSIPp(t, ctx, l.Caller, scenarioArgs(t, "uac_pcmu_pcap.xml", nil, "-key", "pcap", callerPcap, "-key", "sdp_port", "6000",
		"-d", "4000", l.RelayMedia4.String()+":5060", "-s", "+15551234",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")...)
	if st == nil || st["SuccessfulCall(C)"] != "1" {
		t.Fatalf("sipp uac: %v\n%s", st, out)
	}
	if ust := <-uasDone; ust == nil || ust["SuccessfulCall(C)"] != "1" {
		t.Errorf("sipp uas: %v", ust)
	}
	callerCap, calleeCap := stopCaller(), stopCallee()

	// What relayd sent the callee: G.729 from the caller's audio.
	pkts, err := audio.RTPFromPcap(ctx, calleeCap, fmt.Sprintf("ip.src==%s && udp.dstport==7000", l.RelayMedia4))
	if err != nil {
		t.Fatal(err)
	}
	var toCallee []byte
	for _, p := range audio.Payloads(pkts, 18) {
		toCallee = append(toCallee, p...)
	}
	lin := make([]int16, len(callerULaw))
	for i, c := range callerULaw {
		lin[i] = g711.DecodeUlaw(c)
	}
	enc2, err := g729.NewEncoder(false)
	if err != nil {
		t.Fatal(err)
	}
	defer enc2.Close()
	want, _, err := enc2.Encode(make([]byte, 0, packets*20), lin)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkts) != packets || !bytes.Equal(toCallee, want) {
		t.Errorf("callee got %d packets (%d of them PT 18), %d bytes of G.729; want %d packets bit-exact with bcg729 offline (%d bytes)",
			len(pkts), len(audio.Payloads(pkts, 18)), len(toCallee), packets, len(want))
	}
	if heard, err := audio.DecodeG729FFmpeg(ctx, toCallee); err != nil {
		t.Errorf("ffmpeg cannot decode the callee's G.729: %v", err)
	} else if seg := audio.SegSNR(callerPCM, heard, 80); seg < 4 {
		t.Errorf("the callee hears the caller at segmental SNR %.1f dB (ffmpeg), want >= 4", seg)
	} else {
		t.Logf("figure callee_segsnr_db=%.1f (ffmpeg G.729)", seg)
	}

	// What relayd sent the caller: PCMU from the callee's G.729.
	pkts, err = audio.RTPFromPcap(ctx, callerCap, fmt.Sprintf("ip.src==%s && udp.dstport==6000", l.RelayMedia4))
	if err != nil {
		t.Fatal(err)
	}
	var toCaller []byte
	for _, p := range audio.Payloads(pkts, 0) {
		toCaller = append(toCaller, p...)
	}
	dec, err := g729.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	pcm, err := dec.Decode(make([]int16, 0, packets*160), calleeG729)
	if err != nil {
		t.Fatal(err)
	}
	if wantU := g711.AppendUlaw(nil, pcm); len(pkts) != packets || !bytes.Equal(toCaller, wantU) {
		t.Errorf("caller got %d packets, %d bytes of PCMU; want %d packets bit-exact with bcg729 decoding offline", len(pkts), len(toCaller), packets)
	}
	if heard, err := audio.DecodeG711FFmpeg(ctx, toCaller, false); err != nil {
		t.Error(err)
	} else if seg := audio.SegSNR(calleePCM, heard, 80); seg < 4 {
		t.Errorf("the caller hears the callee at segmental SNR %.1f dB, want >= 4", seg)
	} else {
		t.Logf("figure caller_segsnr_db=%.1f (ffmpeg G.711)", seg)
	}

	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 {
		t.Fatalf("%d CDRs, want 1", len(cdrs))
	}
	c := cdrs[0]
	if a, b := c.Media[callpkg.A], c.Media[callpkg.B]; c.Disposition != callpkg.Answered || a.Path != "userspace" || b.Path != "userspace" || a.Packets < packets || b.Packets < packets {
		t.Errorf("CDR: %s, caller leg %+v, callee leg %+v; want answered, %d packets each way in userspace", c.Disposition, a, b, packets)
	}
}
