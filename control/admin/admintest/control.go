// Package admintest has fakes for tests of the admin API and its clients.
package admintest

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/relayd/relayd/control/call"
)

// ErrNoCall is what Control.Hangup wraps for an unknown call.
var ErrNoCall = errors.New("no such call")

// Control is an admin.CallControl over a call table: Hangup ends and
// removes the call, Drain records its timeout. Safe for concurrent use.
type Control struct {
	Calls *call.Table

	mu       sync.Mutex
	hungUp   []string
	draining bool
	timeout  time.Duration
	fail     error
}

// Hangup implements admin.CallControl.
func (f *Control) Hangup(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	c, ok := f.Calls.Get(id)
	if !ok {
		return fmt.Errorf("call %s: %w", id, ErrNoCall)
	}
	f.hungUp = append(f.hungUp, id)
	c.End(call.Shutdown, 0, "hung up")
	f.Calls.Remove(c)
	return nil
}

// Drain implements admin.CallControl.
func (f *Control) Drain(timeout time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.draining, f.timeout = true, timeout
}

// DrainStatus implements admin.CallControl.
func (f *Control) DrainStatus() (bool, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.draining, f.Calls.Len()
}

// Fail makes later Hangups fail with err (nil: succeed again).
func (f *Control) Fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

// HungUp returns the ids Hangup ended, in order.
func (f *Control) HungUp() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.hungUp...)
}

// Draining returns whether Drain was called and its last timeout.
func (f *Control) Draining() (bool, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.draining, f.timeout
}
