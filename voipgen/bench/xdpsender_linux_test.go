package bench

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// TestXDPSenderFrames sends with the XDP sender over the direct pair, both
// ways, to the socket sink: the kernel's UDP stack checks every frame's
// IPv4 and UDP checksums and delivers it to the sink's or the sender's
// socket only if the headers are right, so every stream counted in full
// means every frame was. Building a frame and queueing it allocates
// nothing.
func TestXDPSenderFrames(t *testing.T) {
	testenv.NeedRoot(t)
	b := &fwdBench{cfg: FwdConfig{flows: []int{40}, sender: benchEndXDP}, log: testWriter{t}}
	defer b.close()
	if err := b.setup(40); err != nil {
		t.Fatal(err)
	}
	near := func(j int) netip.AddrPort { return netip.AddrPortFrom(addrAt(directPrefix, j), uint16(fwdSinkPort)) }
	p := fwdPath{msgs: b.snd.messages(20, 0, near)}
	p.rev = b.snd.revMessages(20, 20, near, func(int) netip.AddrPort {
		return netip.AddrPortFrom(directCaller.Addr(), uint16(fwdSenderPort))
	})
	if p.msgs.frames == nil || p.rev.frames == nil || p.msgs.err != nil || p.rev.err != nil {
		t.Fatalf("no frames: %v %v", p.msgs.err, p.rev.err)
	}
	m := fwdMode{Name: "direct", Kind: "kernel"}
	tag := b.tag(m, true)
	before, err := b.sink.counts(40)
	if err != nil {
		t.Fatal(err)
	}
	res := b.snd.run(context.Background(), p, 20*time.Millisecond, 200*time.Millisecond, tag)
	if res.err != nil || res.errors != 0 || res.packets != 10*40 || res.rev != 10*20 {
		t.Fatalf("sent %d (%d reverse), %d errors, %v; want 400 (200 reverse)", res.packets, res.rev, res.errors, res.err)
	}
	b.sink.drain(tag, res.packets)
	if got := b.sink.run(tag); got != res.packets {
		t.Errorf("run %d: the sink counted %d of %d packets", tag, got, res.packets)
	}
	after, err := b.sink.counts(40)
	if err != nil {
		t.Fatal(err)
	}
	for i := range after {
		if d := after[i] - before[i]; d != 10 {
			t.Errorf("stream %d: %d packets counted, want 10", i, d)
		}
	}
	var pushed fwdSendResult
	allocs := testing.AllocsPerRun(100, func() {
		b.snd.push(&pushed, &p.msgs, 0, 20, false)
		b.snd.push(&pushed, &p.rev, 0, 20, true)
	})
	if allocs != 0 {
		t.Errorf("push: %.1f allocations per run, want 0", allocs)
	}
}
