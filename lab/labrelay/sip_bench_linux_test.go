package labrelay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// TestSIPBench measures the B2BUA with SIPp in the lab (set
// RELAYD_SIP_BENCH=1; not part of make test): calls per second with two
// failed attempts per call, and the heap per call with many calls held.
// RELAYD_SIP_CPS (default 500) and RELAYD_SIP_HOLD (default 10000) set
// the load.
func TestSIPBench(t *testing.T) {
	if os.Getenv("RELAYD_SIP_BENCH") == "" {
		t.Skip("set RELAYD_SIP_BENCH=1 to run the SIP benchmark")
	}
	needSIPp(t)
	cps, _ := strconv.Atoi(os.Getenv("RELAYD_SIP_CPS"))
	if cps == 0 {
		cps = 500
	}
	hold, _ := strconv.Atoi(os.Getenv("RELAYD_SIP_HOLD"))
	if hold == 0 {
		hold = 10000
	}
	l := lab.NewT(t)
	uas := l.CalleeAddr4.String()
	dir := t.TempDir()
	extra := fmt.Sprintf(`[sip]
listen = ["udp:%[1]s:5060"]
[[route]]
name = "bench"
match = "."
destinations = ["sip:%[2]s:5062", "sip:%[2]s:5064", "sip:%[2]s:5060"]
[cdr]
path = %[3]q
`, l.RelayMedia4, uas, filepath.Join(dir, "cdr.jsonl"))
	r, err := New(l, Options{Dir: dir, ExtraMedia: extra, Ports: "20000-59999", LogLevel: "warn"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, port := range []string{"5062", "5064"} {
		rej := scenarioArgs(t, "reject.xml", map[string]string{"code": "503"}, "-i", uas, "-p", port, "-max_socket", "60000")
		go runSIPp(t, ctx, l.Callee, rej...)
	}
	go runSIPp(t, ctx, l.Callee, "-sn", "uas", "-i", uas, "-p", "5060", "-max_socket", "60000")
	time.Sleep(500 * time.Millisecond)

	heap0 := minHeap(t, r)
	// Hold calls: heap per call. heap_alloc counts garbage until the next
	// GC, so take the lowest of several samples.
	waitUntil := time.Now().Add(90 * time.Second)
	for time.Now().Before(waitUntil) {
		if a, _ := r.Metric("relayd_calls_active"); a == 0 {
			break
		}
		time.Sleep(time.Second)
	}
	holdCtx, stopHold := context.WithTimeout(ctx, 5*time.Minute)
	defer stopHold()
	done := make(chan struct{})
	var holdOut string
	go func() {
		defer close(done)
		_, holdOut = runSIPp(t, holdCtx, l.Caller, l.RelayMedia4.String()+":5060", "-sn", "uac", "-s", "100", "-i", l.CallerAddr4.String(), "-p", "5082",
			"-r", "500", "-m", strconv.Itoa(hold), "-d", "45000", "-l", strconv.Itoa(hold), "-max_socket", "60000", "-recv_timeout", "10000")
	}()
	deadline := time.Now().Add(40 * time.Second)
	var active float64
	for time.Now().Before(deadline) {
		a, err := r.Metric("relayd_calls_active")
		if err != nil {
			t.Logf("metrics: %v", err)
			continue
		}
		active = a
		// Calls carry no media: media.timeout (60 s) would end them.
		if active >= 0.97*float64(hold) {
			break
		}
		time.Sleep(time.Second)
	}
	heap1 := minHeap(t, r)
	flows, _ := r.Metric(`relayd_flows{path="xdp"}`)
	rss := procRSS(t, r.Pid())
	t.Logf("held %.0f calls (want %d): heap %.1f MiB idle -> %.1f MiB = %.1f KiB per call; RSS %.1f MiB; XDP flows (static and call) %.0f",
		active, hold, heap0/(1<<20), heap1/(1<<20), (heap1-heap0)/1024/max(active, 1), float64(rss)/(1<<20), flows)
	stopHold()
	<-done
	// The held calls end (sipp stopped: media timeout) before the CPS run.
	for end := time.Now().Add(3 * time.Minute); time.Now().Before(end); time.Sleep(time.Second) {
		if a, _ := r.Metric("relayd_calls_active"); a == 0 {
			break
		}
	}
	if int(active) < hold {
		t.Logf("sipp (hold):\n%s", holdOut)
	}
	cpuBefore := procCPU(t, r.Pid())
	const secs = 10
	start := time.Now()
	st, out := runSIPp(t, ctx, l.Caller, l.RelayMedia4.String()+":5060", "-sn", "uac", "-s", "100", "-i", l.CallerAddr4.String(), "-p", "5080",
		"-r", strconv.Itoa(cps), "-m", strconv.Itoa(cps*secs), "-d", "0", "-l", strconv.Itoa(cps*4), "-recv_timeout", "10000")
	took := time.Since(start)
	cpu := procCPU(t, r.Pid()) - cpuBefore
	if st == nil {
		t.Fatalf("sipp: %s", out)
	}
	ok, _ := strconv.Atoi(st["SuccessfulCall(C)"])
	failed, _ := strconv.Atoi(st["FailedCall(C)"])
	t.Logf("CPS with 2 failed attempts per call: %d calls ok, %d failed in %.1fs = %.0f CPS (asked %d); relayd CPU %.1fs = %.0f%% of one core, %.0f us per call",
		ok, failed, took.Seconds(), float64(ok)/took.Seconds(), cps, cpu.Seconds(), 100*cpu.Seconds()/took.Seconds(), cpu.Seconds()*1e6/float64(max(ok, 1)))

	cancel()
}

// minHeap returns the lowest heap_alloc of 10 samples a second apart.
func minHeap(t *testing.T, r *Relay) float64 {
	low := 0.0
	for i := range 10 {
		h, err := r.Metric("go_memstats_heap_alloc_bytes")
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 || h < low {
			low = h
		}
		time.Sleep(time.Second)
	}
	return low
}

func procCPU(t *testing.T, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func procRSS(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	n, _ := strconv.ParseInt(f[1], 10, 64)
	return n * int64(os.Getpagesize())
}
