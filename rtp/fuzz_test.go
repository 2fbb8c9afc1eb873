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

// FuzzStreamAnalyzer feeds packets whose sequence numbers move by the
// fuzzed steps (signed bytes: losses, duplicates, reordering, jumps) and
// checks the loss-period invariants; when every step is forward and small
// the periods must account for every lost packet.
func FuzzStreamAnalyzer(f *testing.F) {
	f.Add([]byte{1, 1, 1, 5, 1, 0xff, 2, 1})
	f.Add([]byte{1, 16, 1, 1, 3, 1})
	f.Fuzz(func(t *testing.T, steps []byte) {
		a := StreamAnalyzer{ClockRate: 8000}
		seq := uint16(65500)
		inOrder := true
		at := int64(1e18)
		for i, s := range steps {
			d := int8(s)
			if i > 0 {
				seq += uint16(int16(d))
				inOrder = inOrder && d >= 1
			}
			at += 20e6
			h := Header{SSRC: 1, SequenceNumber: seq, Timestamp: uint32(seq) * 160}
			a.Update(&h, 172, at)
		}
		if len(a.LossPeriods) > MaxLossPeriods || a.LossRuns < uint64(len(a.LossPeriods)) {
			t.Fatalf("%d periods, %d runs", len(a.LossPeriods), a.LossRuns)
		}
		var lost int64
		for _, p := range a.LossPeriods {
			if p.Lost == 0 || p.After < p.Before || p.Missing < 0 {
				t.Fatalf("period %+v", p)
			}
			lost += int64(p.Lost)
		}
		if len(steps) > 0 && inOrder && a.LossRuns <= MaxLossPeriods && lost != a.Stats.Lost() {
			t.Fatalf("periods hold %d lost packets, RFC 3550 counts %d", lost, a.Stats.Lost())
		}
	})
}
