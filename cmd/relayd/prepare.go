package main

import (
	"fmt"
	"io"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/internal/hostprep"
)

// runPrepare is `relayd -prepare`: the privileged part of a start, run by
// the unit's ExecStartPre=+ outside the service's sandbox, so that relayd
// itself runs with ProtectKernelTunables= and without a mount of its own.
// For the configured interfaces it turns on per-interface forwarding,
// mounts bpffs on /sys/fs/bpf when missing and installs the forward-drop
// rule (see internal/hostprep). It validates the config first, so a start
// with a config that is not ready fails here, naming the file and the key.
func runPrepare(cfgPath string, stderr io.Writer) int {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "relayd: %v\n", err)
		return 1
	}
	log := prepareLogger(cfg.Log, stderr)
	defer log.Sync()
	hc := hostprep.Config{PinPath: cfg.Dataplane.PinPath}
	if cfg.Dataplane.Mode == "xdp" {
		hc.Interfaces = cfg.Dataplane.Interfaces
	}
	if err := hostprep.Prepare(hc, log.Named("prepare")); err != nil {
		log.Error("prepare host", zap.String("config", cfgPath), zap.Error(err))
		return 1
	}
	return 0
}

// prepareLogger logs -prepare's few lines to stderr (the journal under
// systemd) at the config's level and format.
func prepareLogger(c config.Log, stderr io.Writer) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	enc := zapcore.NewJSONEncoder(ec)
	if c.Format == "console" {
		enc = zapcore.NewConsoleEncoder(ec)
	}
	level, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		level = zapcore.InfoLevel // config.Load accepts only valid levels
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(stderr), level))
}
