package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A go test -json stream: a package with a pass, a skip with its reason
// and a failure with its output, and a package that skips an allowed test.
const stream = `{"Action":"start","Package":"example.com/a"}
{"Action":"run","Package":"example.com/a","Test":"TestPass"}
{"Action":"output","Package":"example.com/a","Test":"TestPass","Output":"=== RUN   TestPass\n"}
{"Action":"pass","Package":"example.com/a","Test":"TestPass","Elapsed":2.5}
{"Action":"run","Package":"example.com/a","Test":"TestNeedsTool"}
{"Action":"output","Package":"example.com/a","Test":"TestNeedsTool","Output":"=== RUN   TestNeedsTool\n"}
{"Action":"output","Package":"example.com/a","Test":"TestNeedsTool","Output":"    a_test.go:9: sipp not installed\n"}
{"Action":"output","Package":"example.com/a","Test":"TestNeedsTool","Output":"--- SKIP: TestNeedsTool (0.00s)\n"}
{"Action":"skip","Package":"example.com/a","Test":"TestNeedsTool","Elapsed":0}
{"Action":"run","Package":"example.com/a","Test":"TestBroken"}
{"Action":"output","Package":"example.com/a","Test":"TestBroken","Output":"    a_test.go:12: got 1, want 2\n"}
{"Action":"output","Package":"example.com/a","Test":"TestBroken","Output":"--- FAIL: TestBroken (0.10s)\n"}
{"Action":"fail","Package":"example.com/a","Test":"TestBroken","Elapsed":0.1}
{"Action":"fail","Package":"example.com/a","Elapsed":2.7}
{"Action":"run","Package":"example.com/b/c","Test":"TestUnavailable"}
{"Action":"output","Package":"example.com/b/c","Test":"TestUnavailable","Output":"    c_test.go:3: built with bcg729\n"}
{"Action":"skip","Package":"example.com/b/c","Test":"TestUnavailable","Elapsed":0}
{"Action":"pass","Package":"example.com/b/c","Elapsed":0.2}
`

func run(t *testing.T, allow string, ci bool, input string) (string, bool) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "allow")
	if err := os.WriteFile(f, []byte(allow), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := readAllow(f)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	r := newReport(&out, a, ci)
	if err := r.read(strings.NewReader(input)); err != nil {
		t.Fatal(err)
	}
	ok := r.summary(5)
	return out.String(), ok
}

func TestReport(t *testing.T) {
	out, ok := run(t, "example.com/b/... TestUnavail* # runs only without bcg729\n", true, stream)
	if ok {
		t.Error("a failed test and an unlisted skip in CI: reported ok")
	}
	for _, want := range []string{
		"--- FAIL: TestBroken (example.com/a)\n    a_test.go:12: got 1, want 2\n",
		"FAIL\texample.com/a\t2.700s\n",
		"ok  \texample.com/b/c\t0.200s\n",
		"SKIP example.com/a TestNeedsTool: a_test.go:9: sipp not installed [NOT on the allow-list]",
		"SKIP example.com/b/c TestUnavailable: c_test.go:3: built with bcg729 [allowed: runs only without bcg729]",
		"FAIL: 1 tests skipped in CI that are not on the allow-list",
		"     2.5s example.com/a TestPass\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// TestSkipsOutsideCI: without CI a skip is reported, not a failure; in CI
// an allowed skip passes.
func TestSkipsOutsideCI(t *testing.T) {
	passing := strings.ReplaceAll(strings.ReplaceAll(stream, `"Action":"fail"`, `"Action":"pass"`), "--- FAIL", "--- PASS")
	if out, ok := run(t, "", false, passing); !ok || !strings.Contains(out, "NOT on the allow-list") {
		t.Errorf("outside CI: ok=%v\n%s", ok, out)
	}
	if out, ok := run(t, "example.com/a TestNeedsTool # reviewed\nexample.com/b/c TestUnavailable # reviewed\n", true, passing); !ok {
		t.Errorf("in CI with both skips allowed: not ok\n%s", out)
	}
}

func TestAllowListErrors(t *testing.T) {
	for _, bad := range []string{"example.com/a TestX\n", "example.com/a # why\n", "example.com/a Test[ # why\n"} {
		f := filepath.Join(t.TempDir(), "allow")
		os.WriteFile(f, []byte(bad), 0o644)
		if _, err := readAllow(f); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestShow: -show prints the matching lines of a passing test as they
// come, and nothing else of it.
func TestShow(t *testing.T) {
	const in = `{"Action":"run","Package":"example.com/v","Test":"TestGuest"}
{"Action":"output","Package":"example.com/v","Test":"TestGuest","Output":"    v_test.go:5: figure guest_run_s=409 (qemu start to power-off)\n"}
{"Action":"output","Package":"example.com/v","Test":"TestGuest","Output":"    v_test.go:6: image cached\n"}
{"Action":"pass","Package":"example.com/v","Test":"TestGuest","Elapsed":410}
{"Action":"pass","Package":"example.com/v","Elapsed":410}
`
	var out strings.Builder
	r := newReport(&out, nil, true)
	r.show = regexp.MustCompile(`figure guest_`)
	if err := r.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if want := "    TestGuest: v_test.go:5: figure guest_run_s=409 (qemu start to power-off)\nok  \texample.com/v\t410.000s\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
}
