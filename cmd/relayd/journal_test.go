package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
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

func TestPrintError(t *testing.T) {
	var b bytes.Buffer
	printError(&b, true, "relayd: f.toml: line 2: log.level: bad\nf.toml: dataplane.interfaces: required\n")
	if want := "<3>relayd: f.toml: line 2: log.level: bad\n<3>f.toml: dataplane.interfaces: required\n"; b.String() != want {
		t.Errorf("journal: %q, want %q", b.String(), want)
	}
	b.Reset()
	printError(&b, false, "relayd: bad")
	if b.String() != "relayd: bad\n" {
		t.Errorf("terminal: %q", b.String())
	}
}

// TestMain lets a test run relayd's main in a child process (the test
// binary again, with RELAYD_TEST_MAIN set), with real standard streams.
func TestMain(m *testing.M) {
	if os.Getenv("RELAYD_TEST_MAIN") == "1" {
		os.Args = append([]string{"relayd"}, strings.Fields(os.Getenv("RELAYD_TEST_ARGS"))...)
		main()
		return
	}
	os.Exit(m.Run())
}

// TestJournalStream runs relayd with stderr on a file that JOURNAL_STREAM
// names, as systemd does with the journal's stream socket: its error lines
// carry priority 3; with JOURNAL_STREAM naming something else, none.
func TestJournalStream(t *testing.T) {
	bad := writeFile(t, "[log]\nlevel = \"loud\"\n")
	for _, match := range []bool{true, false} {
		f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
		if err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		ino := st.Ino
		if !match {
			ino++
		}
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "RELAYD_TEST_MAIN=1", "RELAYD_TEST_ARGS=-config "+bad,
			"JOURNAL_STREAM="+strconv.FormatUint(uint64(st.Dev), 10)+":"+strconv.FormatUint(ino, 10))
		cmd.Stderr = f
		if err := cmd.Run(); err == nil {
			t.Fatal("relayd with a bad config exited 0")
		}
		f.Close()
		b, _ := os.ReadFile(f.Name())
		out := string(b)
		if !strings.Contains(out, "log.level") || strings.HasPrefix(out, "<3>") != match {
			t.Errorf("JOURNAL_STREAM matching %v: stderr %q", match, out)
		}
	}
}
