package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/relayd/relayd/voipgen/analyze"

	"golang.org/x/sys/unix"
)

var stderrFd = int(os.Stderr.Fd())

// isTerminal reports whether fd is a terminal.
func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// bidirReceiver returns a receiver over the generator's per-stream sockets
// (RTP and RTCP), for --bidir.
func (g *generator) bidirReceiver() *analyze.Receiver {
	if len(g.conns) == 0 {
		return nil
	}
	cfg := analyze.Config{
		Addr: g.cfg.src.lo, Duration: g.cfg.duration + g.cfg.grace + 10*time.Second,
		ClockRate: g.cfg.codec.ClockRate, Batch: 8, MaxSSRCsPerPort: 64, Emodel: g.cfg.emodel,
	}
	return analyze.NewOnConns(cfg, append(slices.Clone(g.conns), g.rtcpCon...))
}

// sendReport is voipgen send's JSON output.
type sendReport struct {
	Config map[string]any  `json:"config"`
	Load   genLoad         `json:"load"`
	Result genResult       `json:"result"`
	Recv   *analyze.Report `json:"recv,omitempty"`
}

// runGen runs the generator and, with --bidir, the analysis of what the
// peer sends back, until the duration passed or ctx is done.
func runGen(ctx context.Context, g *generator, progress io.Writer) (genResult, *analyze.Report) {
	var rc *analyze.Receiver
	var rep analyze.Report
	var wg sync.WaitGroup
	rctx, stopRecv := context.WithCancel(context.Background())
	defer stopRecv()
	if g.cfg.bidir {
		rc = g.bidirReceiver()
		wg.Go(func() { rep = rc.Run(rctx) })
	}
	pctx, stopProgress := context.WithCancel(ctx)
	if progress != nil {
		wg.Go(func() { g.showProgress(pctx, progress, rc) })
	}
	res := g.run(ctx)
	stopProgress()
	if rc != nil {
		select {
		case <-ctx.Done():
		case <-time.After(g.cfg.grace):
		}
		stopRecv()
	}
	wg.Wait()
	if rc == nil {
		return res, nil
	}
	return res, &rep
}

// showProgress rewrites one line on w every 250 ms until ctx is done.
func (g *generator) showProgress(ctx context.Context, w io.Writer, rc *analyze.Receiver) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	start := time.Now()
	var last uint64
	lastT := start
	for {
		select {
		case <-ctx.Done():
			fmt.Fprint(w, "\r\033[K")
			return
		case now := <-t.C:
			n := g.sent.Load()
			pps := float64(n-last) / now.Sub(lastT).Seconds()
			last, lastT = n, now
			line := fmt.Sprintf("\r\033[K%5.1fs/%v sent %d packets, %.0f pps", now.Sub(start).Seconds(), g.cfg.duration, n, pps)
			if rc != nil {
				line += fmt.Sprintf(", received %d", rc.Received())
			}
			fmt.Fprint(w, line)
		}
	}
}

func runSend(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := parseGen(args, out)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	g, err := newGenerator(cfg)
	if err != nil {
		return err
	}
	defer g.close()
	cfg = g.cfg
	l := cfg.load()
	if !cfg.json {
		l.writeText(out, &cfg)
		fmt.Fprintf(out, "pacing: %d sender threads (%s transport), %d streams staggered %.1f us apart, slots of %v\n",
			len(g.threads), cfg.transport, cfg.streams, float64(cfg.ptime)/float64(cfg.streams)/1e3, cfg.slot)
	}
	var progress io.Writer
	if cfg.progress {
		progress = os.Stderr
	}
	res, rep := runGen(ctx, g, progress)
	if cfg.json {
		return json.NewEncoder(out).Encode(sendReport{Config: cfg.jsonConfig(), Load: l, Result: res, Recv: rep})
	}
	res.writeText(out)
	if rep != nil {
		fmt.Fprintln(out, "received from the peer:")
		rep.WriteText(out)
	}
	return nil
}

func (r genResult) writeText(w io.Writer) {
	fmt.Fprintf(w, "sent %d RTP packets (%d bytes, %d RTCP, %d errors) of %d calls in %.3f s: %.0f pps; lateness against schedule p50 %.0f us, p99 %.0f us, max %.0f us; sender CPU %.2f s, %.2f us per packet\n",
		r.Packets, r.Bytes, r.RTCP, r.Errors, r.Calls, r.Elapsed, r.PPS, r.LateP50us, r.LateP99us, r.LateMaxus, r.CPUs, r.CPUPerPkUs)
}

func (c *genConfig) jsonConfig() map[string]any {
	m := map[string]any{
		"dst": c.dst.String(), "src": c.src.String(), "streams": c.streams, "codec": c.codec.Name,
		"ptime_ms": float64(c.ptime) / 1e6, "duration_s": c.duration.Seconds(),
		"call_duration_s": c.callDur.Seconds(), "call_duration_exp": c.callDurExp, "rate": c.rate,
		"bidir": c.bidir, "rtcp": c.rtcp, "threads": c.threads, "transport": c.transport,
		"slot_us": float64(c.slot) / 1e3, "dscp": c.dscp,
	}
	if c.codec.Kbps != 0 {
		m["opus_kbps"] = c.codec.Kbps
	}
	if c.srtp != nil {
		m["srtp_suite"] = c.srtp.Suite.String()
	}
	return m
}
