package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"

	"github.com/relayd/relayd/config"
)

// Journal priorities: relayd logs one line per entry to stderr, as
// before. When stderr is connected to the journal (JOURNAL_STREAM names its
// device and inode), each line starts with a syslog priority prefix "<N>"
// that journald strips and stores as PRIORITY (SyslogLevelPrefix=, on by
// default), so `journalctl -p err` finds the errors. The prefix was chosen
// over the journal's native protocol because it keeps one output path for
// every run (terminal, tests, systemd), cannot lose lines to a full
// journal socket, and the JSON line already carries every field (call_id,
// sip_call_id) for `journalctl -o cat | jq`.

// priority maps a zap level to a syslog priority (sd-daemon.h).
func priority(l zapcore.Level) int {
	switch {
	case l <= zapcore.DebugLevel:
		return 7 // debug
	case l == zapcore.InfoLevel:
		return 6 // info
	case l == zapcore.WarnLevel:
		return 4 // warning
	case l == zapcore.ErrorLevel:
		return 3 // err
	default:
		return 2 // crit: dpanic, panic, fatal
	}
}

// prioEncoder prefixes each encoded entry with its syslog priority.
type prioEncoder struct{ zapcore.Encoder }

func (e prioEncoder) Clone() zapcore.Encoder { return prioEncoder{e.Encoder.Clone()} }

var prefixPool = buffer.NewPool()

func (e prioEncoder) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	line, err := e.Encoder.EncodeEntry(ent, fields)
	if err != nil {
		return nil, err
	}
	out := prefixPool.Get()
	out.AppendByte('<')
	out.AppendInt(int64(priority(ent.Level)))
	out.AppendByte('>')
	out.Write(line.Bytes())
	line.Free()
	return out, nil
}

// printError writes an error from before the logger exists (a config
// that does not load), each line at priority err for the journal.
func printError(w io.Writer, journal bool, msg string) {
	for _, line := range strings.Split(strings.TrimRight(msg, "\n"), "\n") {
		if journal {
			line = "<3>" + line
		}
		fmt.Fprintln(w, line)
	}
}

// toJournal reports whether f is the stream JOURNAL_STREAM ("dev:inode")
// names: systemd connected it to journald.
func toJournal(env string, f *os.File) bool {
	dev, ino, ok := strings.Cut(env, ":")
	if !ok || f == nil {
		return false
	}
	d, err1 := strconv.ParseUint(dev, 10, 64)
	i, err2 := strconv.ParseUint(ino, 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && uint64(st.Dev) == d && st.Ino == i
}

// newLogger builds the daemon's logger writing to w, with journal
// priority prefixes when journal is set. The returned level changes the
// logger's level at run time (SIGHUP).
func newLogger(c config.Log, w io.Writer, journal bool) (*zap.Logger, zap.AtomicLevel, error) {
	level, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, zap.AtomicLevel{}, fmt.Errorf("log level: %w", err)
	}
	atom := zap.NewAtomicLevelAt(level)
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if c.Format == "console" {
		ec = zap.NewDevelopmentEncoderConfig()
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		enc = zapcore.NewConsoleEncoder(ec)
	} else {
		enc = zapcore.NewJSONEncoder(ec)
	}
	if journal {
		enc = prioEncoder{enc}
	}
	ws := zapcore.Lock(zapcore.AddSync(w))
	core := zapcore.NewCore(enc, ws, atom)
	return zap.New(core, zap.AddCaller(), zap.AddStacktrace(zapcore.ErrorLevel), zap.ErrorOutput(ws)), atom, nil
}
