package fastpath

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/dataplane"
)

// oldLayoutSpec makes loadSpec return the program with a counters map of
// 22 slots, as relayds before the loop counter pinned it.
func oldLayoutSpec(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { loadSpec = loadRelay })
	loadSpec = func() (*ebpf.CollectionSpec, error) {
		spec, err := loadRelay()
		if err != nil {
			return nil, err
		}
		spec.Maps["counters"].MaxEntries = 22
		return spec, nil
	}
}

// TestCountersMapUpgrade: a relayd whose pinned counters map has fewer
// slots (a release with fewer counters) is taken over: the new program
// gets a map of its own size, the counters keep their values, the flows
// stay. A refused program leaves the old map pinned.
func TestCountersMapUpgrade(t *testing.T) {
	requireBPF(t)
	log := zaptest.NewLogger(t)
	pins := bpffsT(t)
	oldLayoutSpec(t)
	f, err := New(Config{PinPath: pins, MaxFlows: 16}, log)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.objs.Counters.MaxEntries(); got != 22 {
		t.Fatalf("old layout: %d counter slots", got)
	}
	fl := dataplane.Flow{ID: 5, Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000}
	if err := f.Install(fl); err != nil {
		t.Fatal(err)
	}
	per := make([]relayCounter, ebpf.MustPossibleCPU())
	per[0] = relayCounter{Packets: 7, Bytes: 700}
	const wrongSource = 20
	if err := f.objs.Counters.Put(uint32(wrongSource), per); err != nil {
		t.Fatal(err)
	}
	f.Close()
	path := filepath.Join(pins, "v1", "counters")

	// A refused program: the old map stays pinned, as it was.
	loadSpec = func() (*ebpf.CollectionSpec, error) {
		spec, err := loadRelay()
		if err == nil {
			spec.Programs["relay_xdp"].Instructions = spec.Programs["relay_xdp"].Instructions[:0:0]
		}
		return spec, err
	}
	if _, err := New(Config{PinPath: pins, MaxFlows: 16}, log); err == nil {
		t.Fatal("an empty program loaded")
	}
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatalf("counters map after a refused load: %v", err)
	}
	if m.MaxEntries() != 22 {
		t.Errorf("counters map after a refused load has %d slots, want the old 22", m.MaxEntries())
	}
	m.Close()

	loadSpec = loadRelay
	f, err = New(Config{PinPath: pins, MaxFlows: 16}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, want := f.objs.Counters.MaxEntries(), uint32(64); got != want {
		t.Errorf("counters map has %d slots, want %d", got, want)
	}
	cs, err := f.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Verdict == "drop" && c.Reason == "wrong_source" && (c.Packets != 7 || c.Bytes != 700) {
			t.Errorf("wrong_source after the upgrade: %d packets %d bytes, want 7 and 700", c.Packets, c.Bytes)
		}
	}
	if _, err := f.Stats(fl.Match); err != nil {
		t.Errorf("flow of the previous run: %v", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("new counters map not pinned: %v", err)
	}
}
