package fastpath

import (
	"testing"

	"github.com/relayd/relayd/dataplane"
)

// FuzzXDP feeds arbitrary frames through the program. Whatever the input:
// the program never aborts, it forwards only frames that pass full header
// validation in Go and are addressed to an installed flow from an accepted
// source, the forwarded frame is itself valid, and every packet is counted
// exactly once. The program does not sum payloads to verify UDP checksums:
// a frame with a bad one may be forwarded, but then with a checksum that is
// still bad, so the receiver drops it as it would have without the relay.
func FuzzXDP(f *testing.F) {
	e := newTestEnv(f)
	flows := []dataplane.Flow{
		{Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000), ClockRate: 8000},
		{Match: ap(relay6, 30000), SendFrom: ap(relay6, 30002), SendTo: ap(callee6, 5000), ClockRate: 8000},
		{Match: ap(relay4, 30004), Action: dataplane.Reflect},
		{Match: ap(relay4, 30008), ExpectSource: ap(caller4, 4000), SendFrom: ap(relay4, 30010), SendTo: ap(callee4, 5002), ClockRate: 8000},
	}
	byMatch := map[string]dataplane.Flow{}
	for _, fl := range flows {
		if err := e.fp.Install(fl); err != nil {
			f.Fatal(err)
		}
		byMatch[fl.Match.String()] = fl
	}
	rtp := rtpPacket(9, 1, 160, 40)
	f.Add(buildFrame(ap(caller4, 4000), ap(relay4, 30000), rtp, frameOpts{}))
	f.Add(buildFrame(ap(caller6, 4000), ap(relay6, 30000), rtp, frameOpts{}))
	f.Add(buildFrame(ap(caller4, 4000), ap(relay4, 30004), rtp, frameOpts{zeroCsum: true}))
	f.Add(buildFrame(ap(caller4, 4000), ap(relay4, 30008), rtp, frameOpts{}))
	f.Add(buildFrame(ap(caller4, 4000), ap(relay4, 30000), rtp, frameOpts{ipOptions: true}))
	f.Add(buildFrame(ap(caller6, 4000), ap(relay6, 30000), rtp, frameOpts{hasExt: true, ipv6Ext: 44}))

	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > 1500 {
			return // BPF_PROG_TEST_RUN refuses frames shorter than Ethernet
		}
		before := e.counters(t)
		in := append([]byte(nil), frame...)
		verdict, out := e.run(t, in)
		var total, was uint64
		for k, v := range e.counters(t) {
			total += v
			was += before[k]
		}
		if total != was+1 {
			t.Fatalf("counters rose by %d, want 1", total-was)
		}
		switch verdict {
		case xdpPass:
			return
		case xdpDrop:
			return
		case xdpTx, xdpRedirect:
		default:
			t.Fatalf("verdict %d", verdict)
		}
		p, inErr := parseFrame(frame)
		if inErr != nil && inErr != errUDPChecksum {
			t.Fatalf("forwarded a frame that fails validation: %v", inErr)
		}
		fl, ok := byMatch[p.dst.String()]
		if !ok {
			t.Fatalf("forwarded a frame to %s: no such flow", p.dst)
		}
		if fl.ExpectSource.IsValid() && p.src != fl.ExpectSource {
			t.Fatalf("forwarded a frame from %s, flow expects %s", p.src, fl.ExpectSource)
		}
		if len(p.payload) == 0 || p.payload[0] < 128 || p.payload[0] > 191 {
			t.Fatalf("forwarded a non-RTP payload %x", p.payload)
		}
		o, err := parseFrame(out)
		if err != inErr {
			t.Fatalf("forwarded frame: %v, input frame: %v", err, inErr)
		}
		if o.ttl != p.ttl-1 {
			t.Fatalf("TTL %d -> %d", p.ttl, o.ttl)
		}
	})
}
