// Package testenv holds helpers for tests that need capabilities of the
// machine they run on (root, kernel features, tools).
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run in CI (CI=true), where every test
// must run: a missing capability is a failure there, not a skip.
func InCI() bool { return os.Getenv("CI") == "true" }

// Skip skips the test with the reason, or fails it in CI.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI=true, cannot run: "+format, args...)
	}
	t.Skipf(format, args...)
}

// NeedRoot skips the test (fails it in CI) unless it runs as root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root")
	}
}

// NeedCommand returns the path of a command, skipping the test (failing it
// in CI) when it is not installed; pkg names the Debian package.
func NeedCommand(t testing.TB, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Skip(t, "%s not installed (Debian package %s): %v", name, pkg, err)
	}
	return p
}
