// Package testenv holds helpers for tests that need capabilities of the
// machine they run on (root, tools). A missing one skips the test on a
// developer's machine and fails it in CI, as lab.SkipOrFail decides.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/relayd/relayd/lab"
)

// Skip skips the test with the reason, or fails it in CI.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	lab.SkipOrFail(t, fmt.Sprintf(format, args...))
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

// Emulated reports whether the test runs in a guest whose CPU is
// emulated (lab/vm boots Debian's kernel under qemu's TCG and sets
// RELAYD_TEST_EMULATED=1 there): instructions cost 10-50 times what they
// do on the host, so bounds on latency are loosened, never the checks
// of behaviour.
func Emulated() bool { return os.Getenv("RELAYD_TEST_EMULATED") == "1" }
