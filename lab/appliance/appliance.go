// Package appliance boots relayd's Debian packages in a Debian 12 guest
// under qemu with a real systemd as PID 1, for the appliance test.
//
// The guest is a root tree built by mmdebstrap from the build machine's apt
// sources (testdata/mkimage.sh), cached under CacheDir keyed by its package
// list and the build scripts, and turned into a fresh ext4 image for each
// boot with `mkfs.ext4 -d` (no loop device). qemu boots Debian's own
// kernel and initrd from the tree's /boot with root=/dev/vda, no network
// device, the serial console in a file, and a host directory shared over
// 9p on /mnt/share. There relayd-vmtest.service runs guest.sh, which writes
// its results and an exit status to the share and powers the guest off.
//
// qemu runs under TCG by default: /dev/kvm may exist in a VM whose nested
// KVM hangs. RELAYD_VM_ACCEL=kvm opts in to KVM.
package appliance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// DefaultCacheDir holds the cached root trees, one directory per key,
// unless RELAYD_VM_CACHE names another directory (an empty one measures a
// build from scratch, as on a fresh CI machine).
const DefaultCacheDir = "/var/cache/relayd-vm"

// CacheDir returns RELAYD_VM_CACHE, or DefaultCacheDir when it is unset.
func CacheDir() string {
	if d := os.Getenv("RELAYD_VM_CACHE"); d != "" {
		return d
	}
	return DefaultCacheDir
}

// BasePackages are what the guest needs besides the packages' own
// dependencies: systemd as init, Debian's kernel (with initramfs-tools for
// its initrd), udev for the virtio and 9p modules, and the tools the guest
// script uses.
var BasePackages = []string{
	"systemd-sysv", "udev", "kmod", "linux-image-amd64", "initramfs-tools",
	"iproute2", "iputils-ping", "ethtool", "nftables", "sip-tester", "jq",
}

// Image is a cached guest root tree.
type Image struct {
	Root   string // the tree
	Kernel string // Root/boot/vmlinuz-*
	Initrd string // Root/boot/initrd.img-*
}

// Scripts is where mkimage.sh and the guest's files are, relative to this
// package's directory (where its test runs).
const Scripts = "testdata"

// cacheKey names the tree for a package list and the scripts that build
// it: a change to either builds a new tree.
func cacheKey(packages []string, scripts string) (string, error) {
	h := sha256.New()
	for _, p := range packages {
		fmt.Fprintf(h, "package %s\n", p)
	}
	for _, f := range []string{"mkimage.sh", "initramfs-hook", "relayd-vmtest.service"} {
		b, err := os.ReadFile(filepath.Join(scripts, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "file %s %d\n", f, len(b))
		h.Write(b)
	}
	return "appliance-" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

// EnsureImage returns the cached tree for packages (BasePackages are
// added), building it with mmdebstrap and the scripts in the directory
// scripts (Scripts from this package's directory) when it is missing.
// built says whether it was built now.
func EnsureImage(ctx context.Context, scripts string, packages []string, logf func(string, ...any)) (img Image, built bool, err error) {
	scripts, err = filepath.Abs(scripts)
	if err != nil {
		return Image{}, false, err
	}
	pkgs := slices.Concat(BasePackages, packages)
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	key, err := cacheKey(pkgs, scripts)
	if err != nil {
		return Image{}, false, err
	}
	dir := filepath.Join(CacheDir(), key)
	root := filepath.Join(dir, "root")
	if img, err := findBoot(root); err == nil {
		return img, false, nil
	}
	logf("building guest tree %s with mmdebstrap: %s", root, strings.Join(pkgs, " "))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Image{}, false, err
	}
	tmp := filepath.Join(dir, fmt.Sprintf("root.tmp-%d", os.Getpid()))
	os.RemoveAll(tmp)
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, "sh", append([]string{filepath.Join(scripts, "mkimage.sh"), tmp}, pkgs...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return Image{}, false, fmt.Errorf("mkimage.sh: %w\n%s", err, tail(out, 4000))
	}
	os.RemoveAll(root) // a tree without a kernel
	if err := os.Rename(tmp, root); err != nil {
		return Image{}, false, err
	}
	img, err = findBoot(root)
	return img, true, err
}

func findBoot(root string) (Image, error) {
	k, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	i, _ := filepath.Glob(filepath.Join(root, "boot", "initrd.img-*"))
	if len(k) != 1 || len(i) != 1 {
		return Image{}, fmt.Errorf("%s: want one kernel and one initrd in boot/, have %d and %d", root, len(k), len(i))
	}
	return Image{Root: root, Kernel: k[0], Initrd: i[0]}, nil
}

// MakeDisk writes a fresh ext4 image of the tree to path (sparse, size
// bytes), with mkfs.ext4 -d: no loop device, no mount.
func (img Image) MakeDisk(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "relayd-vm", "-d", img.Root, path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4 -d %s: %w\n%s", img.Root, err, out)
	}
	return nil
}

// BootOptions configure a boot.
type BootOptions struct {
	Disk    string // ext4 image, the guest's /dev/vda
	Share   string // host directory on the guest's /mnt/share (9p)
	Console string // file the serial console is written to
	Memory  string // default "1536"
	CPUs    int    // default 2
}

// Accel returns the qemu accelerator to use: tcg, or kvm when
// RELAYD_VM_ACCEL=kvm and /dev/kvm exists. The second result says why.
func Accel() (string, string) {
	_, err := os.Stat("/dev/kvm")
	kvm := err == nil
	switch want := os.Getenv("RELAYD_VM_ACCEL"); {
	case want == "kvm" && kvm:
		return "kvm", "RELAYD_VM_ACCEL=kvm"
	case want == "kvm":
		return "tcg", "RELAYD_VM_ACCEL=kvm but no /dev/kvm"
	case kvm:
		return "tcg", "/dev/kvm present but nested KVM can hang; RELAYD_VM_ACCEL=kvm opts in"
	default:
		return "tcg", "no /dev/kvm"
	}
}

// Boot runs the guest until it powers off or ctx ends (then qemu is
// killed and the error says so).
func (img Image) Boot(ctx context.Context, o BootOptions) error {
	if o.Memory == "" {
		o.Memory = "1536"
	}
	if o.CPUs == 0 {
		// Two vCPUs: with one, the guest's own media senders lose
		// packets while apt and dpkg run an upgrade.
		o.CPUs = 2
	}
	accel, _ := Accel()
	cpu := "max"
	if accel == "kvm" {
		cpu = "host"
	}
	args := []string{
		"-machine", "q35,accel=" + accel, "-cpu", cpu,
		"-smp", fmt.Sprint(o.CPUs), "-m", o.Memory,
		"-display", "none", "-monitor", "none", "-serial", "file:" + o.Console,
		"-no-reboot", "-nic", "none",
		"-kernel", img.Kernel, "-initrd", img.Initrd,
		// A soft lockup or an RCU stall panics the guest, and panic=-1
		// with -no-reboot ends qemu: a wedged guest fails fast.
		// no5lvl: qemu's "max" CPU offers 5-level paging under TCG,
		// which every TLB miss then walks in software (the boot took
		// a quarter longer with it); the hardware Debian 12 runs on has
		// 4 levels.
		"-append", "console=ttyS0 root=/dev/vda rw panic=-1 softlockup_panic=1 sysctl.kernel.panic_on_rcu_stall=1 no5lvl",
		// The disk is a scratch copy made for this boot: the guest's
		// flushes need not reach the host's disk.
		"-drive", "file=" + o.Disk + ",format=raw,if=virtio,cache=unsafe",
		"-virtfs", "local,path=" + o.Share + ",mount_tag=share,security_model=none,id=share",
	}
	qctx, kill := context.WithCancel(ctx)
	defer kill()
	cmd := exec.CommandContext(qctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("qemu-system-x86_64: %w", err)
	}
	stalled := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if watchBoot(qctx, o.Console, bootStall) {
			close(stalled)
			kill()
		}
	}()
	err := cmd.Wait()
	kill()
	<-watched
	select {
	case <-stalled:
		return fmt.Errorf("%w: no console output for %s before the kernel ran init", ErrBootStalled, bootStall)
	default:
	}
	if ctx.Err() != nil {
		return fmt.Errorf("guest did not power off in time: %w", ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("qemu-system-x86_64: %w\n%s", err, out.Bytes())
	}
	return nil
}

// ErrBootStalled is Boot's error for a guest whose kernel stopped before
// it ran init: Debian 6.1's kernel under TCG has hung in early boot now
// and then (its console ending at the ACPI devices, both vCPUs spinning),
// before the lockup detectors could panic it.
var ErrBootStalled = errors.New("the guest's boot stalled")

// bootStall is how long the console may stay silent before the kernel
// runs init (a boot prints its lines a few milliseconds apart, and is at
// init in about 10 s under TCG).
const bootStall = 90 * time.Second

// watchBoot polls the console file until the kernel runs init, and
// reports true when it stayed silent for stall before that.
func watchBoot(ctx context.Context, console string, stall time.Duration) bool {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	size, grew := int64(-1), time.Now()
	for {
		select {
		case <-ctx.Done():
			return false
		case now := <-t.C:
			con, _ := os.ReadFile(console)
			if BootReachedInit(con) {
				return false
			}
			if int64(len(con)) != size {
				size, grew = int64(len(con)), now
			} else if now.Sub(grew) >= stall {
				return true
			}
		}
	}
}

// BootReachedInit reports whether the console shows the kernel running
// init (its own line, whatever init prints after it).
func BootReachedInit(console []byte) bool {
	return bytes.Contains(console, []byte(" as init process"))
}

// Packages are the .debs the appliance test installs, by package name.
var Packages = []string{"relayd", "relayd-tools"}

// FindDebs returns the .deb of each of Packages in dir, in that order.
func FindDebs(dir string) ([]string, error) {
	var debs []string
	for _, pkg := range Packages {
		m, _ := filepath.Glob(filepath.Join(dir, pkg+"_*_amd64.deb"))
		if len(m) != 1 {
			return nil, fmt.Errorf("want one %s_*_amd64.deb in %s, have %v", pkg, dir, m)
		}
		debs = append(debs, m[0])
	}
	return debs, nil
}

// DebsDepends returns what the .debs of Packages in dir depend on: the
// packages the guest image needs besides BasePackages.
func DebsDepends(dir string) ([]string, error) {
	debs, err := FindDebs(dir)
	if err != nil {
		return nil, err
	}
	var deps []string
	for _, deb := range debs {
		d, err := Depends(deb)
		if err != nil {
			return nil, err
		}
		deps = append(deps, d...)
	}
	return deps, nil
}

// Depends returns the package names in a .deb's Depends (the first of
// each set of alternatives, without versions).
func Depends(deb string) ([]string, error) {
	out, err := exec.Command("dpkg-deb", "-f", deb, "Depends").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("dpkg-deb -f %s Depends: %w: %s", deb, err, ee.Stderr)
		}
		return nil, err
	}
	var names []string
	for _, dep := range strings.Split(string(out), ",") {
		alt, _, _ := strings.Cut(dep, "|")
		name, _, _ := strings.Cut(strings.TrimSpace(alt), " ")
		if name = strings.TrimSpace(name); name != "" {
			names = append(names, name)
		}
	}
	return names, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// GuestLockup returns the console line that says the guest kernel locked
// up (a soft lockup or an RCU stall), or "" when it did not.
func GuestLockup(console []byte) string {
	for _, l := range strings.Split(string(console), "\n") {
		if strings.Contains(l, "soft lockup - CPU#") || strings.Contains(l, "self-detected stall on CPU") ||
			strings.Contains(l, "rcu_preempt detected stalls") {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// LockupReport is what a lockup's console says past its first line (the
// stalled CPUs' registers and call traces), up to n bytes, for finding
// the cause across runs: GuestLockup's line and what follows it.
func LockupReport(console []byte, n int) string {
	line := GuestLockup(console)
	if line == "" {
		return ""
	}
	i := strings.Index(string(console), line)
	rest := console[i:]
	if len(rest) > n {
		rest = rest[:n]
	}
	return string(rest)
}

// CheckLog returns what guest.sh printed during check name: the lines of
// guest.log from its "== name (" header to the next check's header, each
// cut to width bytes (the voipgen reports are long JSON lines that would
// otherwise crowd out the reason a check gave). Empty when the check
// printed nothing or did not run.
func CheckLog(log []byte, name string, width int) string {
	var b strings.Builder
	in := false
	for _, l := range strings.Split(strings.TrimRight(string(log), "\n"), "\n") {
		if strings.HasPrefix(l, "== ") {
			if in {
				break
			}
			in = strings.HasPrefix(l, "== "+name+" (")
		}
		if !in {
			continue
		}
		if len(l) > width {
			l = l[:width] + " [...]"
		}
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}
