//go:build !linux

package main

import (
	"context"
	"errors"
	"io"
)

var stderrFd = 2

func isTerminal(fd int) bool { return false }

// runSend falls back to the single-model sender where the generator of
// gen_linux.go (raw sockets, sendmmsg, clock_nanosleep) is not available.
func runSend(ctx context.Context, args []string, out io.Writer) error {
	return runSendBasic(ctx, args, out)
}

func runCall(ctx context.Context, args []string, out io.Writer) error {
	return errors.New("voipgen call runs on Linux only")
}

func runAnswer(ctx context.Context, args []string, out io.Writer) error {
	return errors.New("voipgen answer runs on Linux only")
}

func runPacebench(ctx context.Context, args []string, out io.Writer) error {
	return errors.New("voipgen pacebench runs on Linux only")
}
