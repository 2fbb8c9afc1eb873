package hostprep

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/internal/bpffs"
)

// Prepare prepares the host for cfg; see the package documentation. It
// stops at the first error, which names the step and the interface.
func Prepare(cfg Config, log *zap.Logger) error {
	if cfg.procSys == "" {
		cfg.procSys = "/proc/sys"
	}
	if cfg.Nft == "" {
		cfg.Nft = "nft"
	}
	for _, name := range cfg.Interfaces {
		if strings.ContainsAny(name, "\"\\") {
			return fmt.Errorf("interface %q: quotes and backslashes are not supported in names", name)
		}
		if err := enableForwarding(cfg.procSys, name, log); err != nil {
			return err
		}
	}
	if cfg.PinPath != "" {
		if err := ensureBPFFS(cfg.PinPath, log); err != nil {
			return err
		}
	}
	if err := loadRuleset(cfg.Nft, Ruleset(cfg.Interfaces)); err != nil {
		return err
	}
	if len(cfg.Interfaces) > 0 {
		log.Info("forward-drop rule installed", zap.String("table", "inet "+Table), zap.Strings("interfaces", cfg.Interfaces))
	}
	return nil
}

// enableForwarding writes 1 to the interface's IPv4 and IPv6 forwarding
// sysctls. An interface without IPv6 (disable_ipv6, or no IPv6 in the
// kernel) has no IPv6 directory and is left so.
func enableForwarding(procSys, name string, log *zap.Logger) error {
	v4 := filepath.Join(procSys, "net/ipv4/conf", name, "forwarding")
	if _, err := os.Stat(filepath.Dir(v4)); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("interface %s: no such interface (dataplane.interfaces)", name)
	}
	if err := writeSysctl(v4, log); err != nil {
		return fmt.Errorf("enable IPv4 forwarding on %s: %w", name, err)
	}
	v6 := filepath.Join(procSys, "net/ipv6/conf", name, "forwarding")
	if _, err := os.Stat(filepath.Dir(v6)); errors.Is(err, os.ErrNotExist) {
		log.Info("no IPv6 on interface, IPv6 forwarding left alone", zap.String("interface", name))
		return nil
	}
	if err := writeSysctl(v6, log); err != nil {
		return fmt.Errorf("enable IPv6 forwarding on %s: %w", name, err)
	}
	return nil
}

func writeSysctl(path string, log *zap.Logger) error {
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
		return err
	}
	log.Info("enabled forwarding", zap.String("sysctl", path))
	return nil
}

const bpffsRoot = bpffs.Root

// ensureBPFFS makes sure dir is on a bpf filesystem: it mounts one on
// /sys/fs/bpf when dir is below it and /sys/fs/bpf is not one yet. A pin
// path elsewhere must already be on a bpffs.
func ensureBPFFS(dir string, log *zap.Logger) error {
	on, err := bpffs.On(dir)
	if err != nil {
		return err
	}
	if on {
		return mkdirPins(dir)
	}
	if dir != bpffsRoot && !strings.HasPrefix(dir, bpffsRoot+"/") {
		return fmt.Errorf("pin path %s (dataplane.pin_path) is not on a bpf filesystem: mount one there or use a path below %s", dir, bpffsRoot)
	}
	if err := os.MkdirAll(bpffsRoot, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", bpffsRoot, err)
	}
	if err := mountBPFFS(log); err != nil {
		return err
	}
	if on, err := bpffs.On(bpffsRoot); err != nil || !on {
		return fmt.Errorf("mounted a bpf filesystem on %s in the system's mount namespace, but it does not show here (statfs: %v)", bpffsRoot, err)
	}
	return mkdirPins(dir)
}

// mountBPFFS mounts bpffs on /sys/fs/bpf in the system's mount namespace
// (PID 1's). systemd 252 runs even ExecStartPre=+ commands in a mount
// namespace of their own when the unit has ProtectSystem= and the like: a
// mount made there would vanish with the command, and the pins with it. A
// Go process cannot setns(2) into another mount namespace (it has
// threads), so nsenter (util-linux, essential) makes the mount there; the
// mount propagates back into this namespace, a slave of the system's.
func mountBPFFS(log *zap.Logger) error {
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	pid1, err2 := os.Readlink("/proc/1/ns/mnt")
	if err1 != nil || err2 != nil || self == pid1 {
		if err := unix.Mount("bpffs", bpffsRoot, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpf filesystem on %s: %w", bpffsRoot, err)
		}
		log.Info("mounted bpf filesystem", zap.String("path", bpffsRoot))
		return nil
	}
	out, err := exec.Command("nsenter", "--target", "1", "--mount", "--",
		"mount", "-t", "bpf", "-o", "mode=0700", "bpffs", bpffsRoot).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount bpf filesystem on %s in the system's mount namespace (nsenter -t 1 -m): %w: %s", bpffsRoot, err, bytes.TrimSpace(out))
	}
	log.Info("mounted bpf filesystem in the system's mount namespace", zap.String("path", bpffsRoot))
	return nil
}

// mkdirPins creates the pin directory: the unit makes it, not all of
// /sys/fs/bpf, writable (ReadWritePaths=), which needs it to exist when the
// service's namespace is set up.
func mkdirPins(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create pin directory %s: %w", dir, err)
	}
	return nil
}

// loadRuleset runs nft -f - with the script on its standard input.
func loadRuleset(nft, script string) error {
	cmd := exec.Command(nft, "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("load forward-drop rule: %w (install the nftables package)", err)
		}
		return fmt.Errorf("load forward-drop rule with %s: %w: %s", nft, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
