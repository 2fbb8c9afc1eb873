// Package fwtest is the part of the firewall-pair experiment that needs no
// network: the RFC 2544 style search for the highest rate a pair forwards
// without loss (Search), the analysis of what the receivers recorded around
// a failover (Analyze), and the report that puts the measured figures beside
// the reference ones (Report). `voipgen fwtest` runs the trials and the
// failures and hands their results here.
//
// Nothing in the package is per packet, and it has no Linux-only code. Its
// functions keep no state and may run concurrently; its types are plain
// values, safe to read from several goroutines, not to change while read.
package fwtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// TrialResult is what one trial at one offered rate measured. The trial
// fills it from the sender's and the receiver's counters; Search reads Sent,
// Lost, OfferedPPS and AchievedPPS.
type TrialResult struct {
	Offered    uint64  `json:"offered"`    // packets the sender was asked to send
	Sent       uint64  `json:"sent"`       // packets it sent
	Received   uint64  `json:"received"`   // packets the receiver counted (duplicates included)
	Lost       uint64  `json:"lost"`       // sent but never received, by sequence
	Duplicated uint64  `json:"duplicated"` // extra copies received
	OfferedPPS float64 `json:"offered_pps"`
	// AchievedPPS is the rate the sender really sent at; well below
	// OfferedPPS means the sender, not the pair, was the limit.
	AchievedPPS float64       `json:"achieved_pps"`
	Duration    time.Duration `json:"duration_ns"`
}

// LossFraction is Lost over Sent (over Offered when Sent is unknown), 1
// when nothing was sent or counted.
func (r TrialResult) LossFraction() float64 {
	n := r.Sent
	if n == 0 {
		n = r.Offered
	}
	if n == 0 {
		return 1
	}
	return float64(r.Lost) / float64(n)
}

// Trial runs one trial with the sender offering pps packets per second and
// returns what it measured. It must return when ctx is done.
type Trial func(ctx context.Context, pps int) (TrialResult, error)

// SearchConfig bounds the search. Its zero value is not valid: Lo, Hi and
// Resolution have no defaults.
type SearchConfig struct {
	Lo int `json:"lo"` // lowest rate searched, pps (>= 0)
	Hi int `json:"hi"` // highest rate searched, pps (> Lo); tried first
	// Resolution ends the search when the bracket is this narrow, pps (> 0).
	Resolution int `json:"resolution"`
	// Trials per step, all of which must pass for the step to pass; a
	// failing trial ends its step early. 0 means 1.
	Trials int `json:"trials"`
	// LossThreshold is the loss fraction a trial may show and still pass;
	// 0 (the default) is RFC 2544's zero loss.
	LossThreshold float64 `json:"loss_threshold"`
	// SenderTolerance is how far, as a fraction of the offered rate, the
	// achieved rate may fall short before the trial counts as
	// sender-limited. 0 means 0.02.
	SenderTolerance float64 `json:"sender_tolerance"`
	// BelowSender goes on searching below a sender-limited step, as below
	// a failed one, instead of ending the search: the result is then the
	// highest rate the sender offered and the pair forwarded within the
	// threshold, SenderBound when the bracket's top is a rate the sender
	// could not offer. On veth, where the sender's own softirq does the
	// forwarding, that is the path's capacity.
	BelowSender bool `json:"below_sender,omitempty"`
}

// DefaultSenderTolerance is SearchConfig.SenderTolerance when left 0.
const DefaultSenderTolerance = 0.02

func (c SearchConfig) validate() (SearchConfig, error) {
	switch {
	case c.Lo < 0:
		return c, fmt.Errorf("search: lo %d is negative", c.Lo)
	case c.Hi <= c.Lo:
		return c, fmt.Errorf("search: hi %d is not above lo %d", c.Hi, c.Lo)
	case c.Resolution <= 0:
		return c, fmt.Errorf("search: resolution %d is not positive", c.Resolution)
	case c.Trials < 0:
		return c, fmt.Errorf("search: trials %d is negative", c.Trials)
	case c.LossThreshold < 0 || c.LossThreshold >= 1 || math.IsNaN(c.LossThreshold):
		return c, fmt.Errorf("search: loss threshold %v is not in [0, 1)", c.LossThreshold)
	case c.SenderTolerance < 0 || c.SenderTolerance >= 1 || math.IsNaN(c.SenderTolerance):
		return c, fmt.Errorf("search: sender tolerance %v is not in [0, 1)", c.SenderTolerance)
	}
	if c.Trials == 0 {
		c.Trials = 1
	}
	if c.SenderTolerance == 0 {
		c.SenderTolerance = DefaultSenderTolerance
	}
	return c, nil
}

// Outcome is what a step (or a trial) decided about the pair.
type Outcome string

// The outcomes of a step.
const (
	Pass Outcome = "pass" // every trial within the loss threshold
	Fail Outcome = "fail" // a trial lost more
	// SenderLimited: the sender could not offer the rate, so the step says
	// nothing about the pair. It ends the search.
	SenderLimited Outcome = "sender-limited"
)

// Step is one rate the search tried.
type Step struct {
	N       int           `json:"n"`   // 1-based order
	PPS     int           `json:"pps"` // rate asked of the sender
	Trials  []TrialResult `json:"trials"`
	Outcome Outcome       `json:"outcome"`
	MaxLoss float64       `json:"max_loss"` // highest loss fraction over its trials
}

// SearchResult is where the search ended. The zero value is an empty
// search that found nothing.
type SearchResult struct {
	Config SearchConfig `json:"config"` // as validated (defaults filled)
	Steps  []Step       `json:"steps"`
	// Found is the highest rate at which every trial passed, 0 when none
	// did.
	Found int `json:"found_pps"`
	// Lo and Hi bracket the limit: Lo passed (or is 0 when nothing did),
	// Hi failed (or equals Found when the pair passed at the config's Hi,
	// or is the rate the sender could not offer).
	Lo int `json:"lo_pps"`
	Hi int `json:"hi_pps"`
	// AboveHi: the pair passed at the highest rate searched, so its limit
	// is at least Hi.
	AboveHi bool `json:"above_hi,omitempty"`
	// BelowLo: the pair failed at the lowest rate searched.
	BelowLo bool `json:"below_lo,omitempty"`
	// SenderBound: a step was sender-limited and the search stopped there;
	// the limit is at least Found. SenderPPS is the rate the sender did
	// reach in that step (the lowest over its trials).
	SenderBound bool    `json:"sender_bound,omitempty"`
	SenderPPS   float64 `json:"sender_pps,omitempty"`
	// AtLeast is the rate the pair is known to forward within the loss
	// threshold: Found, or, sender-bound, the rate the sender reached if
	// the pair lost nothing of it.
	AtLeast int `json:"at_least_pps"`
}

// Tolerance is the width of the bracket, Hi - Lo.
func (r SearchResult) Tolerance() int { return r.Hi - r.Lo }

// String reads the result the way a test engineer says it.
func (r SearchResult) String() string {
	switch {
	case r.SenderBound && r.Config.BelowSender:
		return fmt.Sprintf(">= %d pps, sender-bound (the sender could not offer %d pps: it reached %.0f)", r.AtLeast, r.Hi, r.SenderPPS)
	case r.SenderBound:
		return fmt.Sprintf(">= %d pps, sender-bound (the sender reached %.0f pps when asked for %d)", r.AtLeast, r.SenderPPS, r.Hi)
	case r.AboveHi:
		return fmt.Sprintf(">= %d pps (passed at the highest rate searched)", r.Found)
	case r.BelowLo:
		return fmt.Sprintf("< %d pps (failed at the lowest rate searched)", r.Hi)
	case len(r.Steps) == 0:
		return "no steps"
	}
	return fmt.Sprintf("%d pps (limit in [%d, %d))", r.Found, r.Lo, r.Hi)
}

// Search looks for the highest offered rate at which all cfg.Trials trials
// lose no more than cfg.LossThreshold: it halves [cfg.Lo, cfg.Hi] until the
// bracket is at most cfg.Resolution wide, then tries cfg.Hi if no step
// failed and cfg.Lo if none passed. A sender-limited step ends the search (the
// result is then a lower bound). progress, if not nil, is called after each
// step. On an error of trial or of ctx, Search returns the steps so far with
// the error.
func Search(ctx context.Context, cfg SearchConfig, trial Trial, progress func(Step)) (SearchResult, error) {
	cfg, err := cfg.validate()
	if err != nil {
		return SearchResult{}, err
	}
	if trial == nil {
		return SearchResult{}, errors.New("search: no trial")
	}
	res := SearchResult{Config: cfg, Lo: cfg.Lo, Hi: cfg.Hi}
	// step runs the trials of one rate and records it.
	step := func(pps int) (Outcome, error) {
		s := Step{N: len(res.Steps) + 1, PPS: pps, Outcome: Pass}
		var err error
		for range cfg.Trials {
			if err = ctx.Err(); err != nil {
				err = fmt.Errorf("search: %w", err)
				break
			}
			var tr TrialResult
			tr, err = trial(ctx, pps)
			if err != nil {
				err = fmt.Errorf("search: trial at %d pps: %w", pps, err)
				break
			}
			s.Trials = append(s.Trials, tr)
			s.MaxLoss = max(s.MaxLoss, tr.LossFraction())
			if o := cfg.judge(pps, tr); o != Pass {
				s.Outcome = o
				if o == SenderLimited {
					achieved := tr.AchievedPPS
					if !res.SenderBound || achieved < res.SenderPPS || cfg.BelowSender {
						res.SenderPPS = achieved
					}
					res.SenderBound = true
				}
				break
			}
		}
		if err != nil {
			if len(s.Trials) > 0 {
				// The trials that finished are worth keeping; the step
				// decided nothing if they all passed.
				res.Steps = append(res.Steps, s)
			}
			return "", err
		}
		res.Steps = append(res.Steps, s)
		if progress != nil {
			progress(s)
		}
		return s.Outcome, nil
	}

	// lo is the highest rate passed (or cfg.Lo, untried), hi the lowest
	// failed (or cfg.Hi, untried).
	lo, hi := cfg.Lo, cfg.Hi
	passed, failed := false, false
	senderHi := false // hi is a rate the sender could not offer
	sender := func() (SearchResult, error) {
		res.Found, res.Lo, res.Hi = 0, 0, res.Steps[len(res.Steps)-1].PPS
		if passed {
			res.Found, res.Lo = lo, lo
		}
		res.AtLeast = res.Found
		if s := res.Steps[len(res.Steps)-1]; s.MaxLoss <= cfg.LossThreshold {
			// The pair forwarded what the sender managed without loss.
			res.AtLeast = max(res.AtLeast, int(res.SenderPPS))
		}
		return res, nil
	}
	for hi-lo > cfg.Resolution {
		mid := lo + (hi-lo)/2
		o, err := step(mid)
		if err != nil {
			return res, err
		}
		switch o {
		case Pass:
			lo, passed = mid, true
		case Fail:
			hi, failed, senderHi = mid, true, false
		case SenderLimited:
			if !cfg.BelowSender {
				return sender()
			}
			hi, senderHi = mid, true
		}
	}
	if !failed && !senderHi {
		// Everything passed so far: is the limit above the range?
		o, err := step(cfg.Hi)
		if err != nil {
			return res, err
		}
		switch o {
		case Pass:
			lo, passed, res.AboveHi = cfg.Hi, true, true
		case SenderLimited:
			return sender()
		}
	}
	if !passed && cfg.Lo > 0 {
		// Everything failed so far: is the limit below the range?
		o, err := step(cfg.Lo)
		if err != nil {
			return res, err
		}
		switch o {
		case Pass:
			passed = true
		case Fail:
			hi, res.BelowLo = cfg.Lo, true
		case SenderLimited:
			return sender()
		}
	}
	res.Lo, res.Hi = lo, hi
	if passed {
		res.Found = lo
	} else {
		res.Lo = 0
	}
	if res.AboveHi {
		res.Hi = lo
	}
	res.AtLeast = res.Found
	// Below the sender's limit: the pair's limit is at least Found, and
	// above the bracket nothing is known.
	res.SenderBound = senderHi
	return res, nil
}

// judge decides one trial at the asked rate pps.
func (c SearchConfig) judge(pps int, tr TrialResult) Outcome {
	offered := tr.OfferedPPS
	if offered <= 0 {
		offered = float64(pps)
	}
	if tr.Sent == 0 || tr.AchievedPPS < offered*(1-c.SenderTolerance) {
		return SenderLimited
	}
	if tr.LossFraction() > c.LossThreshold {
		return Fail
	}
	return Pass
}

// Calls is how many concurrent calls a packet rate carries: each call sends
// directions streams (2 for a bidirectional call, 1 for one-way media) of
// one packet per ptime. A bidirectional G.711 call at 20 ms is 100 pps.
// It returns 0 for a ptime or directions that are not positive.
func Calls(pps float64, ptime time.Duration, directions int) int {
	if ptime <= 0 || directions <= 0 || pps <= 0 {
		return 0
	}
	perCall := float64(directions) * float64(time.Second) / float64(ptime)
	// A hair of slack so that 12500 pps / 100 is 125, not 124.99999.
	return int(math.Floor(pps/perCall + 1e-9))
}

// Mbps is the bit rate of pps packets of ipBytes bytes each (IP header
// included), at layer 3.
func Mbps(pps float64, ipBytes int) float64 {
	return pps * float64(ipBytes) * 8 / 1e6
}
