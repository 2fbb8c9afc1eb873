package gen

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/relayd/relayd/voipgen/analyze"
)

// bidirReceiver returns a receiver over the generator's per-stream sockets
// (RTP and RTCP), for --bidir.
func bidirReceiver(g *Generator) *analyze.Receiver {
	conns := g.Conns()
	if len(conns) == 0 {
		return nil
	}
	c := g.Config()
	cfg := analyze.Config{
		Addr: c.Src.Lo, Duration: c.Duration + c.Grace + 10*time.Second,
		ClockRate: c.Codec.ClockRate, Batch: 8, MaxSSRCsPerPort: 64, Emodel: c.Emodel,
	}
	return analyze.NewOnConns(cfg, conns)
}

// RunAndReceive runs the generator and, with --bidir, the analysis of what the
// peer sends back, until the duration passed or ctx is done. With
// progress, a live line is rewritten on it every 250 ms.
func (g *Generator) RunAndReceive(ctx context.Context, progress io.Writer) (Result, *analyze.Report) {
	var rc *analyze.Receiver
	var rep analyze.Report
	var wg sync.WaitGroup
	rctx, stopRecv := context.WithCancel(context.Background())
	defer stopRecv()
	cfg := g.Config()
	if cfg.Bidir {
		rc = bidirReceiver(g)
		wg.Go(func() { rep = rc.Run(rctx) })
	}
	pctx, stopProgress := context.WithCancel(ctx)
	if progress != nil {
		wg.Go(func() { g.showProgress(pctx, progress, rc) })
	}
	res := g.Run(ctx)
	stopProgress()
	if rc != nil {
		select {
		case <-ctx.Done():
		case <-time.After(cfg.Grace):
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
func (g *Generator) showProgress(ctx context.Context, w io.Writer, rc *analyze.Receiver) {
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
			n := g.Sent()
			pps := float64(n-last) / now.Sub(lastT).Seconds()
			last, lastT = n, now
			line := fmt.Sprintf("\r\033[K%5.1fs/%v sent %d packets, %.0f pps", now.Sub(start).Seconds(), g.Config().Duration, n, pps)
			if rc != nil {
				line += fmt.Sprintf(", received %d", rc.Received())
			}
			fmt.Fprint(w, line)
		}
	}
}
