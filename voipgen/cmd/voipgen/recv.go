package main

import (
	"context"
	"encoding/json"
	"io"

	"github.com/relayd/relayd/voipgen/analyze"
)

// runRecv is voipgen recv.
func runRecv(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := analyze.Parse(args, out)
	if err != nil {
		return err
	}
	cfg.Progress = isTerminal(stderrFd)
	rc, err := analyze.New(cfg)
	if err != nil {
		return err
	}
	r := rc.Run(ctx)
	if cfg.JSON {
		return json.NewEncoder(out).Encode(r)
	}
	r.WriteTextAll(out, cfg.AllStreams)
	return nil
}
