package kamailio

import (
	"bufio"
	"bytes"
	"context"
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
	"github.com/relayd/relayd/lab/sipp"
)

// SIPp (Debian package sip-tester) is the caller, in the caller
// namespace, and the callee, in the callee namespace, on either side of
// Kamailio, running lab/sipp's scenarios. Through a proxy, requests inside
// the dialog follow the Record-Route and the callee copies it into its
// answer. Each side of uac.xml and uas.xml logs the SDP it received
// (<log>, to the file -log_file names) so that the tests see what the
// relay wrote.

// scenario is one of lab/sipp's SIPp scenarios with its template values
// and the arguments it takes (-key, -set, -d).
type scenario struct {
	name string
	vars map[string]string
	args []string
}

// write writes the scenario into a temporary directory and returns the
// arguments that run it: -sf and its own.
func (s scenario) write(t testing.TB) []string {
	t.Helper()
	path, err := sipp.WriteFile(t.TempDir(), s.name, s.vars)
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"-sf", path}, s.args...)
}

func needSIPp(t testing.TB) {
	t.Helper()
	testenv.NeedCommand(t, "sipp", "sip-tester")
}

// pcmuWAV writes a µ-law WAV file of d of audio for rtp_stream.
func pcmuWAV(t testing.TB, d time.Duration) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pcmu.wav")
	if err := os.WriteFile(path, sipp.WAV(d), 0o644); err != nil {
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
