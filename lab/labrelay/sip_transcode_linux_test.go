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

// codecWire encodes pcm for codec (PCMU or G729, 20 ms packets) with a
// fresh encoder.
func codecWire(t *testing.T, codec string, pcm []int16) []byte {
	t.Helper()
	if codec == "PCMU" {
		return g711.AppendUlaw(nil, pcm)
	}
	enc, err := g729.NewEncoder(false)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	out, _, err := enc.Encode(make([]byte, 0, len(pcm)/8), pcm)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// codecPCM decodes a stream of codec with a fresh decoder.
func codecPCM(t *testing.T, codec string, b []byte) []int16 {
	t.Helper()
	if codec == "PCMU" {
		pcm := make([]int16, len(b))
		for i, c := range b {
			pcm[i] = g711.DecodeUlaw(c)
		}
		return pcm
	}
	dec, err := g729.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	pcm, err := dec.Decode(make([]int16, 0, len(b)*8), b)
	if err != nil {
		t.Fatal(err)
	}
	return pcm
}

// ffmpegPCM decodes a stream of codec with ffmpeg.
func ffmpegPCM(ctx context.Context, codec string, b []byte) ([]int16, error) {
	if codec == "PCMU" {
		return audio.DecodeG711FFmpeg(ctx, b, false)
	}
	return audio.DecodeG729FFmpeg(ctx, b)
}

// TestSIPTranscode: SIPp as both peers, each speaking one codec only: a
// PCMU caller and a G.729 callee (the route has relayd offer G.729 too),
// and a G.729 caller and a PCMU callee (the route offers PCMU). Each
// plays 3 s of speech from a pcap. What relayd sends each leg is
// captured with tcpdump and read with tshark: bit-exact with bcg729
// transcoding the other leg's audio offline, and heard by ffmpeg's own
// decoders; the call's CDR has its media in userspace and names the
// codec pairs.
func TestSIPTranscode(t *testing.T) {
	needSIPp(t)
	if !g729.Available {
		lab.SkipOrFail(t, "relayd built without bcg729 (cgo and libbcg729-dev)")
	}
	for _, tc := range []struct {
		caller, callee string // codecs
		uac, uas       string // scenarios
	}{
		{"PCMU", "G729", "uac_pcmu_pcap.xml", "uas_g729.xml"},
		{"G729", "PCMU", "uac_g729_pcap.xml", "uas_pcmu.xml"},
	} {
		t.Run(tc.caller+"-"+tc.callee, func(t *testing.T) {
			sipTranscode(t, tc.caller, tc.callee, tc.uac, tc.uas)
		})
	}
}

func sipTranscode(t *testing.T, callerCodec, calleeCodec, uac, uasScenario string) {
	l := lab.NewT(t)
	dir := t.TempDir()
	cdrPath := filepath.Join(dir, "cdr.jsonl")
	uas := l.CalleeAddr4.String()
	extra := fmt.Sprintf(`[sip]
listen = ["udp:%[1]s:5060"]
[[route]]
name = "transcoding"
match = "."
transcode = [%[4]q]
destinations = ["sip:%[2]s:5060"]
[cdr]
path = %[3]q
fsync_interval = "100ms"
`, l.RelayMedia4, uas, cdrPath, calleeCodec)
	startRelayIn(t, l, Options{Dir: dir, ExtraMedia: extra, LogLevel: "debug"})

	const packets = 150 // 3 s of 20 ms
	pt := map[string]uint8{"PCMU": 0, "G729": 18}
	size := map[string]int{"PCMU": 160, "G729": 20}
	callerPCM := audio.Speech(11, packets*160)
	calleePCM := audio.Speech(3, packets*160)
	callerWire := codecWire(t, callerCodec, callerPCM)
	calleeWire := codecWire(t, calleeCodec, calleePCM)
	pcapOf := func(name, codec string, wire []byte) string {
		path := filepath.Join(dir, name)
		s := audio.RTPStream{Src: netip.MustParseAddrPort("198.18.9.1:4000"), Dst: netip.MustParseAddrPort("198.18.9.2:4000"),
			SSRC: 0x51 + uint32(pt[codec]), PT: pt[codec], Seq: 100, Timestamp: 1600, Samples: 160, Interval: 20 * time.Millisecond, Marker: true}
		if err := audio.WritePcap(path, audio.RTPPackets(s, audio.Chunk(wire, size[codec]))); err != nil {
			t.Fatal(err)
		}
		return path
	}
	callerPcap := pcapOf("caller.pcap", callerCodec, callerWire)
	calleePcap := pcapOf("callee.pcap", calleeCodec, calleeWire)

	stopCaller := capture(t, l.Caller, lab.CallerIfName)
	stopCallee := capture(t, l.Callee, lab.CalleeIfName)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, scenarioArgs(t, uasScenario, nil, "-key", "pcap", calleePcap, "-key", "sdp_port", "7000",
			"-i", uas, "-p", "5060", "-mp", "7000", "-m", "1")...)
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	st, out := runSIPp(t, ctx, l.Caller, scenarioArgs(t, uac, nil, "-key", "pcap", callerPcap, "-key", "sdp_port", "6000",
		"-d", "4000", l.RelayMedia4.String()+":5060", "-s", "+15551234",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")...)
	if st == nil || st["SuccessfulCall(C)"] != "1" {
		t.Fatalf("sipp uac: %v\n%s", st, out)
	}
	if ust := <-uasDone; ust == nil || ust["SuccessfulCall(C)"] != "1" {
		t.Errorf("sipp uas: %v", ust)
	}
	callerCap, calleeCap := stopCaller(), stopCallee()

	// Each leg gets the other's audio in its own codec, bit-exact with
	// bcg729 transcoding it offline, and heard by ffmpeg.
	for _, leg := range []struct {
		name, capture, codec string
		port                 int
		from                 []byte // what the other leg sent
		fromCodec            string
		source               []int16 // the other leg's speech
	}{
		{"callee", calleeCap, calleeCodec, 7000, callerWire, callerCodec, callerPCM},
		{"caller", callerCap, callerCodec, 6000, calleeWire, calleeCodec, calleePCM},
	} {
		pkts, err := audio.RTPFromPcap(ctx, leg.capture, fmt.Sprintf("ip.src==%s && udp.dstport==%d", l.RelayMedia4, leg.port))
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		payloads := audio.Payloads(pkts, pt[leg.codec])
		for _, p := range payloads {
			got = append(got, p...)
		}
		want := codecWire(t, leg.codec, codecPCM(t, leg.fromCodec, leg.from))
		if len(pkts) != packets || len(payloads) != packets || !bytes.Equal(got, want) {
			t.Errorf("%s got %d packets (%d of them %s), %d bytes; want %d packets bit-exact with bcg729 offline (%d bytes)",
				leg.name, len(pkts), len(payloads), leg.codec, len(got), packets, len(want))
		}
		heard, err := ffmpegPCM(ctx, leg.codec, got)
		if err != nil {
			t.Errorf("ffmpeg cannot decode what the %s got: %v", leg.name, err)
			continue
		}
		if seg := audio.SegSNR(leg.source, heard, 80); seg < 4 {
			t.Errorf("the %s hears the other leg at segmental SNR %.1f dB (ffmpeg %s), want >= 4", leg.name, seg, leg.codec)
		} else {
			t.Logf("figure %s_segsnr_db=%.1f (ffmpeg %s)", leg.name, seg, leg.codec)
		}
	}

	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 {
		t.Fatalf("%d CDRs, want 1", len(cdrs))
	}
	c := cdrs[0]
	a, b := c.Media[callpkg.A], c.Media[callpkg.B]
	if c.Disposition != callpkg.Answered || a.Path != "userspace" || b.Path != "userspace" || a.Packets < packets || b.Packets < packets ||
		a.Transcode != callerCodec+">"+calleeCodec || b.Transcode != calleeCodec+">"+callerCodec || a.Concealed != 0 || b.Concealed != 0 {
		t.Errorf("CDR: %s, caller leg %+v, callee leg %+v; want answered, %d packets each way in userspace, transcoded, none concealed",
			c.Disposition, a, b, packets)
	}
}
