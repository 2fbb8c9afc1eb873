package labrelay

import (
	"bufio"
	"bytes"
	"context"
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
	"github.com/relayd/relayd/lab/sipp"
)

// The B2BUA end to end: SIPp (Debian package sip-tester) is the caller in
// the caller namespace and the callees in the callee namespace, running
// lab/sipp's scenarios or SIPp's own uas; relayd anchors the media in XDP
// in the relay namespace.

func needSIPp(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("sipp"); err != nil {
		lab.SkipOrFail(t, "sipp not installed (Debian package sip-tester)")
	}
}

// pcmuWAV writes a µ-law WAV file of d of audio for rtp_stream.
func pcmuWAV(t *testing.T, d time.Duration) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pcmu.wav")
	if err := os.WriteFile(path, sipp.WAV(d), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// scenarioArgs writes lab/sipp's scenario name, filled in from vars, into
// a temporary directory and returns the arguments that run it: -sf and
// the file, then args.
func scenarioArgs(t *testing.T, name string, vars map[string]string, args ...string) []string {
	t.Helper()
	path, err := sipp.WriteFile(t.TempDir(), name, vars)
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"-sf", path}, args...)
}

// audioArgs have a caller's scenario stream d of PCMU once (-key audio).
func audioArgs(t *testing.T, d time.Duration) []string {
	t.Helper()
	return []string{"-key", "audio", pcmuWAV(t, d) + ",1,0"}
}

// uacArgs run uac.xml: a call that streams 2 s of PCMU and hangs up
// after 2.5 s.
func uacArgs(t *testing.T) []string {
	t.Helper()
	return scenarioArgs(t, "uac.xml", nil, append(audioArgs(t, 2*time.Second), "-d", "2500")...)
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
	st, out := runSIPp(t, ctx, l.Caller, append(uacArgs(t), l.RelayMedia4.String()+":5060", "-s", "+15551234",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", strconv.Itoa(n), "-r", "5", "-l", strconv.Itoa(n))...)
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
	// The calls' flows gone, none is left in the program's port table.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		xdp, err := r.Metric(`relayd_flows{path="xdp"}`)
		if err == nil && xdp == 0 || time.Now().After(deadline) {
			break
		}
	}
	if v, err := r.Metric(`relayd_xdp_port_table_flows`); err != nil || v != 0 {
		t.Errorf("relayd_xdp_port_table_flows after the calls = %v, %v; want 0", v, err)
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
	rej := scenarioArgs(t, "reject.xml", map[string]string{"code": "503"}, "-i", uas, "-p", "5062", "-m", "1")
	go runSIPp(t, ctx, l.Callee, rej...)
	go runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "1")
	time.Sleep(500 * time.Millisecond)
	st, out := runSIPp(t, ctx, l.Caller, append(uacArgs(t), l.RelayMedia4.String()+":5060", "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")...)
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
	st, out := runSIPp(t, ctx, l.Caller, append(uacArgs(t), l.RelayMedia4.String()+":5060", "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "2", "-r", "10", "-l", "2")...)
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
		rej := scenarioArgs(t, "reject.xml", map[string]string{"code": strconv.Itoa(code)}, "-i", uas, "-p", strconv.Itoa(port))
		go runSIPp(t, failCtx, l.Callee, rej...)
	}
	// 5068: nobody answers.
	uasDone := make(chan map[string]string, 1)
	go func() {
		st, _ := runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", strconv.Itoa(n))
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	st, out := runSIPp(t, ctx, l.Caller, append(uacArgs(t), l.RelayMedia4.String()+":5060", "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", strconv.Itoa(n), "-r", "4", "-l", strconv.Itoa(n),
		"-recv_timeout", "20000")...)
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
		st, out := runSIPp(t, ctx, l.Callee, scenarioArgs(t, "uas_bye.xml", nil, "-d", "2500",
			"-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "1")...)
		if st == nil || st["SuccessfulCall(C)"] != "1" {
			t.Errorf("sipp uas: %v\n%s", st, out)
		}
		uasDone <- st
	}()
	time.Sleep(500 * time.Millisecond)
	// The caller streams, then waits for the BYE instead of sending one.
	uac := scenarioArgs(t, "uac_wait_bye.xml", nil, audioArgs(t, 2*time.Second)...)
	st, out := runSIPp(t, ctx, l.Caller, append(uac, l.RelayMedia4.String()+":5060", "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")...)
	if st == nil || st["SuccessfulCall(C)"] != "1" {
		t.Fatalf("sipp uac: %v\n%s", st, out)
	}
	<-uasDone
	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 || cdrs[0].Reason != "callee hung up" || cdrs[0].Media[callpkg.A].Packets < 80 {
		t.Errorf("CDRs %+v", cdrs)
	}
}

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
		st, out := runSIPp(t, ctx, l.Callee, scenarioArgs(t, "uas_ring.xml", nil, "-i", uas, "-p", "5060", "-m", "1")...)
		if st == nil || st["SuccessfulCall(C)"] != "1" {
			t.Errorf("sipp uas (rings, gets CANCEL): %v\n%s", st, out)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	st, out := runSIPp(t, ctx, l.Caller, scenarioArgs(t, "uac_cancel.xml", nil, l.RelayMedia4.String()+":5060", "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")...)
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

// TestSIPHoldResume: the caller holds (sendonly) and resumes (sendrecv)
// by re-INVITE; each reaches the callee rewritten, the call goes on.
func TestSIPHoldResume(t *testing.T) {
	needSIPp(t)
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	_, cdrPath := startSIPRelay(t, l, "", "sip:"+uas+":5060")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	uasDone := make(chan struct{})
	go func() {
		defer close(uasDone)
		st, out := runSIPp(t, ctx, l.Callee, scenarioArgs(t, "uas_hold.xml", nil, "-i", uas, "-p", "5060", "-rtp_echo", "-mp", "7000", "-m", "1")...)
		if st == nil || st["SuccessfulCall(C)"] != "1" {
			t.Errorf("sipp uas: %v\n%s", st, out)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	uac := scenarioArgs(t, "uac_hold.xml", nil, audioArgs(t, 2*time.Second)...)
	st, out := runSIPp(t, ctx, l.Caller, append(uac, l.RelayMedia4.String()+":5060", "-s", "100",
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", "1")...)
	if st == nil || st["SuccessfulCall(C)"] != "1" {
		t.Fatalf("sipp uac: %v\n%s", st, out)
	}
	<-uasDone
	cdrs := readCDRs(t, cdrPath, 1)
	if len(cdrs) != 1 || cdrs[0].Disposition != callpkg.Answered || cdrs[0].Media[callpkg.A].Packets < 80 || cdrs[0].Media[callpkg.B].Packets < 80 {
		t.Errorf("CDRs %+v", cdrs)
	}
}
