package rtp

import (
	"bytes"
	"testing"
)

// Seed corpora live in testdata/fuzz/<FuzzName>; `go test -fuzz` adds
// failing inputs there.

func FuzzHeaderUnmarshal(f *testing.F) {
	f.Add([]byte{0x80, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		off, err := h.Unmarshal(b)
		if err != nil {
			if off != 0 {
				t.Fatalf("offset %d with error %v", off, err)
			}
			return
		}
		if off < HeaderSize || off+int(h.PaddingLen) > len(b) {
			t.Fatalf("offset %d padding %d len %d", off, h.PaddingLen, len(b))
		}
		if Demux(b) != ClassRTP && Demux(b) != ClassRTCP {
			t.Fatalf("parsed as RTP but demuxed as %v", Demux(b))
		}
		out, err := h.Append(nil)
		if err != nil {
			t.Fatalf("marshal parsed header: %v", err)
		}
		if !bytes.Equal(out, b[:off]) {
			t.Fatalf("round trip\n got %x\nwant %x", out, b[:off])
		}
		var h2 Header
		if off2, err := h2.Unmarshal(append(out, b[off:]...)); err != nil || off2 != off {
			t.Fatalf("reparse: %d %v", off2, err)
		}
	})
}

func FuzzRTCPUnmarshal(f *testing.F) {
	f.Add([]byte{0x80, 0xc9, 0, 1, 1, 2, 3, 4})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h RTCPHeader
		var rr ReceptionReport
		var si SenderInfo
		for len(b) > 0 {
			off, err := h.Unmarshal(b)
			if err != nil {
				return
			}
			n := h.PacketLen()
			if n < RTCPHeaderSize || n > len(b) || off != RTCPHeaderSize {
				t.Fatalf("packet length %d offset %d of %d", n, off, len(b))
			}
			body := b[off:n]
			if h.Type == TypeSenderReport {
				if si.Unmarshal(body) != nil {
					return
				}
				body = body[SenderInfoSize:]
			}
			if h.Type == TypeSenderReport || h.Type == TypeReceiverReport {
				for i := 0; i < int(h.Count) && rr.Unmarshal(body) == nil; i++ {
					var buf [ReceptionReportSize]byte
					rr.MarshalTo(buf[:])
					if !bytes.Equal(buf[:], body[:ReceptionReportSize]) {
						t.Fatalf("report round trip %x != %x", buf, body[:ReceptionReportSize])
					}
					body = body[ReceptionReportSize:]
				}
			}
			b = b[n:]
		}
	})
}

// FuzzReceiverStats feeds arbitrary (seq, ts, arrival) triples and checks
// the invariants the XDP comparison relies on.
func FuzzReceiverStats(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 0xff, 0xff, 0, 0, 0x13, 0x88, 0x13, 0x89})
	f.Fuzz(func(t *testing.T, b []byte) {
		var s ReceiverStats
		var a StreamAnalyzer
		a.ClockRate = 8000
		for i := 0; i+2 <= len(b); i += 2 {
			seq := uint16(b[i])<<8 | uint16(b[i+1])
			ssrc := uint32(1)
			if b[i]&0xf0 == 0xf0 && b[i+1] == 0 {
				ssrc = 2
			}
			before := s
			s.Update(ssrc, seq, uint32(i)*80, uint32(i)*81)
			if !s.Initialized || s.SSRC != ssrc || s.Received == 0 {
				t.Fatalf("state %+v", s)
			}
			if s.Received < before.Received && s.Received != 1 {
				t.Fatalf("received went from %d to %d", before.Received, s.Received)
			}
			if s.BadSeq > SeqMod+1 {
				t.Fatalf("BadSeq %d", s.BadSeq)
			}
			h := Header{SSRC: ssrc, SequenceNumber: seq, Timestamp: uint32(i) * 80}
			a.Update(&h, 10, int64(i)*1e6)
			got, want := a.Stats, s // arrival clocks differ: compare sequence state
			got.Jitter16, got.LastTransit, want.Jitter16, want.LastTransit = 0, 0, 0, 0
			if got != want {
				t.Fatalf("analyzer stats diverge\n%+v\n%+v", a.Stats, s)
			}
			if a.Duplicates+a.Reordered > a.Packets {
				t.Fatalf("dups %d reordered %d packets %d", a.Duplicates, a.Reordered, a.Packets)
			}
		}
	})
}
