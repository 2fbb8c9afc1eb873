package transcode

import (
	"testing"

	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// The benchmarks cost one 20 ms packet each: Push, then Pull until 0.
// BenchmarkBcg729 is the bare codec on the same frames (two G.729 frames
// encoded, or decoded), so that the engine's own overhead is the
// difference.

func benchPCM() []int16 { return speechLike(8000, false) }

func BenchmarkG711ToG729(b *testing.B) {
	needBcg729(b)
	payloads := g711Packets(pcmu(20), benchPCM())
	s := newStream(b, pcmu(20), g729c(20, false))
	pkt := make([]byte, rtp.HeaderSize+160)
	dst := make([]byte, MaxPacket)
	var h rtp.Header
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		h = rtp.Header{SequenceNumber: uint16(i), Timestamp: uint32(i * 160), SSRC: inSSRC}
		_, _ = h.MarshalTo(pkt)
		copy(pkt[rtp.HeaderSize:], payloads[i%len(payloads)])
		now := t0 + int64(i)*20*ms
		if err := s.Push(pkt, now); err != nil {
			b.Fatal(err)
		}
		for s.Pull(dst, now) > 0 {
		}
	}
}

func BenchmarkG729ToG711(b *testing.B) {
	needBcg729(b)
	payloads := g729Packets(g729Frames(b, benchPCM(), false), 20)
	s := newStream(b, g729c(20, false), pcmu(20))
	pkt := make([]byte, rtp.HeaderSize+20)
	dst := make([]byte, MaxPacket)
	var h rtp.Header
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		h = rtp.Header{PayloadType: ptG729, SequenceNumber: uint16(i), Timestamp: uint32(i * 160), SSRC: inSSRC}
		_, _ = h.MarshalTo(pkt)
		copy(pkt[rtp.HeaderSize:], payloads[i%len(payloads)])
		now := t0 + int64(i)*20*ms
		if err := s.Push(pkt, now); err != nil {
			b.Fatal(err)
		}
		for s.Pull(dst, now) > 0 {
		}
	}
}

// BenchmarkBcg729 is the codec alone per 20 ms: encode two frames of the
// same PCM, and decode two frames of the same bitstream.
func BenchmarkBcg729(b *testing.B) {
	needBcg729(b)
	pcm := ulawRoundTrip(benchPCM())
	codes := g729Packets(g729Frames(b, pcm, false), 20)
	b.Run("encode", func(b *testing.B) {
		e, _ := g729.NewEncoder(false)
		defer e.Close()
		out := make([]byte, 0, 20)
		b.ReportAllocs()
		for i := range b.N {
			off := i % (len(pcm) / 160) * 160
			_, _, _ = e.Encode(out[:0], pcm[off:off+160])
		}
	})
	b.Run("decode", func(b *testing.B) {
		d, _ := g729.NewDecoder()
		defer d.Close()
		out := make([]int16, 0, 160)
		b.ReportAllocs()
		for i := range b.N {
			_, _ = d.Decode(out[:0], codes[i%len(codes)])
		}
	})
}
