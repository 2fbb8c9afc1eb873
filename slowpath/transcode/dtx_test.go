package transcode

import (
	"bytes"
	"testing"

	"github.com/relayd/relayd/dataplane"
)

// g729Script: G.729 Annex B input, 20 ms packets arriving at the end of
// their frames: speech (frames 0-9), a SID (10), DTX, the same SID again
// (60), a changed SID (80), speech again (100-103).
func g729Script(t *testing.T) []inPkt {
	codes := g729Frames(t, tone(104*FrameSamples, 440, 6000), false)
	var s []inPkt
	add := func(frame int, p []byte, marker bool) {
		n := frameCount(g729c(20, true), p)
		s = append(s, inPkt{seq: len(s), frame: frame, at: t0 + int64(frame+n)*10*ms, pt: ptG729, p: p, marker: marker})
	}
	for f := 0; f < 10; f += 2 {
		add(f, bytes.Join(codes[f:f+2], nil), f == 0)
	}
	add(10, []byte{0x12, 0x34}, false)
	add(60, []byte{0x12, 0x34}, false)
	add(80, []byte{0x56, 0x78}, false)
	add(100, bytes.Join(codes[100:102], nil), true)
	add(102, bytes.Join(codes[102:104], nil), false)
	return s
}

func TestDTXToG711WithCN(t *testing.T) {
	needBcg729(t)
	out := pcmu(20)
	out.CN = ptCNOut
	r := newRun(t, newStream(t, g729c(20, true), out))
	script := g729Script(t)
	r.script(script[:6])
	if d := r.s.Deadline(); d != 0 {
		t.Errorf("deadline %d during DTX toward a leg with CN: want none", d)
	}
	r.script(script[6:])
	checkSeq(t, r.out)
	type pkt struct {
		PT     uint8
		Frame  int
		Marker bool
		Len    int
	}
	var got []pkt
	for _, p := range r.out {
		got = append(got, pkt{p.PayloadType, int(p.Timestamp-baseTs) / FrameSamples, p.Marker, len(p.payload)})
		if p.PayloadType == ptCNOut && (p.payload[0] == 0 || p.payload[0] >= 127) {
			t.Errorf("CN level %d", p.payload[0])
		}
	}
	want := []pkt{
		{ptPCMU, 0, true, 160}, {ptPCMU, 2, false, 160}, {ptPCMU, 4, false, 160}, {ptPCMU, 6, false, 160}, {ptPCMU, 8, false, 160},
		{ptCNOut, 10, false, 1}, // start of silence; the repeated SID sends nothing
		{ptCNOut, 80, false, 1}, // the SID changed
		{ptPCMU, 100, true, 160}, {ptPCMU, 102, false, 160},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("packet %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if st := r.s.Stats(); st.CNSent != 2 || st.Noise != 0 {
		t.Errorf("stats: %d CN sent, %d noise frames; want 2, 0", st.CNSent, st.Noise)
	}
}

func TestDTXToG711WithoutCN(t *testing.T) {
	needBcg729(t)
	for _, ptime := range []uint8{10, 20, 30, 40} {
		r := newRun(t, newStream(t, g729c(20, true), pcmu(ptime)))
		script := g729Script(t)
		r.script(script[:6])
		// During DTX, a packet of comfort noise every ptime.
		var times []int64
		for r.now < script[6].at-NoiseGrace.Nanoseconds() {
			d := r.s.Deadline()
			if d == 0 {
				t.Fatal("no deadline during DTX toward a leg without CN")
			}
			n := len(r.out)
			r.until(d)
			if len(r.out) != n+1 {
				t.Fatalf("at the deadline: %d packets, want 1", len(r.out)-n)
			}
			times = append(times, d)
		}
		for i := 1; i < len(times); i++ {
			if times[i]-times[i-1] != int64(ptime)*ms {
				t.Fatalf("ptime %d: comfort noise packets %d ms apart", ptime, (times[i]-times[i-1])/ms)
			}
		}
		r.script(script[6:])
		r.s.flush()
		r.drain(r.now)
		checkSeq(t, r.out)
		if got := checkContinuous(t, pcmu(ptime), r.out); got != 104 {
			t.Errorf("ptime %d: %d frames, want 104 (no gap over the silence)", ptime, got)
		}
		st := r.s.Stats()
		if st.CNSent != 0 || st.Noise != 104-10-3-4 || st.FramesIn != 17 {
			t.Errorf("ptime %d: stats %+v; want no CN, 87 noise frames, 17 in", ptime, st)
		}
		// Comfort noise is not silence, and is not louder than speech.
		pcm := decodeOut(t, pcmu(ptime), r.out)
		if l := levelOf(pcm[20*FrameSamples : 50*FrameSamples]); l >= 100 || l <= levelOf(pcm[:10*FrameSamples]) {
			t.Errorf("comfort noise at -%d dBov, speech at -%d", l, levelOf(pcm[:10*FrameSamples]))
		}
		marks := 0
		for _, p := range r.out {
			if p.Marker {
				marks++
			}
		}
		if marks != 2 {
			t.Errorf("ptime %d: %d markers, want 2 (start, speech after DTX)", ptime, marks)
		}
	}
}

// g711CNScript: PCMU 20 ms, a CN packet at frame 10 (level 50), speech
// again at frame 50.
func g711CNScript() []inPkt {
	a := audio20(27)
	s := append([]inPkt(nil), a[:5]...)
	s = append(s, inPkt{seq: 5, frame: 10, at: t0 + 100*ms, pt: ptCN, p: []byte{50}})
	for i, p := range a[25:27] {
		p.seq = 6 + i
		p.marker = i == 0
		s = append(s, p)
	}
	return s
}

func TestG711CNToG729(t *testing.T) {
	needBcg729(t)
	in := pcmu(20)
	in.CN = ptCN
	for _, vad := range []bool{false, true} {
		out := g729c(20, vad)
		out.CN = ptCNOut // never used toward G.729
		r := newRun(t, newStream(t, in, out))
		r.script(g711CNScript())
		r.s.flush()
		r.drain(r.now)
		checkSeq(t, r.out)
		frames := 0
		for _, p := range r.out {
			if p.PayloadType != ptG729 {
				t.Fatalf("vad %v: payload type %d toward G.729", vad, p.PayloadType)
			}
			frames += frameCount(out, p.payload)
		}
		st := r.s.Stats()
		if !vad {
			if got := checkContinuous(t, out, r.out); got != 54 {
				t.Errorf("%d frames, want 54 (no gap over the silence)", got)
			}
			if st.Noise != 40 {
				t.Errorf("%d noise frames, want 40", st.Noise)
			}
		} else if frames >= 54 || frames <= 14 {
			t.Errorf("VAD on: %d frames sent of 54; the silence should be SID or nothing", frames)
		}
	}
}

func TestG711CNForwarded(t *testing.T) {
	in, out := pcmu(20), pcma(20)
	in.CN, out.CN = ptCN, ptCNOut
	r := newRun(t, newStream(t, in, out))
	r.script(g711CNScript())
	checkSeq(t, r.out)
	var cn []outPacket
	for _, p := range r.out {
		if p.PayloadType == ptCNOut {
			cn = append(cn, p)
		}
	}
	if len(cn) != 1 || !bytes.Equal(cn[0].payload, []byte{50}) || cn[0].Timestamp != baseTs+10*FrameSamples {
		t.Fatalf("CN out: %+v", cn)
	}
	if st := r.s.Stats(); st.Noise != 0 || r.s.Deadline() != 0 {
		t.Errorf("%d noise frames, deadline %d: nothing to synthesise toward a leg with CN", st.Noise, r.s.Deadline())
	}
	if last := r.out[len(r.out)-2]; !last.Marker || last.Timestamp != baseTs+50*FrameSamples {
		t.Errorf("speech after CN: marker %v ts %d", last.Marker, last.Timestamp)
	}
}

// TestG729LossConcealed: G.729 input losses are concealed by the decoder
// toward G.711; passed through to G.729 they are a timestamp gap.
func TestG729LossConcealed(t *testing.T) {
	needBcg729(t)
	codes := g729Frames(t, tone(40*FrameSamples, 440, 6000), false)
	payloads := g729Packets(codes, 20)
	for _, out := range []dataplane.Codec{pcmu(20), g729c(20, false)} {
		r := newRun(t, newStream(t, g729c(20, false), out))
		ts := uint32(inTs0)
		for i, p := range payloads {
			if i != 7 && i != 8 {
				r.push(mkPkt(ptG729, uint16(inSeq0+i), ts, inSSRC, false, p), t0+int64(i)*20*ms)
			}
			ts += 160
		}
		r.until(r.now + 100*ms)
		checkSeq(t, r.out)
		st := r.s.Stats()
		if out.Name == "PCMU" {
			if got := checkContinuous(t, out, r.out); got != 40 || st.Concealed != 4 {
				t.Errorf("toward PCMU: %d frames, %d concealed; want 40, 4", got, st.Concealed)
			}
			pcm := decodeOut(t, out, r.out)
			if l := levelOf(pcm[14*FrameSamples : 18*FrameSamples]); l > 30 {
				t.Errorf("concealed frames at -%d dBov: concealment should continue the tone", l)
			}
		} else if len(r.out) != 18 || r.out[7].Timestamp != baseTs+18*FrameSamples || !r.out[7].Marker || st.Concealed != 0 {
			t.Errorf("G.729 passed through: %d packets, after the loss ts %d marker %v, %d concealed", len(r.out), r.out[7].Timestamp, r.out[7].Marker, st.Concealed)
		}
	}
}
