package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"

	"github.com/relayd/relayd/config"
)

// TestJournalPrefix: with journal on, every line starts with the syslog
// priority of its level and the rest is the JSON entry; without it, no
// prefix.
func TestJournalPrefix(t *testing.T) {
	var buf bytes.Buffer
	log, atom, err := newLogger(config.Log{Level: "debug", Format: "json"}, &buf, true)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("d")
	log.Info("call ended", zap.String("sip_call_id", "abc@198.18.0.2"))
	log.Warn("w")
	log.Error("e")
	log.DPanic("p")
	atom.SetLevel(zap.WarnLevel)
	log.Info("hidden")
	want := []struct {
		prefix, msg string
	}{{"<7>", "d"}, {"<6>", "call ended"}, {"<4>", "w"}, {"<3>", "e"}, {"<2>", "p"}}
	sc := bufio.NewScanner(&buf)
	i := 0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "<") { // a stack trace of the error entries spans no lines: it is a JSON field
			t.Fatalf("line without prefix: %q", line)
		}
		if i >= len(want) {
			t.Fatalf("extra line %q", line)
		}
		rest, ok := strings.CutPrefix(line, want[i].prefix)
		if !ok {
			t.Errorf("line %d %q: want prefix %s", i, line, want[i].prefix)
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(rest), &e); err != nil {
			t.Errorf("line %d after the prefix is not JSON: %v: %q", i, err, rest)
		}
		if e["msg"] != want[i].msg {
			t.Errorf("line %d msg %v, want %s", i, e["msg"], want[i].msg)
		}
		i++
	}
	if i != len(want) {
		t.Errorf("%d lines, want %d", i, len(want))
	}

	buf.Reset()
	log, _, _ = newLogger(config.Log{Level: "info", Format: "console"}, &buf, false)
	log.Error("plain")
	if strings.HasPrefix(buf.String(), "<") || !strings.Contains(buf.String(), "plain") {
		t.Errorf("without journal: %q", buf.String())
	}
}

func TestToJournal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stream")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	env := func(dev, ino uint64) string { return strconv.FormatUint(dev, 10) + ":" + strconv.FormatUint(ino, 10) }
	if !toJournal(env(uint64(st.Dev), st.Ino), f) {
		t.Error("matching JOURNAL_STREAM not recognised")
	}
	for _, bad := range []string{"", "x", env(uint64(st.Dev), st.Ino+1), "1:a"} {
		if toJournal(bad, f) {
			t.Errorf("JOURNAL_STREAM %q taken for this file", bad)
		}
	}
}
