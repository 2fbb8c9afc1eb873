package bpffs

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/lab"
)

func TestOn(t *testing.T) {
	dir := t.TempDir()
	if on, err := On(filepath.Join(dir, "a", "b")); err != nil || on {
		t.Errorf("On(a directory of a tmpfs or disk) = %v, %v; want false", on, err)
	}
	if err := unix.Mount("bpffs", dir, "bpf", 0, "mode=0700"); err != nil {
		lab.SkipOrFail(t, "mount bpffs: "+err.Error())
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	if on, err := On(filepath.Join(dir, "not", "yet", "made")); err != nil || !on {
		t.Errorf("On(below a bpffs) = %v, %v; want true", on, err)
	}
}
