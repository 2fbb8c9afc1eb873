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

// errDemoFailed is returned after a complete demo report that did not pass.
var errDemoFailed = errors.New("demo failed")

// runBench is voipgen bench.
func runBench(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := bench.Parse(args, out)
	if err != nil {
		return err
	}
	cfg.Progress = os.Stderr
	rep, err := bench.Run(ctx, cfg)
	if rep == nil {
		return err
	}
	err = errors.Join(err, rep.WriteOutputs(cfg.Out))
	if cfg.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return errors.Join(err, enc.Encode(rep))
	}
	rep.WriteText(out)
	return err
}

// runFwdbench is voipgen fwdbench.
func runFwdbench(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := bench.ParseFwd(args, out)
	if err != nil {
		return err
	}
	progress := out
	if cfg.JSON {
		progress = io.Discard
	}
	rep, err := bench.Fwd(ctx, cfg, progress)
	if rep == nil {
		return err
	}
	if cfg.Save != "" {
		b, jerr := json.MarshalIndent(rep, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(cfg.Save, append(b, '\n'), 0o644)
		}
		err = errors.Join(err, jerr)
	}
	if cfg.JSON {
		if jerr := json.NewEncoder(out).Encode(rep); jerr != nil {
			return errors.Join(err, jerr)
		}
		return err
	}
	rep.WriteText(out)
	return err
}

// runDemo is voipgen demo.
func runDemo(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := bench.ParseDemo(args, out)
	if err != nil {
		return err
	}
	// main traps SIGINT and SIGTERM; a closed terminal must tear the lab
	// down too.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGHUP)
	defer stop()
	rep, err := bench.Demo(ctx, cfg)
	if err != nil {
		return err
	}
	if cfg.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.WriteText(out, cfg.AllFlows)
	}
	if !rep.Pass {
		return fmt.Errorf("%w: %s", errDemoFailed, strings.Join(rep.Problems, "; "))
	}
	return nil
}
