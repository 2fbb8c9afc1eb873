package state

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap/zaptest"
)

func open(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPutGetDeleteReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "state.db")
	s := open(t, Config{Path: path, Version: "test"})
	if err := s.Put("sip", "c1", []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("sip", "c2", []byte("two")); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("ng", "c1", []byte("other namespace")); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("sip", "c1", []byte("one again")); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("sip", "c2"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("sip", "missing"); err != nil {
		t.Errorf("delete of a missing record: %v", err)
	}
	if err := s.Put("", "x", nil); err == nil {
		t.Error("empty namespace accepted")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("sip", "c3", []byte("x")); err == nil {
		t.Error("put after close succeeded")
	}
	s = open(t, Config{Path: path})
	defer s.Close()
	got := map[string]string{}
	if err := s.ForEach("sip", func(k string, v []byte) error { got[k] = string(v); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["c1"] != "one again" {
		t.Errorf("sip records after reopen: %v", got)
	}
	v, ok, err := s.Get("ng", "c1")
	if err != nil || !ok || string(v) != "other namespace" {
		t.Errorf("ng/c1 = %q %v %v", v, ok, err)
	}
	if n, _ := s.Len("sip"); n != 1 {
		t.Errorf("Len(sip) = %d", n)
	}
	schema, compat, by, err := s.SchemaInfo()
	if err != nil || schema != Schema || compat != Compat || by != "test" {
		t.Errorf("schema %d compat %d written by %q, %v", schema, compat, by, err)
	}
}

// The free pages are not written to the file (NoFreelistSync): a store
// opened again finds those its calls left and writes the next calls'
// records there, instead of growing the file.
func TestFreePagesAfterReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	record := []byte(strings.Repeat("x", 2500)) // a held call's record: the dialogs' text
	// 4,000 calls' records in one commit (Put commits each, with an
	// fsync), then the same calls ending.
	each := func(s *Store, round int, f func(b *bolt.Bucket, key []byte) error) {
		t.Helper()
		if err := s.db.Update(func(tx *bolt.Tx) error {
			b, err := tx.Bucket(dataBucket).CreateBucketIfNotExists([]byte("sip"))
			for i := range 4000 {
				if err == nil {
					err = f(b, fmt.Appendf(nil, "r%d-%d", round, i))
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	fill := func(s *Store, round int) {
		each(s, round, func(b *bolt.Bucket, key []byte) error { return b.Put(key, record) })
	}
	size := func() int64 {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	s := open(t, Config{Path: path})
	fill(s, 0)
	each(s, 0, func(b *bolt.Bucket, key []byte) error { return b.Delete(key) })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	full := size()
	s = open(t, Config{Path: path})
	defer s.Close()
	if n, _ := s.Len("sip"); n != 0 {
		t.Fatalf("%d records after reopen, want none", n)
	}
	fill(s, 1)
	if n, _ := s.Len("sip"); n != 4000 {
		t.Errorf("%d records, want 4000", n)
	}
	if got := size(); got > full+full/4 {
		t.Errorf("the file grew from %d to %d bytes: the pages freed before the reopen were not used again", full, got)
	}
	// With thousands of pages free (the first round's, freed again), a
	// commit costs what it writes, not the free list: bbolt's defaults
	// wrote the list at every commit and merged into a new sorted copy
	// of it, tens of KB a call.
	each(s, 1, func(b *bolt.Bucket, key []byte) error { return b.Delete(key) })
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const puts = 20
	for i := range puts {
		if err := s.Put("sip", fmt.Sprintf("c%d", i), record); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / puts; per > 40<<10 {
		t.Errorf("a Put with %d pages free allocates %d bytes", full/4096, per)
	} else {
		t.Logf("a Put with about %d pages free allocates %d bytes", full/4096, per)
	}
}

func TestConcurrentPuts(t *testing.T) {
	s := open(t, Config{Path: filepath.Join(t.TempDir(), "state.db")})
	defer s.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	start := time.Now()
	for i := range 200 {
		wg.Go(func() {
			if err := s.Put("sip", strconv.Itoa(i), []byte(strings.Repeat("x", 2000))); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n, _ := s.Len("sip"); n != 200 {
		t.Errorf("%d records, want 200", n)
	}
	t.Logf("200 concurrent puts in %v", time.Since(start))
}

func TestLockedByAnotherStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, Config{Path: path})
	defer s.Close()
	_, err := Open(Config{Path: path, LockTimeout: 100 * time.Millisecond}, zaptest.NewLogger(t))
	if err == nil || !strings.Contains(err.Error(), "another relayd") {
		t.Errorf("second open: %v", err)
	}
}

// v2 is a made-up next schema: records move from a namespace's bucket
// into "<namespace>.v2" with a prefix, so the test can see them migrated.
var v2 = []Migration{{From: 1, Do: func(tx *bolt.Tx) error {
	data := tx.Bucket(dataBucket)
	old := data.Bucket([]byte("sip"))
	if old == nil {
		return nil
	}
	nb, err := data.CreateBucket([]byte("sip.v2"))
	if err != nil {
		return err
	}
	if err := old.ForEach(func(k, v []byte) error { return nb.Put(k, append([]byte("v2:"), v...)) }); err != nil {
		return err
	}
	return data.DeleteBucket([]byte("sip"))
}}}

func TestMigrateOlderSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, Config{Path: path, Version: "old"})
	s.Put("sip", "c1", []byte("call"))
	s.Close()

	s = open(t, Config{Path: path, Version: "new", schema: 2, compat: 2, migrations: v2})
	v, ok, _ := s.Get("sip.v2", "c1")
	if !ok || string(v) != "v2:call" {
		t.Errorf("migrated record %q %v", v, ok)
	}
	schema, compat, by, _ := s.SchemaInfo()
	if schema != 2 || compat != 2 || by != "new" {
		t.Errorf("after migration: schema %d compat %d by %q", schema, compat, by)
	}
	s.Close()

	// The previous relayd (schema 1) refuses it: compat 2 says it cannot
	// read it.
	_, err := Open(Config{Path: path}, zaptest.NewLogger(t))
	if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), "schema 2") || !strings.Contains(err.Error(), "relayd new") {
		t.Errorf("schema 1 opening a compat-2 file: %v", err)
	}
}

func TestFailedMigrationLeavesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, Config{Path: path})
	s.Put("sip", "c1", []byte("call"))
	s.Close()
	bad := []Migration{{From: 1, Do: func(tx *bolt.Tx) error {
		tx.Bucket(dataBucket).DeleteBucket([]byte("sip"))
		return errors.New("disk on fire")
	}}}
	if _, err := Open(Config{Path: path, schema: 2, compat: 2, migrations: bad}, zaptest.NewLogger(t)); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("failed migration: %v", err)
	}
	if _, err := Open(Config{Path: path, schema: 3, compat: 3, migrations: v2}, zaptest.NewLogger(t)); !errors.Is(err, ErrSchema) {
		t.Errorf("missing migration 2->3: %v", err)
	}
	s = open(t, Config{Path: path})
	defer s.Close()
	if v, ok, _ := s.Get("sip", "c1"); !ok || string(v) != "call" {
		t.Errorf("record after a failed migration: %q %v", v, ok)
	}
	if schema, _, _, _ := s.SchemaInfo(); schema != 1 {
		t.Errorf("schema %d after a failed migration", schema)
	}
}

// A newer relayd that keeps compat 1 (an additive change) writes schema 2;
// this relayd still opens it, and leaves the stamp for the newer one.
func TestNewerCompatibleSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, Config{Path: path, Version: "new", schema: 2, compat: 1})
	s.Put("sip", "c1", []byte("call"))
	s.Close()
	s = open(t, Config{Path: path, Version: "old"})
	if v, ok, _ := s.Get("sip", "c1"); !ok || string(v) != "call" {
		t.Errorf("record %q %v", v, ok)
	}
	s.Put("sip", "c2", []byte("from the old one"))
	schema, compat, by, _ := s.SchemaInfo()
	if schema != 2 || compat != 1 || by != "new" {
		t.Errorf("stamp changed by the older relayd: schema %d compat %d by %q", schema, compat, by)
	}
	s.Close()
}

func TestDamagedMeta(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		b, _ := tx.CreateBucket(metaBucket)
		return b.Put(keySchema, []byte("garbage"))
	})
	db.Close()
	if _, err := Open(Config{Path: path}, zaptest.NewLogger(t)); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("damaged meta: %v", err)
	}
	os.WriteFile(path, []byte("not a bbolt file at all, just text"), 0o600)
	if _, err := Open(Config{Path: path}, zaptest.NewLogger(t)); err == nil {
		t.Error("a text file opened as a store")
	}
}

// TestKill9 puts records in a child process and kills it with SIGKILL: every
// record whose Put returned is in the file.
func TestKill9(t *testing.T) {
	if path := os.Getenv("STATE_TEST_CHILD"); path != "" {
		s, err := Open(Config{Path: path}, zaptest.NewLogger(t))
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		for i := 0; ; i++ {
			if err := s.Put("sip", fmt.Sprintf("call-%06d", i), []byte(strings.Repeat("r", 3000))); err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			fmt.Println("put", i)
		}
	}
	path := filepath.Join(t.TempDir(), "state.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKill9$")
	cmd.Env = append(os.Environ(), "STATE_TEST_CHILD="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	acked := -1
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "error") {
			t.Fatal(line)
		}
		if n, ok := strings.CutPrefix(line, "put "); ok {
			acked, _ = strconv.Atoi(n)
			if acked == 300 {
				cmd.Process.Kill()
				break
			}
		}
	}
	cmd.Wait()
	s := open(t, Config{Path: path})
	defer s.Close()
	for i := 0; i <= acked; i++ {
		if _, ok, err := s.Get("sip", fmt.Sprintf("call-%06d", i)); !ok || err != nil {
			t.Fatalf("record %d acknowledged before kill -9 is missing (%v)", i, err)
		}
	}
	n, _ := s.Len("sip")
	t.Logf("%d puts acknowledged before SIGKILL, %d records in the file", acked+1, n)
}
