package transcode

import (
	"testing"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/rtp"
)

// allocCycle returns a function that sends the next 100 ms of input
// (five 20 ms packets, the third lost, so the fourth is held and the
// hold expires) and pulls everything out.
func allocCycle(t *testing.T, in, out dataplane.Codec, payload []byte) (*Stream, func()) {
	s := newStream(t, in, out)
	pkt := mkPkt(in.PT, 0, 0, inSSRC, false, payload)
	dst := make([]byte, MaxPacket)
	var h rtp.Header
	seq, ts, now := uint16(1), uint32(0), t0
	return s, func() {
		for i := range 5 {
			if i != 2 {
				h = rtp.Header{PayloadType: in.PT, SequenceNumber: seq, Timestamp: ts, SSRC: inSSRC}
				_, _ = h.MarshalTo(pkt)
				if err := s.Push(pkt, now); err != nil {
					t.Fatal(err)
				}
			}
			for s.Pull(dst, now) > 0 {
			}
			seq, ts, now = seq+1, ts+160, now+20*ms
			if d := s.Deadline(); d != 0 && d <= now {
				for s.Pull(dst, d) > 0 {
				}
			}
		}
		_ = s.Report(dst, now, &rtp.ReceiverStats{}, &rtp.LossInterval{}, "relayd@example")
	}
}

func TestNoAlloc(t *testing.T) {
	needBcg729(t)
	g729Payload := make([]byte, 20)
	for i := range g729Payload {
		g729Payload[i] = byte(i * 37)
	}
	ulaw := g711Packets(pcmu(20), tone(160, 300, 3000))[0]
	for _, tc := range []struct {
		name    string
		in, out dataplane.Codec
		payload []byte
	}{
		{"G.711 to G.729", pcmu(20), g729c(20, false), ulaw},
		{"G.711 to G.729 VAD", pcmu(20), g729c(40, true), ulaw},
		{"G.729 to G.711", g729c(20, false), pcma(30), g729Payload},
	} {
		s, f := allocCycle(t, tc.in, tc.out, tc.payload)
		f()
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations per 100 ms with loss, want 0", tc.name, n)
		}
		if st := s.Stats(); st.Concealed == 0 || st.MaxHold == 0 || st.SentPackets == 0 {
			t.Errorf("%s: the cycle did not conceal, hold and send: %+v", tc.name, st)
		}
	}
}
