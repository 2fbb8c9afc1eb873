package labrelay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	callpkg "github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/lab"
)

// The B2BUA end to end: SIPp (Debian package sip-tester) is the caller in
// the caller namespace and the callees in the callee namespace; relayd
// anchors the media in XDP in the relay namespace.

// uacScenario places a call with an SDP offer, streams 2 s of PCMU from
// a file once answered (rtp_stream), and hangs up.
const uacScenario = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="relayd uac with rtp_stream">
  <send retrans="500"><![CDATA[
INVITE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>
Call-ID: [call_id]
CSeq: 1 INVITE
Contact: sip:sipp@[local_ip]:[local_port]
Max-Forwards: 70
Content-Type: application/sdp
Content-Length: [len]

v=0
o=user1 53655765 2353687637 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [media_port] RTP/AVP 0
a=rtpmap:0 PCMU/8000
]]></send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="183" optional="true"/>
  <recv response="200" rtd="true"/>
  <send><![CDATA[
ACK sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: 1 ACK
Contact: sip:sipp@[local_ip]:[local_port]
Max-Forwards: 70
Content-Length: 0

]]></send>
  <nop><action><exec rtp_stream="%s,1,0"/></action></nop>
  <pause milliseconds="2500"/>
  <send retrans="500"><![CDATA[
BYE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: 2 BYE
Contact: sip:sipp@[local_ip]:[local_port]
Max-Forwards: 70
Content-Length: 0

]]></send>
  <recv response="200" crlf="true"/>
</scenario>
`

// rejectScenario answers every INVITE with a final failure.
const rejectScenario = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="reject">
  <recv request="INVITE"/>
  <send><![CDATA[
SIP/2.0 %d Rejected
[last_Via:]
[last_From:]
[last_To:];tag=[pid]SIPpTag01[call_number]
[last_Call-ID:]
[last_CSeq:]
Content-Length: 0

]]></send>
  <recv request="ACK"/>
</scenario>
`

func needSIPp(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("sipp"); err != nil {
		lab.SkipOrFail(t, "sipp not installed (Debian package sip-tester)")
	}
}

// pcmuWAV writes a µ-law WAV file of d of audio for rtp_stream.
func pcmuWAV(t *testing.T, d time.Duration) string {
	t.Helper()
	n := int(d.Seconds() * 8000)
	var b bytes.Buffer
	le := binary.LittleEndian
	b.WriteString("RIFF")
	binary.Write(&b, le, uint32(4+26+8+12+8+n))
	b.WriteString("WAVEfmt ")
	binary.Write(&b, le, uint32(18))
	binary.Write(&b, le, uint16(7)) // WAVE_FORMAT_MULAW
	binary.Write(&b, le, uint16(1))
	binary.Write(&b, le, uint32(8000))
	binary.Write(&b, le, uint32(8000))
	binary.Write(&b, le, uint16(1))
	binary.Write(&b, le, uint16(8))
	binary.Write(&b, le, uint16(0))
	b.WriteString("fact")
	binary.Write(&b, le, uint32(4))
	binary.Write(&b, le, uint32(n))
	b.WriteString("data")
	binary.Write(&b, le, uint32(n))
	for i := range n {
		b.WriteByte(byte(0x55 + i%7))
	}
	path := filepath.Join(t.TempDir(), "pcmu.wav")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func writeScenario(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runSIPp runs SIPp in ns until it exits or ctx ends and returns its last
// statistics row.
func runSIPp(t *testing.T, ctx context.Context, ns *lab.NS, args ...string) (map[string]string, string) {
	t.Helper()
	stat := filepath.Join(t.TempDir(), "stat.csv")
	args = append(args, "-nostdin", "-trace_stat", "-stf", stat, "-fd", "1")
	cmd := ns.CommandContext(ctx, "sipp", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	f, err := os.Open(stat)
	if err != nil {
		return nil, fmt.Sprintf("sipp %q: %v, no statistics\n%s", args, runErr, tail(out.Bytes()))
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comma, r.FieldsPerRecord = ';', -1
	rows, err := r.ReadAll()
	if err != nil || len(rows) < 2 {
		return nil, fmt.Sprintf("sipp statistics: %v (%d rows)\n%s", err, len(rows), tail(out.Bytes()))
	}
	m := map[string]string{}
	for i, k := range rows[0] {
		if i < len(rows[len(rows)-1]) {
			m[k] = rows[len(rows)-1][i]
		}
	}
	return m, tail(out.Bytes())
}

func tail(b []byte) string { return string(b[max(0, len(b)-3000):]) }

// startSIPRelay starts relayd with the B2BUA on 198.18.1.1:5060 routing
// every call to destinations, CDRs in its directory.
func startSIPRelay(t *testing.T, l *lab.Lab, ports string, destinations ...string) (*Relay, string) {
	t.Helper()
	return startSIPRelayWith(t, l, Options{Ports: ports}, destinations...)
}

// startSIPRelayWith is startSIPRelay with more relay options.
func startSIPRelayWith(t *testing.T, l *lab.Lab, o Options, destinations ...string) (*Relay, string) {
	t.Helper()
	dir := t.TempDir()
	cdrPath := filepath.Join(dir, "cdr.jsonl")
	var dests []string
	for _, d := range destinations {
		dests = append(dests, strconv.Quote(d))
	}
	extra := fmt.Sprintf(`[sip]
listen = ["udp:%[1]s:5060", "tcp:%[1]s:5060"]
[[route]]
name = "lab"
match = "."
attempt_timeout = "500ms"
destinations = [%[2]s]
[cdr]
path = %[3]q
fsync_interval = "100ms"
`, l.RelayMedia4, strings.Join(dests, ", "), cdrPath)
	o.Dir, o.ExtraMedia, o.LogLevel = dir, extra, "debug"
	r := startRelayIn(t, l, o)
	return r, cdrPath
}

func readCDRs(t *testing.T, path string, want int) []callpkg.Info {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var out []callpkg.Info
		if f, err := os.Open(path); err == nil {
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				var i callpkg.Info
				if err := json.Unmarshal(sc.Bytes(), &i); err != nil {
					t.Fatalf("CDR line %q: %v", sc.Text(), err)
				}
				out = append(out, i)
			}
			f.Close()
		}
		if len(out) >= want || time.Now().After(deadline) {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSIPCallsThroughXDP: SIPp's UAC places calls with RTP through relayd
// to SIPp's UAS, which echoes the RTP; the media of both legs goes
// through XDP and every call has a CDR.
func TestSIPCallsThroughXDP(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	r, cdrPath := startSIPRelay(t, l, "", "sip:"+uas+":5060")
	const n = 5
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", strconv.Itoa(n))
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	scen := writeScenario(t, "uac.xml", fmt.Sprintf(uacScenario, pcmuWAV(t, 2*time.Second)))
	st, out := runSIPp(t, ctx, l.Caller, l.RelayMedia4.String()+":5060", "-sf", scen, "-s", "+15551234",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", strconv.Itoa(n), "-r", "5", "-l", strconv.Itoa(n))
	if st == nil || st["SuccessfulCall(C)"] != strconv.Itoa(n) {
		t.Fatalf("sipp uac: %v\n%s", st, out)
	}
	if ust := <-uasDone; ust == nil || ust["SuccessfulCall(C)"] != strconv.Itoa(n) {
		t.Errorf("sipp uas: %v", ust)
	}
	cdrs := readCDRs(t, cdrPath, n)
	if len(cdrs) != n {
		t.Fatalf("%d CDRs, want %d", len(cdrs), n)
	}
	for _, c := range cdrs {
		a, b := c.Media[callpkg.A], c.Media[callpkg.B]
		if c.Disposition != callpkg.Answered || len(c.Attempts) != 1 || c.Legs[callpkg.A].CallID == c.Legs[callpkg.B].CallID {
			t.Errorf("CDR %+v", c)
		}
		// 2 s of 20 ms packets from the caller, echoed by the callee.
		if a.Packets < 80 || b.Packets < 80 || a.Path != "xdp" || b.Path != "xdp" {
			t.Errorf("call %s media: caller leg %+v, callee leg %+v; want ~100 packets each way through xdp", c.ID, a, b)
		}
	}
	if v, err := r.Metric(`relayd_sip_calls_total{disposition="answered"}`); err != nil || v != n {
		t.Errorf("relayd_sip_calls_total answered = %v, %v", v, err)
	}
	if flows, _ := r.Flows(); len(flows) != 0 {
		t.Errorf("%d static flows; call flows must not show there", len(flows))
	}
}

// TestSIPFailover: the first destination answers 503, the second is
// silent, the third (SIPp's UAS) answers; the CDR lists the attempts.
func TestSIPFailover(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	_, cdrPath := startSIPRelay(t, l, "", "sip:"+uas+":5062", "sip:"+uas+":5064", "sip:"+uas+":5060")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rej := writeScenario(t, "reject.xml", fmt.Sprintf(rejectScenario, 503))
	go runSIPp(t, ctx, l.Callee, "-sf", rej, "-i", uas, "-p", "5062", "-m", "1")
	go runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "1")
	time.Sleep(500 * time.Millisecond)
	scen := writeScenario(t, "uac.xml", fmt.Sprintf(uacScenario, pcmuWAV(t, 2*time.Second)))
	st, out := runSIPp(t, ctx, l.Caller, l.RelayMedia4.String()+":5060", "-sf", scen, "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")
	if st == nil || st["SuccessfulCall(C)"] != "1" {
		t.Fatalf("sipp uac: %v\n%s", st, out)
	}
	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 {
		t.Fatalf("%d CDRs", len(cdrs))
	}
	c := cdrs[0]
	var got []string
	for _, a := range c.Attempts {
		got = append(got, fmt.Sprintf("%s %s %d", a.Destination, a.Result, a.Code))
	}
	want := []string{"sip:" + uas + ":5062 failed 503", "sip:" + uas + ":5064 timeout 0", "sip:" + uas + ":5060 answered 200"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("attempts %q, want %q", got, want)
	}
	if c.Disposition != callpkg.Answered || c.Media[callpkg.A].Packets < 80 || c.Media[callpkg.B].Packets < 80 {
		t.Errorf("CDR %+v", c)
	}
}

// TestSIPPortExhaustion: with one call's worth of relay ports, a second
// concurrent call gets 503 and the first completes with its media.
func TestSIPPortExhaustion(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	_, cdrPath := startSIPRelay(t, l, "30000-30003", "sip:"+uas+":5060")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	go runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "1")
	time.Sleep(500 * time.Millisecond)
	scen := writeScenario(t, "uac.xml", fmt.Sprintf(uacScenario, pcmuWAV(t, 2*time.Second)))
	st, out := runSIPp(t, ctx, l.Caller, l.RelayMedia4.String()+":5060", "-sf", scen, "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "2", "-r", "10", "-l", "2")
	if st == nil || st["SuccessfulCall(C)"] != "1" || st["FailedCall(C)"] != "1" {
		t.Fatalf("sipp uac: want 1 successful and 1 failed call: %v\n%s", st, out)
	}
	cdrs := readCDRs(t, cdrPath, 2)
	var answered, rejected int
	for _, c := range cdrs {
		switch {
		case c.Disposition == callpkg.Answered && c.Media[callpkg.A].Packets >= 80 && c.Media[callpkg.B].Packets >= 80:
			answered++
		case c.Disposition == callpkg.Rejected && c.Code == 503:
			rejected++
		default:
			t.Errorf("CDR %+v", c)
		}
	}
	if answered != 1 || rejected != 1 {
		t.Errorf("%d answered with media, %d rejected with 503; want 1 and 1", answered, rejected)
	}
}

// TestSIPTransNexusFailover is the TransNexus failover pattern: five
// destinations in random order, one SIPp UAS that answers and four that
// fail (no response at all, 404, 480, 503). Every call completes after 0
// to 4 failed attempts, and its CDR lists them.
func TestSIPTransNexusFailover(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	dests := []string{"sip:" + uas + ":5060", "sip:" + uas + ":5062", "sip:" + uas + ":5064", "sip:" + uas + ":5066", "sip:" + uas + ":5068"}
	dir := t.TempDir()
	cdrPath := filepath.Join(dir, "cdr.jsonl")
	var quoted []string
	for _, d := range dests {
		quoted = append(quoted, strconv.Quote(d))
	}
	extra := fmt.Sprintf(`[sip]
listen = ["udp:%s:5060"]
[[route]]
name = "transnexus"
match = "."
order = "random"
attempt_timeout = "500ms"
failover_on = [404, 408, 480, 500, 502, 503, 603]
destinations = [%s]
[cdr]
path = %q
fsync_interval = "100ms"
`, l.RelayMedia4, strings.Join(quoted, ", "), cdrPath)
	r, err := New(l, Options{Dir: dir, ExtraMedia: extra})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relayd log:\n%s", r.tail())
		}
		r.Close()
	})
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	const n = 8
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// The failing destinations run until the test ends.
	failCtx, stopFail := context.WithCancel(ctx)
	defer stopFail()
	for port, code := range map[int]int{5062: 404, 5064: 480, 5066: 503} {
		scen := writeScenario(t, fmt.Sprintf("reject%d.xml", code), fmt.Sprintf(rejectScenario, code))
		go runSIPp(t, failCtx, l.Callee, "-sf", scen, "-i", uas, "-p", strconv.Itoa(port))
	}
	// 5068: nobody answers.
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", strconv.Itoa(n))
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	scen := writeScenario(t, "uac.xml", fmt.Sprintf(uacScenario, pcmuWAV(t, 2*time.Second)))
	st, out := runSIPp(t, ctx, l.Caller, l.RelayMedia4.String()+":5060", "-sf", scen, "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", strconv.Itoa(n), "-r", "4", "-l", strconv.Itoa(n),
		"-recv_timeout", "20000")
	if st == nil || st["SuccessfulCall(C)"] != strconv.Itoa(n) {
		t.Fatalf("sipp uac: %v\n%s", st, out)
	}
	<-uasDone
	cdrs := readCDRs(t, cdrPath, n)
	if len(cdrs) != n {
		t.Fatalf("%d CDRs, want %d", len(cdrs), n)
	}
	failedBefore := 0
	for _, c := range cdrs {
		if c.Disposition != callpkg.Answered || len(c.Attempts) < 1 || len(c.Attempts) > 5 {
			t.Errorf("CDR %+v", c)
			continue
		}
		last := c.Attempts[len(c.Attempts)-1]
		if last.Destination != dests[0] || last.Code != 200 {
			t.Errorf("call %s: last attempt %+v, want the answering UAS", c.ID, last)
		}
		for _, a := range c.Attempts[:len(c.Attempts)-1] {
			want := map[string]string{dests[1]: "failed 404", dests[2]: "failed 480", dests[3]: "failed 503", dests[4]: "timeout 0"}[a.Destination]
			if got := fmt.Sprintf("%s %d", a.Result, a.Code); got != want {
				t.Errorf("call %s: attempt %+v, want %s", c.ID, a, want)
			}
			failedBefore++
		}
		if c.Media[callpkg.A].Packets < 80 || c.Media[callpkg.B].Packets < 80 {
			t.Errorf("call %s: media %+v", c.ID, c.Media)
		}
	}
	t.Logf("%d calls, %d failed attempts before the answer (%.1f per call)", n, failedBefore, float64(failedBefore)/n)
	if v, err := r.Metric(`relayd_call_attempts_total{code="200"}`); err != nil || v != n {
		t.Errorf("attempts answered metric %v, %v", v, err)
	}
}

// uasByeScenario answers, and hangs up itself after 2.5 s.
const uasByeScenario = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="uas that hangs up">
  <recv request="INVITE" crlf="true">
    <action>
      <ereg regexp=".*" search_in="hdr" header="From:" check_it="true" assign_to="remote_from"/>
      <ereg regexp="sip:[^>;]*" search_in="hdr" header="Contact:" check_it="true" assign_to="remote_contact"/>
    </action>
  </recv>
  <send><![CDATA[
SIP/2.0 200 OK
[last_Via:]
[last_From:]
[last_To:];tag=[pid]SIPpTag01[call_number]
[last_Call-ID:]
[last_CSeq:]
Contact: <sip:callee@[local_ip]:[local_port]>
Content-Type: application/sdp
Content-Length: [len]

v=0
o=user1 53655765 2353687637 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [media_port] RTP/AVP 0
a=rtpmap:0 PCMU/8000
]]></send>
  <recv request="ACK" crlf="true"/>
  <pause milliseconds="2500"/>
  <send retrans="500"><![CDATA[
BYE [$remote_contact] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: <sip:callee@[local_ip]:[local_port]>;tag=[pid]SIPpTag01[call_number]
To: [$remote_from]
Call-ID: [call_id]
CSeq: 2 BYE
Max-Forwards: 70
Content-Length: 0

]]></send>
  <recv response="200" crlf="true"/>
  <Reference variables="remote_from,remote_contact"/>
</scenario>
`

// TestSIPByeFromCallee: the callee hangs up; the caller gets the BYE.
func TestSIPByeFromCallee(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	_, cdrPath := startSIPRelay(t, l, "", "sip:"+uas+":5060")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	uasDone := make(chan map[string]string, 1)
	go func() {
		scen := writeScenario(t, "uasbye.xml", uasByeScenario)
		st, out := runSIPp(t, ctx, l.Callee, "-sf", scen, "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "1")
		if st == nil || st["SuccessfulCall(C)"] != "1" {
			t.Errorf("sipp uas: %v\n%s", st, out)
		}
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	// The caller streams, then waits for the BYE instead of sending one.
	uac := uacWaitingForBye(t, 2*time.Second)
	scen := writeScenario(t, "uacwait.xml", uac)
	st, out := runSIPp(t, ctx, l.Caller, l.RelayMedia4.String()+":5060", "-sf", scen, "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")
	if st == nil || st["SuccessfulCall(C)"] != "1" {
		t.Fatalf("sipp uac: %v\n%s", st, out)
	}
	<-uasDone
	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 || cdrs[0].Reason != "callee hung up" || cdrs[0].Media[callpkg.A].Packets < 80 {
		t.Errorf("CDRs %+v", cdrs)
	}
}

// uacCancelScenario rings and cancels.
const uacCancelScenario = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="uac that cancels">
  <send retrans="500"><![CDATA[
INVITE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>
Call-ID: [call_id]
CSeq: 1 INVITE
Contact: sip:sipp@[local_ip]:[local_port]
Max-Forwards: 70
Content-Type: application/sdp
Content-Length: [len]

v=0
o=user1 53655765 2353687637 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [media_port] RTP/AVP 0
a=rtpmap:0 PCMU/8000
]]></send>
  <recv response="100" optional="true"/>
  <recv response="180"/>
  <pause milliseconds="300"/>
  <send retrans="500"><![CDATA[
CANCEL sip:[service]@[remote_ip]:[remote_port] SIP/2.0
[last_Via:]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>
Call-ID: [call_id]
CSeq: 1 CANCEL
Max-Forwards: 70
Content-Length: 0

]]></send>
  <recv response="200"/>
  <recv response="487"/>
  <send><![CDATA[
ACK sip:[service]@[remote_ip]:[remote_port] SIP/2.0
[last_Via:]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
[last_To:]
Call-ID: [call_id]
CSeq: 1 ACK
Max-Forwards: 70
Content-Length: 0

]]></send>
</scenario>
`

// uasRingScenario rings until the INVITE is canceled.
const uasRingScenario = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="uas that rings">
  <recv request="INVITE">
    <action>
      <ereg regexp="[0-9]+" search_in="hdr" header="CSeq:" check_it="true" assign_to="icseq"/>
    </action>
  </recv>
  <send><![CDATA[
SIP/2.0 180 Ringing
[last_Via:]
[last_From:]
[last_To:];tag=[pid]SIPpTag01[call_number]
[last_Call-ID:]
[last_CSeq:]
Contact: <sip:callee@[local_ip]:[local_port]>
Content-Length: 0

]]></send>
  <recv request="CANCEL"/>
  <send><![CDATA[
SIP/2.0 200 OK
[last_Via:]
[last_From:]
[last_To:];tag=[pid]SIPpTag01[call_number]
[last_Call-ID:]
[last_CSeq:]
Content-Length: 0

]]></send>
  <send><![CDATA[
SIP/2.0 487 Request Terminated
[last_Via:]
[last_From:]
[last_To:];tag=[pid]SIPpTag01[call_number]
[last_Call-ID:]
CSeq: [$icseq] INVITE
Content-Length: 0

]]></send>
  <recv request="ACK"/>
  <Reference variables="icseq"/>
</scenario>
`

// TestSIPCancel: the caller cancels while the callee rings; the CANCEL
// reaches the callee and the CDR says canceled.
func TestSIPCancel(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	r, cdrPath := startSIPRelay(t, l, "", "sip:"+uas+":5060")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	uasDone := make(chan struct{})
	go func() {
		defer close(uasDone)
		st, out := runSIPp(t, ctx, l.Callee, "-sf", writeScenario(t, "ring.xml", uasRingScenario), "-i", uas, "-p", "5060", "-m", "1")
		if st == nil || st["SuccessfulCall(C)"] != "1" {
			t.Errorf("sipp uas (rings, gets CANCEL): %v\n%s", st, out)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	st, out := runSIPp(t, ctx, l.Caller, l.RelayMedia4.String()+":5060", "-sf", writeScenario(t, "cancel.xml", uacCancelScenario), "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")
	if st == nil || st["SuccessfulCall(C)"] != "1" {
		t.Fatalf("sipp uac (cancels): %v\n%s", st, out)
	}
	<-uasDone
	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 || cdrs[0].Disposition != callpkg.Canceled || cdrs[0].Code != 487 {
		t.Errorf("CDRs %+v", cdrs)
	}
	if v, err := r.Metric("relayd_calls_active"); err != nil || v != 0 {
		t.Errorf("calls active %v, %v", v, err)
	}
}

// reinvite is a re-INVITE from the SIPp caller with direction dir and
// CSeq n, answered and ACKed.
func reinvite(n int, dir string) string {
	return fmt.Sprintf(`  <send retrans="500"><![CDATA[
INVITE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: %[1]d INVITE
Contact: sip:sipp@[local_ip]:[local_port]
Max-Forwards: 70
Content-Type: application/sdp
Content-Length: [len]

v=0
o=user1 53655765 %[1]d IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [media_port] RTP/AVP 0
a=rtpmap:0 PCMU/8000
a=%[2]s
]]></send>
  <recv response="100" optional="true"/>
  <recv response="200"/>
  <send><![CDATA[
ACK sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: %[1]d ACK
Contact: sip:sipp@[local_ip]:[local_port]
Max-Forwards: 70
Content-Length: 0

]]></send>
  <pause milliseconds="500"/>
`, n, dir)
}

// uasAnswer is the callee's 200 with SDP of direction dir to the last
// request.
func uasAnswer(dir, totag string) string {
	return fmt.Sprintf(`  <send retrans="500"><![CDATA[
SIP/2.0 200 OK
[last_Via:]
[last_From:]
[last_To:]%s
[last_Call-ID:]
[last_CSeq:]
Contact: <sip:callee@[local_ip]:[local_port]>
Content-Type: application/sdp
Content-Length: [len]

v=0
o=user1 53655765 2353687637 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [media_port] RTP/AVP 0
a=rtpmap:0 PCMU/8000
a=%s
]]></send>
`, totag, dir)
}

// TestSIPHoldResume: the caller holds (sendonly) and resumes (sendrecv)
// by re-INVITE; each reaches the callee rewritten, the call goes on.
func TestSIPHoldResume(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	_, cdrPath := startSIPRelay(t, l, "", "sip:"+uas+":5060")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	uasScen := `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="uas with hold and resume">
  <recv request="INVITE" crlf="true"/>
` + uasAnswer("sendrecv", ";tag=[pid]SIPpTag01[call_number]") + `  <recv request="ACK"/>
  <recv request="INVITE">
    <action><ereg regexp="a=sendonly" search_in="body" check_it="true" assign_to="hold"/></action>
  </recv>
` + uasAnswer("recvonly", "") + `  <recv request="ACK"/>
  <recv request="INVITE">
    <action><ereg regexp="a=sendrecv" search_in="body" check_it="true" assign_to="resume"/></action>
  </recv>
` + uasAnswer("sendrecv", "") + `  <recv request="ACK"/>
` + answerBye + `
  <Reference variables="hold,resume"/>
</scenario>
`
	uasDone := make(chan struct{})
	go func() {
		defer close(uasDone)
		st, out := runSIPp(t, ctx, l.Callee, "-sf", writeScenario(t, "uashold.xml", uasScen), "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "1")
		if st == nil || st["SuccessfulCall(C)"] != "1" {
			t.Errorf("sipp uas: %v\n%s", st, out)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	uac := strings.Replace(fmt.Sprintf(uacScenario, pcmuWAV(t, 2*time.Second)), `  <pause milliseconds="2500"/>
`, `  <pause milliseconds="500"/>
`+reinvite(2, "sendonly")+reinvite(3, "sendrecv")+`  <pause milliseconds="1500"/>
`, 1)
	uac = strings.Replace(uac, "CSeq: 2 BYE", "CSeq: 4 BYE", 1)
	st, out := runSIPp(t, ctx, l.Caller, l.RelayMedia4.String()+":5060", "-sf", writeScenario(t, "uachold.xml", uac), "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")
	if st == nil || st["SuccessfulCall(C)"] != "1" {
		t.Fatalf("sipp uac: %v\n%s", st, out)
	}
	<-uasDone
	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 || cdrs[0].Disposition != callpkg.Answered || cdrs[0].Media[callpkg.A].Packets < 80 || cdrs[0].Media[callpkg.B].Packets < 80 {
		t.Errorf("CDRs %+v", cdrs)
	}
}

// uacWaitingForBye is uacScenario streaming d of PCMU that, instead of
// hanging up, waits for the BYE and answers it.
func uacWaitingForBye(t *testing.T, d time.Duration) string {
	t.Helper()
	uac := fmt.Sprintf(uacScenario, pcmuWAV(t, d))
	start := strings.Index(uac, `  <pause milliseconds="2500"/>`)
	end := strings.Index(uac, `<recv response="200" crlf="true"/>`)
	if start < 0 || end < 0 {
		t.Fatal("uacScenario no longer has the pause and BYE this rewrites")
	}
	return uac[:start] + answerBye + uac[end+len(`<recv response="200" crlf="true"/>`):]
}

// answerBye waits for a BYE and answers it with 200.
const answerBye = `  <recv request="BYE"/>
  <send><![CDATA[
SIP/2.0 200 OK
[last_Via:]
[last_From:]
[last_To:]
[last_Call-ID:]
[last_CSeq:]
Content-Length: 0

]]></send>`
