package fastpath

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
)

// bpffsT mounts a private bpf filesystem for a test's pins.
func bpffsT(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpffs", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// refusedSpec makes loadSpec return the relay's maps with a program the
// verifier refuses (it returns without setting R0).
func refusedSpec(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { loadSpec = loadRelay })
	loadSpec = func() (*ebpf.CollectionSpec, error) {
		spec, err := loadRelay()
		if err != nil {
			return nil, err
		}
		spec.Programs["relay_xdp"].Instructions = asm.Instructions{asm.Return()}
		return spec, nil
	}
}

// TestRefusedProgramLeavesNothingPinned: a program the kernel refuses
// leaves no new pins, keeps the maps (and flows) a previous run pinned, and
// the error names the kernel and the verifier's reason.
func TestRefusedProgramLeavesNothingPinned(t *testing.T) {
	requireBPF(t)
	log := zaptest.NewLogger(t)

	t.Run("fresh", func(t *testing.T) {
		pins := bpffsT(t)
		refusedSpec(t)
		_, err := New(Config{PinPath: pins, MaxFlows: 16}, log)
		if err == nil {
			t.Fatal("New succeeded with a refused program")
		}
		var u unix.Utsname
		unix.Uname(&u)
		for _, want := range []string{"kernel " + unix.ByteSliceToString(u.Release[:]) + " refused the XDP program", "R0 !read_ok", "verifier log"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		var ents []os.DirEntry
		filepath.WalkDir(pins, func(p string, d os.DirEntry, err error) error {
			if err == nil && p != pins {
				ents = append(ents, d)
			}
			return nil
		})
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".debug") {
				t.Errorf("left pinned: %s", e.Name())
			}
		}
	})

	t.Run("previous run", func(t *testing.T) {
		pins := bpffsT(t)
		f, err := New(Config{PinPath: pins, MaxFlows: 16}, log)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		dir := filepath.Join(pins, "v1")
		before, _ := os.ReadDir(dir)
		refusedSpec(t)
		if _, err := New(Config{PinPath: pins, MaxFlows: 16}, log); err == nil {
			t.Fatal("New succeeded with a refused program")
		}
		after, _ := os.ReadDir(dir)
		if len(after) != len(before) || len(before) == 0 {
			t.Errorf("pins before the refused load %v, after %v: want the previous run's kept", names(before), names(after))
		}
	})
}

func names(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
