package main

import (
	"fmt"
	"io"

	"go.uber.org/zap"

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
// journal says stderr is the journal (priorities from the log levels).
func runPrepare(cfgPath string, stderr io.Writer, journal bool) int {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		printError(stderr, journal, fmt.Sprintf("relayd: %v", err))
		return 1
	}
	log, _, err := newLogger(cfg.Log, stderr, journal)
	if err != nil {
		printError(stderr, journal, fmt.Sprintf("relayd: %v", err))
		return 1
	}
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
