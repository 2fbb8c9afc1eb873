package audio

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/lab/sipp"
	"github.com/relayd/relayd/rtp/g711"
)

// receiver collects the datagrams a UDP socket receives until it closes.
type receiver struct {
	conn *net.UDPConn
	mu   sync.Mutex
	got  [][]byte
	from map[netip.AddrPort]int
	done chan struct{}
}

func listen(t *testing.T) *receiver {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{conn: c, from: map[netip.AddrPort]int{}, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return // closed
			}
			r.mu.Lock()
			r.got = append(r.got, bytes.Clone(buf[:n]))
			r.from[from]++
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() { c.Close(); <-r.done })
	return r
}

func (r *receiver) port() string { return strconv.Itoa(r.conn.LocalAddr().(*net.UDPAddr).Port) }

// stop closes the socket and returns what it received.
func (r *receiver) stop() ([][]byte, map[netip.AddrPort]int) {
	r.conn.Close()
	<-r.done
	return r.got, r.from
}

// freePort returns a UDP port of 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return strconv.Itoa(c.LocalAddr().(*net.UDPAddr).Port)
}

// TestSIPpPlaysPcap: SIPp's uac_pcmu_pcap.xml calls uas_g729.xml on
// 127.0.0.1; each plays a capture WritePcap wrote (PCMU one way, G.729
// the other) to the port of the other's SDP, where a socket of the test
// listens and receives every datagram of the capture, unchanged and in
// order.
func TestSIPpPlaysPcap(t *testing.T) {
	testenv.NeedRoot(t) // play_pcap_audio sends through a raw socket
	sippBin := testenv.NeedCommand(t, "sipp", "sip-tester")
	needBcg729(t)
	dir := t.TempDir()
	speech := Speech(21, 8000) // 1 s
	stream := func(pt uint8, ssrc uint32) RTPStream {
		return RTPStream{
			Src: netip.MustParseAddrPort("198.18.0.1:16000"), Dst: netip.MustParseAddrPort("198.18.0.2:16002"),
			SSRC: ssrc, PT: pt, Seq: 1000, Timestamp: 160000, Samples: 160, Interval: 20 * time.Millisecond, Marker: true,
		}
	}
	pcmuPkts := RTPPackets(stream(0, 0x0a0a0a0a), Chunk(g711.AppendUlaw(nil, speech), 160))
	g729Pkts := RTPPackets(stream(18, 0x12121212), Chunk(encodeG729(t, speech), 20))
	pcmuPcap, g729Pcap := filepath.Join(dir, "pcmu.pcap"), filepath.Join(dir, "g729.pcap")
	if err := WritePcap(pcmuPcap, pcmuPkts); err != nil {
		t.Fatal(err)
	}
	if err := WritePcap(g729Pcap, g729Pkts); err != nil {
		t.Fatal(err)
	}
	uacXML, err := sipp.WriteFile(dir, "uac_pcmu_pcap.xml", nil)
	if err != nil {
		t.Fatal(err)
	}
	uasXML, err := sipp.WriteFile(dir, "uas_g729.xml", nil)
	if err != nil {
		t.Fatal(err)
	}
	toUAC, toUAS := listen(t), listen(t) // the ports of the callers' SDP
	uasPort := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// SIPp binds its media port and the port 2 above (video): free ones
	// a moment ago, not SIPp's default of 6000 that other tests may hold.
	uasMedia, uacMedia := freePort(t), freePort(t)
	run := func(name string, args ...string) (*exec.Cmd, *bytes.Buffer) {
		cmd := exec.CommandContext(ctx, sippBin, append(args, "-i", "127.0.0.1", "-mi", "127.0.0.1", "-m", "1", "-nostdin", "-trace_logs")...)
		cmd.Dir = dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return cmd, &out
	}
	uas, uasOut := run("uas", "-sf", uasXML, "-p", uasPort, "-mp", uasMedia, "-key", "sdp_port", toUAS.port(), "-key", "pcap", g729Pcap)
	time.Sleep(300 * time.Millisecond) // the UAS binds its SIP port
	uac, uacOut := run("uac", "-sf", uacXML, "127.0.0.1:"+uasPort, "-p", freePort(t), "-mp", uacMedia, "-d", "2000",
		"-key", "sdp_port", toUAC.port(), "-key", "pcap", pcmuPcap)
	errUAC := uac.Wait()
	errUAS := uas.Wait()
	for name, e := range map[string]error{"uac": errUAC, "uas": errUAS} {
		var ee *exec.ExitError
		if e != nil && !(errors.As(e, &ee) && ee.ExitCode() == 0) {
			out := uacOut
			if name == "uas" {
				out = uasOut
			}
			t.Errorf("sipp %s: %v\n%s", name, e, lastLines(out.String(), 30))
		}
	}
	// Each logged the other's SDP: the offer PCMU, the answer G.729.
	for scen, want := range map[string]string{"uas_g729": "proto=RTP/AVP pts=0 101", "uac_pcmu_pcap": "proto=RTP/AVP pts=18 101"} {
		logs, _ := filepath.Glob(filepath.Join(dir, scen+"_*_logs.log"))
		var all []byte
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			all = append(all, b...)
		}
		if !bytes.Contains(all, []byte(want)) {
			t.Errorf("%s logged %q, want %q", scen, all, want)
		}
	}
	time.Sleep(100 * time.Millisecond) // the last datagrams on loopback
	for _, tc := range []struct {
		name string
		r    *receiver
		want []UDPPacket
		from string // SIPp's -mp: the X-RTP-Source header sets it
	}{{"PCMU to the UAS", toUAS, pcmuPkts, uacMedia}, {"G.729 to the UAC", toUAC, g729Pkts, uasMedia}} {
		got, from := tc.r.stop()
		want := make([][]byte, len(tc.want))
		for i, p := range tc.want {
			want[i] = p.Payload
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: %d datagrams of %d (-pcap +received):\n%s", tc.name, len(got), len(want), diff)
		}
		wantFrom := map[netip.AddrPort]int{netip.MustParseAddrPort("127.0.0.1:" + tc.from): len(want)}
		if diff := cmp.Diff(wantFrom, from); diff != "" {
			t.Errorf("%s: the sources (-want +got):\n%s", tc.name, diff)
		}
	}
}

func lastLines(s string, n int) string {
	lines := bytes.Split([]byte(s), []byte("\n"))
	return string(bytes.Join(lines[max(0, len(lines)-n):], []byte("\n")))
}
