// Package cdr writes call detail records: one JSON object per line in a
// file, fsync'd in batches and rotated by size, and optionally POSTed to a
// collector (the route server) with retries from a bounded queue.
package cdr

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/call"
)

// Config configures a Writer.
type Config struct {
	Path          string        // JSON lines file; empty: no file
	PostURL       string        // POST each record here; empty: no posting
	MaxSize       int64         // rotate once the file passes this size; default 100 MiB
	Keep          int           // rotated files kept (path.1 newest); default 10
	FsyncInterval time.Duration // default 1s
	QueueSize     int           // records waiting to be posted; default 10000
	PostTimeout   time.Duration // per POST; default 5s
	// RetryMax caps the pause between retries of a failed POST; default 10s.
	RetryMax time.Duration
}

func (c *Config) setDefaults() {
	if c.MaxSize <= 0 {
		c.MaxSize = 100 << 20
	}
	if c.Keep <= 0 {
		c.Keep = 10
	}
	if c.FsyncInterval <= 0 {
		c.FsyncInterval = time.Second
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 10000
	}
	if c.PostTimeout <= 0 {
		c.PostTimeout = 5 * time.Second
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 10 * time.Second
	}
}

// Record is one CDR line: the call's final snapshot.
type Record struct {
	Type string `json:"type"` // "cdr"
	call.Info
}

// Stats count what the writer did.
type Stats struct {
	Written     uint64 // records written to the file
	Posted      uint64 // records the collector accepted
	PostErrors  uint64 // failed POSTs (each retry counts)
	Dropped     uint64 // records not posted: the queue was full
	WriteErrors uint64 // records that could not be written to the file
}

// Writer writes CDRs. Create it with New, stop it with Close. Write is
// safe for concurrent use and never blocks on the collector.
type Writer struct {
	cfg    Config
	log    *zap.Logger
	client *http.Client
	queue  chan []byte
	cancel context.CancelFunc
	wg     sync.WaitGroup

	written, posted, postErrors, dropped, writeErrors atomic.Uint64

	mu    sync.Mutex // guards the following
	f     *os.File
	size  int64
	dirty bool
}

// New opens the file (creating its directory) and starts the background
// fsync and post loops.
func New(cfg Config, log *zap.Logger) (*Writer, error) {
	cfg.setDefaults()
	w := &Writer{cfg: cfg, log: log, client: &http.Client{Timeout: cfg.PostTimeout}}
	if cfg.Path != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.Path), 0o750); err != nil {
			return nil, fmt.Errorf("cdr: %w", err)
		}
		if err := w.open(); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	if cfg.Path != "" {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.syncLoop(ctx)
		}()
	}
	if cfg.PostURL != "" {
		w.queue = make(chan []byte, cfg.QueueSize)
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.postLoop(ctx)
		}()
	}
	return w, nil
}

func (w *Writer) open() error {
	f, err := os.OpenFile(w.cfg.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("cdr: open: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("cdr: %w", err)
	}
	w.f, w.size = f, fi.Size()
	return nil
}

// Write records one call.
func (w *Writer) Write(info call.Info) {
	e := encoders.Get().(*encoder)
	defer encoders.Put(e)
	e.buf.Reset()
	if err := e.enc.Encode(Record{Type: "cdr", Info: info}); err != nil {
		w.writeErrors.Add(1)
		w.log.Error("encode CDR", zap.String("call", info.ID), zap.Error(err))
		return
	}
	line := e.buf.Bytes() // the record and its newline
	if w.cfg.Path != "" {
		w.writeLine(line)
	}
	if w.queue != nil {
		select {
		case w.queue <- bytes.Clone(line[:len(line)-1]):
		default:
			w.dropped.Add(1)
		}
	}
}

// encoder encodes records into a buffer of its own: a line per call
// costs no buffer, nor a copy to add its newline.
type encoder struct {
	buf bytes.Buffer
	enc *json.Encoder
}

var encoders = sync.Pool{New: func() any {
	e := &encoder{}
	e.enc = json.NewEncoder(&e.buf)
	return e
}}

func (w *Writer) writeLine(line []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		w.writeErrors.Add(1)
		return
	}
	if _, err := w.f.Write(line); err != nil {
		w.writeErrors.Add(1)
		w.log.Error("write CDR", zap.Error(err))
		return
	}
	w.written.Add(1)
	w.size += int64(len(line))
	w.dirty = true
	if w.size >= w.cfg.MaxSize {
		if err := w.rotate(); err != nil {
			w.log.Error("rotate CDR file", zap.Error(err))
		}
	}
}

// rotate moves path to path.1 (path.1 to path.2, ...) and opens a new
// file; w.mu must be held.
func (w *Writer) rotate() error {
	errs := []error{w.f.Sync(), w.f.Close()}
	w.f, w.dirty = nil, false
	for i := w.cfg.Keep - 1; i >= 1; i-- {
		from := w.cfg.Path + "." + strconv.Itoa(i)
		if _, err := os.Stat(from); err == nil {
			errs = append(errs, os.Rename(from, w.cfg.Path+"."+strconv.Itoa(i+1)))
		}
	}
	errs = append(errs, os.Rename(w.cfg.Path, w.cfg.Path+".1"))
	errs = append(errs, w.open())
	return errors.Join(errs...)
}

// Sync writes buffered records to stable storage.
func (w *Writer) Sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil || !w.dirty {
		return nil
	}
	w.dirty = false
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("cdr: fsync: %w", err)
	}
	return nil
}

func (w *Writer) syncLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.FsyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := w.Sync(); err != nil {
				w.log.Error("sync CDR file", zap.Error(err))
			}
		}
	}
}

func (w *Writer) postLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-w.queue:
			w.postRetry(ctx, b)
		}
	}
}

// postRetry posts one record until the collector takes it or ctx ends,
// backing off up to RetryMax.
func (w *Writer) postRetry(ctx context.Context, b []byte) {
	pause := 100 * time.Millisecond
	for {
		err := w.post(ctx, b)
		if err == nil {
			w.posted.Add(1)
			return
		}
		w.postErrors.Add(1)
		w.log.Debug("post CDR", zap.Error(err), zap.Duration("retry_in", pause))
		select {
		case <-ctx.Done():
			w.dropped.Add(1)
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, w.cfg.RetryMax)
	}
}

func (w *Writer) post(ctx context.Context, b []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.PostURL, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("collector answered %s", resp.Status)
	}
	return nil
}

// Stats returns the counters.
func (w *Writer) Stats() Stats {
	return Stats{
		Written: w.written.Load(), Posted: w.posted.Load(), PostErrors: w.postErrors.Load(),
		Dropped: w.dropped.Load(), WriteErrors: w.writeErrors.Load(),
	}
}

// Close posts what is queued for up to ctx's deadline, then stops the
// loops, fsyncs and closes the file. Records still queued are counted as
// dropped.
func (w *Writer) Close(ctx context.Context) error {
	if w.queue != nil {
	drain:
		for {
			select {
			case b := <-w.queue:
				if err := w.post(ctx, b); err != nil {
					w.dropped.Add(1)
				} else {
					w.posted.Add(1)
				}
			case <-ctx.Done():
				break drain
			default:
				break drain
			}
		}
	}
	w.cancel()
	w.wg.Wait()
	if w.queue != nil {
		w.dropped.Add(uint64(len(w.queue)))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := errors.Join(w.f.Sync(), w.f.Close())
	w.f = nil
	if err != nil {
		return fmt.Errorf("cdr: close: %w", err)
	}
	return nil
}
