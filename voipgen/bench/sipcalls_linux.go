package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/voipgen/sipua"
)

// sipEnds says where a SIP phase's two user agents run and where the
// caller sends its INVITEs: relayd's B2BUA, or the answerer itself for
// the direct run.
type sipEnds struct {
	caller, callee         *lab.NS
	callerAddr, calleeAddr netip.Addr // each end's SIP and media address
	target                 netip.AddrPort
}

// sipRun is what voipgen call and voipgen answer reported of one run.
type sipRun struct {
	caller, answerer []sipua.CallReport
}

// sipPhaseRate is the SIP phase's call rate, per second: 200 calls are
// placed in 2 s, so most of each call's media overlaps the others'.
const sipPhaseRate = 100

// runSIPEnds places n calls of dur from `voipgen call` to `voipgen
// answer`, each a process of its own in its namespace, as a user runs
// them. In-process user agents measured the bench's own process instead:
// one Go runtime (GOMAXPROCS = the CPUs) shared by both ends' per-call
// sender threads and receivers, both SIP stacks and the CPU sweep's sink
// threads; on 2 CPUs their scheduling made milliseconds of jitter and
// gaps of hundreds of milliseconds that a direct run of the same
// processes does not show.
func runSIPEnds(ctx context.Context, bin string, e sipEnds, n int, dur time.Duration) (sipRun, error) {
	listen := netip.AddrPortFrom(e.calleeAddr, benchSIPPort)
	answer := e.callee.CommandContext(ctx, bin, "answer", "--json",
		"--sip", listen.String(), "--media", e.calleeAddr.String(), "--rtp-port", strconv.Itoa(benchRTPPort),
		"--codec", "pcmu", "--ptime", "20ms", "--max-calls", strconv.Itoa(n),
		"--duration", (dur + time.Duration(n)*10*time.Millisecond + time.Minute).String())
	ansOut, ansErr := interruptible(answer)
	if err := answer.Start(); err != nil {
		return sipRun{}, fmt.Errorf("voipgen answer: %w", err)
	}
	ansDone := make(chan error, 1)
	go func() { ansDone <- answer.Wait() }()
	stopAnswer := func() error {
		_ = answer.Process.Signal(os.Interrupt)
		return <-ansDone
	}
	if err := waitBound(ctx, e.callee, listen, ansDone); err != nil {
		return sipRun{}, errors.Join(fmt.Errorf("voipgen answer: %w: %s", err, firstLine(ansErr.Bytes())), stopAnswer())
	}
	call := e.caller.CommandContext(ctx, bin, "call", "--json",
		"--sip", netip.AddrPortFrom(e.callerAddr, benchCallerSIP).String(), "--media", e.callerAddr.String(),
		"--rtp-port", strconv.Itoa(benchRTPPort), "--codec", "pcmu", "--ptime", "20ms",
		"--target", fmt.Sprintf("sip:answer@%s", e.target), "--calls", strconv.Itoa(n), "--concurrent", strconv.Itoa(n),
		"--rate", strconv.Itoa(sipPhaseRate), "--call-duration", dur.String(), "--answer-timeout", "10s")
	callOut, callErr := interruptible(call)
	// voipgen call exits 1 when a call failed, after its report.
	callRunErr := call.Run()
	var run sipRun
	var err error
	if run.caller, err = parseSIPReport(callOut.Bytes()); err != nil {
		err = fmt.Errorf("voipgen call: %w (%v: %s)", err, callRunErr, firstLine(callErr.Bytes()))
		return run, errors.Join(err, stopAnswer())
	}
	// The answerer ends once it has seen n calls end; a call that never
	// reached it would keep it waiting.
	var ansRunErr error
	select {
	case ansRunErr = <-ansDone:
	case <-time.After(5 * time.Second):
		ansRunErr = stopAnswer()
	}
	if run.answerer, err = parseSIPReport(ansOut.Bytes()); err != nil {
		return run, fmt.Errorf("voipgen answer: %w (%v: %s)", err, ansRunErr, firstLine(ansErr.Bytes()))
	}
	return run, nil
}

// interruptible makes cmd end with SIGINT (its report still printed)
// when its context is done, and returns its stdout and stderr.
func interruptible(cmd *exec.Cmd) (stdout, stderr *bytes.Buffer) {
	stdout, stderr = new(bytes.Buffer), new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	return stdout, stderr
}

// waitBound waits until a UDP socket is bound to addr in ns (a bind there
// fails), or done says the process ended first.
func waitBound(ctx context.Context, ns *lab.NS, addr netip.AddrPort, done <-chan error) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var bound bool
		err := ns.Do(func() error {
			c, err := net.ListenPacket("udp", addr.String())
			if errors.Is(err, syscall.EADDRINUSE) {
				bound = true
				return nil
			}
			if err != nil {
				return err
			}
			return c.Close()
		})
		switch {
		case err != nil:
			return err
		case bound:
			// The user agent registers its listener for client
			// transactions just after the bind.
			time.Sleep(50 * time.Millisecond)
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("not listening on %s after 10 s", addr)
		}
		select {
		case err := <-done:
			return fmt.Errorf("exited before listening on %s: %v", addr, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// parseSIPReport reads the calls of voipgen call's or answer's --json
// report.
func parseSIPReport(out []byte) ([]sipua.CallReport, error) {
	var r struct {
		Calls []sipua.CallReport `json:"calls"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("read its JSON report: %w", err)
	}
	return r.Calls, nil
}

// firstLine is the first line of a process's stderr, for an error.
func firstLine(b []byte) string {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

var voipgenBuild struct {
	sync.Mutex
	dir string
}

// voipgenBinary returns the voipgen binary for the SIP phase's user
// agents: p if set, else this program when it is voipgen, else one built
// with the go toolchain (tests).
func voipgenBinary(p string) (string, error) {
	if p != "" {
		return p, nil
	}
	if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "voipgen" {
		return exe, nil
	}
	voipgenBuild.Lock()
	defer voipgenBuild.Unlock()
	if voipgenBuild.dir != "" {
		return filepath.Join(voipgenBuild.dir, "voipgen"), nil
	}
	if _, err := exec.LookPath("go"); err != nil {
		return "", errors.New("not run as voipgen and no go toolchain to build it: pass --voipgen")
	}
	dir, err := os.MkdirTemp("", "voipgen-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "voipgen")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/relayd/relayd/voipgen/cmd/voipgen").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go build voipgen: %w\n%s", err, out)
	}
	voipgenBuild.dir = dir
	return bin, nil
}

// removeVoipgenBuild removes the binary voipgenBinary built, if any.
func removeVoipgenBuild() {
	voipgenBuild.Lock()
	defer voipgenBuild.Unlock()
	if voipgenBuild.dir != "" {
		os.RemoveAll(voipgenBuild.dir)
		voipgenBuild.dir = ""
	}
}
