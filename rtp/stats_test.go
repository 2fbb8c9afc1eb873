package rtp

import "testing"

type pkt struct {
	ssrc    uint32
	seq     uint16
	ts      uint32
	arrival uint32
}

// seqPkts builds packets of SSRC 1 with 20 ms G.711 timing and no jitter.
func seqPkts(seqs ...uint16) []pkt {
	ps := make([]pkt, len(seqs))
	for i, s := range seqs {
		ps[i] = pkt{ssrc: 1, seq: s, ts: uint32(s) * 160, arrival: uint32(s)*160 + 1000}
	}
	return ps
}

func TestReceiverStatsSequence(t *testing.T) {
	for _, tc := range []struct {
		name       string
		pkts       []pkt
		want       ReceiverStats // jitter fields not compared
		expected   uint32
		lost       int64
		extendedMx uint32
	}{
		{
			name:     "in order",
			pkts:     seqPkts(100, 101, 102),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 100, MaxSeq: 102, BadSeq: SeqMod + 1, Received: 3},
			expected: 3, lost: 0, extendedMx: 102,
		},
		{
			name:     "loss of 102 and 103",
			pkts:     seqPkts(100, 101, 104),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 100, MaxSeq: 104, BadSeq: SeqMod + 1, Received: 3},
			expected: 5, lost: 2, extendedMx: 104,
		},
		{
			name:     "reordering 102 before 101",
			pkts:     seqPkts(100, 102, 101, 103),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 100, MaxSeq: 103, BadSeq: SeqMod + 1, Received: 4},
			expected: 4, lost: 0, extendedMx: 103,
		},
		{
			name:     "duplicate counted as received, loss negative",
			pkts:     seqPkts(100, 101, 101, 102),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 100, MaxSeq: 102, BadSeq: SeqMod + 1, Received: 4},
			expected: 3, lost: -1, extendedMx: 102,
		},
		{
			name:     "wrap at 65535",
			pkts:     seqPkts(65534, 65535, 0, 1),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 65534, MaxSeq: 1, Cycles: 65536, BadSeq: SeqMod + 1, Received: 4},
			expected: 4, lost: 0, extendedMx: 65537,
		},
		{
			name:     "late packet from before the wrap does not add a cycle",
			pkts:     seqPkts(65534, 0, 65535, 1),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 65534, MaxSeq: 1, Cycles: 65536, BadSeq: SeqMod + 1, Received: 4},
			expected: 4, lost: 0, extendedMx: 65537,
		},
		{
			name: "gap of 2999 still in order",
			pkts: seqPkts(100, 3099),
			want: ReceiverStats{SSRC: 1, BaseSeq: 100, MaxSeq: 3099, BadSeq: SeqMod + 1, Received: 2},
			// 3000 expected, 2 received
			expected: 3000, lost: 2998, extendedMx: 3099,
		},
		{
			name:     "large jump rejected once",
			pkts:     seqPkts(100, 101, 5000),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 100, MaxSeq: 101, BadSeq: 5001, Received: 2},
			expected: 2, lost: 0, extendedMx: 101,
		},
		{
			name:     "large jump then resync via BadSeq",
			pkts:     seqPkts(100, 101, 5000, 5001, 5002),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 5001, MaxSeq: 5002, BadSeq: SeqMod + 1, Received: 2},
			expected: 2, lost: 0, extendedMx: 5002,
		},
		{
			name:     "large jump not followed: old sequence continues",
			pkts:     seqPkts(100, 5000, 101, 102),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 100, MaxSeq: 102, BadSeq: 5001, Received: 3},
			expected: 3, lost: 0, extendedMx: 102,
		},
		{
			name:     "BadSeq wraps to 0 after a jump to 65535",
			pkts:     seqPkts(100, 65535, 0, 1),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 0, MaxSeq: 1, BadSeq: SeqMod + 1, Received: 2},
			expected: 2, lost: 0, extendedMx: 1,
		},
		{
			name:     "99 back is late, 100 back is a jump",
			pkts:     seqPkts(1000, 901, 900),
			want:     ReceiverStats{SSRC: 1, BaseSeq: 1000, MaxSeq: 1000, BadSeq: 901, Received: 2},
			expected: 1, lost: -1, extendedMx: 1000,
		},
		{
			name:     "SSRC change resets the source",
			pkts:     append(seqPkts(100, 101, 102), pkt{ssrc: 2, seq: 7, ts: 9, arrival: 5}),
			want:     ReceiverStats{SSRC: 2, BaseSeq: 7, MaxSeq: 7, BadSeq: SeqMod + 1, Received: 1, SSRCChanges: 1},
			expected: 1, lost: 0, extendedMx: 7,
		},
		{
			name:     "second SSRC change carries the count",
			pkts:     append(seqPkts(100), pkt{ssrc: 2, seq: 7}, pkt{ssrc: 3, seq: 9}, pkt{ssrc: 3, seq: 10}),
			want:     ReceiverStats{SSRC: 3, BaseSeq: 9, MaxSeq: 10, BadSeq: SeqMod + 1, Received: 2, SSRCChanges: 2},
			expected: 2, lost: 0, extendedMx: 10,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s ReceiverStats
			for _, p := range tc.pkts {
				s.Update(p.ssrc, p.seq, p.ts, p.arrival)
			}
			got := s
			got.Jitter16, got.LastTransit, got.HaveTransit = 0, 0, false
			tc.want.Initialized = true
			if got != tc.want {
				t.Errorf("state\n got %+v\nwant %+v", got, tc.want)
			}
			if g := s.Expected(); g != tc.expected {
				t.Errorf("Expected() = %d, want %d", g, tc.expected)
			}
			if g := s.Lost(); g != tc.lost {
				t.Errorf("Lost() = %d, want %d", g, tc.lost)
			}
			if g := s.ExtendedMax(); g != tc.extendedMx {
				t.Errorf("ExtendedMax() = %d, want %d", g, tc.extendedMx)
			}
		})
	}
}

// TestReceiverStatsJitter follows A.8 by hand. Packets are 160 timestamp
// units apart; the third arrives 10 units late:
//
//	arrival  ts   transit  |D|  Jitter16
//	   0      0      0      -     0      (first: only records transit)
//	 160    160      0      0     0      0 + 0 - ((0+8)>>4)=0
//	 330    320     10     10    10      0 + 10 - ((0+8)>>4)=0
//	 480    480      0     10    19      10 + 10 - ((10+8)>>4)=1
//	 640    640      0      0    18      19 + 0 - ((19+8)>>4)=1
//
// Floating point gives J = 1.135 units, i.e. Jitter16 = 18.2.
func TestReceiverStatsJitter(t *testing.T) {
	arrivals := []uint32{0, 160, 330, 480, 640}
	want16 := []uint32{0, 0, 10, 19, 18}
	var s ReceiverStats
	for i, a := range arrivals {
		s.Update(42, uint16(i), uint32(i)*160, a)
		if s.Jitter16 != want16[i] {
			t.Fatalf("after packet %d: Jitter16 = %d, want %d", i, s.Jitter16, want16[i])
		}
	}
	if s.Jitter() != 1 {
		t.Errorf("Jitter() = %d, want 1", s.Jitter())
	}
	if s.LastTransit != 0 || !s.HaveTransit {
		t.Errorf("LastTransit = %d, HaveTransit = %v", s.LastTransit, s.HaveTransit)
	}
}

// TestReceiverStatsJitterWrap: timestamps and arrivals both wrap uint32 with
// a constant transit, so jitter stays 0; a negative transit difference
// counts by its magnitude.
func TestReceiverStatsJitterWrap(t *testing.T) {
	var s ReceiverStats
	ts := uint32(0xFFFFFF00)
	arr := uint32(0xFFFFFFF0)
	for i := 0; i < 5; i++ {
		s.Update(1, uint16(i), ts, arr)
		ts += 160
		arr += 160
	}
	if s.Jitter16 != 0 {
		t.Fatalf("Jitter16 = %d, want 0", s.Jitter16)
	}
	// Arrives 32 units early: |D| = 32, Jitter16 = 0 + 32 - 0.
	s.Update(1, 5, ts, arr-32)
	if s.Jitter16 != 32 {
		t.Fatalf("Jitter16 = %d, want 32", s.Jitter16)
	}
}

// TestReceiverStatsRejectedNoJitter: a rejected packet leaves jitter state
// alone, a resync packet updates it (jitter state is kept across resync).
func TestReceiverStatsRejectedNoJitter(t *testing.T) {
	var s ReceiverStats
	s.Update(1, 100, 0, 0)
	s.Update(1, 101, 160, 160)
	s.Update(1, 9000, 999999, 5) // rejected: wild transit must not count
	if s.Jitter16 != 0 || s.LastTransit != 0 {
		t.Fatalf("rejected packet changed jitter: %+v", s)
	}
	s.Update(1, 9001, 320, 336) // resync: transit 16, |D| = 16
	if s.Jitter16 != 16 || s.Received != 1 || s.BaseSeq != 9001 {
		t.Fatalf("after resync: %+v", s)
	}
}

func TestLossInterval(t *testing.T) {
	var s ReceiverStats
	var iv LossInterval
	for seq := uint16(100); seq < 110; seq++ {
		s.Update(1, seq, 0, 0)
	}
	if f, l := iv.Next(&s); f != 0 || l != 0 {
		t.Fatalf("first interval: fraction %d lost %d, want 0 0", f, l)
	}
	// Next interval: 110..119 expected (10), 5 received.
	for _, seq := range []uint16{110, 112, 114, 116, 119} {
		s.Update(1, seq, 0, 0)
	}
	if f, l := iv.Next(&s); f != 128 || l != 5 {
		t.Fatalf("second interval: fraction %d lost %d, want 128 5", f, l)
	}
	// Duplicates only: lost negative, fraction 0.
	s.Update(1, 119, 0, 0)
	if f, l := iv.Next(&s); f != 0 || l != -1 {
		t.Fatalf("third interval: fraction %d lost %d, want 0 -1", f, l)
	}
	// Resync restarts the interval.
	s.Update(1, 30000, 0, 0)
	s.Update(1, 30001, 0, 0)
	s.Update(1, 30003, 0, 0)
	if f, l := iv.Next(&s); f != 85 || l != 1 {
		t.Fatalf("after resync: fraction %d lost %d, want 85 1", f, l)
	}

	var rr ReceptionReport
	s.ReceptionReport(&rr, &iv)
	if rr.SSRC != 1 || rr.TotalLost != 1 || rr.HighestSeq != 30003 || rr.FractionLost != 0 {
		t.Fatalf("report %+v", rr)
	}
}

func TestReceiverStatsNoAlloc(t *testing.T) {
	var s ReceiverStats
	seq := uint16(0)
	if n := testing.AllocsPerRun(1000, func() {
		s.Update(1, seq, uint32(seq)*160, uint32(seq)*160)
		seq++
	}); n != 0 {
		t.Fatalf("allocs = %v", n)
	}
}

func BenchmarkReceiverStatsUpdate(b *testing.B) {
	var s ReceiverStats
	var seq uint16
	b.ReportAllocs()
	for b.Loop() {
		s.Update(1, seq, uint32(seq)*160, uint32(seq)*160+uint32(seq&3))
		seq++
	}
}
