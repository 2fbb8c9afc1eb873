// Package state is relayd's durable call state: a store below every front
// end (the SIP B2BUA, later the rtpengine ng front end) that keeps what a
// restarted relayd needs to take its calls back. It knows no front end's
// types: a record is an opaque blob under a namespace ("sip", "ng") and a
// key (a call id).
//
// The store is a bbolt file (go.etcd.io/bbolt: one file, copy-on-write
// B+tree, every committed transaction fsync'd, no recovery step after a
// crash). Put and Delete return once the change is on disk; concurrent
// calls share one transaction and one fsync (group commit, bbolt's Batch).
// See docs/state.md for the durability model and schema versioning.
package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"
)

// Schema is the layout of the store this relayd writes: bucket names,
// meta keys and what a record is. Compat is the oldest schema whose
// readers can use a file written with Schema: a change a previous relayd
// can live with (a new namespace, a new meta key) raises Schema only.
const (
	Schema = 1
	Compat = 1
)

// ErrSchema: the file was written by a newer relayd whose schema this
// one cannot read. The returned error wraps it with the versions.
var ErrSchema = errors.New("state file schema not supported")

var (
	metaBucket  = []byte("meta")
	dataBucket  = []byte("records") // one sub-bucket per namespace
	keySchema   = []byte("schema")
	keyCompat   = []byte("compat")
	keyWritten  = []byte("written_by")
	errReadOnly = errors.New("state store is closed")
)

// Migration turns a file of schema From into one of schema From+1, inside
// the transaction that opens the store: a failed migration leaves the file
// as it was.
type Migration struct {
	From int
	Do   func(tx *bolt.Tx) error
}

// migrations from older schemas; empty while Schema is 1.
var migrations []Migration

// Config configures the store.
type Config struct {
	// Path of the file; its directory is created (mode 0750) if missing.
	Path string
	// LockTimeout bounds the wait for the file lock another process (a
	// relayd still running) holds; default 5s.
	LockTimeout time.Duration
	// Version names the relayd writing the file, for the meta bucket.
	Version string
	// MaxBatchDelay is how long a Put waits for others to share its
	// commit; default 2ms. The fsync dominates anyway.
	MaxBatchDelay time.Duration

	// Test knobs: the schema this store writes and the migrations it has.
	schema, compat int
	migrations     []Migration
}

// Records is what a front end keeps its calls in, one namespace each
// (the SIP B2BUA's "sip", the ng engine's "ng"): a *Store, or a fake in
// tests.
type Records interface {
	Put(namespace, key string, value []byte) error
	// Get returns a copy of the record, and whether there is one.
	Get(namespace, key string) ([]byte, bool, error)
	Delete(namespace, key string) error
	ForEach(namespace string, f func(key string, value []byte) error) error
}

var _ Records = (*Store)(nil)

// Store is an open state file. Safe for concurrent use; the zero value is
// not usable (Open).
type Store struct {
	db  *bolt.DB
	log *zap.Logger
	m   metrics
}

// Open opens or creates the file, migrates an older schema and refuses a
// newer one it cannot read (ErrSchema).
func Open(cfg Config, log *zap.Logger) (*Store, error) {
	if cfg.Path == "" {
		return nil, errors.New("state: no path")
	}
	if cfg.LockTimeout <= 0 {
		cfg.LockTimeout = 5 * time.Second
	}
	if cfg.MaxBatchDelay <= 0 {
		cfg.MaxBatchDelay = 2 * time.Millisecond
	}
	if cfg.schema == 0 {
		cfg.schema, cfg.compat, cfg.migrations = Schema, Compat, migrations
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Path), 0o750); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	// The free pages are not written at each commit (NoFreelistSync) and
	// are kept in bbolt's hash map (FreelistMapType), as etcd keeps its:
	// after a busy hour the file has thousands of free pages, and with
	// bbolt's defaults every commit then wrote all of their IDs (a new
	// buffer of that many pages) and merged the freed ones into a new
	// sorted array, about 115 KB allocated per call at 500 calls a
	// second once 10,000 had come and gone. Opening the file walks it
	// to find the free pages instead: a state file holds the calls up,
	// a few MB.
	db, err := bolt.Open(cfg.Path, 0o600, &bolt.Options{
		Timeout:        cfg.LockTimeout,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("state: open %s: locked by another process (is another relayd running?): %w", cfg.Path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("state: open %s: %w", cfg.Path, err)
	}
	db.MaxBatchDelay = cfg.MaxBatchDelay
	s := &Store{db: db, log: log, m: newMetrics()}
	if err := s.init(cfg); err != nil {
		db.Close()
		return nil, fmt.Errorf("state: %s: %w", cfg.Path, err)
	}
	return s, nil
}

func (s *Store) init(cfg Config) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(metaBucket)
		if meta == nil {
			// A new file.
			var err error
			if meta, err = tx.CreateBucket(metaBucket); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(dataBucket); err != nil {
				return err
			}
			return stamp(meta, cfg.schema, cfg.compat, cfg.Version)
		}
		schema, compat := getInt(meta, keySchema), getInt(meta, keyCompat)
		if schema == 0 || compat == 0 || compat > schema {
			return fmt.Errorf("meta bucket damaged (schema %d, compat %d)", schema, compat)
		}
		by := string(meta.Get(keyWritten))
		switch {
		case compat > cfg.schema:
			return fmt.Errorf("%w: written by relayd %s with schema %d, readable from schema %d on; this relayd has schema %d. "+
				"Run the newer relayd, or move the file aside to start without its calls", ErrSchema, by, schema, compat, cfg.schema)
		case schema > cfg.schema:
			// A newer relayd wrote it and said this one may use it: keep
			// its stamp, so the newer one finds its own schema again.
			s.log.Info("state file of a newer schema, compatible with this one",
				zap.Int("schema", schema), zap.Int("our_schema", cfg.schema), zap.String("written_by", by))
			return nil
		case schema == cfg.schema:
			return nil
		}
		for v := schema; v < cfg.schema; v++ {
			m, ok := migration(cfg.migrations, v)
			if !ok {
				return fmt.Errorf("%w: no migration from schema %d to %d", ErrSchema, v, v+1)
			}
			if err := m.Do(tx); err != nil {
				return fmt.Errorf("migrate schema %d to %d: %w", v, v+1, err)
			}
		}
		s.log.Info("state file migrated", zap.Int("from_schema", schema), zap.Int("schema", cfg.schema))
		return stamp(meta, cfg.schema, cfg.compat, cfg.Version)
	})
}

func migration(ms []Migration, from int) (Migration, bool) {
	for _, m := range ms {
		if m.From == from {
			return m, true
		}
	}
	return Migration{}, false
}

func stamp(meta *bolt.Bucket, schema, compat int, version string) error {
	if err := putInt(meta, keySchema, schema); err != nil {
		return err
	}
	if err := putInt(meta, keyCompat, compat); err != nil {
		return err
	}
	return meta.Put(keyWritten, []byte(version))
}

func putInt(b *bolt.Bucket, k []byte, v int) error {
	return b.Put(k, binary.BigEndian.AppendUint32(nil, uint32(v)))
}

func getInt(b *bolt.Bucket, k []byte) int {
	v := b.Get(k)
	if len(v) != 4 {
		return 0
	}
	return int(binary.BigEndian.Uint32(v))
}

// SchemaInfo returns the file's schema, compat and writer.
func (s *Store) SchemaInfo() (schema, compat int, writtenBy string, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(metaBucket)
		schema, compat, writtenBy = getInt(meta, keySchema), getInt(meta, keyCompat), string(meta.Get(keyWritten))
		return nil
	})
	return
}

// Put stores value under namespace and key, replacing what was there. It
// returns once the record is on disk; concurrent Puts and Deletes share
// one commit. value is copied.
func (s *Store) Put(namespace, key string, value []byte) error {
	if namespace == "" || key == "" {
		return errors.New("state: put: empty namespace or key")
	}
	start := time.Now()
	err := s.db.Batch(func(tx *bolt.Tx) error {
		s.m.sharing(tx)
		b, err := tx.Bucket(dataBucket).CreateBucketIfNotExists([]byte(namespace))
		if err != nil {
			return err
		}
		return b.Put([]byte(key), value)
	})
	s.m.done(opPut, len(value), start, err)
	if err != nil {
		return fmt.Errorf("state: put %s/%s: %w", namespace, key, closedErr(err))
	}
	return nil
}

// Delete removes a record; a missing one is not an error.
func (s *Store) Delete(namespace, key string) error {
	start := time.Now()
	err := s.db.Batch(func(tx *bolt.Tx) error {
		s.m.sharing(tx)
		b := tx.Bucket(dataBucket).Bucket([]byte(namespace))
		if b == nil {
			return nil
		}
		return b.Delete([]byte(key))
	})
	s.m.done(opDelete, 0, start, err)
	if err != nil {
		return fmt.Errorf("state: delete %s/%s: %w", namespace, key, closedErr(err))
	}
	return nil
}

// Get returns a copy of one record, or false.
func (s *Store) Get(namespace, key string) ([]byte, bool, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(dataBucket).Bucket([]byte(namespace)); b != nil {
			if v := b.Get([]byte(key)); v != nil {
				out = append([]byte{}, v...)
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("state: get %s/%s: %w", namespace, key, closedErr(err))
	}
	return out, out != nil, nil
}

// ForEach calls f with every record of a namespace, in key order, in one
// read transaction; f must not keep value (copy it) nor call the store.
// An error from f stops the walk and is returned.
func (s *Store) ForEach(namespace string, f func(key string, value []byte) error) error {
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(dataBucket).Bucket([]byte(namespace))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error { return f(string(k), v) })
	})
	if err != nil {
		return fmt.Errorf("state: list %s: %w", namespace, closedErr(err))
	}
	return nil
}

// Len returns the number of records in a namespace.
func (s *Store) Len(namespace string) (int, error) {
	n := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(dataBucket).Bucket([]byte(namespace)); b != nil {
			n = b.Stats().KeyN
		}
		return nil
	})
	return n, err
}

// Close closes the file; the store is unusable after.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("state: close: %w", err)
	}
	return nil
}

func closedErr(err error) error {
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
		return errors.Join(errReadOnly, err)
	}
	return err
}
