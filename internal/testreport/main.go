// Command testreport runs go test with -json and reports what the plain
// output hides: it prints each package's result as it finishes, the output
// of every failed test, every skipped test with its reason, and the
// slowest tests; and it fails the run when a test was skipped that is not
// on the allow-list and CI is set. A test that skips for want of a tool,
// a library or a privilege proves nothing, and in CI that is a failure
// whichever way the test skipped (a skip helper that fails in CI, or a
// plain t.Skip).
//
//	go run ./internal/testreport [-allow FILE] [-slowest N] [-show REGEXP] -- GO-TEST-ARGS...
//
// -show prints, as they come, the output lines of any test, passed ones
// too, that match REGEXP (a figure a passing test logs, such as how long
// a guest ran).
//
// The allow-list has one entry per line: a package import path (or a
// path pattern ending in /...), a test name (a path.Match pattern on the
// full name, subtests included), and after a # why it may skip in CI.
// Blank lines and lines starting with # are ignored.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type allowEntry struct {
	pkg, test, why string
}

func main() {
	allowFile := flag.String("allow", "", "allow-list of tests that may skip in CI")
	slowest := flag.Int("slowest", 10, "print the N slowest tests")
	show := flag.String("show", "", "print the output lines of any test that match this regexp")
	flag.Parse()
	var showRe *regexp.Regexp
	if *show != "" {
		var err error
		if showRe, err = regexp.Compile(*show); err != nil {
			fmt.Fprintf(os.Stderr, "testreport: -show: %v\n", err)
			os.Exit(2)
		}
	}
	allow, err := readAllow(*allowFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
		os.Exit(2)
	}
	cmd := exec.Command("go", append([]string{"test", "-json"}, flag.Args()...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
		os.Exit(2)
	}
	r := newReport(os.Stdout, allow, os.Getenv("CI") != "")
	r.show = showRe
	if err := r.read(out); err != nil {
		fmt.Fprintf(os.Stderr, "testreport: reading go test's output: %v\n", err)
	}
	waitErr := cmd.Wait()
	ok := r.summary(*slowest)
	var exit *exec.ExitError
	switch {
	case errors.As(waitErr, &exit):
		os.Exit(max(exit.ExitCode(), 1))
	case waitErr != nil:
		fmt.Fprintf(os.Stderr, "testreport: %v\n", waitErr)
		os.Exit(2)
	case !ok:
		os.Exit(1)
	}
}

func readAllow(file string) ([]allowEntry, error) {
	if file == "" {
		return nil, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []allowEntry
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		spec, why, _ := strings.Cut(line, "#")
		f := strings.Fields(spec)
		if len(f) != 2 || strings.TrimSpace(why) == "" {
			return nil, fmt.Errorf("%s:%d: want \"PACKAGE TEST # why\"", file, i+1)
		}
		if _, err := path.Match(f[1], ""); err != nil {
			return nil, fmt.Errorf("%s:%d: test pattern %q: %v", file, i+1, f[1], err)
		}
		out = append(out, allowEntry{pkg: f[0], test: f[1], why: strings.TrimSpace(why)})
	}
	return out, nil
}

func (a allowEntry) matches(pkg, test string) bool {
	if p, ok := strings.CutSuffix(a.pkg, "/..."); ok {
		if pkg != p && !strings.HasPrefix(pkg, p+"/") {
			return false
		}
	} else if pkg != a.pkg {
		return false
	}
	ok, _ := path.Match(a.test, test)
	return ok
}

type testKey struct{ pkg, test string }

type result struct {
	testKey
	elapsed time.Duration
	reason  string // skips: what the test said
}

// report accumulates go test's events.
type report struct {
	w      io.Writer
	allow  []allowEntry
	ci     bool
	output map[testKey][]string // output so far of tests running
	failed []result
	skips  []result
	done   []result
	pkgs   map[string]string // package -> its final action
	show   *regexp.Regexp    // output lines printed whatever the result (-show)
}

func newReport(w io.Writer, allow []allowEntry, ci bool) *report {
	return &report{w: w, allow: allow, ci: ci, output: map[testKey][]string{}, pkgs: map[string]string{}}
}

func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Not an event (a build error printed raw): pass it on.
			fmt.Fprintln(r.w, sc.Text())
			continue
		}
		r.event(e)
	}
	return sc.Err()
}

func (r *report) event(e event) {
	k := testKey{e.Package, e.Test}
	switch e.Action {
	case "output", "build-output":
		r.output[k] = append(r.output[k], e.Output)
		if r.show != nil && e.Test != "" && r.show.MatchString(e.Output) {
			fmt.Fprintf(r.w, "    %s: %s\n", e.Test, strings.TrimSpace(e.Output))
		}
	case "pass", "fail", "skip":
		lines := r.output[k]
		delete(r.output, k)
		res := result{testKey: k, elapsed: time.Duration(e.Elapsed * float64(time.Second))}
		if e.Test == "" {
			r.pkgs[e.Package] = e.Action
			r.pkgDone(e, lines)
			return
		}
		top := !strings.Contains(e.Test, "/")
		switch e.Action {
		case "pass":
			if top {
				r.done = append(r.done, res)
			}
		case "fail":
			if top {
				r.done = append(r.done, res)
			}
			r.failed = append(r.failed, res)
			fmt.Fprintf(r.w, "--- FAIL: %s (%s)\n%s", e.Test, e.Package, strings.Join(testLines(lines), ""))
		case "skip":
			res.reason = skipReason(lines)
			r.skips = append(r.skips, res)
		}
	}
}

// pkgDone prints a package's result line, as go test does, and its
// output when it failed outside any test (a build error, a panic, a
// timeout).
func (r *report) pkgDone(e event, lines []string) {
	switch e.Action {
	case "fail":
		fmt.Fprint(r.w, strings.Join(lines, ""))
		if len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], "FAIL") {
			fmt.Fprintf(r.w, "FAIL\t%s\t%.3fs\n", e.Package, e.Elapsed)
		}
	case "skip":
		fmt.Fprintf(r.w, "?   \t%s\t[no test files]\n", e.Package)
	default:
		fmt.Fprintf(r.w, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
	}
}

// testLines drops the framing go test adds around a test's own output.
func testLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "=== RUN") || strings.HasPrefix(t, "=== PAUSE") || strings.HasPrefix(t, "=== CONT") || strings.HasPrefix(t, "=== NAME") {
			continue
		}
		out = append(out, l)
	}
	return out
}

func skipReason(lines []string) string {
	var out []string
	for _, l := range testLines(lines) {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		out = append(out, t)
	}
	return strings.Join(out, " | ")
}

func (r *report) allowed(k testKey) (string, bool) {
	for _, a := range r.allow {
		if a.matches(k.pkg, k.test) {
			return a.why, true
		}
	}
	return "", false
}

// summary prints the skips and the slowest tests and reports whether the
// skips are acceptable.
func (r *report) summary(slowest int) bool {
	ok := len(r.failed) == 0
	for _, a := range r.pkgs {
		if a == "fail" {
			ok = false
		}
	}
	if len(r.skips) > 0 {
		fmt.Fprintf(r.w, "\n%d skipped tests:\n", len(r.skips))
		var bad int
		for _, s := range r.skips {
			why, allowed := r.allowed(s.testKey)
			verdict := "allowed: " + why
			if !allowed {
				verdict = "NOT on the allow-list"
				bad++
			}
			fmt.Fprintf(r.w, "  SKIP %s %s: %s [%s]\n", s.pkg, s.test, s.reason, verdict)
		}
		if bad > 0 && r.ci {
			fmt.Fprintf(r.w, "FAIL: %d tests skipped in CI that are not on the allow-list: a capability the tests need is missing here\n", bad)
			ok = false
		}
	}
	slices.SortFunc(r.done, func(a, b result) int { return int(b.elapsed - a.elapsed) })
	if n := min(slowest, len(r.done)); n > 0 {
		fmt.Fprintf(r.w, "\nslowest tests:\n")
		for _, d := range r.done[:n] {
			fmt.Fprintf(r.w, "  %8.1fs %s %s\n", d.elapsed.Seconds(), d.pkg, d.test)
		}
	}
	return ok
}
