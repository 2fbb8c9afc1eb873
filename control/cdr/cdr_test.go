package cdr

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/control/call"
)

func info(id string) call.Info {
	return call.Info{ID: id, Disposition: call.Answered, Code: 200, Attempts: []call.Attempt{{Destination: "sip:198.18.2.2", Code: 200}}}
}

func readLines(t *testing.T, path string) []Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestWriteAndRotate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "cdr.jsonl")
	w, err := New(Config{Path: path, MaxSize: 600, Keep: 2, FsyncInterval: 10 * time.Millisecond}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		w.Write(info(string(rune('a' + i))))
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w.Stats().Written != 10 {
		t.Errorf("stats %+v", w.Stats())
	}
	cur := readLines(t, path)
	one := readLines(t, path+".1")
	two := readLines(t, path+".2")
	if _, err := os.Stat(path + ".3"); err == nil {
		t.Error("keep = 2 left a third rotated file")
	}
	if len(cur)+len(one)+len(two) == 0 || len(one) == 0 {
		t.Fatalf("lines: %d current, %d .1, %d .2", len(cur), len(one), len(two))
	}
	last := cur
	if len(last) == 0 {
		last = one
	}
	if r := last[len(last)-1]; r.ID != "j" || r.Type != "cdr" || r.Disposition != call.Answered || len(r.Attempts) != 1 {
		t.Errorf("last record %+v", r)
	}
}

func TestPostRetryAndOverflow(t *testing.T) {
	var fails atomic.Int32
	fails.Store(2)
	var mu sync.Mutex
	var got []string
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var rec Record
		json.Unmarshal(b, &rec)
		if rec.ID == "slow" {
			<-block
		}
		if fails.Add(-1) >= 0 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		mu.Lock()
		got = append(got, rec.ID)
		mu.Unlock()
	}))
	defer srv.Close()
	w, err := New(Config{PostURL: srv.URL, QueueSize: 2, RetryMax: 20 * time.Millisecond}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	w.Write(info("first"))
	deadline := time.Now().Add(5 * time.Second)
	for w.Stats().Posted != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("not posted after retries: %+v", w.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s := w.Stats(); s.PostErrors != 2 {
		t.Errorf("stats %+v, want 2 failed POSTs", s)
	}
	// A slow collector: the queue holds 2, the rest is counted.
	w.Write(info("slow"))
	time.Sleep(50 * time.Millisecond) // the poster is blocked on "slow"
	for _, id := range []string{"q1", "q2", "over1", "over2"} {
		w.Write(info(id))
	}
	if s := w.Stats(); s.Dropped != 2 {
		t.Errorf("dropped %d, want 2", s.Dropped)
	}
	close(block)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for w.Stats().Posted != 4 {
		if ctx.Err() != nil {
			t.Fatalf("stats %+v", w.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 4 || got[0] != "first" || got[3] != "q2" {
		t.Errorf("collector got %v", got)
	}
}

// TestRecordBytes: a record is written as json.Marshal encodes it, one
// per line, and posted without the newline.
func TestRecordBytes(t *testing.T) {
	posted := make(chan []byte, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		posted <- b
	}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "cdr.jsonl")
	w, err := New(Config{Path: path, PostURL: srv.URL}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	in := info("a<b>&c")
	in.From = "\"Ann\" <sip:ann@198.18.0.2>"
	w.Write(in)
	var body []byte
	select {
	case body = <-posted:
	case <-time.After(5 * time.Second):
		t.Fatal("nothing posted")
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(Record{Type: "cdr", Info: in})
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(file) != string(want)+"\n" {
		t.Errorf("line %q, want %q and a newline", file, want)
	}
	if string(body) != string(want) {
		t.Errorf("posted %q, want %q", body, want)
	}
}
