package bench

import (
	"context"
	"encoding/binary"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/lab/labrelay"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// TestBenchTranscode runs the transcode mode at a tiny scale (one step of
// 10 calls, through relayd and rtpengine) and checks that both relays
// transcoded every packet both ways (G.729 to the callee, PCMU to the
// caller, as the sink counted them), that nothing was lost, and that the
// figures the comparison publishes are there and positive. It needs root,
// bcg729 (cgo) and rtpengine-daemon: without them it skips, and fails in CI.
func TestBenchTranscode(t *testing.T) {
	testenv.NeedRoot(t)
	if testing.Short() {
		t.Skip("builds relayd and a lab: skipped with -short")
	}
	if !g729.Available {
		testenv.Skip(t, "voipgen built without bcg729 (cgo and libbcg729-dev)")
	}
	testenv.NeedCommand(t, "rtpengine", "rtpengine-daemon")
	bin := os.Getenv("BENCH_RELAYD")
	if bin == "" {
		var err error
		if bin, err = labrelay.Build(); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	cfg, err := Parse([]string{"--modes", "transcode", "--with-rtpengine", "--transcode-calls", "10", "--step", "1s",
		"--sip-calls", "0", "--quiet-wait", "5s", "--relayd", bin, "--out", dir}, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Progress = testWriter{t}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := runBenchLab(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteOutputs(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range rep.Runs {
				t.Logf("run %s/%s: sent %d, received %d, streams short %d, transcoded %d+%d", r.Phase, r.Mode, r.Sent, r.Received,
					r.StreamsShort, r.TranscodedToCallee, r.TranscodedToCaller)
			}
		}
	})
	if len(rep.Rows) != 2 || rep.Rows[0].Relay != transcodeRelayd || rep.Rows[1].Relay != transcodeRtpengine {
		t.Fatalf("rows %+v", rep.Rows)
	}
	for _, r := range rep.Rows {
		// A relay may add packets of its own after a pause in its input
		// (the time between two runs: comfort noise, concealment), at
		// most 120 ms per stream and run.
		extra := uint64(2 * 2 * r.Flows * 6)
		if r.Calls != 10 || r.Media != benchMediaNGTranscode || r.Sent == 0 || r.Received < r.Sent || r.Received > r.Sent+extra {
			t.Errorf("row %+v", r)
		}
		// Half the packets go each way, and each arrived transcoded: the
		// sink classifies every packet of a run and fails it on one in
		// the wrong format, and a run's received count is what it
		// classified.
		if r.TranscodedToCallee < r.Sent/2 || r.TranscodedToCaller < r.Sent/2 {
			t.Errorf("%s: %d packets sent, %d received, %d arrived as G.729 at the callee and %d as PCMU at the caller, want %d each",
				r.Relay, r.Sent, r.Received, r.TranscodedToCallee, r.TranscodedToCaller, r.Sent/2)
		}
		if !r.Comparable || r.TaskNsPerPkt <= 0 {
			t.Errorf("%s: comparable %v, %.0f ns per packet (tasks)", r.Relay, r.Comparable, r.TaskNsPerPkt)
		}
	}
	x := rep.Transcode
	if x == nil {
		t.Fatal("no transcode figures")
	}
	b := x.Bcg729
	// Timed before and after the relays and after each of their runs,
	// hot and over one encoder and decoder per call of the step.
	if b.EncodeNsPerFrame <= 0 || b.DecodeNsPerFrame <= 0 || b.Timings != 2*bcg729EdgeReps+bcg729RunReps*len(rep.Runs) || b.MinNsPerFramePair <= 0 ||
		b.MaxNsPerFramePair < b.MinNsPerFramePair || b.PhysicalCallsPerCore <= 0 || b.Contexts != 10 ||
		b.ContextsEncodeNsPerFrame <= 0 || b.ContextsDecodeNsPerFrame <= 0 || b.ContextsMaxNsPerPair < b.ContextsMinNsPerPair ||
		b.ContextsCallsPerCore <= 0 || b.ContextsOverHot <= 0 {
		t.Errorf("bcg729 %+v (%d runs)", b, len(rep.Runs))
	}
	if want := 100 * (b.EncodeNsPerFrame + b.DecodeNsPerFrame); b.NsPerCallSecond != want {
		t.Errorf("bcg729 %.0f ns per call second, want 100 encoded + 100 decoded frames = %.0f", b.NsPerCallSecond, want)
	}
	if len(x.Relays) != 2 {
		t.Fatalf("transcode relays %+v", x.Relays)
	}
	for _, r := range x.Relays {
		// A relay that transcodes costs more than bcg729 alone.
		if r.Steps != 1 || r.CPUNsPerCallSecond <= b.NsPerCallSecond || r.OverheadNsPerCallSecond <= 0 || r.CallsPerCore <= 0 ||
			r.OfPhysicalLimit <= 0 || r.OfPhysicalLimit >= 1 || r.OfContextsLimit <= 0 || r.CallsPerGHz <= 0 || r.MaxZeroLoss != 10 {
			t.Errorf("transcode figures %+v (bcg729 %.0f ns per call second)", r, b.NsPerCallSecond)
		}
	}
	if x.OverheadRatio <= 0 || len(x.Checks) != 3 {
		t.Errorf("overhead ratio %v, checks %+v", x.OverheadRatio, x.Checks)
	}
	var text strings.Builder
	rep.WriteText(&text)
	for _, want := range []string{"bcg729 in-process", "relayd overhead / rtpengine overhead", "transcode / rtpengine-transcode"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, text.String())
		}
	}
	checkBenchOutputs(t, dir, rep)
}

// TestSinkTranscodeCheck: the sink counts a transcode run's packets by
// the relay port they came from and fails the run when one is not in the
// format its leg asked for, or comes from no call's port.
func TestSinkTranscodeCheck(t *testing.T) {
	ports := make([]int32, 1<<16)
	for i := range ports {
		ports[i] = -1
	}
	ports[30000], ports[30002] = 0, 1
	sink := &fwdSink{perSSRC: make([]atomic.Uint64, 2)}
	pkt := func(port uint16, pt uint8, n int) ([2048]byte, mmsghdr, unix.RawSockaddrInet4) {
		var b [2048]byte
		b[0], b[1] = 0x80, pt
		var name unix.RawSockaddrInet4
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&name.Port))[:], port)
		return b, mmsghdr{n: uint32(n)}, name
	}
	batch := func(x *fwdExpect, side int, ps ...[3]int) {
		var bufs [][2048]byte
		var hdrs []mmsghdr
		var names []unix.RawSockaddrInet4
		for _, p := range ps {
			b, h, n := pkt(uint16(p[0]), uint8(p[1]), p[2])
			bufs, hdrs, names = append(bufs, b), append(hdrs, h), append(names, n)
		}
		sink.countTranscoded(x, side, bufs, hdrs, names)
	}
	good := &fwdExpect{tag: 3, ports: ports}
	batch(good, 0, [3]int{30000, 18, 32}, [3]int{30000, 18, 32})
	batch(good, 1, [3]int{30002, 0, 172})
	if err := good.check(); err != nil {
		t.Errorf("transcoded run: %v", err)
	}
	if good.ok[0].Load() != 2 || good.ok[1].Load() != 1 || sink.runs[3].Load() != 3 || sink.perSSRC[0].Load() != 2 || sink.perSSRC[1].Load() != 1 {
		t.Errorf("counts: ok %d/%d, run %d, streams %d/%d", good.ok[0].Load(), good.ok[1].Load(), sink.runs[3].Load(),
			sink.perSSRC[0].Load(), sink.perSSRC[1].Load())
	}
	for _, tc := range []struct {
		name string
		side int
		pkt  [3]int
		want string
	}{
		{"PCMU passed through to the callee", 0, [3]int{30000, 0, 172}, "not PT 18 of 32 bytes (the last: PT 0, 172 bytes)"},
		{"G.729 passed through to the caller", 1, [3]int{30002, 18, 32}, "not PT 0 of 172 bytes (the last: PT 18, 32 bytes)"},
		{"G.729 of 10 ms", 0, [3]int{30000, 18, 22}, "PT 18, 22 bytes"},
		{"unknown port", 0, [3]int{31000, 18, 32}, "from a port that is no call's"},
	} {
		x := &fwdExpect{tag: 4, ports: ports}
		batch(x, tc.side, tc.pkt)
		if err := x.check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
