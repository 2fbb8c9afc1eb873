package labrelay

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/kamailio"
	"github.com/relayd/relayd/lab/rtpengine"
)

// TestSIPBench measures the B2BUA with SIPp in the lab (set
// RELAYD_SIP_BENCH=1; not part of make test). Every call is tried on two
// destinations that answer 503 before the third answers: two failed
// attempts per call. It reports
//
//   - heap per held call: relayd's HeapInuse (and HeapAlloc, the live
//     objects without what fragmentation keeps) after a GC (the lowest
//     of heapReadings readings) with
//     RELAYD_SIP_HOLD (default 10000) calls up, minus the same before the
//     calls, once as soon as the calls are up (their setup's transactions
//     still linger: 64*T1) and once settled, when those have ended;
//   - CPU per call: relayd's CPU time (utime+stime of /proc/PID/stat)
//     while SIPp offers RELAYD_SIP_CPS (default 500) calls per second for
//     RELAYD_SIP_SECS (default 10) s, calls that hang up at once, divided
//     by the calls answered.
//
// RELAYD_TEST_BIN runs another relayd (one built with -tags relaydpprof
// for the heap figures: an older one to compare).
// Then, unless RELAYD_SIP_YARDSTICK=0, the same CPS run goes through the
// field's equivalent of relayd's job on the same address, relayd stopped:
// Kamailio (a stateful proxy trying the same three destinations in turn)
// with rtpengine anchoring the media over ng (offer, answer, delete), and
// Kamailio alone (no media); their CPU per call and relayd's ratios to
// them are logged.
//
// RELAYD_SIP_STATE=1 gives relayd a [state] file (calls persisted);
// RELAYD_SIP_CONTROL_PROCS=N sets dataplane.control_procs,
// RELAYD_SIP_WAIT_TIMER=D sip.wait_timer;
// RELAYD_SIP_PROFILE=DIR writes relayd's profiles there: heap.pprof
// (held calls, settled) and heap_up.pprof (as they are up), heap dumps
// beside them (heap.dump, heap_up.dump; the test logs, per object size,
// how much of the pages holding live objects is not theirs: where
// HeapInuse exceeds the live heap), cpu_held.pprof (while they are held),
// cpu.pprof and allocs_{before,after}.pprof
// (around the CPS run: go tool pprof -base allocs_before.pprof
// allocs_after.pprof), and heap_end.pprof (as SIPp ends: what the ended
// calls' transactions keep, by where it was allocated).
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
	profDir := os.Getenv("RELAYD_SIP_PROFILE")
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
	if os.Getenv("RELAYD_SIP_STATE") != "" {
		extra += fmt.Sprintf("[state]\npath = %q\n", filepath.Join(dir, "state.db"))
	}
	// How long ended transactions stay (sip.wait_timer: Timer D and J):
	// what relayd still holds as SIPp ends.
	wait := 32 * time.Second
	if w := os.Getenv("RELAYD_SIP_WAIT_TIMER"); w != "" {
		extra = strings.Replace(extra, "[sip]\n", fmt.Sprintf("[sip]\nwait_timer = %q\n", w), 1)
		if d, err := time.ParseDuration(w); err == nil {
			wait = d
		}
	}
	// Held calls carry no media: the media timeout must outlast them.
	controlProcs, _ := strconv.Atoi(os.Getenv("RELAYD_SIP_CONTROL_PROCS"))
	r, err := New(l, Options{Dir: dir, ExtraMedia: extra, Ports: "20000-59999", LogLevel: "warn", Timeout: "300s", Profile: true,
		ControlProcs: controlProcs})
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
	go runSIPp(t, ctx, l.Callee, scenarioArgs(t, "uas_bench.xml", nil, "-i", uas, "-p", "5060", "-max_socket", "60000")...)
	time.Sleep(500 * time.Millisecond)

	heap0 := heapAfterGC(t, r)
	goroutines0, _ := r.Metric("go_goroutines")
	// Hold calls: placed at 500 per second, held long enough to measure
	// them once their setup's transactions have ended (64*T1 = 32 s after
	// the last one).
	const settle = 35 * time.Second
	placing := time.Duration(hold/500+1) * time.Second
	holdFor := placing + settle + 20*time.Second
	holdCtx, stopHold := context.WithTimeout(ctx, 5*time.Minute)
	defer stopHold()
	done := make(chan struct{})
	var holdOut string
	holdStart := time.Now()
	go func() {
		defer close(done)
		_, holdOut = runSIPp(t, holdCtx, l.Caller, l.RelayMedia4.String()+":5060", "-sn", "uac", "-s", "100", "-i", l.CallerAddr4.String(), "-p", "5082",
			"-r", "500", "-m", strconv.Itoa(hold), "-d", strconv.Itoa(int(holdFor.Milliseconds())), "-l", strconv.Itoa(hold),
			"-max_socket", "60000", "-recv_timeout", "10000")
	}()
	active := waitActive(t, r, hold, 40*time.Second)
	up := time.Now()
	heap1 := heapAfterGC(t, r)
	if profDir != "" {
		writeProfile(t, r, profDir, "heap_up.pprof", "heap")
		logSizeClasses(t, r, filepath.Join(profDir, "heap_up.dump"), hold)
	}
	// What the held calls cost while nothing happens to them (sweeps,
	// timers), from when the last was set up.
	time.Sleep(time.Until(holdStart.Add(placing + 2*time.Second)))
	idleFrom, idleCPU := time.Now(), procCPU(t, r.Pid())
	if profDir != "" {
		writeProfile(t, r, profDir, "cpu_held.pprof", fmt.Sprintf("profile?seconds=%d", int(time.Until(up.Add(settle)).Seconds())))
	}
	time.Sleep(time.Until(up.Add(settle)))
	idleCPU = procCPU(t, r.Pid()) - idleCPU
	idleFor := time.Since(idleFrom)
	settled, _ := r.Metric("relayd_calls_active")
	heap2 := heapAfterGC(t, r)
	goroutines, _ := r.Metric("go_goroutines")
	flows, _ := r.Metric(`relayd_flows{path="xdp"}`)
	rss := procRSS(t, r.Pid())
	if profDir != "" {
		writeProfile(t, r, profDir, "heap.pprof", "heap")
		logSizeClasses(t, r, filepath.Join(profDir, "heap.dump"), hold)
	}
	perCall := func(h heap, n float64) (inuse, live float64) {
		return (h.inuse - heap0.inuse) / 1024 / max(n, 1), (h.live - heap0.live) / 1024 / max(n, 1)
	}
	in1, live1 := perCall(heap1, active)
	in2, live2 := perCall(heap2, settled)
	t.Logf("held %.0f calls (want %d; up after %.1fs): HeapInuse after GC %.1f MiB idle -> %.1f MiB = %.1f KiB per call (live %.1f KiB); "+
		"settled (%.0fs later, %.0f calls): %.1f MiB = %.1f KiB per held call (live %.1f KiB); RSS %.1f MiB; goroutines %.0f -> %.0f; "+
		"XDP flows (static and call) %.0f; relayd CPU while they are held: %.0f%% of one core",
		active, hold, up.Sub(holdStart).Seconds(), heap0.inuse/(1<<20), heap1.inuse/(1<<20), in1, live1,
		settle.Seconds(), settled, heap2.inuse/(1<<20), in2, live2, float64(rss)/(1<<20), goroutines0, goroutines, flows,
		100*idleCPU.Seconds()/idleFor.Seconds())
	if int(active) < hold {
		t.Logf("sipp (hold):\n%s", holdOut)
	}
	if settled < float64(hold) {
		// Nothing ends a held call before SIPp's BYEs: say what relayd
		// logged (warnings and errors).
		log := r.Log()
		t.Logf("%.0f held calls ended early; relayd's log (%d bytes, the last 4 KiB):\n%s", float64(hold)-settled, len(log), log[max(0, len(log)-4096):])
		// Their CDRs say why (the log's level is warn).
		cdrs, _ := os.ReadFile(filepath.Join(dir, "cdr.jsonl"))
		t.Logf("CDRs so far (the first 4 KiB):\n%s", cdrs[:min(len(cdrs), 4096)])
	}
	// The held calls end with SIPp's BYEs before the CPS run.
	<-done
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(time.Second) {
		if a, _ := r.Metric("relayd_calls_active"); a == 0 {
			break
		}
	}
	if a, _ := r.Metric("relayd_calls_active"); a != 0 {
		t.Fatalf("%.0f held calls still up before the CPS run", a)
	}

	secs, _ := strconv.Atoi(os.Getenv("RELAYD_SIP_SECS"))
	if secs <= 2 {
		secs = 10
	}
	var profiling sync.WaitGroup
	if profDir != "" {
		writeProfile(t, r, profDir, "allocs_before.pprof", "allocs")
		profiling.Go(func() { writeProfile(t, r, profDir, "cpu.pprof", fmt.Sprintf("profile?seconds=%d", secs-2)) })
	}
	flowsLeft, _ := r.Metric(`relayd_flows{path="xdp"}`)
	procsBefore, _ := r.Metric("relayd_control_procs")
	state0 := stateWrites(r)
	alloc0, _ := r.Metric("go_memstats_alloc_bytes_total")
	gc0, _ := r.Metric("go_gc_duration_seconds_count")
	switches0 := procSwitches(r.Pid())
	cpuBefore := procCPU(t, r.Pid())
	// cpsRun offers the CPS load to whatever listens on the relay's SIP
	// address, from SIPp's local port port.
	cpsRun := func(port int) (st map[string]string, out string, took time.Duration) {
		start := time.Now()
		st, out = runSIPp(t, ctx, l.Caller, scenarioArgs(t, "uac_bench.xml", nil, l.RelayMedia4.String()+":5060", "-s", "100", "-i", l.CallerAddr4.String(), "-p", strconv.Itoa(port),
			"-r", strconv.Itoa(cps), "-m", strconv.Itoa(cps*secs), "-d", "0", "-l", strconv.Itoa(cps*4), "-recv_timeout", "10000")...)
		return st, out, time.Since(start)
	}
	st, out, took := cpsRun(5080)
	cpu := procCPU(t, r.Pid()) - cpuBefore
	switches := procSwitches(r.Pid()) - switches0
	alloc, _ := r.Metric("go_memstats_alloc_bytes_total")
	gcs, _ := r.Metric("go_gc_duration_seconds_count")
	procsAfter, _ := r.Metric("relayd_control_procs")
	// What the last wait_timer of calls still hold (their ended
	// transactions), as SIPp ends.
	rssEnd := procRSS(t, r.Pid())
	inuseEnd, liveEnd, heapErr := r.HeapAfterGC()
	if profDir != "" {
		writeProfile(t, r, profDir, "heap_end.pprof", "heap")
	}
	if st == nil {
		t.Fatalf("sipp: %s", out)
	}
	profiling.Wait()
	if profDir != "" {
		writeProfile(t, r, profDir, "allocs_after.pprof", "allocs")
	}
	ok, _ := strconv.Atoi(st["SuccessfulCall(C)"])
	failed, _ := strconv.Atoi(st["FailedCall(C)"])
	t.Logf("CPS with 2 failed attempts per call: %d calls ok, %d failed in %.1fs = %.0f CPS (asked %d); relayd CPU %.1fs = %.0f%% of one core, %.0f us per call (XDP flows before: %.0f; control plane's Ps %.0f before, %.0f after)",
		ok, failed, took.Seconds(), float64(ok)/took.Seconds(), cps, cpu.Seconds(), 100*cpu.Seconds()/took.Seconds(), cpu.Seconds()*1e6/float64(max(ok, 1)), flowsLeft,
		procsBefore, procsAfter)
	// What the CPU went to, per call: the bytes the Go runtime allocated
	// (the collector's work follows them), its collections, and the
	// context switches of relayd's threads (in a VM each costs several
	// microseconds of the thread's CPU time).
	calls := float64(max(ok, 1))
	t.Logf("per call: %.1f KiB allocated, %.4f collections (%.0f in all), %.1f context switches",
		(alloc-alloc0)/1024/calls, (gcs-gc0)/calls, gcs-gc0, float64(switches)/calls)
	if heapErr == nil {
		t.Logf("as SIPp ended (the transactions of the last %s of calls still kept): RSS %.0f MiB, HeapInuse after GC %.0f MiB (live %.0f MiB)",
			min(took, wait).Round(time.Second), float64(rssEnd)/(1<<20), inuseEnd/(1<<20), liveEnd/(1<<20))
	}
	if state0 != nil {
		d := stateWrites(r)
		for k := range d {
			d[k] -= state0[k]
		}
		t.Logf("state file per call: %.2f puts (%.0f bytes each), %.2f deletes, %.2f commits, %.0f us writing and syncing pages; a write waited %.2f ms on average",
			d["put"]/calls, d["bytes"]/max(d["put"], 1), d["delete"]/calls, d["commits"]/calls, d["disk"]*1e6/calls,
			1e3*d["wait"]/max(d["put"]+d["delete"], 1))
	}
	if os.Getenv("RELAYD_SIP_YARDSTICK") != "0" {
		r.Close() // its SIP address and media ports go to the yardstick
		sipYardstick(t, l, uas, cps*secs, cpu.Seconds()*1e6/float64(max(ok, 1)), cpsRun)
	}

	cancel()
}

// sipYardstick runs cpsRun through Kamailio with rtpengine, then through
// Kamailio alone, each listening on the relay's SIP address with the
// bench's three destinations in the same order, and logs their CPU per
// call beside relayd's (relayd, µs per call); it fails when fewer than
// 99% of the offered calls were answered. Kamailio logs errors only
// and rtpengine warnings, as relayd logs warnings.
func sipYardstick(t *testing.T, l *lab.Lab, uas string, offered int, relayd float64,
	cpsRun func(port int) (map[string]string, string, time.Duration)) {
	t.Helper()
	if err := kamailio.Available("", ""); err != nil {
		lab.SkipOrFail(t, fmt.Sprintf("yardstick: %v (RELAYD_SIP_YARDSTICK=0 runs without it)", err))
	}
	dest := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(uas), port) }
	perCall := make(map[bool]float64)
	for i, media := range []bool{true, false} {
		o := kamailio.Options{
			Destination: dest(5062), Fallbacks: []netip.AddrPort{dest(5064), dest(5060)},
			NoMedia: !media, Children: 2, Debug: -1, SharedMemoryMB: 512, Dir: t.TempDir(),
		}
		var e *rtpengine.Engine
		if media {
			e = rtpengine.StartT(t, l, rtpengine.Options{Threads: 1, PortMin: 20000, PortMax: 59999, LogLevel: 4})
			o.RTPEngines = []kamailio.Node{{Addr: rtpengine.DefaultNGAddr}}
		}
		k := kamailio.StartT(t, l, nil, o)
		cpu0, err := k.CPU()
		if err != nil {
			t.Fatal(err)
		}
		var ecpu0 time.Duration
		if e != nil {
			ecpu0 = procCPU(t, e.Pid())
		}
		st, out, took := cpsRun(5084 + 2*i)
		if st == nil {
			t.Fatalf("sipp through kamailio: %s", out)
		}
		cpu1, err := k.CPU()
		if err != nil {
			t.Fatal(err)
		}
		ok, _ := strconv.Atoi(st["SuccessfulCall(C)"])
		failed, _ := strconv.Atoi(st["FailedCall(C)"])
		calls := float64(max(ok, 1))
		kus := (cpu1 - cpu0).Seconds() * 1e6 / calls
		if media {
			eus := (procCPU(t, e.Pid()) - ecpu0).Seconds() * 1e6 / calls
			perCall[media] = kus + eus
			t.Logf("yardstick, Kamailio with rtpengine: %d calls ok, %d failed in %.1fs = %.0f CPS; Kamailio %.0f us + rtpengine %.0f us = %.0f us per call",
				ok, failed, took.Seconds(), float64(ok)/took.Seconds(), kus, eus, kus+eus)
		} else {
			perCall[media] = kus
			t.Logf("yardstick, Kamailio alone (no media): %d calls ok, %d failed in %.1fs = %.0f CPS; %.0f us per call",
				ok, failed, took.Seconds(), float64(ok)/took.Seconds(), kus)
		}
		if failed > 0 {
			t.Logf("kamailio's log (the start):\n%s\nsipp:\n%s", k.Log()[:min(len(k.Log()), 3000)], tail([]byte(out)))
		}
		if ok < offered*99/100 {
			// A yardstick that dropped calls is no yardstick.
			t.Errorf("yardstick: %d of %d calls answered", ok, offered)
		}
		k.Close()
		if e != nil {
			e.Close()
		}
	}
	t.Logf("Ratios, same run: relayd / (Kamailio + rtpengine) %.2f, relayd / Kamailio alone %.2f (relayd %.0f us per call)",
		relayd/perCall[true], relayd/perCall[false], relayd)
}

// waitActive waits up to d for relayd to have 97% of want calls (SIPp's
// retransmission timeouts may lose a few) and returns how many it has.
func waitActive(t *testing.T, r *Relay, want int, d time.Duration) float64 {
	var active float64
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(time.Second) {
		a, err := r.Metric("relayd_calls_active")
		if err != nil {
			t.Logf("metrics: %v", err)
			continue
		}
		if active = a; active >= 0.97*float64(want) {
			break
		}
	}
	return active
}

// heap is relayd's heap right after a GC (Relay.HeapAfterGC).
type heap struct{ inuse, live float64 }

// heapReadings is how many times heapAfterGC forces a GC, heapSpacing
// apart: relayd's sweeps (media timeouts, rebinding: every 2 s) build a
// map of every flow's statistics, alive for the sweep's duration (a
// tenth of the time with 40,000 flows), which a single reading catches
// or not: 1-2 KiB per held call of noise.
const (
	heapReadings = 3
	heapSpacing  = 700 * time.Millisecond
)

// heapAfterGC returns the lowest HeapInuse and HeapAlloc of heapReadings
// readings right after a GC.
func heapAfterGC(t *testing.T, r *Relay) heap {
	var h heap
	for i := range heapReadings {
		if i > 0 {
			time.Sleep(heapSpacing)
		}
		inuse, live, err := r.HeapAfterGC()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 || inuse < h.inuse {
			h.inuse = inuse
		}
		if i == 0 || live < h.live {
			h.live = live
		}
	}
	return h
}

// writeProfile writes relayd's pprof profile name into dir/file.
func writeProfile(t *testing.T, r *Relay, dir, file, name string) {
	b, err := r.Profile(name)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, file), b, 0o644)
	}
	if err != nil {
		t.Errorf("profile %s: %v", name, err)
	}
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

// procSwitches is the context switches, voluntary and not, of pid's
// threads (those alive: relayd's Go threads do not exit).
func procSwitches(pid int) int64 {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	var n int64
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
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

// logSizeClasses logs, from a heap dump of relayd written to path, the
// object sizes whose pages hold the most beyond their live objects, per
// held call.
func logSizeClasses(t *testing.T, r *Relay, path string, calls int) {
	if err := r.HeapDump(path); err != nil {
		t.Fatal(err)
	}
	classes, err := SizeClasses(path)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	var live, waste int64
	for _, c := range classes {
		live += c.Live()
		waste += c.Waste()
	}
	fmt.Fprintf(&b, "heap dump %s: live %.1f MiB, their pages' waste %.1f MiB; per call, the most wasteful sizes:\n", filepath.Base(path), float64(live)/(1<<20), float64(waste)/(1<<20))
	for _, c := range classes[:min(len(classes), 20)] {
		fmt.Fprintf(&b, "  %6d B: %8d objects, live %7.0f B/call, pages %7.0f B/call, waste %7.0f B/call\n",
			c.Size, c.Objects, float64(c.Live())/float64(calls), float64(c.Pages*pageSize)/float64(calls), float64(c.Waste())/float64(calls))
	}
	t.Log(b.String())
}

// stateWrites reads relayd's state file counters; nil without a state
// file.
func stateWrites(r *Relay) map[string]float64 {
	m, err := r.Metrics()
	if err != nil {
		return nil
	}
	out := make(map[string]float64)
	for k, name := range map[string]string{
		"put": `relayd_state_writes_total{op="put"}`, "delete": `relayd_state_writes_total{op="delete"}`,
		"bytes": "relayd_state_record_bytes_total", "commits": "relayd_state_commits_total",
		"disk": "relayd_state_disk_write_seconds_total",
		"wait": `relayd_state_write_seconds_sum{op="put"}`, "waitDel": `relayd_state_write_seconds_sum{op="delete"}`,
	} {
		v, err := sample(m, name)
		if err != nil {
			return nil
		}
		out[k] = v
	}
	out["wait"] += out["waitDel"]
	return out
}
