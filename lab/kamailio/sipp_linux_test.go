package kamailio

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/lab"
)

// SIPp (Debian package sip-tester) is the caller, in the caller
// namespace, and the callee, in the callee namespace, on either side of
// Kamailio. Through a proxy, requests inside the dialog follow the
// Record-Route (rrs="true", [routes], [next_url]) and the callee copies
// it into its answer. Each side logs the SDP it received (<log>, to the
// file -log_file names) so that the tests see what the relay wrote.

// sdpLog is the <log> line of a received SDP: address, port, profile and
// SDES key of the (only) audio stream.
const sdpLog = `<log message="SDP ci=[call_id] in=[$where] c=[$c] port=[$port] proto=[$proto] crypto=[$crypto]"/>`

// sdpEregs read the SDP of the last message into the variables sdpLog
// prints; none must match (an SDP without a=crypto).
const sdpEregs = `<ereg regexp="c=IN IP4 ([0-9.]+)" search_in="body" check_it="false" assign_to="cl,c"/>
      <ereg regexp="m=audio ([0-9]+) ([A-Z/]+)" search_in="body" check_it="false" assign_to="ml,port,proto"/>
      <ereg regexp="a=crypto:([^\r\n]+)" search_in="body" check_it="false" assign_to="kl,crypto"/>`

const sdpVars = `<Reference variables="cl,ml,kl,where"/>`

// offerSDP is a SIPp party's SDP; %s is its profile and attributes.
const offerSDP = `v=0
o=user1 53655765 2353687637 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [media_port] RTP/AVP 0
a=rtpmap:0 PCMU/8000
`

// uacScenario places a call, with an SDP offer in the INVITE or (late)
// in the ACK, streams the audio file once answered, holds for hold and
// hangs up. Arguments: INVITE body headers+body, ACK body headers+body,
// wav file, hold in ms.
const uacScenario = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="uac through kamailio">
  <send retrans="500"><![CDATA[
INVITE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>
Call-ID: [call_id]
CSeq: 1 INVITE
Contact: sip:sipp@[local_ip]:[local_port]
Max-Forwards: 70
%[1]s
]]></send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="183" optional="true"/>
  <recv response="200" rtd="true" rrs="true">
    <action>
      <assignstr assign_to="where" value="200"/>
      ` + sdpEregs + `
      ` + sdpLog + `
    </action>
  </recv>
  <send><![CDATA[
ACK [next_url] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
[routes]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: 1 ACK
Contact: sip:sipp@[local_ip]:[local_port]
Max-Forwards: 70
%[2]s
]]></send>
  <nop><action><exec rtp_stream="%[3]s,1,0"/></action></nop>
  <pause milliseconds="%[4]d"/>
  <send retrans="500"><![CDATA[
BYE [next_url] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
[routes]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
Call-ID: [call_id]
CSeq: 2 BYE
Contact: sip:sipp@[local_ip]:[local_port]
Max-Forwards: 70
Content-Length: 0

]]></send>
  <recv response="200" crlf="true"/>
  ` + sdpVars + `
</scenario>
`

const withSDP = "Content-Type: application/sdp\nContent-Length: [len]\n\n" + offerSDP
const noBody = "Content-Length: 0\n"

// uasScenario answers one INVITE with 200 and SDP, and the BYE.
// Arguments: the 200's SDP attributes after the m= line (for a=crypto),
// the m= line's profile.
const uasScenario = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="uas behind kamailio">
  <recv request="INVITE" crlf="true">
    <action>
      <assignstr assign_to="where" value="INVITE"/>
      ` + sdpEregs + `
      ` + sdpLog + `
    </action>
  </recv>
  <send retrans="500"><![CDATA[
SIP/2.0 200 OK
[last_Via:]
[last_Record-Route:]
[last_From:]
[last_To:];tag=[pid]SIPpTag01[call_number]
[last_Call-ID:]
[last_CSeq:]
Contact: <sip:callee@[local_ip]:[local_port];transport=[transport]>
Content-Type: application/sdp
Content-Length: [len]

v=0
o=user2 53655765 2353687637 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [media_port] %[2]s 0
a=rtpmap:0 PCMU/8000
%[1]s
]]></send>
  <recv request="ACK" crlf="true">
    <action>
      <assignstr assign_to="where" value="ACK"/>
      ` + sdpEregs + `
      ` + sdpLog + `
    </action>
  </recv>
  <recv request="BYE"/>
  <send><![CDATA[
SIP/2.0 200 OK
[last_Via:]
[last_From:]
[last_To:]
[last_Call-ID:]
[last_CSeq:]
Contact: <sip:callee@[local_ip]:[local_port];transport=[transport]>
Content-Length: 0

]]></send>
  ` + sdpVars + `
</scenario>
`

// uasRejectScenario answers an INVITE with a final failure (%d).
const uasRejectScenario = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="uas that rejects">
  <recv request="INVITE"/>
  <send><![CDATA[
SIP/2.0 %d Busy Here
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

// uacRejectedScenario places a call the callee rejects with %d.
const uacRejectedScenario = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="uac rejected">
  <send retrans="500"><![CDATA[
INVITE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
To: <sip:[service]@[remote_ip]:[remote_port]>
Call-ID: [call_id]
CSeq: 1 INVITE
Contact: sip:sipp@[local_ip]:[local_port]
Max-Forwards: 70
` + withSDP + `
]]></send>
  <recv response="100" optional="true"/>
  <recv response="%d"/>
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
` + withSDP + `
]]></send>
  <recv response="100" optional="true"/>
  <recv response="180"/>
  <pause milliseconds="200"/>
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
[last_Record-Route:]
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

func needSIPp(t testing.TB) {
	t.Helper()
	testenv.NeedCommand(t, "sipp", "sip-tester")
}

// pcmuWAV writes a µ-law WAV file of d of audio for rtp_stream.
func pcmuWAV(t testing.TB, d time.Duration) string {
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

func writeFile(t testing.TB, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// sippRun is one finished SIPp run.
type sippRun struct {
	Stats map[string]string // the last row of its statistics
	Out   string            // the end of its output
	Log   string            // the <log> lines
}

// calls returns the count of successful and failed calls.
func (r sippRun) calls() (ok, failed string) {
	return r.Stats["SuccessfulCall(C)"], r.Stats["FailedCall(C)"]
}

func (r sippRun) String() string {
	return fmt.Sprintf("stats %v\n%s\nlog:\n%s", r.Stats, r.Out, r.Log)
}

// runSIPp runs SIPp in ns until it exits or ctx ends.
func runSIPp(t testing.TB, ctx context.Context, ns *lab.NS, args ...string) sippRun {
	t.Helper()
	dir := t.TempDir()
	stat, logPath := filepath.Join(dir, "stat.csv"), filepath.Join(dir, "log.txt")
	args = append(args, "-nostdin", "-trace_stat", "-stf", stat, "-fd", "1", "-trace_logs", "-log_file", logPath)
	cmd := ns.CommandContext(ctx, "sipp", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	var r sippRun
	r.Out = string(out.Bytes()[max(0, out.Len()-3000):])
	if b, err := os.ReadFile(logPath); err == nil {
		r.Log = string(b)
	}
	f, err := os.Open(stat)
	if err != nil {
		r.Out = fmt.Sprintf("sipp %q: %v, no statistics\n%s", args, runErr, r.Out)
		return r
	}
	defer f.Close()
	cr := csv.NewReader(f)
	cr.Comma, cr.FieldsPerRecord = ';', -1
	rows, err := cr.ReadAll()
	if err != nil || len(rows) < 2 {
		r.Out = fmt.Sprintf("sipp statistics: %v (%d rows)\n%s", err, len(rows), r.Out)
		return r
	}
	r.Stats = map[string]string{}
	for i, k := range rows[0] {
		if i < len(rows[len(rows)-1]) {
			r.Stats[k] = rows[len(rows)-1][i]
		}
	}
	return r
}

// receivedSDP is what a SIPp party's log says about one SDP it received.
type receivedSDP struct {
	CallID, In, Conn, Port, Proto, Crypto string
}

var sdpLine = regexp.MustCompile(`SDP ci=(\S*) in=(\S*) c=(\S*) port=(\S*) proto=(\S*) crypto=(.*)$`)

// sdps returns the SDPs a SIPp run logged, received in where ("200",
// "INVITE", "ACK").
func (r sippRun) sdps(where string) []receivedSDP {
	var out []receivedSDP
	sc := bufio.NewScanner(strings.NewReader(r.Log))
	for sc.Scan() {
		m := sdpLine.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil || m[2] != where {
			continue
		}
		out = append(out, receivedSDP{CallID: m[1], In: m[2], Conn: m[3], Port: m[4], Proto: m[5], Crypto: strings.TrimSpace(m[6])})
	}
	return out
}
