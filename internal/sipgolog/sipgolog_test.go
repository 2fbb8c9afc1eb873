package sipgolog

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/emiago/sipgo/sip"
)

// TestTarget checks that sipgo's default logger writes to the last target
// set, and to nothing before one is or after nil.
func TestTarget(t *testing.T) {
	t.Cleanup(func() { SetTarget(nil) })
	var a, b bytes.Buffer
	log := func() { sip.DefaultLogger().Error("tx ended", "id", 7) }

	SetTarget(nil)
	log()
	SetTarget(slog.New(slog.NewTextHandler(&a, nil)))
	log()
	SetTarget(slog.New(slog.NewTextHandler(&b, nil)))
	log()
	sip.DefaultLogger().With("call", "x").Info("with attrs")
	SetTarget(nil)
	log()

	if got := strings.Count(a.String(), "tx ended"); got != 1 {
		t.Errorf("first target got %d records, want 1:\n%s", got, a.String())
	}
	if got := strings.Count(b.String(), "tx ended"); got != 1 || !strings.Contains(b.String(), "id=7") {
		t.Errorf("second target got %d records, want 1 with its attribute:\n%s", got, b.String())
	}
	if !strings.Contains(b.String(), "call=x") {
		t.Errorf("a logger derived with With lost its attribute:\n%s", b.String())
	}
	if sip.DefaultLogger().Enabled(context.Background(), slog.LevelError) {
		t.Error("without a target, the default logger is enabled")
	}
}

// TestTargetRace is for -race: setting the target while sipgo's
// goroutines log through the default logger is safe.
func TestTargetRace(t *testing.T) {
	t.Cleanup(func() { SetTarget(nil) })
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				sip.DefaultLogger().Debug("x")
			}
		})
	}
	for range 200 {
		SetTarget(slog.New(slog.DiscardHandler))
	}
	wg.Wait()
}
