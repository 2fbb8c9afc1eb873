// Package watchdog decides whether relayd is healthy enough to pet the
// systemd watchdog: it runs probes (each userspace worker answers a ping,
// the SIP server answers an OPTIONS on each listener, /healthz answers) and
// reports success only when every probe answered within its bound. A
// wedged daemon stops petting and systemd restarts it after WatchdogSec.
package watchdog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Probe is one check of a part of the daemon. Check should return when
// ctx is done; one that does not is reported as failing, and is not
// started again while it is still running.
type Probe struct {
	Name  string
	Check func(ctx context.Context) error
}

// grace is how long after its deadline a probe may take to return.
const grace = 100 * time.Millisecond

// MaxTimeout caps the bound a probe must answer within.
const MaxTimeout = 5 * time.Second

// Bounds returns, for systemd's watchdog interval (WatchdogSec), how often
// the probes run and how long each may take: every quarter of the interval,
// each probe within a quarter of it but at most MaxTimeout. A daemon whose
// probes stop answering is thus not petted for a whole interval after its
// last good check, and restarted.
func Bounds(watchdog time.Duration) (interval, timeout time.Duration) {
	interval = watchdog / 4
	return interval, min(interval, MaxTimeout)
}

// Checker runs probes. The zero value is not usable; use NewChecker. Safe
// for concurrent use.
type Checker struct {
	probes  []Probe
	timeout time.Duration

	mu      sync.Mutex // guards the following
	running map[int]bool
}

// NewChecker returns a checker that gives each probe timeout to answer.
func NewChecker(timeout time.Duration, probes ...Probe) *Checker {
	return &Checker{probes: probes, timeout: timeout, running: make(map[int]bool)}
}

// Check runs every probe at once and returns nil when each answered
// without error within the timeout; otherwise an error naming each probe
// that failed or was late.
func (c *Checker) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	errs := make([]error, len(c.probes))
	done := make([]chan error, len(c.probes))
	for i, p := range c.probes {
		c.mu.Lock()
		busy := c.running[i]
		c.running[i] = true
		c.mu.Unlock()
		if busy {
			errs[i] = fmt.Errorf("%s: previous check still running", p.Name)
			continue
		}
		ch := make(chan error, 1)
		done[i] = ch
		go func() {
			err := p.Check(ctx)
			c.mu.Lock()
			delete(c.running, i)
			c.mu.Unlock()
			ch <- err
		}()
	}
	// A probe that honours ctx returns its own reason shortly after the
	// deadline; one that does not is given up on a little later.
	late := time.NewTimer(c.timeout + grace)
	defer late.Stop()
	for i, ch := range done {
		if ch == nil {
			continue
		}
		select {
		case err := <-ch:
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", c.probes[i].Name, err)
			}
		case <-late.C:
			errs[i] = fmt.Errorf("%s: no answer within %v", c.probes[i].Name, c.timeout)
			late.Reset(0)
		}
	}
	return errors.Join(errs...)
}

// Run checks every interval until ctx is done and calls pet after each
// check that passed. A failed check is logged (once per change from good to
// bad, then every minute) and not petted.
func Run(ctx context.Context, c *Checker, interval time.Duration, pet func() error, log *zap.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var failingSince, lastLog time.Time
	for {
		err := c.Check(ctx)
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			if !failingSince.IsZero() {
				log.Info("watchdog probes answer again", zap.Duration("failed_for", now.Sub(failingSince)))
				failingSince = time.Time{}
			}
			if perr := pet(); perr != nil {
				log.Warn("pet the watchdog", zap.Error(perr))
			}
		default:
			if failingSince.IsZero() {
				failingSince = now
			}
			if lastLog.IsZero() || now.Sub(lastLog) >= time.Minute || failingSince == now {
				log.Error("watchdog probe failed: not petting the watchdog", zap.Error(err))
				lastLog = now
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
