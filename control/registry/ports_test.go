package registry

import (
	"errors"
	"testing"
)

func TestPorts(t *testing.T) {
	p, err := NewPorts(30000, 30005)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint16
	for range 3 {
		port, err := p.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, port)
	}
	if got[0] != 30000 || got[1] != 30002 || got[2] != 30004 {
		t.Errorf("ports %v, want 30000 30002 30004", got)
	}
	if _, err := p.Alloc(); !errors.Is(err, ErrNoPorts) {
		t.Errorf("exhausted: %v, want ErrNoPorts", err)
	}
	p.Release(30002)
	p.Release(30002) // twice: no effect
	p.Release(12)    // out of range: no effect
	if p.Free() != 1 {
		t.Errorf("free %d, want 1", p.Free())
	}
	if port, _ := p.Alloc(); port != 30002 {
		t.Errorf("after release got %d, want 30002", port)
	}
	if _, err := NewPorts(30001, 30005); err == nil {
		t.Error("odd first port accepted")
	}
}

func TestPortsRoundRobin(t *testing.T) {
	p, _ := NewPorts(30000, 30007)
	a, _ := p.Alloc()
	p.Release(a)
	b, _ := p.Alloc()
	if a == b {
		t.Errorf("released pair %d reused at once; want the next one", a)
	}
}
