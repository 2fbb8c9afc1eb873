package fastpath

import (
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// portEntry is an entry of the program's port_flows table (struct
// port_flow in bpf/relay.c): a copy of one flow's key and value, indexed
// by its relay port, under a sequence lock.
type portEntry struct {
	seq   uint32 // odd while the entry changes
	key   flowKey
	value relayFlowValue
	_     [16]byte
}

// The C layout: 128 bytes, the value at 24.
const portEntries = 1 << 16

var (
	_ [unsafe.Sizeof(portEntry{}) - 128]byte
	_ [128 - unsafe.Sizeof(portEntry{})]byte
	_ [unsafe.Offsetof(portEntry{}.value) - 24]byte
	_ [24 - unsafe.Offsetof(portEntry{}.value)]byte
)

// portTable is relayd's side of port_flows: the map's memory, mapped
// into relayd, where it writes entries in place; the program only reads
// them. An entry holds the last flow installed on its port and is
// rewritten when that flow changes. The other flows on the port (the
// same port on another address: IPv4 and IPv6, or media interfaces
// whose port ranges overlap) are found in the flow map, and wait in
// others: when the entry's flow goes, the one installed last of them
// takes the entry, so that a port keeps an entry while it has a flow.
// The flow map is written first at an install or an update, the entry
// first at a removal, so an entry never holds what the flow map no
// longer does. All methods are called with the Fastpath's mu held: one
// writer.
//
// The program checks an entry's seq before and after copying it, and a
// writer makes seq odd, writes, and makes it even again. That needs the
// writer's stores seen in order and the program's loads done in order,
// with no barrier instruction between them: true on x86 (TSO), not on
// arm64. Elsewhere the table is never mapped and stays empty, and the
// program finds every flow in the flow map, as before the table.
type portTable struct {
	mem     []byte
	entries *[portEntries]portEntry
	held    int // entries that hold a flow
	// others are the flows of ports whose entry holds another flow, in
	// the order they were installed or lost the entry.
	others map[uint16][]flowKey
}

// portTableSupported says whether this machine's memory model lets the
// table be written (see portTable).
const portTableSupported = runtime.GOARCH == "amd64" || runtime.GOARCH == "386"

// mapPortTable maps the table of the map whose file descriptor is fd. It
// returns nil, nil where the table is not used.
func mapPortTable(fd int) (*portTable, error) {
	if !portTableSupported {
		return nil, nil
	}
	size := portEntries * int(unsafe.Sizeof(portEntry{}))
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the port table: %w", err)
	}
	return &portTable{
		mem:     mem,
		entries: (*[portEntries]portEntry)(unsafe.Pointer(&mem[0])),
		others:  make(map[uint16][]flowKey),
	}, nil
}

// close unmaps the table; the methods do nothing after it.
func (t *portTable) close() error {
	if !t.mapped() {
		return nil
	}
	t.entries, t.others = nil, nil
	return unix.Munmap(t.mem)
}

// mapped reports whether the table is there to be written.
func (t *portTable) mapped() bool { return t != nil && t.entries != nil }

// install makes k's port entry hold k and v; the flow it held, if
// another, waits for the entry in others.
func (t *portTable) install(k *flowKey, v *relayFlowValue) {
	if !t.mapped() {
		return
	}
	port := ntohs(k.Port)
	e := &t.entries[port]
	switch {
	case e.key.Family == 0:
		t.held++
	case e.key != *k:
		t.others[port] = append(t.others[port], e.key)
	}
	t.write(e, k, v)
}

// update rewrites k's port entry with v when it holds k.
func (t *portTable) update(k *flowKey, v *relayFlowValue) {
	if !t.mapped() {
		return
	}
	if e := &t.entries[ntohs(k.Port)]; e.key == *k {
		t.write(e, k, v)
	}
}

// remove takes k out of the table. When k's port entry holds k, the
// flow of others installed last on the port takes the entry, with the
// value lookup gives for it (the flow map's); with none (or none lookup
// finds), the entry is emptied.
func (t *portTable) remove(k *flowKey, lookup func(*flowKey, *relayFlowValue) bool) {
	if !t.mapped() {
		return
	}
	port := ntohs(k.Port)
	e := &t.entries[port]
	if e.key != *k {
		t.dropOther(port, k)
		return
	}
	for q := t.others[port]; len(q) > 0; q = t.others[port] {
		next := q[len(q)-1]
		t.setOthers(port, q[:len(q)-1])
		var v relayFlowValue
		if lookup(&next, &v) {
			t.write(e, &next, &v)
			return
		}
	}
	t.write(e, &flowKey{}, &relayFlowValue{})
	t.held--
}

// dropOther takes k out of port's others.
func (t *portTable) dropOther(port uint16, k *flowKey) {
	q := t.others[port]
	if i := slices.Index(q, *k); i >= 0 {
		t.setOthers(port, slices.Delete(q, i, i+1))
	}
}

func (t *portTable) setOthers(port uint16, q []flowKey) {
	if len(q) == 0 {
		delete(t.others, port)
		return
	}
	t.others[port] = q
}

// holds reports whether k's port entry holds k, with the value it holds.
func (t *portTable) holds(k *flowKey) (relayFlowValue, bool) {
	if !t.mapped() {
		return relayFlowValue{}, false
	}
	e := &t.entries[ntohs(k.Port)]
	return e.value, e.key == *k
}

// write is the sequence lock's writer: the atomic increments order the
// plain stores between them for the compiler, and x86 keeps stores in
// order for the program's CPUs.
func (t *portTable) write(e *portEntry, k *flowKey, v *relayFlowValue) {
	atomic.AddUint32(&e.seq, 1)
	e.key = *k
	e.value = *v
	atomic.AddUint32(&e.seq, 1)
}
