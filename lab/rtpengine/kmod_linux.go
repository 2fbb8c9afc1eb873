package rtpengine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/relayd/relayd/lab"
)

// rtpengine's kernel module, xt_RTPENGINE, forwards a call's media in the
// kernel once the daemon has seen both ends ("Kernelizing media stream"):
// an iptables rule in the INPUT chain hands every UDP packet to the
// RTPENGINE target, which looks its destination up in the daemon's kernel
// table (--table) and sends it on rewritten.
//
// The module cannot load on the development kernel; it builds against
// Debian 12's 6.1 and runs in lab/vm's guest. BuildKernelModule compiles
// Debian's own source (package rtpengine-kernel-dkms, in /usr/src) against
// the headers of a release (package linux-headers-<release>), outside the
// dkms tree and without loading anything on the host:
//
//	apt-get install --no-install-recommends rtpengine-kernel-dkms rtpengine-iptables linux-headers-6.1.0-57-amd64
//
// (with a policy-rc.d that exits 101, as for the daemon). SetupKernel
// loads it in the guest and installs the rules Debian's
// rtpengine-iptables-setup installs, in the relay's namespace.

// KernelModuleName is the module's name in lsmod and /proc/modules.
const KernelModuleName = "xt_RTPENGINE"

// KernelSource returns the directory of Debian's module source
// (/usr/src/rtpengine-<version>) and its version.
func KernelSource() (dir, version string, err error) {
	ms, _ := filepath.Glob("/usr/src/rtpengine-*/xt_RTPENGINE.c")
	if len(ms) == 0 {
		return "", "", errors.New("no rtpengine kernel module source in /usr/src (make deps-kmod installs rtpengine-kernel-dkms and the headers)")
	}
	dir = filepath.Dir(ms[len(ms)-1])
	return dir, strings.TrimPrefix(filepath.Base(dir), "rtpengine-"), nil
}

// BuildKernelModule compiles xt_RTPENGINE.ko for kernel release (such as
// 6.1.0-57-amd64) in outDir and returns its path. It copies the source
// there first: neither /usr/src nor the dkms tree is written. The build
// log is returned in the error when it fails.
func BuildKernelModule(ctx context.Context, release, outDir string) (string, error) {
	src, version, err := KernelSource()
	if err != nil {
		return "", err
	}
	headers := filepath.Join("/usr/src", "linux-headers-"+release)
	if _, err := os.Stat(filepath.Join(headers, "Makefile")); err != nil {
		return "", fmt.Errorf("no headers for %s in %s (apt-get install linux-headers-%s): %w", release, headers, release, err)
	}
	build := filepath.Join(outDir, "xt_RTPENGINE-"+version+"-"+release)
	if err := os.RemoveAll(build); err != nil {
		return "", err
	}
	if err := os.MkdirAll(build, 0o755); err != nil {
		return "", err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if err := copyFile(filepath.Join(src, e.Name()), filepath.Join(build, e.Name())); err != nil {
			return "", err
		}
	}
	// As dkms.conf does: make -C <headers> M=<build> RTPENGINE_VERSION=<v>.
	cmd := exec.CommandContext(ctx, "make", "-C", headers, "M="+build, "RTPENGINE_VERSION="+version, "modules")
	out, err := cmd.CombinedOutput()
	ko := filepath.Join(build, KernelModuleName+".ko")
	if err != nil {
		return "", fmt.Errorf("build %s for %s: %w\n%s", KernelModuleName, release, err, out)
	}
	if _, err := os.Stat(ko); err != nil {
		return "", fmt.Errorf("build %s for %s left no %s:\n%s", KernelModuleName, release, ko, out)
	}
	return ko, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// KernelModuleLoaded reports whether xt_RTPENGINE is loaded.
func KernelModuleLoaded() bool {
	_, err := os.Stat("/proc/rtpengine/control")
	return err == nil
}

// SetupKernel loads the module from ko (unless it is loaded already) with
// the netfilter modules it needs, and installs in ns the rules of Debian's
// rtpengine-iptables-setup for table: a chain rtpengine that INPUT sends
// every UDP packet to, holding the RTPENGINE target for the table, IPv4
// and IPv6 (iptables-legacy: the guest loads no nf_tables compat layer).
// The daemon creates the table itself at start (Options.Kernel).
func SetupKernel(ns *lab.NS, ko string, table int) error {
	if !KernelModuleLoaded() {
		// The guest's kernel cannot load modules on demand (its
		// usermode helper runs in the initramfs): load the
		// dependencies by name first.
		if out, err := exec.Command("modprobe", "-a", "x_tables", "ip_tables", "iptable_filter", "ip6_tables", "ip6table_filter").CombinedOutput(); err != nil {
			return fmt.Errorf("modprobe netfilter modules: %w: %s", err, out)
		}
		if out, err := exec.Command("insmod", ko).CombinedOutput(); err != nil {
			return fmt.Errorf("insmod %s: %w: %s", ko, err, out)
		}
		if !KernelModuleLoaded() {
			return fmt.Errorf("insmod %s: no /proc/rtpengine/control", ko)
		}
	}
	id := strconv.Itoa(table)
	for _, ipt := range []string{"iptables-legacy", "ip6tables-legacy"} {
		for _, args := range [][]string{
			{"-N", "rtpengine"},
			{"-I", "INPUT", "-p", "udp", "-j", "rtpengine"},
			{"-I", "rtpengine", "-p", "udp", "-j", "RTPENGINE", "--id", id},
		} {
			if out, err := ns.Command(ipt, args...).CombinedOutput(); err != nil {
				return fmt.Errorf("%s %s in %s: %w: %s", ipt, strings.Join(args, " "), ns, err, out)
			}
		}
	}
	return nil
}

// KernelStats are the kernel table's counters summed over its targets
// (one per forwarded stream and direction), from /proc/rtpengine/<table>/list.
type KernelStats struct {
	Targets                int
	Packets, Bytes, Errors uint64
}

// ReadKernelStats reads table's counters.
func ReadKernelStats(table int) (KernelStats, error) {
	f, err := os.Open(filepath.Join("/proc/rtpengine", strconv.Itoa(table), "list"))
	if err != nil {
		return KernelStats{}, err
	}
	defer f.Close()
	return parseKernelList(f)
}

// parseKernelList sums the "stats:" lines of a table's list:
//
//	local inet4 198.18.1.1:30000
//	    stats:                 8600 bytes,                   50 packets,                    0 errors
func parseKernelList(r io.Reader) (KernelStats, error) {
	var s KernelStats
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "local ") {
			s.Targets++
			continue
		}
		rest, ok := strings.CutPrefix(line, "stats:")
		if !ok {
			continue
		}
		f := strings.Fields(strings.NewReplacer(",", " ").Replace(rest))
		if len(f) != 6 || f[1] != "bytes" || f[3] != "packets" || f[5] != "errors" {
			return s, fmt.Errorf("kernel table list: unexpected stats line %q", line)
		}
		var v [3]uint64
		for i := range v {
			n, err := strconv.ParseUint(f[2*i], 10, 64)
			if err != nil {
				return s, fmt.Errorf("kernel table list: %q: %w", line, err)
			}
			v[i] = n
		}
		s.Bytes += v[0]
		s.Packets += v[1]
		s.Errors += v[2]
	}
	return s, sc.Err()
}

// TeardownKernel undoes SetupKernel's rules in ns and deletes the kernel
// table, which the daemon leaves behind when it exits (as Debian's
// rtpengine-iptables-setup stop does: the daemon may take a moment to let
// go of it). The module stays loaded.
func TeardownKernel(ns *lab.NS, table int) error {
	var errs []error
	if _, err := os.Stat(filepath.Join("/proc/rtpengine", strconv.Itoa(table))); err == nil {
		var err error
		for range 50 {
			if err = os.WriteFile("/proc/rtpengine/control", []byte("del "+strconv.Itoa(table)+"\n"), 0); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("delete kernel table %d: %w", table, err))
		}
	}
	id := strconv.Itoa(table)
	for _, ipt := range []string{"iptables-legacy", "ip6tables-legacy"} {
		for _, args := range [][]string{
			{"-D", "INPUT", "-p", "udp", "-j", "rtpengine"},
			{"-D", "rtpengine", "-p", "udp", "-j", "RTPENGINE", "--id", id},
			{"-X", "rtpengine"},
		} {
			if out, err := ns.Command(ipt, args...).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s %s in %s: %w: %s", ipt, strings.Join(args, " "), ns, err, out))
			}
		}
	}
	return errors.Join(errs...)
}
