package srtpflow

import (
	"reflect"
	"unsafe"
)

// warmSet lists the cache lines an RTP packet's protection reads in the
// standard library's objects behind a context (the AES key schedule, the
// HMAC and its keyed SHA-1 states), so that a worker can have them on
// their way to the CPU's caches for a whole batch of packets before it
// protects the first one. A worker meets hundreds of flows in turn and
// finds a flow's context out of its caches at the flow's next packet; one
// packet's misses come one after the other as the cipher and the MAC
// reach each object, while prefetches issued together for a batch
// overlap. The lines are found once, when the context is made, by walking
// the objects with reflect (their fields are the standard library's, not
// relayd's); nothing is ever read or written through them. They are kept
// as line addresses (uintptr), not pointers: a line may begin before its
// object, and the objects stay where they are (Go's heap does not move
// objects) and alive as long as the context that holds them and the set.
// The context's own first lines are listed too (cmRTP.warmLines).
// TestPrefetch checks that the objects found are the ones packets go on
// reading.
type warmSet struct {
	lines [maxWarmLines]uintptr
	n     int
}

const (
	maxWarmLines   = 20 // lines kept in all
	maxObjectLines = 4  // lines taken from one object: its first
	maxWarmDepth   = 4  // pointers followed from the context's fields
	cacheLine      = 64
)

// collect adds the lines of the objects v points to, and of those they
// point to, up to maxWarmDepth pointers away.
func (w *warmSet) collect(v reflect.Value, depth int) {
	if depth > maxWarmDepth || w.n == len(w.lines) {
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return
		}
		w.add(v.UnsafePointer(), v.Type().Elem().Size())
		w.collect(v.Elem(), depth+1)
	case reflect.Interface:
		if !v.IsNil() {
			w.collect(v.Elem(), depth)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			w.collect(v.Field(i), depth)
		}
	case reflect.Slice:
		if v.IsNil() || v.Len() == 0 {
			return
		}
		w.add(v.UnsafePointer(), uintptr(v.Len())*v.Type().Elem().Size())
	}
}

// add notes the lines that the first bytes of the object of size bytes at
// p are on (at most maxObjectLines lines' worth of bytes), each once.
func (w *warmSet) add(p unsafe.Pointer, size uintptr) {
	start := uintptr(p)
	end := start + min(size, maxObjectLines*cacheLine)
	for l := start &^ (cacheLine - 1); l < end; l += cacheLine {
		if w.has(l) {
			continue
		}
		if w.n == len(w.lines) {
			return
		}
		w.lines[w.n] = l
		w.n++
	}
}

// has reports whether line l is in the set.
func (w *warmSet) has(l uintptr) bool {
	for _, x := range w.lines[:w.n] {
		if x == l {
			return true
		}
	}
	return false
}

// prefetch starts the loads of the lines.
func (w *warmSet) prefetch() {
	if w.n > 0 {
		prefetchLines(&w.lines[0], w.n)
	}
}
