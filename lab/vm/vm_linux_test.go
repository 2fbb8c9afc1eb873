package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// requireVM fails in CI, and skips elsewhere, when the guest cannot be
// booted here.
func requireVM(t *testing.T) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, b := range []string{"qemu-system-x86_64", "busybox", "modprobe", "depmod", "apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		lab.SkipOrFail(t, "the VM tests need "+strings.Join(missing, ", ")+" (make deps)")
	}
	if testing.Short() {
		t.Skip("boots a kernel in qemu: skipped with -short")
	}
}

func debianKernel(t *testing.T) *Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k, err := DebianKernel(ctx, DefaultCache)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// goTestC builds the test binary of pkg into dir.
func goTestC(t *testing.T, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg)+".test")
	if b, err := exec.Command("go", "test", "-c", "-o", out, "github.com/relayd/relayd/"+pkg).CombinedOutput(); err != nil {
		t.Fatalf("go test -c %s: %v\n%s", pkg, err, b)
	}
	return out
}

func boot(t *testing.T, k *Kernel, dir, script string, timeout time.Duration) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := Run(ctx, Options{Kernel: k, Dir: dir, Script: script})
	if res != nil {
		t.Logf("guest %s, %s:\n%s", k.Release, res.Took.Round(time.Millisecond), res.Output)
	}
	if err != nil {
		if res != nil {
			t.Logf("console:\n%s", res.Console)
		}
		t.Fatal(err)
	}
	return res
}

// TestBootsDebianKernel checks the harness itself: the guest runs the
// Debian kernel, sees the host's files and reports the script's status.
func TestBootsDebianKernel(t *testing.T) {
	requireVM(t)
	k := debianKernel(t)
	dir := t.TempDir()
	res := boot(t, k, dir, "uname -r; test -d /sys/fs/bpf && grep -q ' /sys/fs/bpf bpf ' /proc/mounts && modprobe veth && ip link add vm0 type veth peer name vm1 && echo veth-ok; exit 7\n", 3*time.Minute)
	if res.ExitCode != 7 {
		t.Errorf("exit status %d, want 7 (the script's)", res.ExitCode)
	}
	if !strings.HasPrefix(res.Output, k.Release+"\n") {
		t.Errorf("guest runs %q, want %s", firstLine(res.Output), k.Release)
	}
	if !strings.Contains(res.Output, "veth-ok") {
		t.Errorf("guest could not load its own modules or make a veth pair")
	}
}

// preamble starts every guest script: the environment of a CI run, and the
// modules the tests use loaded up front (the kernel's own module loading
// runs in the initramfs, which has none), and a longer backlog: an emulated
// CPU drains a veth's queue late.
const preamble = `set -e
export CI=true HOME=/root PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
modprobe -a veth
sysctl -qw net.core.netdev_max_backlog=10000
`

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// TestFastpathOnDebianKernel runs the XDP program's prog.Run tests (load,
// verifier, forwarding, punts, statistics) under Debian 12's kernel.
func TestFastpathOnDebianKernel(t *testing.T) {
	requireVM(t)
	k := debianKernel(t)
	dir := t.TempDir()
	bin := goTestC(t, dir, "fastpath")
	res := boot(t, k, dir, preamble+bin+" -test.v -test.count=1\n", 8*time.Minute)
	if res.ExitCode != 0 {
		t.Fatalf("fastpath tests under %s: exit status %d", k.Release, res.ExitCode)
	}
}

// TestRelayOnDebianKernel runs the userspace data plane's tests (the
// sk_lookup steering program among them) and end-to-end lab tests under
// Debian 12's kernel: a real relayd in network namespaces, native and
// generic XDP on veth, IPv4 and IPv6, an interface re-created between two
// starts (the pinned link severed), the punt of a packet to an unresolved
// neighbour, the userspace relay steered by sk_lookup, SRTP, and SIP calls
// through the B2BUA with SIPp and over ng, IPv4 and IPv6. Restarts that keep media and calls run
// under the same kernel in lab/appliance, with systemd.
func TestRelayOnDebianKernel(t *testing.T) {
	requireVM(t)
	k := debianKernel(t)
	dir := t.TempDir()
	slow := goTestC(t, dir, "slowpath")
	e2e := goTestC(t, dir, "lab/labrelay")
	relayd := filepath.Join(dir, "relayd")
	if b, err := exec.Command("go", "build", "-o", relayd, "github.com/relayd/relayd/cmd/relayd").CombinedOutput(); err != nil {
		t.Fatalf("go build relayd: %v\n%s", err, b)
	}
	tests := "^(TestRelayForwarding|TestRelayUnresolvedNeighbour|TestRelayStopAndDetach|TestRelayInterfaceRecreated|TestRelayUserspace|TestRelaySRTP|TestSIPCallsThroughXDP|TestNGMedia)$"
	script := preamble + "cd " + repoDir(t, "slowpath") + "\n" + slow + " -test.count=1\n" +
		"cd " + repoDir(t, "lab/labrelay") + "\nRELAYD_TEST_RATE_DIVISOR=20 RELAYD_TEST_BIN=" + relayd + " " + e2e + " -test.v -test.count=1 -test.run '" + tests + "'\n"
	res := boot(t, k, dir, script, 15*time.Minute)
	if res.ExitCode != 0 {
		t.Fatalf("relay tests under %s: exit status %d", k.Release, res.ExitCode)
	}
	for _, name := range []string{"TestRelayForwarding", "TestRelayUserspace", "TestSIPCallsThroughXDP", "TestNGMedia"} {
		if !strings.Contains(res.Output, "--- PASS: "+name) {
			t.Errorf("%s did not pass under %s", name, k.Release)
		}
	}
}

// repoDir is the directory of pkg in this checkout: test binaries run
// there, as go test runs them, to find their testdata.
func repoDir(t *testing.T, pkg string) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(filepath.Dir(filepath.Dir(wd)), pkg)
}
