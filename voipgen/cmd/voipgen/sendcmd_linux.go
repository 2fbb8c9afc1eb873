package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/relayd/relayd/voipgen/gen"

	"github.com/relayd/relayd/voipgen/analyze"

	"golang.org/x/sys/unix"
)

var stderrFd = int(os.Stderr.Fd())

// isTerminal reports whether fd is a terminal.
func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// sendReport is voipgen send's JSON output.
type sendReport struct {
	Config map[string]any  `json:"config"`
	Load   gen.Load        `json:"load"`
	Result gen.Result      `json:"result"`
	Recv   *analyze.Report `json:"recv,omitempty"`
}

func runSend(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := gen.Parse(args, out)
	if err != nil {
		return err
	}
	g, err := gen.New(cfg)
	if err != nil {
		return err
	}
	defer g.Close()
	cfg = g.Config()
	l := cfg.Load()
	if !cfg.JSON {
		l.WriteText(out, &cfg)
		fmt.Fprintf(out, "pacing: %d sender threads (%s transport), %d streams staggered %.1f us apart, slots of %v\n",
			g.Threads(), cfg.Transport, cfg.Streams, float64(cfg.Ptime)/float64(cfg.Streams)/1e3, cfg.Slot)
	}
	var progress io.Writer
	if cfg.Progress {
		progress = os.Stderr
	}
	res, rep := g.RunAndReceive(ctx, progress)
	if cfg.JSON {
		return json.NewEncoder(out).Encode(sendReport{Config: jsonConfig(&cfg), Load: l, Result: res, Recv: rep})
	}
	res.WriteText(out)
	if rep != nil {
		fmt.Fprintln(out, "received from the peer:")
		rep.WriteText(out)
	}
	return nil
}

// jsonConfig is the config part of voipgen send --json.
func jsonConfig(c *gen.Config) map[string]any {
	m := map[string]any{
		"dst": c.Dst.String(), "src": c.Src.String(), "streams": c.Streams, "codec": c.Codec.Name,
		"ptime_ms": float64(c.Ptime) / 1e6, "duration_s": c.Duration.Seconds(),
		"call_duration_s": c.CallDur.Seconds(), "call_duration_exp": c.CallDurExp, "rate": c.Rate,
		"bidir": c.Bidir, "rtcp": c.RTCP, "threads": c.Threads, "transport": c.Transport,
		"slot_us": float64(c.Slot) / 1e3, "dscp": c.DSCP,
	}
	if c.Codec.Kbps != 0 {
		m["opus_kbps"] = c.Codec.Kbps
	}
	if c.SRTP != nil {
		m["srtp_suite"] = c.SRTP.Suite.String()
	}
	return m
}
