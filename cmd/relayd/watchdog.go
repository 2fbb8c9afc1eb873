package main

import (
	"context"
	"fmt"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/internal/watchdog"
)

// pinger is the userspace data plane's worker ping (slowpath.Pool.Ping).
type pinger interface {
	Ping(ctx context.Context) error
}

// probes are what must answer for relayd to pet systemd's watchdog: every
// userspace worker, the SIP server on each listener, GET /healthz.
func probes(cfg *config.Config, pool pinger) []watchdog.Probe {
	ps := []watchdog.Probe{
		{Name: "userspace workers", Check: pool.Ping},
		{Name: "admin /healthz", Check: watchdog.Admin(cfg.Admin.Listen)},
	}
	for _, l := range cfg.SIP.Listeners {
		ps = append(ps, watchdog.Probe{
			Name:  fmt.Sprintf("SIP OPTIONS %s:%s", l.Network, l.Addr),
			Check: watchdog.SIPOptions(l.Network, l.Addr),
		})
	}
	return ps
}

// runWatchdog pets systemd's watchdog (WatchdogSec= in the unit) while
// the probes answer, until ctx is done. Without a watchdog it returns at
// once.
func runWatchdog(ctx context.Context, cfg *config.Config, pool pinger, log *zap.Logger) {
	every, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("systemd watchdog settings", zap.Error(err))
		return
	}
	if every <= 0 {
		return
	}
	interval, timeout := watchdog.Bounds(every)
	log.Info("systemd watchdog on", zap.Duration("watchdog", every), zap.Duration("check_every", interval),
		zap.Duration("probe_timeout", timeout))
	c := watchdog.NewChecker(timeout, probes(cfg, pool)...)
	watchdog.Run(ctx, c, interval, func() error {
		_, err := daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		return err
	}, log)
}
