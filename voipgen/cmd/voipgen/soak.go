package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/relayd/relayd/voipgen/bench"
)

// errSoakFailed is returned after a complete soak report that missed a
// goal.
var errSoakFailed = errors.New("soak failed")

// runSoak is voipgen soak.
func runSoak(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := bench.ParseSoak(args, out)
	if err != nil {
		return err
	}
	cfg.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGHUP)
	defer stop()
	rep, err := bench.Soak(ctx, cfg)
	if rep == nil {
		return err
	}
	b, jerr := json.MarshalIndent(rep, "", "  ")
	if jerr != nil {
		return errors.Join(err, jerr)
	}
	if cfg.Out != "" {
		err = errors.Join(err, os.WriteFile(cfg.Out, append(b, '\n'), 0o644))
	}
	if cfg.JSON {
		fmt.Fprintf(out, "%s\n", b)
	} else {
		rep.WriteText(out)
	}
	if err != nil {
		return err
	}
	if !rep.Pass {
		return fmt.Errorf("%w: %s", errSoakFailed, strings.Join(rep.Problems, "; "))
	}
	return nil
}
