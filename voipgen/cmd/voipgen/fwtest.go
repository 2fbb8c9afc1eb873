package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/relayd/relayd/voipgen/fwtest"
)

// runFwtest is voipgen fwtest.
func runFwtest(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := fwtest.Parse(args, out)
	if err != nil {
		return err
	}
	// main traps SIGINT and SIGTERM; a closed terminal tears down too.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGHUP)
	defer stop()
	cfg.Progress = os.Stderr
	rep, err := fwtest.Run(ctx, cfg)
	if rep == nil {
		return err
	}
	if cfg.Out != "" {
		files, oerr := rep.WriteOutputs(cfg.Out)
		err = errors.Join(err, oerr)
		if oerr == nil {
			fmt.Fprintf(os.Stderr, "fwtest: wrote %d files to %s\n", len(files), cfg.Out)
		}
	}
	if cfg.JSON {
		return errors.Join(err, rep.WriteJSON(out))
	}
	rep.WriteText(out)
	return err
}
