package kamailio

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// BenchmarkCalls: the same SIPp load through Kamailio in front of
// rtpengine and in front of relayd, in one run: b.N calls offered at
// KAMAILIO_BENCH_RATE calls per second (default 50), each with
// KAMAILIO_BENCH_AUDIO of audio (default 10s) that the callee echoes, and
// as long a hold. Reported: completed calls per
// second (completed calls over the time from the first INVITE to the last
// BYE's answer), failed calls, the relay process's CPU time per call and
// the whole machine's (SIPp and Kamailio, the same in both runs, and the
// softirq time where XDP forwards, included).
//
//	go test -run '^$' -bench Calls -benchtime 300x -count 3 ./lab/kamailio/
func BenchmarkCalls(b *testing.B) {
	rate, audio := 50, 10*time.Second
	if v, err := strconv.Atoi(os.Getenv("KAMAILIO_BENCH_RATE")); err == nil && v > 0 {
		rate = v
	}
	if v, err := time.ParseDuration(os.Getenv("KAMAILIO_BENCH_AUDIO")); err == nil && v > 0 {
		audio = v
	}
	for _, k := range relayKinds {
		b.Run(k.name, func(b *testing.B) {
			l := lab.NewT(b)
			spec := relayA(l)
			spec.PortMax = 39999 // 5,000 pairs: the load, not the range, is the limit
			r := k.start(b, l, spec)
			p := newProxy(b, l, Options{Children: 4}, []mediaRelay{r})
			p.wav = pcmuWAV(b, audio)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			c := call{n: b.N, rate: rate, hold: audio, cidTag: "bench"}
			wait := p.runUAS(b, ctx, c.n, p.uasBody(c))
			b.ResetTimer()
			start := time.Now()
			cpu0, busy0 := procCPU(b, r.Pid()), machineBusy(b)
			uac := p.runUAC(b, ctx, c)
			elapsed := time.Since(start)
			cpu1, busy1 := procCPU(b, r.Pid()), machineBusy(b)
			b.StopTimer()
			wait()
			ok, _ := strconv.Atoi(uac.Stats["SuccessfulCall(C)"])
			failed, _ := strconv.Atoi(uac.Stats["FailedCall(C)"])
			b.ReportMetric(float64(ok)/elapsed.Seconds(), "calls/s")
			b.ReportMetric(float64(failed), "failed")
			if ok > 0 {
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(ok)/1e3, "relay-cpu-ms/call")
				b.ReportMetric(float64((busy1-busy0).Microseconds())/float64(ok)/1e3, "machine-cpu-ms/call")
			}
			b.ReportMetric(0, "ns/op")
			if failed > 0 {
				b.Logf("%d calls failed; the proxy's rtpengine messages:\n%s", failed, tail(strings.Join(p.k.Lines("rtpengine ["), "\n"), 10))
			}
		})
	}
}

// clockTick is USER_HZ, the unit of /proc's CPU times.
const clockTick = 10 * time.Millisecond

// procCPU returns the user and system CPU time of a process.
func procCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name (in parentheses, may hold spaces):
	// utime and stime are the 12th and 13th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * clockTick
}

// machineBusy returns the CPU time all CPUs spent not idle (softirq, where
// XDP runs, included).
func machineBusy(tb testing.TB) time.Duration {
	tb.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var busy int64
	for i, v := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return time.Duration(busy) * clockTick
}
