package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"

	"github.com/relayd/relayd/voipgen/bench"
)

// runKmodbench is voipgen kmodbench.
func runKmodbench(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := bench.ParseKmod(args, out)
	if err != nil {
		return err
	}
	cfg.Progress = os.Stderr
	rep, err := bench.Kmod(ctx, cfg)
	if rep == nil {
		return err
	}
	if cfg.Out != "" && cfg.VM {
		b, jerr := json.MarshalIndent(rep, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(cfg.Out, append(b, '\n'), 0o644)
		}
		err = errors.Join(err, jerr)
	}
	if cfg.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return errors.Join(err, enc.Encode(rep))
	}
	rep.WriteText(out)
	return err
}
