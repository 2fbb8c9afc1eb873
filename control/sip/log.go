package sip

import (
	"context"
	"log/slog"
	"net/netip"

	"github.com/relayd/relayd/internal/loglimit"
	"github.com/relayd/relayd/internal/sipgolog"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
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

// newSlog returns sipgo's logger for log: warnings and errors, noisy ones
// at debug.
func newSlog(log *zap.Logger) *slog.Logger {
	l := slog.New(sipgoHandler{zapslog.NewHandler(log.Named("sipgo").Core())})
	sipgolog.SetTarget(l)
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

// callLog writes a call's lines with its identity first: relayd's call
// id and, for calls this run set up, the caller's Call-ID. Unlike a
// logger from zap's With, it keeps no encoded copy of them (a buffer of
// its own per call, for the call's lifetime): a held call costs no
// logger, a line the encoding of two fields when it is written.
type callLog struct {
	log       *zap.Logger // the server's, skipping callLog's frames
	call      string
	sipCallID string
}

// callLogSkip are the frames between a call's code and zap's Check:
// callLog's method and write, or callLog.limited and the limiter's Check.
const callLogSkip = 2

func (s *Server) newCallLog(id, sipCallID string) callLog {
	return callLog{log: s.clog, call: id, sipCallID: sipCallID}
}

// Debug, Info, Warn and Error log msg with the call's fields, then fields.
func (l callLog) Debug(msg string, fields ...zap.Field) { l.write(zap.DebugLevel, msg, fields) }
func (l callLog) Info(msg string, fields ...zap.Field)  { l.write(zap.InfoLevel, msg, fields) }
func (l callLog) Warn(msg string, fields ...zap.Field)  { l.write(zap.WarnLevel, msg, fields) }
func (l callLog) Error(msg string, fields ...zap.Field) { l.write(zap.ErrorLevel, msg, fields) }

func (l callLog) write(lvl zapcore.Level, msg string, fields []zap.Field) {
	if ce := l.log.Check(lvl, msg); ce != nil {
		ce.Write(l.with(fields)...)
	}
}

// limited logs a line that strangers can trigger, within lim's rate for
// the source src.
func (l callLog) limited(lim *loglimit.Limiter, lvl zapcore.Level, src netip.Addr, msg string, fields ...zap.Field) {
	if ce := lim.Check(l.log, lvl, src, msg); ce != nil {
		ce.Write(l.with(fields)...)
	}
}

// with returns the call's fields followed by fields.
func (l callLog) with(fields []zap.Field) []zap.Field {
	out := make([]zap.Field, 0, 2+len(fields))
	out = append(out, zap.String("call", l.call))
	if l.sipCallID != "" {
		out = append(out, zap.String("sip_call_id", l.sipCallID))
	}
	return append(out, fields...)
}
