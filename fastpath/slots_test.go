package fastpath

import (
	"math/rand/v2"
	"testing"
)

// TestSlotAllocByPort: a flow takes its port's slot when that is free;
// another flow on the port, or one outside the range, the lowest free
// slot above the range, then the lowest below it; nothing when all are
// taken. Released slots are found again.
func TestSlotAllocByPort(t *testing.T) {
	a := newSlotAlloc(8, 30000, 4) // ports 30000-30003: slots 0-3
	want := func(port uint16, slot uint32) {
		t.Helper()
		if s, ok := a.alloc(port); !ok || s != slot {
			t.Fatalf("port %d: slot %d (%v), want %d", port, s, ok, slot)
		}
	}
	want(30002, 2)
	want(30002, 4) // the port's slot taken
	want(29000, 5) // below the range
	want(40000, 6) // above it
	want(30000, 0)
	want(30002, 7)
	want(30002, 1) // above the range full: below it
	want(30003, 3)
	if s, ok := a.alloc(30001); ok {
		t.Fatalf("slot %d of 8 taken twice", s)
	}
	a.release(5)
	a.release(1)
	want(30002, 5)
	want(30001, 1)
	a.release(3)
	a.release(3) // twice: no second slot freed
	want(30001, 3)
	if _, ok := a.alloc(30003); ok || a.inUse != 8 {
		t.Fatalf("%d slots in use, want all 8", a.inUse)
	}
}

// TestSlotAllocAdopted: slots taken for adopted flows are never handed
// out again until released, whatever their port.
func TestSlotAllocAdopted(t *testing.T) {
	a := newSlotAlloc(100, 0, 50)
	for _, s := range []uint32{7, 50, 51, 99, 100 /* past the array: ignored */} {
		a.take(s)
	}
	if s, _ := a.alloc(7); s != 52 {
		t.Errorf("port 7 (slot adopted): slot %d, want 52", s)
	}
	if s, _ := a.alloc(8); s != 8 {
		t.Errorf("port 8: slot %d, want 8", s)
	}
	if a.inUse != 6 {
		t.Errorf("%d in use, want 6", a.inUse)
	}
}

// TestSlotAllocRandom checks the allocator against a plain set over
// random allocations and releases: no slot handed out twice, the port's
// slot whenever it is free, else the lowest free one of the right region.
func TestSlotAllocRandom(t *testing.T) {
	const n, base, span = 300, 1000, 200
	a := newSlotAlloc(n, base, span)
	used := map[uint32]bool{}
	rng := rand.New(rand.NewPCG(3, 4))
	lowest := func(from, to uint32) (uint32, bool) {
		for s := from; s < to; s++ {
			if !used[s] {
				return s, true
			}
		}
		return 0, false
	}
	for i := range 20000 {
		if rng.IntN(3) == 0 && len(used) > 0 {
			for s := range used {
				a.release(s)
				delete(used, s)
				break
			}
			continue
		}
		port := uint16(base - 20 + rng.IntN(span+40))
		got, ok := a.alloc(port)
		want, wantOK := uint32(port)-base, true
		if want >= span || used[want] {
			if want, wantOK = lowest(span, n); !wantOK {
				want, wantOK = lowest(0, span)
			}
		}
		if got != want || ok != wantOK {
			t.Fatalf("step %d, port %d: slot %d (%v), want %d (%v)", i, port, got, ok, want, wantOK)
		}
		if ok {
			used[got] = true
		}
		if a.inUse != len(used) {
			t.Fatalf("step %d: %d in use, want %d", i, a.inUse, len(used))
		}
	}
}
