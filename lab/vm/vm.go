// Package vm boots a Linux kernel other than the host's in qemu and runs a
// command under it, for testing relayd's BPF programs and data planes on the
// kernels users run (Debian 12's 6.1) and not only on the development one.
//
// The guest has no disk: a tiny initramfs (busybox and the guest kernel's
// virtio, 9p and overlay modules) mounts the host's root file system
// read-only over 9p under a tmpfs overlay (the guest may write anywhere; the
// host sees none of it), mounts the guest kernel's modules on /lib/modules,
// a fresh /run, /proc, /sys, /dev and a bpffs, and chroots into it to
// run the command. The host's binaries (test binaries built with `go test
// -c`, relayd, ip, ethtool) therefore run unchanged under the guest kernel.
// One host directory, Options.Dir, is shared read-write at the same path:
// the command's output and exit status are written there. The guest has no
// network device at all.
//
// qemu runs under TCG (software emulation) unless RELAYD_VM_ACCEL=kvm:
// nested KVM can hang on the development VMs, TCG always works and boots
// Debian's kernel in seconds.
package vm

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Kernel is a guest kernel unpacked on the host.
type Kernel struct {
	Release string // uname -r, e.g. 6.1.0-57-amd64
	Image   string // the bzImage
	Modules string // the directory holding lib/modules/<Release>
}

// DefaultCache is where DebianKernel keeps what it downloads.
const DefaultCache = "/var/cache/relayd-vm"

// DebianKernel returns Debian's current kernel for this release (the one
// the linux-image-amd64 metapackage depends on), downloading it with apt
// and unpacking it under cache the first time.
func DebianKernel(ctx context.Context, cache string) (*Kernel, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-amd64").Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache depends linux-image-amd64: %w (run apt-get update)", err)
	}
	var pkg string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			pkg = f[1]
			break
		}
	}
	if pkg == "" {
		return nil, fmt.Errorf("linux-image-amd64 depends on no linux-image package:\n%s", out)
	}
	release := strings.TrimPrefix(pkg, "linux-image-")
	dir := filepath.Join(cache, pkg)
	k := &Kernel{
		Release: release,
		Image:   filepath.Join(dir, "root", "boot", "vmlinuz-"+release),
		Modules: filepath.Join(dir, "root"),
	}
	if _, err := os.Stat(filepath.Join(k.Modules, "lib", "modules", release, "modules.dep")); err == nil {
		return k, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	dl := exec.CommandContext(ctx, "apt-get", "download", pkg)
	dl.Dir = dir
	if out, err := dl.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apt-get download %s: %w\n%s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(debs) == 0 {
		return nil, fmt.Errorf("apt-get download %s left no .deb in %s", pkg, dir)
	}
	tmp := filepath.Join(dir, "root.tmp")
	os.RemoveAll(tmp)
	steps := [][]string{
		{"dpkg-deb", "-x", debs[0], tmp},
		{"depmod", "-b", tmp, release},
	}
	for _, s := range steps {
		if out, err := exec.CommandContext(ctx, s[0], s[1:]...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", strings.Join(s, " "), err, out)
		}
	}
	os.RemoveAll(k.Modules)
	if err := os.Rename(tmp, k.Modules); err != nil {
		return nil, err
	}
	for _, d := range debs {
		os.Remove(d)
	}
	return k, nil
}

// bootModules are what the initramfs loads, in dependency order as
// `modprobe --show-depends` gives it: virtio over PCI, the 9p file system
// over virtio, and overlayfs for a writable root over the read-only share. Everything else the guest loads itself from the
// kernel's own modules once it runs on the host's root.
var bootModules = []string{"virtio_pci", "9pnet_virtio", "9p", "overlay"}

// Initramfs writes a gzipped cpio archive with a static busybox, the modules
// the 9p root needs and the init script.
func (k *Kernel) Initramfs(ctx context.Context, path string) error {
	var order []string
	seen := map[string]bool{}
	for _, m := range bootModules {
		out, err := exec.CommandContext(ctx, "modprobe", "-S", k.Release, "-d", k.Modules, "--show-depends", m).Output()
		if err != nil {
			return fmt.Errorf("modprobe --show-depends %s for %s: %w", m, k.Release, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "insmod" && !seen[f[1]] {
				seen[f[1]] = true
				order = append(order, f[1])
			}
		}
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox (Debian package busybox-static): %w", err)
	}
	files := []cpioFile{
		{name: "bin", mode: 0o40755},
		{name: "dev", mode: 0o40755},
		{name: "proc", mode: 0o40755},
		{name: "sys", mode: 0o40755},
		{name: "mnt", mode: 0o40755},
		{name: "mod", mode: 0o40755},
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	files = append(files, cpioFile{name: "bin/busybox", mode: 0o100755, data: bb})
	var insmods strings.Builder
	for i, m := range order {
		data, err := os.ReadFile(m)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("mod/%02d-%s", i, filepath.Base(m))
		files = append(files, cpioFile{name: name, mode: 0o100644, data: data})
		fmt.Fprintf(&insmods, "insmod /%s\n", name)
	}
	files = append(files, cpioFile{name: "init", mode: 0o100755, data: []byte(strings.Replace(initScript, "@INSMOD@", insmods.String(), 1))})

	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := writeCpio(zw, files); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// initScript is the guest's PID 1. The kernel command line carries
// relayd.dir (the shared directory) and relayd.modules (where the guest's
// modules are on the host). It runs $dir/run.sh in the chroot, writes its
// exit status to $dir/rc and powers the guest off.
const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for a in $(cat /proc/cmdline); do
	case "$a" in
	relayd.dir=*) dir=${a#relayd.dir=} ;;
	esac
done
@INSMOD@
opts=trans=virtio,version=9p2000.L,msize=262144
mkdir -p /host /rw
mount -t 9p -o $opts,ro,cache=loose hostroot /host || { echo "vm: mount host root failed"; poweroff -f; }
mount -t tmpfs -o mode=0755 rw /rw
mkdir -p /rw/upper /rw/work /rw/modules
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work root /mnt || { echo "vm: overlay failed"; poweroff -f; }
mkdir -p /mnt/lib/modules
mount -t 9p -o $opts,ro,cache=loose modules /mnt/lib/modules || { echo "vm: mount modules failed"; poweroff -f; }
mount -t proc proc /mnt/proc
mount -t sysfs sys /mnt/sys
mount -t devtmpfs dev /mnt/dev
mkdir -p /mnt/dev/pts /mnt/dev/shm
mount -t devpts devpts /mnt/dev/pts
mount -t tmpfs shm /mnt/dev/shm
mount -t bpf bpffs /mnt/sys/fs/bpf
mount -t cgroup2 cgroup2 /mnt/sys/fs/cgroup 2>/dev/null
mount -t debugfs debugfs /mnt/sys/kernel/debug 2>/dev/null
mount -t tmpfs tmpfs /mnt/run
mkdir -p /mnt$dir
mount -t 9p -o $opts out /mnt$dir || { echo "vm: mount $dir failed"; poweroff -f; }
hostname relayd-vm
ip link set lo up
echo "vm: kernel $(uname -r), running $dir/run.sh"
chroot /mnt /bin/sh -c "cd $dir && exec /bin/sh $dir/run.sh" > /mnt$dir/output 2>&1
echo $? > /mnt$dir/rc
sync
umount /mnt$dir
echo "vm: done"
poweroff -f
`

// Options say what to run.
type Options struct {
	Kernel *Kernel
	// Dir is a host directory shared read-write with the guest at the same
	// path. Run writes run.sh, the initramfs and the console log there; the
	// guest writes output and rc.
	Dir string
	// Script is the shell script run in the guest (sh), in Dir, with the
	// host's root as its root.
	Script string
	Memory int // MiB, default 2048
	CPUs   int // default 1 (RELAYD_VM_CPUS)
}

// Result is what the guest reported.
type Result struct {
	ExitCode int           // the script's exit status
	Output   string        // what it printed
	Console  string        // the guest kernel's console
	Took     time.Duration // boot to power-off
}

// ErrNoExit means the guest stopped without reporting the script's exit
// status (a kernel panic, the init script failing, or ctx expiring).
var ErrNoExit = errors.New("guest stopped without an exit status")

// Run boots the kernel, runs the script and returns when the guest powered
// off or ctx is done.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Memory == 0 {
		o.Memory = 2048
	}
	if o.CPUs == 0 {
		// One vCPU by default: under TCG a second one costs more in
		// cross-vCPU synchronisation than it gives (this package's
		// tests ran in 213 s with one, 260 s with two, on a two-core
		// host). RELAYD_VM_CPUS overrides it.
		o.CPUs = 1
		if n, err := strconv.Atoi(os.Getenv("RELAYD_VM_CPUS")); err == nil && n > 0 {
			o.CPUs = n
		}
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	for _, f := range []string{"rc", "output"} {
		os.Remove(filepath.Join(dir, f))
	}
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte(o.Script), 0o755); err != nil {
		return nil, err
	}
	initrd := filepath.Join(dir, "initramfs.gz")
	if err := o.Kernel.Initramfs(ctx, initrd); err != nil {
		return nil, err
	}
	console := filepath.Join(dir, "console.log")
	accel, cpu := "tcg,thread=multi", "max"
	if useKVM() {
		accel, cpu = "kvm", "host"
	}
	args := []string{
		"-machine", "q35", "-accel", accel, "-cpu", cpu,
		"-m", strconv.Itoa(o.Memory), "-smp", strconv.Itoa(o.CPUs),
		"-kernel", o.Kernel.Image, "-initrd", initrd,
		// no5lvl: 4-level paging, as on the hardware Debian 12 runs
		// on; qemu's "max" CPU offers 5 levels under TCG, which every
		// TLB miss then walks in software.
		"-append", "console=ttyS0 panic=-1 quiet no5lvl relayd.dir=" + dir,
		"-display", "none", "-monitor", "none", "-serial", "file:" + console,
		"-no-reboot", "-nic", "none",
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path=" + filepath.Join(o.Kernel.Modules, "lib", "modules") + ",mount_tag=modules,security_model=none,readonly=on",
		"-virtfs", "local,path=" + dir + ",mount_tag=out,security_model=none",
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	qout, qerr := cmd.CombinedOutput()
	res := &Result{Took: time.Since(start), ExitCode: -1}
	con, _ := os.ReadFile(console)
	res.Console = string(con)
	out, _ := os.ReadFile(filepath.Join(dir, "output"))
	res.Output = string(out)
	if qerr != nil {
		return res, fmt.Errorf("qemu: %w\n%s", qerr, qout)
	}
	rc, err := os.ReadFile(filepath.Join(dir, "rc"))
	if err != nil {
		return res, ErrNoExit
	}
	res.ExitCode, err = strconv.Atoi(strings.TrimSpace(string(rc)))
	if err != nil {
		return res, fmt.Errorf("guest exit status %q: %w", rc, err)
	}
	return res, nil
}

// useKVM reports whether guests run under KVM (RELAYD_VM_ACCEL=kvm);
// otherwise qemu emulates the CPU (TCG).
func useKVM() bool { return os.Getenv("RELAYD_VM_ACCEL") == "kvm" }
