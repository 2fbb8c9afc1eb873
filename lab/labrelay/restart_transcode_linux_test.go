package labrelay

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/audio"
	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/rtp/g711"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// tcStream is one direction of a transcoded call's media as the test's
// endpoints saw it.
type tcStream struct {
	sent, received int
	maxGap         time.Duration
	ssrcs          map[uint32]int // output SSRCs relayd used, with their packet counts
	badPT          int
	// Continuity of relayd's output between consecutive packets: how
	// often the sequence number went back or repeated, its largest
	// jump, and the largest difference between the timestamp's step
	// and the time between arrivals (8 kHz samples).
	seqBack, maxSeqJump int
	maxSkew             int64
}

// runTC sends payloads (cycling) every 20 ms from tx to dst and counts
// what rx receives from relayd, until stop closes.
func runTC(tx *net.UDPConn, dst netip.AddrPort, pt uint8, payloads [][]byte, rx *net.UDPConn, wantPT uint8, stop <-chan struct{}) <-chan tcStream {
	out := make(chan tcStream, 1)
	var st tcStream
	st.ssrcs = map[uint32]int{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		var last time.Time
		var lastSeq uint16
		var lastTS uint32
		for {
			rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			n, _, err := rx.ReadFromUDPAddrPort(buf)
			if err != nil {
				select {
				case <-stop:
					return
				default:
					continue
				}
			}
			var h rtp.Header
			if _, err := h.Unmarshal(buf[:n]); err != nil {
				continue
			}
			now := time.Now()
			if !last.IsZero() {
				st.maxGap = max(st.maxGap, now.Sub(last))
				if d := int(int16(h.SequenceNumber - lastSeq)); d <= 0 {
					st.seqBack++
				} else {
					st.maxSeqJump = max(st.maxSeqJump, d)
				}
				// Across an outage (numbers jumped: a restart) the
				// timestamps must follow the clock. Between consecutive
				// packets the difference is only the path's jitter, which
				// a loaded machine makes large.
				if d := int(int16(h.SequenceNumber - lastSeq)); d > 1 {
					skew := int64(int32(h.Timestamp-lastTS)) - int64(now.Sub(last)/(time.Second/8000))
					st.maxSkew = max(st.maxSkew, skew, -skew)
				}
			}
			last, lastSeq, lastTS = now, h.SequenceNumber, h.Timestamp
			st.received++
			st.ssrcs[h.SSRC]++
			if h.PayloadType != wantPT {
				st.badPT++
			}
		}
	}()
	go func() {
		// Packet i is due at start + 20 ms * i, and sent late rather
		// than skipped (a ticker drops ticks on a busy machine): the
		// stream's timestamps keep up with the clock, as a real sender's.
		start := time.Now()
		pkt := make([]byte, 12+160)
		for i := 0; ; i++ {
			select {
			case <-stop:
				// The last packets relayd is still sending.
				time.Sleep(300 * time.Millisecond)
				wg.Wait()
				out <- st
				return
			case <-time.After(time.Until(start.Add(time.Duration(i) * 20 * time.Millisecond))):
			}
			p := payloads[i%len(payloads)]
			pkt = pkt[:12+len(p)]
			pkt[0], pkt[1] = 0x80, pt
			binary.BigEndian.PutUint16(pkt[2:], uint16(i))
			binary.BigEndian.PutUint32(pkt[4:], uint32(i*160))
			binary.BigEndian.PutUint32(pkt[8:], 0xabc0+uint32(pt))
			copy(pkt[12:], p)
			if _, err := tx.WriteToUDPAddrPort(pkt, dst); err == nil {
				st.sent++
			}
		}
	}()
	return out
}

// TestSIPTranscodedCallSurvivesRestart: a call transcoded between a PCMU
// caller and a G.729 callee (the route's transcode) goes on while relayd
// is stopped with SIGTERM and started again, then killed and started
// again: media flows both ways after each restart, still transcoded, and
// relayd sends each leg the same stream as before (kept in the call's
// state): the same SSRC, sequence numbers going on forward, timestamps
// following the clock across the outage.
func TestSIPTranscodedCallSurvivesRestart(t *testing.T) {
	needSIPp(t)
	if !g729.Available {
		lab.SkipOrFail(t, "relayd built without bcg729 (cgo and libbcg729-dev)")
	}
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	dir := t.TempDir()
	extra := fmt.Sprintf(`[sip]
listen = ["udp:%s:5060"]
[[route]]
name = "g729"
match = "."
transcode = ["G729"]
destinations = ["sip:%s:5060"]
[state]
path = %q
`, l.RelayMedia4, uas, filepath.Join(dir, "state", "state.db"))
	r := startRelayIn(t, l, Options{Dir: dir, ExtraMedia: extra, LogLevel: "debug"})

	// SIPp answers G.729 only and plays nothing (an empty capture); the
	// callee's media is the test's socket at the SDP's port.
	empty := filepath.Join(dir, "empty.pcap")
	if err := audio.WritePcap(empty, nil); err != nil {
		t.Fatal(err)
	}
	calleeMedia := netip.AddrPortFrom(l.CalleeAddr4, 7100)
	calleeRTP, err := l.Callee.ListenUDP("udp4", calleeMedia.String())
	if err != nil {
		t.Fatal(err)
	}
	defer calleeRTP.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, scenarioArgs(t, "uas_g729.xml", nil, "-key", "pcap", empty, "-key", "sdp_port", "7100",
			"-i", uas, "-p", "5060", "-mp", "7000", "-m", "1")...)
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	caller := placeLabCall(t, l, 5094, 4220, false)

	// relayd's port toward the callee: the match of the callee leg's
	// transcoding flow.
	var toRelayB netip.AddrPort
	calls, err := r.Calls()
	if err != nil || len(calls) != 1 {
		t.Fatalf("calls: %v, %v", calls, err)
	}
	for _, f := range calls[0].Flows {
		if f.Leg == "b" && f.Transcode == "G729>PCMU" {
			toRelayB = netip.MustParseAddrPort(f.Match)
		}
	}
	if !toRelayB.IsValid() {
		t.Fatalf("no G729>PCMU flow on the callee's leg: %+v", calls[0].Flows)
	}

	pcm := audio.Speech(11, 50*160)
	ulaw := audio.Chunk(g711.AppendUlaw(nil, pcm), 160)
	enc, err := g729.NewEncoder(false)
	if err != nil {
		t.Fatal(err)
	}
	g, _, err := enc.Encode(make([]byte, 0, 50*20), pcm)
	enc.Close()
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	toCallee := runTC(caller.rtp, caller.relayRTP, 0, ulaw, calleeRTP, 18, stop)
	toCaller := runTC(calleeRTP, toRelayB, 18, audio.Chunk(g, 20), caller.rtp, 0, stop)
	time.Sleep(2 * time.Second)
	for _, step := range []struct {
		name string
		do   func() error
	}{{"SIGTERM", r.Stop}, {"SIGKILL", r.Kill}} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if err := r.Start(); err != nil {
			t.Fatalf("start after %s: %v", step.name, err)
		}
		if !strings.Contains(r.Log(), `"calls restored"`) {
			t.Errorf("after %s: no calls restored", step.name)
		}
		time.Sleep(2 * time.Second)
	}
	close(stop)
	a, b := <-toCallee, <-toCaller
	caller.bye(t)
	for _, s := range []struct {
		name string
		st   tcStream
	}{{"to the callee (G.729)", a}, {"to the caller (PCMU)", b}} {
		t.Logf("%s: %d sent, %d received, largest gap %v, SSRCs %v", s.name, s.st.sent, s.st.received, s.st.maxGap, s.st.ssrcs)
		if s.st.received < s.st.sent*8/10 || s.st.maxGap > time.Second || s.st.badPT != 0 {
			t.Errorf("%s: %d of %d packets, largest gap %v, %d with the wrong payload type; want 80%%, under 1 s, none",
				s.name, s.st.received, s.st.sent, s.st.maxGap, s.st.badPT)
		}
		if len(s.st.ssrcs) != 1 {
			t.Errorf("%s: relayd sent under %d SSRCs across the restarts, want its one", s.name, len(s.st.ssrcs))
		}
		// The same stream continues: numbers only go forward, by less
		// than RFC 3550's MAX_DROPOUT (3000), and the timestamps follow
		// the clock across the outage (within 200 ms: scheduling on a
		// busy machine, and the time between relayd's restore and the
		// first packet it transcodes).
		t.Logf("%s: largest sequence jump %d, largest timestamp skew %d samples", s.name, s.st.maxSeqJump, s.st.maxSkew)
		if s.st.seqBack != 0 || s.st.maxSeqJump >= 3000 || s.st.maxSkew > 1600 {
			t.Errorf("%s: sequence went back %d times, largest jump %d, timestamp skew %d samples; want 0, under 3000, at most 1600",
				s.name, s.st.seqBack, s.st.maxSeqJump, s.st.maxSkew)
		}
	}
	if st := <-uasDone; st == nil || st["SuccessfulCall(C)"] != "1" {
		t.Errorf("sipp uas: %v", st)
	}
}
