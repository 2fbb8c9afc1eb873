package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/relayd/relayd/voipgen/sipua"
)

// runCall is voipgen call.
func runCall(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := sipua.ParseCall(args, out)
	if err != nil {
		return err
	}
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
