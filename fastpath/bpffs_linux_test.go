package fastpath

import (
	"runtime"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/internal/testenv"
)

// TestBPFFSErrors: a pin path that is not on a bpffs gets an error that
// says what to do; in a private mount namespace relayd refuses to mount
// one, since it would vanish with the pins at exit.
func TestBPFFSErrors(t *testing.T) {
	err := ensureBPFFS(t.TempDir()+"/relayd", zaptest.NewLogger(t))
	if err == nil || !strings.Contains(err.Error(), "mount -t bpf bpffs") {
		t.Errorf("pin path on tmpfs: %v", err)
	}
	testenv.NeedRoot(t)
	errc := make(chan error, 1)
	go func() {
		// This thread gets a mount namespace of its own and is never
		// handed back to the scheduler: it ends with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			errc <- err
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errc <- err
			return
		}
		// /sys/fs/bpf is not a bpffs, and a slave of a shared mount: as
		// in a systemd service's namespace, mounts under it would not
		// propagate back.
		for _, m := range []struct {
			src, fs string
			flags   uintptr
		}{
			{"tmpfs", "tmpfs", 0},
			{"", "", unix.MS_SHARED},
			{"/sys/fs/bpf", "", unix.MS_BIND},
			{"", "", unix.MS_SLAVE},
		} {
			if err := unix.Mount(m.src, "/sys/fs/bpf", m.fs, m.flags, ""); err != nil {
				errc <- err
				return
			}
		}
		errc <- ensureBPFFS("/sys/fs/bpf/relayd", zaptest.NewLogger(t))
	}()
	err = <-errc
	if err == nil || !strings.Contains(err.Error(), "private mount namespace") || !strings.Contains(err.Error(), "relayd -prepare") {
		t.Errorf("private mount namespace: %v", err)
	}
}
