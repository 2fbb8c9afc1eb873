package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// The guests run in parallel, as many at once as -parallel allows (the
// host's CPUs by default): under TCG each guest's single vCPU is one host
// thread, so two guests on two cores take the time of the longer one. What
// they share (the kernel, the binaries) is made once, before any boots.

// binDir holds the host binaries the guests run, built once (see bins).
var binDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "relayd-vm-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

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

var kernelOnce = sync.OnceValues(func() (*Kernel, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return DebianKernel(ctx, DefaultCache)
})

// debianKernel downloads the kernel once for every test (parallel tests
// would otherwise unpack it into the same cache directory at once).
func debianKernel(t *testing.T) *Kernel {
	t.Helper()
	k, err := kernelOnce()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// guestBinaries are the host binaries the guests run, in binDir.
type guestBinaries struct {
	fastpath, slowpath, labrelay string // test binaries (go test -c)
	xdpsink                      string
	relayd                       string
}

// bins builds every guest binary once, before the first guest boots: a
// build while a guest runs would take CPU from it.
var bins = sync.OnceValues(func() (guestBinaries, error) {
	var b guestBinaries
	var err error
	testC := func(pkg string) string {
		out := filepath.Join(binDir, filepath.Base(pkg)+".test")
		if err == nil {
			if o, e := exec.Command("go", "test", "-c", "-o", out, "github.com/relayd/relayd/"+pkg).CombinedOutput(); e != nil {
				err = fmt.Errorf("go test -c %s: %w\n%s", pkg, e, o)
			}
		}
		return out
	}
	b.fastpath = testC("fastpath")
	b.slowpath = testC("slowpath")
	b.labrelay = testC("lab/labrelay")
	b.xdpsink = testC("lab/xdpsink")
	b.relayd = filepath.Join(binDir, "relayd")
	if err == nil {
		if o, e := exec.Command("go", "build", "-o", b.relayd, "github.com/relayd/relayd/cmd/relayd").CombinedOutput(); e != nil {
			err = fmt.Errorf("go build relayd: %w\n%s", e, o)
		}
	}
	return b, err
})

// binaries returns the guest binaries, building them the first time.
func binaries(t *testing.T) guestBinaries {
	t.Helper()
	start := time.Now()
	b, err := bins()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("built the guest binaries in %s", d.Round(100*time.Millisecond))
	}
	return b
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

// TestRelayOnDebianKernel runs relayd's tests under Debian 12's kernel:
//   - the XDP program's prog.Run tests (load, verifier, forwarding, punts,
//     statistics) and the benchmarks' XDP sink's (lab/xdpsink, voipgen
//     bench --sink xdp: it must load and count on 6.1 as on current
//     kernels);
//   - the userspace data plane's tests (the sk_lookup steering program
//     among them);
//   - end-to-end lab tests: a real relayd in network namespaces, native
//     and generic XDP on veth, IPv4 and IPv6, an interface re-created
//     between two starts (the pinned link severed), the punt of a packet
//     to an unresolved neighbour, the userspace relay steered by sk_lookup
//     and through AF_XDP (dataplane.userspace_io afxdp), a veth that
//     refuses redirected frames (its flows moved to userspace and back),
//     SRTP, and SIP calls through the B2BUA with SIPp and over ng, IPv4
//     and IPv6.
//
// Restarts that keep media and calls run under the same kernel in
// lab/appliance, with systemd.
//
// The tests are split between two guests that run in parallel, each on
// one of the host's CPUs, of about the same length under TCG (the
// programs' tests take 40 s, SRTP 30 s, the second guest's 90 s); every
// test named must pass. The first guest checks the harness too: it runs
// the Debian kernel, loads its own modules, and the script's own exit
// status (7, after every test passed) comes back.
func TestRelayOnDebianKernel(t *testing.T) {
	requireVM(t)
	k := debianKernel(t)
	b := binaries(t)
	for _, g := range []struct {
		name     string
		programs bool // the harness check, the fastpath and xdpsink tests first
		slowpath bool // the slowpath package's tests first
		tests    []string
	}{
		{"programs_srtp_forwarding", true, false, []string{"TestRelaySRTP", "TestRelayForwarding"}},
		{"slowpath_restarts_sip", false, true, []string{"TestRelayUnresolvedNeighbour", "TestRelayStopAndDetach", "TestRelayUserspace", "TestRelayInterfaceRecreated", "TestRelayInterfaceRecreatedWhileRunning", "TestRelayInterfaceRecreatedAFXDP", "TestSIPCallsThroughXDP", "TestNGMedia", "TestRelayRedirectRefused"}},
	} {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			script := preamble
			if g.programs {
				script = "uname -r\n" + preamble + "ip link add vm0 type veth peer name vm1 && ip link del vm0 && echo veth-ok\n" +
					b.fastpath + " -test.v -test.count=1\n" + b.xdpsink + " -test.v -test.count=1\n"
			}
			if g.slowpath {
				script += "cd " + repoDir(t, "slowpath") + "\nRELAYD_TEST_EMULATED=" + emulated() + " " + b.slowpath + " -test.v -test.count=1\n"
			}
			script += "cd " + repoDir(t, "lab/labrelay") + "\nRELAYD_TEST_RATE_DIVISOR=20 RELAYD_TEST_BIN=" + b.relayd + " " + b.labrelay +
				" -test.v -test.count=1 -test.run '^(" + strings.Join(g.tests, "|") + ")$'\nexit 7\n"
			res := boot(t, k, dir, script, 15*time.Minute)
			if res.ExitCode != 7 {
				t.Fatalf("tests under %s: exit status %d, want 7 (the script's, after every test passed)", k.Release, res.ExitCode)
			}
			names := g.tests
			if g.programs {
				if !strings.HasPrefix(res.Output, k.Release+"\n") {
					t.Errorf("guest runs %q, want %s", firstLine(res.Output), k.Release)
				}
				if !strings.Contains(res.Output, "veth-ok") {
					t.Errorf("guest could not load its own modules or make a veth pair")
				}
				// The fastpath binary's failure would have ended the
				// script; the sink's test is named.
				names = append(names, "TestSinkCounts")
				// The relay program's AF_XDP redirect (userspace_io
				// "afxdp" in mode xdp) through 6.1's verifier, native
				// and generic.
				names = append(names, "TestRelaySRTP/afxdp", "TestRelaySRTP/afxdp-generic")
				// An interface re-created while the data plane runs:
				// 6.1's link events, a link on the new ifindex.
				names = append(names, "TestInterfaceRecreated")
			}
			if g.slowpath {
				// AF_XDP receive (dataplane.userspace_io = "afxdp"):
				// bpf/xsk.c through 6.1's verifier, copy-mode XDP
				// sockets with a shared UMEM, native and generic XDP.
				// And their move to an interface created again.
				names = append(names, "TestPoolIO/afxdp", "TestPoolIO/afxdp-generic", "TestPoolIO/afxdp-w2", "TestRelayXSK", "TestRelayUserspace/dataplane_userspace_afxdp",
					"TestPoolInterfaceRecreated")
			}
			for _, name := range names {
				if !strings.Contains(res.Output, "--- PASS: "+name+" ") {
					t.Errorf("%s did not pass under %s", name, k.Release)
				}
			}
		})
	}
}

func repoDir(t *testing.T, pkg string) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(filepath.Dir(filepath.Dir(wd)), pkg)
}

// emulated is RELAYD_TEST_EMULATED for the guest's tests: "1" under
// TCG, "0" under KVM.
func emulated() string {
	if useKVM() {
		return "0"
	}
	return "1"
}
