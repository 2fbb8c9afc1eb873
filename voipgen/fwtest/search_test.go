package fwtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakePair is a firewall pair that forwards without loss up to limit pps
// and loses the excess above it; the sender reaches at most senderMax pps
// (0: any rate).
type fakePair struct {
	limit     int
	senderMax int
	// noise, if not nil, decides trials in [limit-band, limit]: true
	// passes.
	noise *rand.Rand
	band  int
	calls []int
}

func (p *fakePair) trial(_ context.Context, pps int) (TrialResult, error) {
	p.calls = append(p.calls, pps)
	achieved := pps
	if p.senderMax > 0 && achieved > p.senderMax {
		achieved = p.senderMax
	}
	const dur = 2 * time.Second
	sent := uint64(achieved) * 2
	r := TrialResult{Offered: uint64(pps) * 2, Sent: sent, OfferedPPS: float64(pps), AchievedPPS: float64(achieved), Duration: dur}
	switch {
	case achieved > p.limit:
		r.Lost = uint64(achieved-p.limit) * 2
	case p.noise != nil && achieved > p.limit-p.band:
		if p.noise.IntN(3) == 0 {
			r.Lost = 1
		}
	}
	r.Received = r.Sent - r.Lost
	return r, nil
}

func TestSearchStepLimit(t *testing.T) {
	for _, tc := range []struct {
		name           string
		cfg            SearchConfig
		limit          int
		wantAboveHi    bool
		wantBelowLo    bool
		wantFoundAtMin int // Found must be >= this
	}{
		{name: "thesis", cfg: SearchConfig{Lo: 10000, Hi: 500000, Resolution: 1000, Trials: 2}, limit: 125000},
		{name: "near hi", cfg: SearchConfig{Lo: 0, Hi: 200000, Resolution: 100}, limit: 199950},
		{name: "near lo", cfg: SearchConfig{Lo: 1000, Hi: 200000, Resolution: 100}, limit: 1050},
		{name: "above hi", cfg: SearchConfig{Lo: 1000, Hi: 100000, Resolution: 100}, limit: 150000, wantAboveHi: true},
		{name: "below lo", cfg: SearchConfig{Lo: 1000, Hi: 100000, Resolution: 100}, limit: 500, wantBelowLo: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakePair{limit: tc.limit}
			var progress []Step
			res, err := Search(context.Background(), tc.cfg, p.trial, func(s Step) { progress = append(progress, s) })
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(res.Steps, progress); diff != "" {
				t.Errorf("progress saw other steps than the result (-result +progress):\n%s", diff)
			}
			if res.AboveHi != tc.wantAboveHi || res.BelowLo != tc.wantBelowLo || res.SenderBound {
				t.Errorf("above hi %v below lo %v sender bound %v, want %v %v false", res.AboveHi, res.BelowLo, res.SenderBound, tc.wantAboveHi, tc.wantBelowLo)
			}
			switch {
			case tc.wantAboveHi:
				if res.Found != tc.cfg.Hi {
					t.Errorf("found %d, want hi %d", res.Found, tc.cfg.Hi)
				}
			case tc.wantBelowLo:
				if res.Found != 0 || res.Hi != tc.cfg.Lo {
					t.Errorf("found %d, bracket [%d, %d], want 0 and hi %d", res.Found, res.Lo, res.Hi, tc.cfg.Lo)
				}
			default:
				if res.Found > tc.limit || res.Found < tc.limit-tc.cfg.Resolution {
					t.Errorf("found %d, want within %d below %d", res.Found, tc.cfg.Resolution, tc.limit)
				}
				if res.Tolerance() > tc.cfg.Resolution || res.Lo != res.Found || res.Hi <= tc.limit {
					t.Errorf("bracket [%d, %d] does not hold the limit %d within %d", res.Lo, res.Hi, tc.limit, tc.cfg.Resolution)
				}
			}
			// Every step's outcome is the truth at its rate, and every
			// passing step ran all its trials.
			trials := max(tc.cfg.Trials, 1)
			for _, s := range res.Steps {
				want := Pass
				if s.PPS > tc.limit {
					want = Fail
				}
				if s.Outcome != want {
					t.Errorf("step %d at %d pps: %s, want %s", s.N, s.PPS, s.Outcome, want)
				}
				if s.Outcome == Pass && len(s.Trials) != trials {
					t.Errorf("step %d passed on %d trials, want %d", s.N, len(s.Trials), trials)
				}
				if s.Outcome == Fail && len(s.Trials) != 1 {
					t.Errorf("step %d failed but ran %d trials, want 1 (a failing trial ends the step)", s.N, len(s.Trials))
				}
			}
			if mid := tc.cfg.Lo + (tc.cfg.Hi-tc.cfg.Lo)/2; res.Steps[0].PPS != mid {
				t.Errorf("first step at %d pps, want the middle %d", res.Steps[0].PPS, mid)
			}
			if res.AtLeast != res.Found {
				t.Errorf("at least %d, want found %d", res.AtLeast, res.Found)
			}
		})
	}
}

func TestSearchNoisyLimit(t *testing.T) {
	// Near the limit a trial loses a packet one time in three: three
	// trials per step make the search settle below the noisy band or in
	// it, never above the limit.
	const limit, band, res = 125000, 3000, 500
	for seed := range uint64(20) {
		p := &fakePair{limit: limit, noise: rand.New(rand.NewPCG(seed, 1)), band: band}
		r, err := Search(context.Background(), SearchConfig{Lo: 1000, Hi: 400000, Resolution: res, Trials: 3}, p.trial, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Found > limit || r.Found < limit-band-res {
			t.Errorf("seed %d: found %d, want in [%d, %d]", seed, r.Found, limit-band-res, limit)
		}
		if r.Tolerance() > res {
			t.Errorf("seed %d: bracket [%d, %d] wider than %d", seed, r.Lo, r.Hi, res)
		}
	}
}

func TestSearchLossThreshold(t *testing.T) {
	// 1% loss allowed: the pair losing the excess over 100 kpps passes
	// up to 100000/0.99 = 101010 pps.
	p := &fakePair{limit: 100000}
	r, err := Search(context.Background(), SearchConfig{Lo: 1000, Hi: 200000, Resolution: 50, LossThreshold: 0.01}, p.trial, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := 101010; r.Found > want || r.Found < want-50 {
		t.Errorf("found %d, want within 50 below %d", r.Found, want)
	}
}

func TestSearchSenderBound(t *testing.T) {
	for _, tc := range []struct {
		name              string
		limit, senderMax  int
		wantFound, wantAt int
		wantHi            int
	}{
		// 100500 passes, 150250 the sender cannot offer, but what it did
		// send (110 kpps) the pair forwarded.
		{name: "after a pass", limit: 125000, senderMax: 110000, wantFound: 100500, wantAt: 110000, wantHi: 150250},
		{name: "first step", limit: 125000, senderMax: 400, wantFound: 0, wantAt: 400, wantHi: 100500},
		// The sender reached only 90 kpps and the pair lost some of it:
		// still no verdict on the pair, and no lower bound either.
		{name: "with loss", limit: 50000, senderMax: 90000, wantFound: 0, wantAt: 0, wantHi: 100500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakePair{limit: tc.limit, senderMax: tc.senderMax}
			r, err := Search(context.Background(), SearchConfig{Lo: 1000, Hi: 200000, Resolution: 100}, p.trial, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !r.SenderBound || r.SenderPPS != float64(tc.senderMax) {
				t.Fatalf("sender bound %v at %.0f pps, want true at %d", r.SenderBound, r.SenderPPS, tc.senderMax)
			}
			last := r.Steps[len(r.Steps)-1]
			if last.Outcome != SenderLimited || len(p.calls) != len(r.Steps) {
				t.Errorf("last step %s after %d trials in %d steps, want %s and the search stopped there", last.Outcome, len(p.calls), len(r.Steps), SenderLimited)
			}
			if r.Found != tc.wantFound || r.AtLeast != tc.wantAt || r.Hi != tc.wantHi {
				t.Errorf("found %d, at least %d, bracket [%d, %d]; want %d, %d, hi %d", r.Found, r.AtLeast, r.Lo, r.Hi, tc.wantFound, tc.wantAt, tc.wantHi)
			}
			if s := r.String(); !strings.Contains(s, "sender-bound") || !strings.HasPrefix(s, fmt.Sprintf(">= %d pps", tc.wantAt)) {
				t.Errorf("String %q does not say >= %d pps and sender-bound", s, tc.wantAt)
			}
		})
	}
}

// TestSearchBelowSender: with BelowSender the search goes on below a rate
// the sender cannot offer, to the highest rate the sender offered and the
// pair forwarded; it is sender-bound only when the sender, not the pair,
// set the top of the bracket.
func TestSearchBelowSender(t *testing.T) {
	for _, tc := range []struct {
		name             string
		limit, senderMax int
		wantSenderBound  bool
		want             int // the limit the search brackets
	}{
		{"sender below the pair", 125000, 45000, true, 45000},
		{"pair below the sender", 30000, 45000, false, 30000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakePair{limit: tc.limit, senderMax: tc.senderMax}
			cfg := SearchConfig{Lo: 1000, Hi: 200000, Resolution: 1000, BelowSender: true}
			r, err := Search(context.Background(), cfg, p.trial, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.SenderBound != tc.wantSenderBound {
				t.Errorf("sender-bound %v, want %v (%s)", r.SenderBound, tc.wantSenderBound, r)
			}
			// A trial passes when the sender came within the tolerance
			// (2%) of the rate.
			slack := int(DefaultSenderTolerance*float64(tc.want)) + 1
			if r.Found > tc.want+slack || tc.want-r.Found > cfg.Resolution || r.Hi-r.Lo > cfg.Resolution || r.AtLeast != r.Found {
				t.Errorf("found %d in [%d, %d], at least %d: want within %d below %d (+%d)", r.Found, r.Lo, r.Hi, r.AtLeast, cfg.Resolution, tc.want, slack)
			}
			if tc.wantSenderBound && !strings.Contains(r.String(), "could not offer") {
				t.Errorf("String %q does not say the sender could not offer the rate", r)
			}
		})
	}
}

func TestSearchCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	trial := func(ctx context.Context, pps int) (TrialResult, error) {
		n++
		if n == 4 {
			cancel()
		}
		if err := ctx.Err(); err != nil {
			return TrialResult{}, err
		}
		return TrialResult{Sent: 100, OfferedPPS: float64(pps), AchievedPPS: float64(pps)}, nil
	}
	r, err := Search(ctx, SearchConfig{Lo: 1, Hi: 1 << 20, Resolution: 1, Trials: 2}, trial, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if n != 4 {
		t.Errorf("%d trials ran, want 4 (none after the cancel)", n)
	}
	if len(r.Steps) != 2 {
		t.Errorf("%d steps kept, want 2 (one whole, one with the trial before the cancel)", len(r.Steps))
	}
}

func TestSearchTrialError(t *testing.T) {
	boom := errors.New("boom")
	_, err := Search(context.Background(), SearchConfig{Lo: 1, Hi: 100, Resolution: 1},
		func(context.Context, int) (TrialResult, error) { return TrialResult{}, boom }, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want it to wrap %v", err, boom)
	}
}

func TestSearchConfigInvalid(t *testing.T) {
	for _, cfg := range []SearchConfig{
		{},
		{Lo: -1, Hi: 10, Resolution: 1},
		{Lo: 10, Hi: 10, Resolution: 1},
		{Lo: 1, Hi: 10, Resolution: 0},
		{Lo: 1, Hi: 10, Resolution: 1, Trials: -1},
		{Lo: 1, Hi: 10, Resolution: 1, LossThreshold: 1},
		{Lo: 1, Hi: 10, Resolution: 1, SenderTolerance: -0.1},
	} {
		called := false
		_, err := Search(context.Background(), cfg, func(context.Context, int) (TrialResult, error) {
			called = true
			return TrialResult{}, nil
		}, nil)
		if err == nil || called {
			t.Errorf("%+v: err %v, trial called %v; want an error and no trial", cfg, err, called)
		}
	}
}

func TestCalls(t *testing.T) {
	for _, tc := range []struct {
		pps        float64
		ptime      time.Duration
		directions int
		want       int
	}{
		{100, 20 * time.Millisecond, 2, 1},
		{125000, 20 * time.Millisecond, 2, 1250},
		{125000, 20 * time.Millisecond, 1, 2500},
		{125000, 30 * time.Millisecond, 2, 1875},
		{199, 20 * time.Millisecond, 2, 1},
		{125000, 0, 2, 0},
		{125000, 20 * time.Millisecond, 0, 0},
	} {
		if got := Calls(tc.pps, tc.ptime, tc.directions); got != tc.want {
			t.Errorf("Calls(%v, %v, %d) = %d, want %d", tc.pps, tc.ptime, tc.directions, got, tc.want)
		}
	}
	if got := Mbps(125000, 200); got != 200 {
		t.Errorf("Mbps(125000, 200) = %v, want 200", got)
	}
}
