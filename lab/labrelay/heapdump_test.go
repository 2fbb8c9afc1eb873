package labrelay

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"
)

// SizeClasses reads this process's own heap dump back: objects of a size
// nothing else here uses, kept alive, are all counted, on at least the
// pages they fill.
func TestSizeClasses(t *testing.T) {
	const n, size = 5000, 1152 // a size class of its own
	keep := make([]*[size]byte, n)
	for i := range keep {
		keep[i] = new([size]byte)
		keep[i][0] = 1 // not a zeroed slot
	}
	path := filepath.Join(t.TempDir(), "heap.dump")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	debug.WriteHeapDump(f.Fd())
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(keep)
	classes, err := SizeClasses(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range classes {
		if c.Size != size {
			continue
		}
		if c.Objects < n || c.Pages < n*size/pageSize || c.Waste() < 0 {
			t.Errorf("size %d: %d objects on %d pages (waste %d), want at least %d objects on %d pages", size, c.Objects, c.Pages, c.Waste(), n, n*size/pageSize)
		}
		return
	}
	t.Errorf("no objects of %d bytes in %d sizes", size, len(classes))
}
