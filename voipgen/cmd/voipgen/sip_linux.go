package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/relayd/relayd/voipgen/sipua"
)

// runCall is voipgen call.
func runCall(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := sipua.ParseCall(args, out)
	if err != nil {
		return err
	}
	// SIGUSR1: hang up now (BYE), report as usual. Registered before the
	// first call so that the signal never takes its default action (exit).
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	hangup := make(chan struct{})
	go func() {
		select {
		case <-usr1:
			close(hangup)
		case <-ctx.Done():
		}
	}()
	cfg.Hangup = hangup
	calls, err := sipua.PlaceCalls(ctx, cfg)
	if err != nil {
		return err
	}
	sum := sipua.Summarize(calls)
	if cfg.JSON {
		return json.NewEncoder(out).Encode(map[string]any{"summary": sum, "calls": calls})
	}
	sum.WriteText(out, "call")
	if sum.Failed > 0 {
		return fmt.Errorf("%d of %d calls failed", sum.Failed, sum.Calls)
	}
	return nil
}

// runAnswer is voipgen answer.
func runAnswer(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := sipua.ParseAnswer(args, out)
	if err != nil {
		return err
	}
	calls, err := sipua.AnswerCalls(ctx, cfg, nil)
	if err != nil {
		return err
	}
	sum := sipua.Summarize(calls)
	if cfg.JSON {
		return json.NewEncoder(out).Encode(map[string]any{"summary": sum, "calls": calls})
	}
	sum.WriteText(out, "answer ("+cfg.Personality+")")
	return nil
}
