package sip

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
)

// sipgo logs through slog, some of it through a process-wide default
// logger. Both go to zap through sipgoHandler, which demotes what a peer
// can trigger at will (a parse error per malformed message) to debug, so
// garbage on the SIP port cannot flood the log.

// noisy are sipgo messages demoted to debug.
var noisy = map[string]bool{
	"failed to parse":                        true,
	"UDP ref went negative on try close":     true,
	"TCP ref went negative":                  true,
	"Server tx failed to handle request":     true,
	"SIP request handler not found":          true,
	"ACK missed":                             true,
	"Read connection error":                  true,
	"Read error":                             true,
	"Failed to create server tx":             true,
	"Failed to handle response, skipping it": true,
}

// defaultTarget is where sipgo's default logger goes: the last B2BUA's
// logger.
var defaultTarget atomic.Pointer[slog.Logger]

func init() {
	sip.SetDefaultLogger(slog.New(defaultHandler{}))
}

// newSlog returns sipgo's logger for log: warnings and errors, noisy ones
// at debug.
func newSlog(log *zap.Logger) *slog.Logger {
	l := slog.New(sipgoHandler{zapslog.NewHandler(log.Named("sipgo").Core())})
	defaultTarget.Store(l)
	return l
}

type sipgoHandler struct{ h slog.Handler }

func (s sipgoHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return s.h.Enabled(ctx, slog.LevelDebug) && (l >= slog.LevelWarn || s.h.Enabled(ctx, l))
}

func (s sipgoHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		r.Level = slog.LevelDebug
	}
	if noisy[r.Message] {
		r.Level = slog.LevelDebug
	}
	if !s.h.Enabled(ctx, r.Level) {
		return nil
	}
	return s.h.Handle(ctx, r)
}

func (s sipgoHandler) WithAttrs(a []slog.Attr) slog.Handler { return sipgoHandler{s.h.WithAttrs(a)} }
func (s sipgoHandler) WithGroup(g string) slog.Handler      { return sipgoHandler{s.h.WithGroup(g)} }

type defaultHandler struct{}

func (defaultHandler) target() slog.Handler {
	if l := defaultTarget.Load(); l != nil {
		return l.Handler()
	}
	return slog.DiscardHandler
}

func (d defaultHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return d.target().Enabled(ctx, l)
}
func (d defaultHandler) Handle(ctx context.Context, r slog.Record) error {
	return d.target().Handle(ctx, r)
}
func (d defaultHandler) WithAttrs(a []slog.Attr) slog.Handler { return d.target().WithAttrs(a) }
func (d defaultHandler) WithGroup(g string) slog.Handler      { return d.target().WithGroup(g) }
