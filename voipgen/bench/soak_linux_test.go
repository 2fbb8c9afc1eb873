package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/lab/labrelay"
)

// TestSoakLab is voipgen soak's short version: 100 calls for 50 s with
// the full run's background, through the same code. It must pass as the
// full run must, but for the heap: 46 s after a baseline at 34 s (the
// stranger's refused INVITEs stop piling up after 32 s, SIP's Timer H)
// hold two or three GCs per 15-s window (relayd collects about every 7 s
// here; 16 s left windows of 5 s, some without a GC), whose live heap swings by half from
// one GC to the next at this size; the test asks only that it did not
// grow by half (a gross leak), the full run asks 5% over minutes. It also
// checks that the attacks happened as configured and were seen by relayd.
func TestSoakLab(t *testing.T) {
	testenv.NeedRoot(t)
	if testing.Short() {
		t.Skip("builds relayd and a lab, runs 80 s: skipped with -short")
	}
	bin, err := labrelay.Build()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseSoak([]string{"--calls", "100", "--duration", "80s", "--baseline", "34s", "--sample", "1s", "--chunk", "5s",
		"--heap-tolerance", "0.5", "--relayd", bin}, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Progress = testWriter{t}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := runSoakLab(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.WriteText(&out)
	t.Logf("report:\n%s", out.String())
	if !rep.Pass {
		t.Errorf("soak failed: %q", rep.Problems)
	}
	secs := rep.ElapsedS
	for _, d := range rep.Media {
		// 100 streams of 50 pps each way.
		if want := 0.9 * 100 * 50 * secs; float64(d.Sent) < want {
			t.Errorf("%s: %d packets sent in %.0f s, want at least %.0f", d.Name, d.Sent, secs, want)
		}
	}
	a := rep.Attack
	if float64(a.sent()) < 0.8*float64(cfg.AttackPPS)*secs || a.RTPAllocated == 0 || a.RTPRandom == 0 || a.GarbageAllocated == 0 || a.GarbageRandom == 0 {
		t.Errorf("spoofed media: %+v", a)
	}
	// XDP dropped what came to the calls' ports from forged sources.
	if a.RelaydDrops["wrong_source"] < a.RTPAllocated/2 {
		t.Errorf("relayd dropped %d packets as from a wrong source, %d spoofed RTP packets went to the calls' ports", a.RelaydDrops["wrong_source"], a.RTPAllocated)
	}
	s := rep.SIP
	if float64(s.Invites) < 0.8*float64(cfg.InviteRate)*secs || float64(s.Garbage) < 0.8*float64(cfg.SIPGarbageRate)*secs {
		t.Errorf("the stranger sent %d INVITEs and %d malformed datagrams in %.0f s", s.Invites, s.Garbage, secs)
	}
	// Every INVITE of the stranger was refused for its source, and only
	// that.
	if s.InvitesAnswered != int(s.Invites) || len(s.InviteAnswers) != 1 || s.InviteAnswers["403"] < s.Invites || s.RelaydRefused["source"] < float64(s.Invites) {
		t.Errorf("the stranger's INVITEs: %d sent, %d answered, answers %v, relayd refused %v", s.Invites, s.InvitesAnswered, s.InviteAnswers, s.RelaydRefused)
	}
	if s.RelaydMalformed < float64(s.Garbage)/2 || s.GarbageAnswers["400"] == 0 || s.TortureMessages < 49 {
		t.Errorf("malformed SIP: %d sent, relayd counted %.0f malformed, answers %v", s.Garbage, s.RelaydMalformed, s.GarbageAnswers)
	}
	if rep.Heap.BaseN == 0 || rep.Heap.EndN == 0 || rep.Gorout.BaseN < 5 || rep.Gorout.EndN < 5 {
		t.Errorf("windows: heap %+v, goroutines %+v", rep.Heap, rep.Gorout)
	}
	if rep.Calls.HungUp != 100 {
		t.Errorf("%d of 100 calls hung up with a BYE at the end (%s)", rep.Calls.HungUp, rep.Calls.Failures)
	}
}
