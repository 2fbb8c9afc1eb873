package labrelay

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// SizeClass is how one object size of a heap dump sits in the heap's
// pages: Objects live objects of Size bytes each, on Pages distinct 8 KiB
// pages (a page with one live object of the size counts whole; spans of
// several pages are counted by the pages their objects touch, so Waste
// is a lower bound for those).
type SizeClass struct {
	Size, Objects, Pages int64
}

// Live is the bytes the size's live objects take.
func (c SizeClass) Live() int64 { return c.Size * c.Objects }

// Waste is what the pages holding the size's objects hold beyond them.
func (c SizeClass) Waste() int64 { return c.Pages*pageSize - c.Live() }

const pageSize = 8192

// Heap dump records (runtime/heapdump.go, format "go1.7 heap dump").
const (
	dumpObject = 1
	dumpType   = 3
	dumpParams = 6
	dumpItab   = 8
)

// SizeClasses reads a heap dump (runtime/debug.WriteHeapDump, as
// relayd's /debug/heapdump writes one in test builds) and returns its
// live objects by size, the most wasteful first. It reads the dump's
// objects only: they follow its parameters, types and itabs, and the
// goroutines and roots after them are of no use here.
func SizeClasses(path string) ([]SizeClass, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	const header = "go1.7 heap dump\n"
	h := make([]byte, len(header))
	if _, err := io.ReadFull(r, h); err != nil || string(h) != header {
		return nil, fmt.Errorf("%s: not a heap dump (%q)", path, h)
	}
	uv := func() uint64 {
		v, e := binary.ReadUvarint(r)
		if e != nil && err == nil {
			err = e
		}
		return v
	}
	skip := func() { // a string or memory range: length, then bytes
		if n := uv(); err == nil {
			if _, e := r.Discard(int(n)); e != nil {
				err = e
			}
		}
	}
	pages := make(map[int64]bool) // a page holds objects of one size only
	classes := make(map[int64]*SizeClass)
	var buf []byte
	for err == nil {
		switch tag := uv(); tag {
		case dumpParams:
			uv()   // big-endian
			uv()   // pointer size
			uv()   // arena start
			uv()   // arena end
			skip() // GOARCH
			skip() // Go version
			uv()   // CPUs
		case dumpType:
			uv() // address
			uv() // size
			skip()
			uv() // has pointers
		case dumpItab:
			uv()
			uv()
		case dumpObject:
			addr := int64(uv())
			size := int64(uv())
			if cap(buf) < int(size) {
				buf = make([]byte, size)
			}
			if _, e := io.ReadFull(r, buf[:size]); e != nil {
				return nil, e
			}
			// The dump lists the last slot of a small-object span,
			// where Go 1.26 keeps the span's mark bits, as an object:
			// zeroed, never referenced. Such slots (and any live
			// object of zeroes) count for their page, not as objects.
			zero := !slices.ContainsFunc(buf[:size], func(b byte) bool { return b != 0 })
			for uv() != 0 && err == nil { // pointer fields: kind, offset
				uv()
			}
			c := classes[size]
			if c == nil {
				c = &SizeClass{Size: size}
				classes[size] = c
			}
			if !zero {
				c.Objects++
			}
			for p := addr / pageSize; p <= (addr+size-1)/pageSize; p++ {
				if !pages[p] {
					pages[p] = true
					c.Pages++
				}
			}
		default:
			// The goroutines and roots: the objects are all read.
			out := make([]SizeClass, 0, len(classes))
			for _, c := range classes {
				out = append(out, *c)
			}
			slices.SortFunc(out, func(a, b SizeClass) int { return cmp.Compare(b.Waste(), a.Waste()) })
			return out, nil
		}
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return nil, fmt.Errorf("%s: %w", path, err)
}
