// Command relayd is the VoIP media relay daemon: it reads the config,
// attaches the XDP data plane, serves the admin API and keeps running
// until SIGINT or SIGTERM. See docs/architecture.md and docs/api.md.
//
//	relayd -config /etc/relayd/relayd.toml   run
//	relayd -check -config FILE               validate the config and exit
//	relayd -detach -config FILE              remove pinned XDP state and exit
//	relayd -prepare -config FILE             prepare the host (run as root before start)
//	relayd -version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/relayd/relayd/internal/secret"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/control"
	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/fastpath"
	"github.com/relayd/relayd/slowpath"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

const (
	defaultConfig   = "/etc/relayd/relayd.toml"
	sweepInterval   = 5 * time.Second
	shutdownTimeout = 10 * time.Second
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func getVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// run is main without the exit, for tests. It returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("relayd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", defaultConfig, "config `file` (TOML)")
	check := fs.Bool("check", false, "validate the config, print \"config OK\" or the error, and exit")
	detach := fs.Bool("detach", false, "detach XDP and remove the state pinned under dataplane.pin_path, and exit")
	prepare := fs.Bool("prepare", false, "prepare the host for the config (per-interface forwarding, bpffs, forward-drop rule; needs root), and exit")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "relayd: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, "relayd", getVersion())
		return 0
	}
	f, _ := stderr.(*os.File)
	journal := toJournal(os.Getenv("JOURNAL_STREAM"), f)
	if *prepare {
		return runPrepare(*cfgPath, stderr, journal)
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		printError(stderr, journal, fmt.Sprintf("relayd: %v", err))
		return 1
	}
	if *check {
		for _, w := range cfg.Warnings() {
			fmt.Fprintf(stderr, "relayd: warning: %s\n", w)
		}
		fmt.Fprintln(stdout, "config OK")
		return 0
	}
	log, level, err := newLogger(cfg.Log, stderr, journal)
	if err != nil {
		printError(stderr, journal, fmt.Sprintf("relayd: %v", err))
		return 1
	}
	defer log.Sync()
	if *detach {
		if err := fastpath.Detach(cfg.Dataplane.PinPath, log.Named("fastpath")); err != nil {
			log.Error("detach", zap.String("pin_path", cfg.Dataplane.PinPath), zap.Error(err))
			return 1
		}
		log.Info("detached", zap.String("pin_path", cfg.Dataplane.PinPath))
		return 0
	}
	for _, w := range cfg.Warnings() {
		log.Warn("config: "+w, zap.String("config", *cfgPath))
	}
	r := &reloader{path: *cfgPath, log: log.Named("reload"), level: level, cur: cfg}
	if err := serve(ctx, cfg, r, log); err != nil {
		log.Error("relayd stopped", zap.Error(err))
		return 1
	}
	return 0
}

// workerScheduling is dataplane.worker_scheduling as slowpath.Config
// takes it: "" for "default".
func workerScheduling(s string) string {
	if s == "default" {
		return ""
	}
	return s
}

// afxdpInterfaces are where the userspace workers open their AF_XDP
// sockets (and, in mode userspace, attach the program that redirects into
// them): dataplane.interfaces in userspace_io afxdp, none otherwise.
func afxdpInterfaces(cfg *config.Config) []string {
	if cfg.Dataplane.UserspaceIO != "afxdp" {
		return nil
	}
	return cfg.Dataplane.Interfaces
}

// xskTarget is where the XDP program redirects the packets of the flows
// the workers carry: their AF_XDP sockets in userspace_io afxdp, nil (the
// kernel's receive path) otherwise.
func xskTarget(pool *slowpath.Pool) *fastpath.XSKTarget {
	steer, socks, devs, n := pool.XSKMaps()
	if socks == nil {
		return nil
	}
	return &fastpath.XSKTarget{Steer: steer, Sockets: socks, Devices: devs, NumDevices: n, ReceiveTime: pool.XSKReceiveTime()}
}

// mediaPorts returns the lowest and highest relay port of every media
// interface: the XDP data plane gives the flows on them their statistics
// slots by port. A reload that moves the ranges leaves the slots as they
// are until the next start (flows outside are only forwarded a little
// slower).
func mediaPorts(cfg *config.Config) (lo, hi uint16) {
	ifaces := cfg.MediaInterfaces()
	if len(ifaces) == 0 {
		return cfg.Media.PortMin, cfg.Media.PortMax
	}
	lo, hi = ifaces[0].PortMin, ifaces[0].PortMax
	for _, in := range ifaces[1:] {
		lo, hi = min(lo, in.PortMin), max(hi, in.PortMax)
	}
	return lo, hi
}

// serve runs the daemon until ctx is done. It reports ready to systemd
// once every listener is bound and the data planes are up, pets the
// watchdog while the probes answer, and reloads on SIGHUP.
func serve(ctx context.Context, cfg *config.Config, reload *reloader, log *zap.Logger) (err error) {
	// SIGHUP's default would end the process: catch it from the start.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	log.Info("relayd starting", zap.String("version", getVersion()), zap.String("mode", cfg.Dataplane.Mode))

	var planes []dataplane.DataPlane
	var observers []dataplane.Observer
	// The userspace data plane: every flow in mode userspace, and in mode
	// xdp the flows XDP hands over.
	// Latched sources go to the flow registry, made below over the data
	// planes, which hands each to the holder of the flow.
	var regRef atomic.Pointer[registry.Registry]
	// What the control plane may grow to (dataplane.control_procs 0): one
	// P per online CPU, or $GOMAXPROCS; read before the pool counts its
	// workers' Ps on top.
	maxProcs := runtime.GOMAXPROCS(0)
	pool, err := slowpath.New(slowpath.Config{
		Workers:      cfg.Dataplane.Workers,
		CPUs:         cfg.Dataplane.CPUs,
		MaxFlows:     cfg.Dataplane.MaxFlows,
		LatchWindow:  cfg.Media.LatchDuration,
		RTCPInterval: cfg.Media.RTCPDuration,
		Coalesce:     cfg.Dataplane.CoalesceDuration,
		PackFlows:    cfg.Dataplane.PackFlows,
		IO:           cfg.Dataplane.UserspaceIO,
		Scheduling:   workerScheduling(cfg.Dataplane.WorkerScheduling),
		Priority:     cfg.Dataplane.WorkerPriority,
		XDPGeneric:   cfg.Dataplane.XDPMode == "generic",
		Interfaces:   afxdpInterfaces(cfg),
		// In mode xdp the relay program owns the interfaces' XDP hook
		// and redirects the workers' flows into their sockets.
		ExternalXDP: cfg.Dataplane.Mode == "xdp",
		OnLatched: func(match, source netip.AddrPort, locked bool) {
			if r := regRef.Load(); r != nil {
				r.Latched(match, source, locked)
			}
		},
	}, log.Named("slowpath"))
	if err != nil {
		return fmt.Errorf("start userspace data plane: %w", err)
	}
	defer func() {
		if cerr := pool.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close userspace data plane: %w", cerr))
		}
	}()
	planes = append(planes, pool)
	observers = append(observers, pool)
	if n := cfg.Dataplane.ControlProcs; n > 0 {
		// The control plane's Ps (dataplane.control_procs), the workers
		// that hold one aside.
		slowpath.SetControlProcs(n)
	} else {
		// By its load, from one up to maxProcs; stopped before the pool
		// closes, which puts GOMAXPROCS back.
		scaleCtx, stopScale := context.WithCancel(ctx)
		scaled := make(chan struct{})
		go func() {
			defer close(scaled)
			slowpath.AutoControlProcs(scaleCtx, maxProcs, log.Named("procs"))
		}()
		defer func() {
			stopScale()
			<-scaled
		}()
	}
	switch cfg.Dataplane.Mode {
	case "xdp":
		portMin, portMax := mediaPorts(cfg)
		fp, err := fastpath.New(fastpath.Config{
			Interfaces:       cfg.Dataplane.Interfaces,
			XDPMode:          cfg.Dataplane.XDPMode,
			PinPath:          cfg.Dataplane.PinPath,
			MaxFlows:         cfg.Dataplane.MaxFlows,
			PortMin:          portMin,
			PortMax:          portMax,
			EnableForwarding: cfg.Dataplane.EnableForwarding,
			Punt:             pool,
			XSK:              xskTarget(pool),
		}, log.Named("fastpath"))
		if err != nil {
			return fmt.Errorf("start xdp data plane: %w", err)
		}
		// Close keeps the pinned program, maps and links: media keeps
		// flowing while relayd restarts.
		defer func() {
			if cerr := fp.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("close xdp data plane: %w", cerr))
			}
		}()
		planes = append(planes, fp)
		observers = append(observers, fp)
	}

	// One registry of flows and ports for every front end; it adopts the
	// flows a previous run left pinned. Call flows nobody claims carry
	// media until idle, then go.
	reg, err := registry.New(registryConfig(cfg), log.Named("flows"), planes...)
	if err != nil {
		return err
	}
	regRef.Store(reg)
	mgr := control.NewManager(reg, log.Named("flows"))

	// One call table for every front end: SIP and ng calls share the
	// session limit and show in /v1/calls.
	calls := call.NewTable(reg, log.Named("calls"))
	calls.SetMaxSessions(cfg.Media.MaxSessions)

	// Every listener binds before READY=1: one that cannot fails the start.
	b2b, err := startB2BUA(ctx, cfg, log, calls)
	if err != nil {
		return fmt.Errorf("start SIP B2BUA: %w", err)
	}
	ngf, err := startNG(ctx, cfg, log, calls, b2b.cdrs, b2b.ngStore())
	if err != nil {
		shCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		return errors.Join(fmt.Errorf("start ng: %w", err), b2b.stop(shCtx))
	}
	if n := reg.Unclaimed(); n > 0 {
		log.Info("call flows of the previous run no restored call claimed: removed once idle", zap.Int("flows", n))
	}
	l, err := admin.Listen(cfg.Admin.Listen)
	if err != nil {
		shCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		return errors.Join(err, b2b.stop(shCtx))
	}
	var token string
	if f := cfg.Admin.TokenFile; f != "" {
		if token, err = secret.ReadToken(f); err != nil {
			l.Close()
			shCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer cancel()
			return errors.Join(fmt.Errorf("admin.token_file: %w", err), b2b.stop(shCtx))
		}
	}
	srv := admin.New(admin.Config{Observers: observers, Version: getVersion(), Calls: calls, Collectors: append(append(b2b.metrics, ngf.Metrics()...), controlProcsGauge()),
		Control: b2b.control(), CDRStats: b2b.cdrStats(), Token: token}, mgr, log.Named("admin"))
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	reload.router, reload.admin = b2b.router, srv
	if b2b.srv != nil {
		reload.setCredentials = b2b.srv.SetCredentials
	}

	if ok, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		log.Warn("sd_notify READY", zap.Error(err))
	} else if ok {
		log.Debug("notified systemd: ready")
	}
	wdCtx, stopWatchdog := context.WithCancel(ctx)
	wdDone := make(chan struct{})
	go func() {
		defer close(wdDone)
		runWatchdog(wdCtx, cfg, pool, log.Named("watchdog"))
	}()
	sweepCtx, stopSweep := context.WithCancel(ctx)
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		mgr.RunIdleSweep(sweepCtx, sweepInterval, cfg.Media.TimeoutDuration)
	}()
	rebindDone := make(chan struct{})
	go func() {
		defer close(rebindDone)
		runRebind(sweepCtx, cfg.Media.RebindDuration, reg, calls, mgr, log)
	}()
	log.Info("relayd ready", zap.String("admin", cfg.Admin.Listen))

	runErr := waitStop(ctx, hup, reload, serveErr, b2b, ngf, log)
	if _, err := daemon.SdNotify(false, daemon.SdNotifyStopping); err != nil {
		log.Warn("sd_notify STOPPING", zap.Error(err))
	}
	stopWatchdog()
	<-wdDone
	stopSweep()
	<-sweepDone
	<-rebindDone
	shCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := ngf.stop(); err != nil {
		runErr = errors.Join(runErr, err)
	}
	if err := b2b.stop(shCtx); err != nil {
		runErr = errors.Join(runErr, err)
	}
	if err := srv.Shutdown(shCtx); err != nil {
		runErr = errors.Join(runErr, err)
	}
	return runErr
}

// waitStop reloads on each SIGHUP until ctx is done or a front end stops;
// it returns why it stopped (nil for ctx).
func waitStop(ctx context.Context, hup <-chan os.Signal, reload *reloader, serveErr <-chan error, b2b *b2bua, ngf *ngFront, log *zap.Logger) error {
	for {
		select {
		case <-hup:
			if err := reload.reload(); err != nil {
				log.Error("reload: config not applied", zap.Error(err))
			}
		case <-ctx.Done():
			log.Info("shutting down")
			return nil
		case err := <-serveErr:
			log.Error("admin API stopped", zap.Error(err))
			return err
		case <-b2b.Done():
			if ctx.Err() != nil {
				// Stopped by the same signal: a shutdown, not a failure
				// (select picks either ready case).
				log.Info("shutting down")
				return nil
			}
			log.Error("SIP B2BUA stopped", zap.Error(b2b.Error()))
			return fmt.Errorf("SIP B2BUA stopped: %w", b2b.Error())
		case <-ngf.Done():
			if ctx.Err() != nil {
				log.Info("shutting down")
				return nil
			}
			log.Error("ng stopped", zap.Error(ngf.err))
			return fmt.Errorf("ng stopped: %w", ngf.err)
		}
	}
}

// registryConfig returns the flow registry's configuration: the media
// interfaces and the destination policy (media never goes to relayd's own
// addresses, special-purpose addresses or the operator's denied
// networks, whichever front end asks).
func registryConfig(cfg *config.Config) registry.Config {
	m := &cfg.Media
	return registry.Config{Interfaces: mediaInterfaces(cfg), Own: cfg.OwnAddrs(), Deny: m.DenyPrefixes,
		Rates: registry.RatePolicy{Factor: m.RateLimitFactor, DefaultPPS: m.RateLimitDefaultPPS, RTCPPPS: m.RateLimitRTCPPPS}}
}

// mediaInterfaces returns the registry's media interfaces of the config,
// the default first.
func mediaInterfaces(cfg *config.Config) []registry.Interface {
	var out []registry.Interface
	for _, in := range cfg.MediaInterfaces() {
		out = append(out, registry.Interface{
			Name: in.Name, Addr: in.Addr, Addr6: in.Addr6, Advertise: in.AdvertiseAddr, Advertise6: in.AdvertiseAddr6,
			PortMin: in.PortMin, PortMax: in.PortMax,
		})
	}
	return out
}

// rebindInterval is how often locked sources are checked for a NAT
// rebinding: what a rebinding waits beyond media.rebind_after.
const rebindInterval = 2 * time.Second

// runRebind, until ctx is done, opens learning again on locked flows
// (calls' and static ones) whose source has been silent for after while
// packets from elsewhere were dropped. after 0: never.
func runRebind(ctx context.Context, after time.Duration, reg *registry.Registry, calls *call.Table, mgr *control.Manager, log *zap.Logger) {
	if after <= 0 {
		return
	}
	t := time.NewTicker(rebindInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		stats, err := reg.Activity()
		if err != nil {
			log.Warn("rebind check", zap.Error(err))
		}
		calls.Rebind(stats, after)
		mgr.Rebind(stats, after)
	}
}

// controlProcsGauge is relayd_control_procs: the Go Ps the control plane
// runs on (dataplane.control_procs, or what its load set).
func controlProcsGauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relayd_control_procs",
		Help: "Go processors (GOMAXPROCS) the control plane runs on, beside the userspace workers that hold one (dataplane.control_procs; 0 sets them by the load).",
	}, func() float64 { return float64(slowpath.ControlProcs()) })
}
