// Package bpffs answers whether a path is on a bpf filesystem, for the
// daemon (fastpath, which pins there) and its privileged start step
// (hostprep, which mounts one).
package bpffs

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Root is where systemd mounts the bpf filesystem at boot.
const Root = "/sys/fs/bpf"

const magic = 0xcafe4a11 // BPF_FS_MAGIC

// On reports whether dir, or the nearest of its parents that exists, is on
// a bpf filesystem.
func On(dir string) (bool, error) {
	p := dir
	for {
		if _, err := os.Stat(p); err == nil {
			break
		}
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", p, err)
	}
	return st.Type == magic, nil
}
