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
// relayd's); nothing is ever written through them. The context's own
// first lines are listed too (cmRTP.warmLines). TestPrefetch checks that the objects
// found are the ones packets go on reading.
type warmSet struct {
	lines [maxWarmLines]unsafe.Pointer
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

// add notes the first lines of the object of size bytes at p.
func (w *warmSet) add(p unsafe.Pointer, size uintptr) {
	// The object's first line, then the lines its first maxObjectLines
	// lines' worth of bytes reach; offsets stay inside the object.
	for off := uintptr(0); off < size && off < maxObjectLines*cacheLine; off += cacheLine {
		if w.n == len(w.lines) {
			return
		}
		w.lines[w.n] = unsafe.Add(p, off)
		w.n++
	}
}

// prefetch starts the loads of the lines.
func (w *warmSet) prefetch() {
	if w.n > 0 {
		prefetchLines(&w.lines[0], w.n)
	}
}
