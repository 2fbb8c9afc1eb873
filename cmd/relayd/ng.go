package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/cdr"
	"github.com/relayd/relayd/control/ng"
)

// ngFront is the rtpengine ng protocol front end; the zero value ([ng]
// without listen addresses) does nothing.
type ngFront struct {
	srv    *ng.Server
	engine *ng.CallEngine
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// startNG binds the ng listeners (before READY, like SIP's) and serves.
func startNG(ctx context.Context, cfg *config.Config, log *zap.Logger, calls *call.Table, cdrs *cdr.Writer, store ng.Store) (*ngFront, error) {
	f := &ngFront{}
	if !cfg.NG.Enabled() {
		return f, nil
	}
	ecfg := ng.EngineConfig{Calls: calls, MediaTimeout: cfg.Media.TimeoutDuration, MaxLoad: cfg.NG.MaxLoad, Load: loadPerCPU}
	if cdrs != nil {
		ecfg.OnEnd = cdrs.Write
	}
	ecfg.Store = store
	var err error
	f.engine, err = ng.NewEngine(ecfg, log.Named("ng"))
	if err != nil {
		return nil, err
	}
	f.srv, err = ng.New(ng.Config{Listen: cfg.NG.Listen, Allow: cfg.NG.AllowPrefixes}, f.engine, log.Named("ng"))
	if err != nil {
		return nil, err
	}
	if err := f.srv.Listen(); err != nil {
		return nil, fmt.Errorf("ng: %w", err)
	}
	f.engine.Restore()
	sctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	f.done = make(chan struct{})
	go f.engine.Run(sctx)
	go func() {
		f.err = f.srv.Serve(sctx)
		close(f.done)
	}()
	log.Info("ng listening", zap.Strings("listen", cfg.NG.Listen))
	return f, nil
}

// Done is closed if the ng listeners stop (nil when off: never).
func (f *ngFront) Done() <-chan struct{} { return f.done }

// Metrics returns the ng server's collectors; none when off.
func (f *ngFront) Metrics() []prometheus.Collector {
	if f.srv == nil {
		return nil
	}
	return []prometheus.Collector{f.srv.Metrics()}
}

// stop closes the listeners; with a [state] store the answered ng calls
// stay up for the next run, otherwise they end with a record each.
func (f *ngFront) stop() error {
	if f.srv == nil {
		return nil
	}
	f.cancel()
	<-f.done
	err := f.srv.Close()
	f.engine.Close()
	return err
}

// loadPerCPU returns the 1-minute load average divided by the CPUs.
func loadPerCPU() (float64, error) {
	fh, err := os.Open("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	line, err := bufio.NewReader(fh).ReadString(' ')
	if err != nil {
		return 0, fmt.Errorf("read /proc/loadavg: %w", err)
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(line), 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc/loadavg: %w", err)
	}
	return v / float64(runtime.NumCPU()), nil
}
