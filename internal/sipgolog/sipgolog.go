// Package sipgolog owns sipgo's process-wide default logger.
//
// sipgo logs some of its messages (transactions ending, connections
// closing) through a package global that its goroutines read at any time,
// also after the server or client that started them is gone. Setting that
// global per server would race with those readers, and two packages of
// one binary setting it would override each other. So it is set once,
// here, to a logger that forwards to whatever SetTarget chose last.
package sipgolog

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/emiago/sipgo/sip"
)

var target atomic.Pointer[slog.Logger]

func init() { sip.SetDefaultLogger(slog.New(handler{})) }

// SetTarget sends sipgo's default logger's records to l from now on; nil
// discards them. The last call wins.
func SetTarget(l *slog.Logger) { target.Store(l) }

// handler hands each record to the target's handler at the time.
type handler struct{}

func (handler) target() slog.Handler {
	if l := target.Load(); l != nil {
		return l.Handler()
	}
	return slog.DiscardHandler
}

func (h handler) Enabled(ctx context.Context, l slog.Level) bool  { return h.target().Enabled(ctx, l) }
func (h handler) Handle(ctx context.Context, r slog.Record) error { return h.target().Handle(ctx, r) }
func (h handler) WithAttrs(a []slog.Attr) slog.Handler            { return h.target().WithAttrs(a) }
func (h handler) WithGroup(g string) slog.Handler                 { return h.target().WithGroup(g) }
