package rtp

import "testing"

func TestStreamAnalyzer(t *testing.T) {
	a := StreamAnalyzer{ClockRate: 8000}
	const ms = int64(1e6)
	base := int64(1_700_000_000) * 1e9
	// seq: arrival ms. 3 is lost, 5 arrives after 6 (reordered), 6 is
	// duplicated, and a 100 ms gap precedes 8.
	for _, p := range []struct {
		seq uint16
		at  int64
	}{{0, 0}, {1, 20}, {2, 40}, {4, 80}, {6, 120}, {5, 121}, {6, 122}, {7, 140}, {8, 240}} {
		h := Header{SSRC: 9, SequenceNumber: p.seq, Timestamp: uint32(p.seq) * 160, PayloadType: 0}
		a.Update(&h, 172, base+p.at*ms)
	}
	if a.Packets != 9 || a.Bytes != 9*172 {
		t.Errorf("packets %d bytes %d", a.Packets, a.Bytes)
	}
	if a.Duplicates != 1 || a.Reordered != 1 {
		t.Errorf("duplicates %d reordered %d, want 1 1", a.Duplicates, a.Reordered)
	}
	// 9 expected (0..8), 9 received including the duplicate.
	if a.Stats.Expected() != 9 || a.Stats.Lost() != 0 || a.Stats.Received != 9 {
		t.Errorf("expected %d lost %d received %d", a.Stats.Expected(), a.Stats.Lost(), a.Stats.Received)
	}
	if a.MaxGap != 100*ms || a.MaxGapMillis() != 100 {
		t.Errorf("max gap %d", a.MaxGap)
	}
	if a.FirstArrival != base || a.LastArrival != base+240*ms {
		t.Errorf("first %d last %d", a.FirstArrival, a.LastArrival)
	}
	if j := a.JitterMillis(); j < 5 || j > 20 {
		t.Errorf("jitter %.2f ms, want between 5 and 20 after an 80 ms delay", j)
	}

	if a.Resyncs != 0 {
		t.Errorf("%d resyncs before the jump, want 0", a.Resyncs)
	}
	// Resync restarts the duplicate window: a second 20000 is a duplicate
	// only once the new sequence is established.
	for _, s := range []uint16{20000, 20001, 20001, 20002} {
		h := Header{SSRC: 9, SequenceNumber: s}
		a.Update(&h, 172, base+300*ms)
	}
	if a.Stats.BaseSeq != 20001 || a.Stats.Received != 3 || a.Duplicates != 2 || a.Resyncs != 1 {
		t.Errorf("after resync: base %d received %d duplicates %d resyncs %d", a.Stats.BaseSeq, a.Stats.Received, a.Duplicates, a.Resyncs)
	}
}

// TestStreamAnalyzerOvertaken: a stream whose packets take two paths, one
// 150 packets (3 s) behind the other, as when a relay moved a flow from a
// backlogged userspace worker into XDP: the receiver resyncs on the late
// pairs and records the jumps back as loss periods the size of the lag.
// Resyncs is what tells this from loss.
func TestStreamAnalyzerOvertaken(t *testing.T) {
	a := StreamAnalyzer{ClockRate: 8000}
	base := int64(1_700_000_000) * 1e9
	at := base
	up := func(seq uint16) {
		at += 5e6
		h := Header{SSRC: 9, SequenceNumber: seq, Timestamp: uint32(seq) * 160}
		a.Update(&h, 172, at)
	}
	for seq := range uint16(100) {
		up(seq)
	}
	// The fast path's packet, then two of the slow path's, in turn.
	for i := range uint16(10) {
		up(250 + i)
		up(100 + 2*i)
		up(101 + 2*i)
	}
	if a.Resyncs < 9 {
		t.Errorf("%d resyncs, want one per late pair after the first (at least 9)", a.Resyncs)
	}
	if len(a.LossPeriods) < 9 || a.LossPeriods[len(a.LossPeriods)-1].Lost < 100 {
		t.Errorf("%d loss periods (last %+v): want the jumps forward recorded as losses of over 100", len(a.LossPeriods), a.LossPeriods[len(a.LossPeriods)-1])
	}
}

func TestStreamAnalyzerSteady(t *testing.T) {
	a := StreamAnalyzer{ClockRate: 8000}
	for i := 0; i < 70000; i++ { // wraps the sequence number
		h := Header{SSRC: 1, SequenceNumber: uint16(i), Timestamp: uint32(i) * 160}
		a.Update(&h, 172, int64(i)*20e6)
	}
	if a.Stats.Lost() != 0 || a.Duplicates != 0 || a.Reordered != 0 || a.Stats.Jitter16 != 0 ||
		a.Stats.Expected() != 70000 || a.MaxGap != 20e6 {
		t.Fatalf("%+v", a)
	}
	if n := testing.AllocsPerRun(100, func() {
		h := Header{SSRC: 1, SequenceNumber: 3, Timestamp: 480}
		a.Update(&h, 172, 1)
	}); n != 0 {
		t.Fatalf("allocs = %v", n)
	}
}

// TestLossPeriods works a hand-made sequence: 20 ms packets, a 300 ms
// outage (15 packets, seq 10-24), a single loss later (seq 40) whose packet
// then arrives late, and a two-packet run across the sequence wrap.
func TestLossPeriods(t *testing.T) {
	a := StreamAnalyzer{ClockRate: 8000}
	const ms = int64(1e6)
	send := func(seq int, at int64) {
		h := Header{SSRC: 7, SequenceNumber: uint16(65000 + seq), Timestamp: uint32(seq) * 160}
		a.Update(&h, 172, at*ms)
	}
	for s := 0; s < 10; s++ {
		send(s, int64(s)*20)
	}
	for s := 25; s < 40; s++ { // 10..24 lost: the link was down 300 ms
		send(s, int64(s)*20)
	}
	for s := 41; s < 530; s++ { // 40 missing for now; wraps at s = 536
		if s == 45 {
			send(40, 45*20+1) // 40 arrives late
		}
		send(s, int64(s)*20)
	}
	for s := 538; s < 600; s++ { // 530..537 lost across the wrap (65530..65537)
		send(s, int64(s)*20)
	}
	if a.LossRuns != 2 || len(a.LossPeriods) != 2 {
		t.Fatalf("loss runs %d, periods %+v; want 2", a.LossRuns, a.LossPeriods)
	}
	p := a.LossPeriods[0]
	if p.Lost != 15 || p.Before != 9*20*ms || p.After != 25*20*ms || p.MissingMillis() != 300 || p.GapMillis() != 320 ||
		p.FirstSeq != 65010 {
		t.Errorf("outage period %+v, want 15 lost, 300 ms missing, 320 ms gap, first seq 65010", p)
	}
	if p := a.LossPeriods[1]; p.Lost != 8 || p.MissingMillis() != 160 || p.FirstSeq != 65530 {
		t.Errorf("wrap period %+v, want 8 lost from 65530", p)
	}
	if a.Reordered != 1 || a.Stats.Lost() != 23 {
		t.Errorf("reordered %d lost %d, want 1 and 23", a.Reordered, a.Stats.Lost())
	}
	if n := testing.AllocsPerRun(100, func() { send(600, 600*20) }); n != 0 {
		t.Errorf("allocs per in-order packet = %v", n)
	}
}
