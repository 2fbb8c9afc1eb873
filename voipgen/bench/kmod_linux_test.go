package bench

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestKernelModuleBench is the functional side by side of voipgen
// kmodbench (set RELAYD_KMOD_BENCH=1; not part of make test: it builds
// rtpengine's kernel module for Debian's 6.1 and boots that kernel under
// qemu, about two minutes under TCG). The same five ng calls through
// rtpengine's kernel module and through relayd's XDP, and routed by the
// kernel for reference: every packet arrives, rtpengine kernelized the
// streams and its kernel table counted every measured packet, relayd's XDP
// forwarded every one of them and its userspace none.
func TestKernelModuleBench(t *testing.T) {
	if os.Getenv("RELAYD_KMOD_BENCH") == "" {
		t.Skip("set RELAYD_KMOD_BENCH=1 to build rtpengine's kernel module and run it against relayd's XDP in Debian's 6.1 under qemu")
	}
	cfg, err := ParseKmod([]string{"--vm", "--calls", "5", "--duration", "3s", "--repeat", "1"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Progress = testWriter{t}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	rep, err := Kmod(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rep.Runs {
		seen[r.Relay] = true
		want := uint64(2*cfg.Calls) * uint64((cfg.Warmup+cfg.Duration)/(20*time.Millisecond))
		if r.Error != "" || r.SentAll != want || r.Received != want || r.Lost != 0 || r.SendErrors != 0 {
			t.Errorf("%s: %d of %d sent, %d received, %d lost, %d send errors, error %q", r.Relay, r.SentAll, want, r.Received, r.Lost, r.SendErrors, r.Error)
		}
		switch r.Relay {
		case kmodRtpengine:
			if r.Kernelized < 2*cfg.Calls || r.Relayed != int64(r.Sent) || r.RelayErrors != 0 {
				t.Errorf("rtpengine: %d streams kernelized (want %d), its kernel table forwarded %d of the %d measured packets, %d errors",
					r.Kernelized, 2*cfg.Calls, r.Relayed, r.Sent, r.RelayErrors)
			}
		case kmodXDP:
			if r.Relayed != int64(r.Sent) || r.RelayedUserspace != 0 || r.RelayErrors != 0 {
				t.Errorf("relayd: forwarded %d of the %d measured packets, %d in userspace, %d drops", r.Relayed, r.Sent, r.RelayedUserspace, r.RelayErrors)
			}
		}
	}
	for _, name := range cfg.Relays {
		if !seen[name] {
			t.Errorf("no run of %s", name)
		}
	}
}
