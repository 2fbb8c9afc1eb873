package transcode

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/rtp/g711"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// sendAudio pushes payloads of c in sequence, one every ptime from t0.
func sendAudio(r *run, c dataplane.Codec, payloads [][]byte) {
	r.t.Helper()
	ts := uint32(inTs0)
	for i, p := range payloads {
		r.push(mkPkt(c.PT, uint16(inSeq0+i), ts, inSSRC, i == 0, p), t0+int64(i)*int64(c.Ptime)*ms)
		ts += uint32(frameCount(c, p) * FrameSamples)
	}
}

type tsFrame struct {
	Ts   int
	Code []byte
}

// TestBitExactG711ToG729: PCMU 20 ms into G.729 at every output ptime,
// with and without VAD, gives the frames a g729.Encoder makes of the same
// decoded PCM, each at the timestamp of its frame.
func TestBitExactG711ToG729(t *testing.T) {
	needBcg729(t)
	in := pcmu(20)
	pcm := speechLike(3*8000, true)
	payloads := g711Packets(in, pcm)
	decoded := make([]int16, 0, len(pcm))
	for _, p := range payloads {
		for _, b := range p {
			decoded = append(decoded, g711.DecodeUlaw(b))
		}
	}
	for _, vad := range []bool{false, true} {
		offline := g729Frames(t, decoded, vad)
		var want []tsFrame
		for i, f := range offline {
			if len(f) > 0 {
				want = append(want, tsFrame{i * FrameSamples, f})
			}
		}
		for _, ptime := range []uint8{10, 20, 30, 40} {
			t.Run(fmt.Sprintf("vad=%v/ptime=%d", vad, ptime), func(t *testing.T) {
				out := g729c(ptime, vad)
				r := newRun(t, newStream(t, in, out))
				sendAudio(r, in, payloads)
				r.s.flush()
				r.drain(r.now)
				checkSeq(t, r.out)
				var got []tsFrame
				for _, p := range r.out {
					speech, sid, err := g729.Frames(p.payload)
					if err != nil || speech+b2i(sid) > int(ptime)/10 {
						t.Fatalf("payload of %d bytes at ptime %d: %v", len(p.payload), ptime, err)
					}
					for i := 0; i < len(p.payload); i += g729.FrameBytes {
						got = append(got, tsFrame{int(p.Timestamp-baseTs) + i/g729.FrameBytes*FrameSamples, p.payload[i:min(i+g729.FrameBytes, len(p.payload))]})
					}
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("frames differ from the offline encoder (-want +got):\n%s", diff)
				}
				if st := r.s.Stats(); st.FramesIn != uint64(len(offline)) || st.FramesOut != uint64(len(want)) {
					t.Errorf("stats: %d frames in, %d out; want %d, %d", st.FramesIn, st.FramesOut, len(offline), len(want))
				}
				if vad {
					sids := 0
					for _, f := range want {
						if len(f.Code) == g729.SIDBytes {
							sids++
						}
					}
					if sids == 0 || len(want) == len(offline) {
						t.Fatalf("VAD: %d SID frames, %d of %d frames sent; the signal's pauses should give both", sids, len(want), len(offline))
					}
				}
			})
		}
	}
}

// TestPtimePairs: every pair of ptimes, for each conversion, keeps the
// output continuous and the duration of what went in.
func TestPtimePairs(t *testing.T) {
	pcm := tone(120*FrameSamples, 700, 6000)
	var g729Codes [][]byte
	if g729.Available {
		g729Codes = g729Frames(t, pcm, false)
	}
	pairs := []struct{ in, out func(uint8) dataplane.Codec }{
		{pcmu, func(p uint8) dataplane.Codec { return g729c(p, false) }},
		{func(p uint8) dataplane.Codec { return g729c(p, false) }, pcmu},
		{pcmu, pcma},
		{pcmu, pcmu},
		{func(p uint8) dataplane.Codec { return g729c(p, false) }, func(p uint8) dataplane.Codec { return g729c(p, false) }},
	}
	for _, pair := range pairs {
		for _, ip := range []uint8{10, 20, 30, 40} {
			for _, op := range []uint8{10, 20, 30, 40} {
				in, out := pair.in(ip), pair.out(op)
				t.Run(fmt.Sprintf("%s%d-%s%d", in.Name, ip, out.Name, op), func(t *testing.T) {
					if in.Name == "G729" || out.Name == "G729" {
						needBcg729(t)
					}
					var payloads [][]byte
					if in.Name == "G729" {
						payloads = g729Packets(g729Codes, int(ip))
					} else {
						payloads = g711Packets(in, pcm)
					}
					r := newRun(t, newStream(t, in, out))
					sendAudio(r, in, payloads)
					checkSeq(t, r.out)
					if got := checkContinuous(t, out, r.out); got != 120 {
						t.Errorf("%d frames out, want 120", got)
					}
					if !r.out[0].Marker {
						t.Error("first packet without marker")
					}
					for i, p := range r.out[1:] {
						if p.Marker {
							t.Errorf("packet %d: marker in the middle of a talkspurt", i+1)
						}
					}
					if in.Name == "G729" && out.Name == "G729" {
						var got []byte
						for _, p := range r.out {
							got = append(got, p.payload...)
						}
						if !bytes.Equal(got, bytes.Join(g729Codes, nil)) {
							t.Error("G.729 repacketized is not bit-exact")
						}
					}
				})
			}
		}
	}
}

// inPkt is one input packet of a scripted test.
type inPkt struct {
	seq    int // offset from inSeq0
	frame  int // first frame's index: ts = inTs0 + 80*frame
	at     int64
	marker bool
	pt     uint8
	p      []byte
	ssrc   uint32
}

func (r *run) script(pkts []inPkt) {
	r.t.Helper()
	for _, p := range pkts {
		r.until(p.at)
		ssrc := p.ssrc
		if ssrc == 0 {
			ssrc = inSSRC
		}
		r.push(mkPkt(p.pt, uint16(inSeq0+p.seq), uint32(inTs0+p.frame*FrameSamples), ssrc, p.marker, p.p), p.at)
	}
}

// audio20 is a script of 20 ms PCMU packets of a tone: packet i at 20i ms.
func audio20(n int) []inPkt {
	payloads := g711Packets(pcmu(20), tone(n*160, 440, 5000))
	out := make([]inPkt, n)
	for i := range out {
		out[i] = inPkt{seq: i, frame: 2 * i, at: t0 + int64(i)*20*ms, pt: ptPCMU, p: payloads[i], marker: i == 0}
	}
	return out
}

// TestReorder covers the reorder buffer toward G.711 (PCMU to PCMA, no
// codec library needed): in order, reordered within the hold, lost with
// the hold expiring by time and by count, late and duplicate packets.
func TestReorder(t *testing.T) {
	type want struct {
		concealed, late, dups uint64
		maxHold               int64
		heldOut               int // packets out before the hold gives up (-1: not checked)
	}
	a := audio20(12)
	swap := func(i, j int, s []inPkt) []inPkt {
		s = append([]inPkt(nil), s...)
		s[i].at, s[j].at = s[j].at, s[i].at
		s[i], s[j] = s[j], s[i]
		return s
	}
	drop := func(s []inPkt, idx ...int) []inPkt {
		var out []inPkt
	next:
		for i, p := range s {
			for _, d := range idx {
				if i == d {
					continue next
				}
			}
			out = append(out, p)
		}
		return out
	}
	late := func(s []inPkt, i int, at int64) []inPkt {
		p := s[i]
		p.at = at
		s = drop(s, i)
		for j := range s {
			if s[j].at > at {
				return append(s[:j], append([]inPkt{p}, s[j:]...)...)
			}
		}
		return append(s, p)
	}
	dup := func(s []inPkt, i int, at int64) []inPkt {
		p := s[i]
		p.at = at
		return late(append(s, p), len(s), at)
	}
	for _, tc := range []struct {
		name   string
		script []inPkt
		want   want
	}{
		{"in order", a, want{}},
		{"swapped", swap(4, 5, a), want{maxHold: 20 * ms}},
		{"lost, hold expires by time", drop(a, 4), want{concealed: 2, maxHold: 60 * ms}},
		{"lost, then arrives after its slot", late(a, 4, t0+160*ms), want{concealed: 2, late: 1, maxHold: 60 * ms}},
		{"arrives within the hold", late(a, 4, t0+125*ms), want{maxHold: 25 * ms}},
		{"two lost", drop(a, 4, 5), want{concealed: 4, maxHold: 60 * ms}},
		{"duplicate", dup(a, 3, t0+70*ms), want{dups: 1}},
		{"duplicate while held", dup(drop(a, 4), 5, t0+105*ms), want{concealed: 2, dups: 1, maxHold: 60 * ms}},
		{"lost beyond the window", drop(a, 2, 3, 4, 5, 6, 7, 8, 9), want{concealed: 0, maxHold: 0}},
		{"lost, the longest concealed", drop(a, 2, 3, 4, 5, 6, 7), want{concealed: MaxConceal, maxHold: 40 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRun(t, newStream(t, pcmu(20), pcma(20)))
			r.script(tc.script)
			r.until(r.now + 100*ms)
			checkSeq(t, r.out)
			if tc.name == "lost beyond the window" {
				// Longer than MaxConceal frames: nothing is
				// synthesised, the loss is a jump; the last packet is
				// where it was.
				if last := r.out[len(r.out)-1]; last.Timestamp != baseTs+22*FrameSamples || !r.out[len(r.out)-2].Marker {
					t.Errorf("after a long loss: last ts %d (want %d), jump marked %v", last.Timestamp, baseTs+22*FrameSamples, r.out[len(r.out)-2].Marker)
				}
			} else if got := checkContinuous(t, pcma(20), r.out); got != 24 {
				t.Errorf("%d frames out, want 24", got)
			}
			st := r.s.Stats()
			got := want{st.Concealed, st.LateDropped, st.Duplicates, int64(st.MaxHold), -1}
			tc.want.heldOut = -1
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestHoldByCount: with 10 ms input, the fourth packet after a gap gives
// up on it at once, before the 60 ms pass; with 20 ms input the missing
// packet is concealed when HoldLimit passes, not before.
func TestHoldByCount(t *testing.T) {
	payloads := g711Packets(pcmu(10), tone(20*80, 440, 5000))
	r := newRun(t, newStream(t, pcmu(10), pcmu(10)))
	for i, p := range payloads {
		if i == 5 {
			continue
		}
		r.push(mkPkt(ptPCMU, uint16(inSeq0+i), uint32(inTs0+i*80), inSSRC, false, p), t0+int64(i)*10*ms)
		switch held := r.s.nheld; {
		case i > 5 && i < 9 && held != i-5:
			t.Fatalf("after packet %d: %d held, want %d", i, held, i-5)
		case i == 9 && held != 0:
			t.Fatalf("after the fourth packet past the gap: %d held, want none", held)
		}
	}
	if st := r.s.Stats(); st.MaxHold != 30*1e6 || st.Concealed != 1 {
		t.Errorf("max hold %v, concealed %d; want 30ms, 1", st.MaxHold, st.Concealed)
	}

	r = newRun(t, newStream(t, pcmu(20), pcmu(20)))
	a := audio20(8)
	r.script(append(a[:3:3], a[4]))
	if d := r.s.Deadline(); d != a[4].at+int64(HoldLimit) {
		t.Fatalf("deadline %d ms, want the hold's end at %d ms", (d-t0)/ms, (a[4].at+int64(HoldLimit)-t0)/ms)
	}
	n := len(r.out)
	r.until(a[4].at + int64(HoldLimit) - 1)
	if len(r.out) != n {
		t.Fatal("held packet sent before the hold expired")
	}
	r.until(a[4].at + int64(HoldLimit))
	if len(r.out) != n+2 || r.s.Stats().Concealed != 2 {
		t.Fatalf("at the hold's end: %d packets more (want 2: concealed, held), %d concealed", len(r.out)-n, r.s.Stats().Concealed)
	}
}

// TestSSRCChange: a new input source continues the output timeline.
func TestSSRCChange(t *testing.T) {
	a := audio20(10)
	for i := 5; i < 10; i++ {
		a[i].ssrc, a[i].seq, a[i].frame = 0x99, 7+i, 900000+2*i // arbitrary new sequence and timeline
	}
	a[5].marker = true
	r := newRun(t, newStream(t, pcmu(20), pcmu(30)))
	r.script(a)
	r.s.flush()
	r.drain(r.now)
	checkSeq(t, r.out)
	if got := checkContinuous(t, pcmu(30), r.out); got != 20 {
		t.Errorf("%d frames out, want 20", got)
	}
	marks := 0
	for _, p := range r.out {
		if p.Marker {
			marks++
		}
	}
	// 10 frames of the old source: three 30 ms packets and a short one;
	// then the new source's first.
	if marks != 2 || !r.out[4].Marker || r.out[4].Timestamp != baseTs+10*FrameSamples {
		t.Errorf("%d markers, packet 4 (the new source's first) marker %v ts %d; want 2, true, %d", marks, r.out[4].Marker, r.out[4].Timestamp, baseTs+10*FrameSamples)
	}
}

// TestEvents: telephone-events keep their marker, take the output's
// sequence and payload type, and their timestamps map as the audio's.
func TestEvents(t *testing.T) {
	ev := func(seq, frame int, at int64, marker bool) inPkt {
		return inPkt{seq: seq, frame: frame, at: at, marker: marker, pt: ptEvent, p: []byte{5, 0x0a, 0, 160}}
	}
	a := audio20(4)
	// audio 0..1, events at the time of frame 4 (seq 2, 3), audio 2..3 (seq 4, 5)
	script := []inPkt{a[0], a[1], ev(2, 4, t0+40*ms, true), ev(3, 4, t0+50*ms, false)}
	for _, p := range a[2:] {
		p.seq += 2
		script = append(script, p)
	}
	for _, outEvent := range []uint8{ptEvOut, 0} {
		in, out := pcmu(20), pcma(20)
		in.Event, out.Event = ptEvent, outEvent
		r := newRun(t, newStream(t, in, out))
		r.script(script)
		checkSeq(t, r.out)
		var events []outPacket
		for _, p := range r.out {
			if p.PayloadType != ptPCMA {
				events = append(events, p)
			}
		}
		st := r.s.Stats()
		if outEvent == 0 {
			if len(events) != 0 || st.EventsDropped != 2 || st.Events != 0 {
				t.Errorf("no event PT out: %d events sent, %d dropped", len(events), st.EventsDropped)
			}
			continue
		}
		if len(events) != 2 || st.Events != 2 {
			t.Fatalf("%d events out, stats %d; want 2", len(events), st.Events)
		}
		for i, e := range events {
			if e.PayloadType != ptEvOut || e.Timestamp != baseTs+4*FrameSamples || e.Marker != (i == 0) || !bytes.Equal(e.payload, script[2].p) {
				t.Errorf("event %d: pt %d ts %d marker %v payload %x", i, e.PayloadType, e.Timestamp, e.Marker, e.payload)
			}
		}
		if got := checkContinuous(t, out, r.out); got != 8 {
			t.Errorf("%d audio frames, want 8", got)
		}
	}
}

// TestBadInput: what Push refuses leaves the stream as it was.
func TestBadInput(t *testing.T) {
	needBcg729(t)
	good := func(i int) []byte {
		return mkPkt(ptG729, uint16(inSeq0+i), uint32(inTs0+160*i), inSSRC, false, make([]byte, 20))
	}
	bad := []struct {
		p    []byte
		want error
	}{
		{[]byte{0x80, 18, 0}, nil},
		{append([]byte{0x40}, good(1)[1:]...), nil},            // version 1
		{append(append([]byte{0xa0}, good(1)[1:]...), 0), nil}, // padding of 0 octets
		{mkPkt(77, inSeq0+1, inTs0+160, inSSRC, false, make([]byte, 20)), ErrPayloadType},
		{mkPkt(ptPCMU, inSeq0+1, inTs0+160, inSSRC, false, make([]byte, 160)), ErrPayloadType},
		{mkPkt(ptG729, inSeq0+1, inTs0+160, inSSRC, false, make([]byte, 5)), ErrPayload},
		{mkPkt(ptG729, inSeq0+1, inTs0+160, inSSRC, false, make([]byte, 13)), ErrPayload},
		{mkPkt(ptG729, inSeq0+1, inTs0+160, inSSRC, false, make([]byte, 11)), ErrPayload},
		{mkPkt(ptG729, inSeq0+1, inTs0+160, inSSRC, false, nil), ErrPayload},
		{mkPkt(ptG729, inSeq0+1, inTs0+160, inSSRC, false, make([]byte, 10*MaxFrames+10)), ErrPayload},
		{mkPkt(ptG729, inSeq0+1, inTs0+160, 0x5555, false, make([]byte, 25)), ErrPayload}, // other SSRC: no source change
		{mkPkt(ptEvent, inSeq0+1, inTs0+160, inSSRC, false, []byte{1, 2}), ErrPayload},
	}
	in := g729c(20, true)
	in.Event = ptEvent
	ref := newRun(t, newStream(t, in, pcmu(20)))
	r := newRun(t, newStream(t, in, pcmu(20)))
	for i := range 4 {
		ref.push(good(i), t0+int64(i)*20*ms)
		r.push(good(i), t0+int64(i)*20*ms)
		if i == 0 {
			continue
		}
		for j, b := range bad {
			before := r.s.Stats()
			err := r.s.Push(b.p, t0+int64(i)*20*ms+1)
			if err == nil || b.want != nil && !errors.Is(err, b.want) {
				t.Fatalf("bad packet %d: %v, want %v", j, err, b.want)
			}
			r.drain(t0 + int64(i)*20*ms + 1)
			if diff := cmp.Diff(before, r.s.Stats()); diff != "" {
				t.Fatalf("bad packet %d changed the stats:\n%s", j, diff)
			}
		}
	}
	if diff := cmp.Diff(ref.out, r.out, cmp.AllowUnexported(outPacket{})); diff != "" {
		t.Errorf("output differs from a stream without bad packets:\n%s", diff)
	}
}

func TestUnavailable(t *testing.T) {
	if g729.Available {
		t.Skip("built with bcg729")
	}
	if _, err := New(dataplane.Transcode{In: pcmu(20), Out: g729c(20, false)}, 1); !errors.Is(err, g729.ErrUnavailable) {
		t.Errorf("G.729 without bcg729: %v, want ErrUnavailable", err)
	}
	s, err := New(dataplane.Transcode{In: pcmu(20), Out: pcma(20)}, 1)
	if err != nil {
		t.Errorf("G.711 only without bcg729: %v", err)
	}
	s.Close()
}

func TestNewRefuses(t *testing.T) {
	for _, tc := range []dataplane.Transcode{
		{In: dataplane.Codec{Name: "OPUS", Ptime: 20}, Out: pcmu(20)},
		{In: pcmu(20), Out: pcmu(25)},
		{In: pcmu(0), Out: pcmu(20)},
	} {
		if _, err := New(tc, 1); err == nil {
			t.Errorf("%+v: accepted", tc)
		}
	}
	s := newStream(t, pcmu(20), pcma(20))
	s.Close()
	s.Close()
	if err := s.Push(mkPkt(0, 1, 1, 1, false, make([]byte, 160)), t0); !errors.Is(err, ErrClosed) {
		t.Errorf("push after close: %v", err)
	}
}

// TestResume: a stream made again from another's position continues it:
// the first packet takes the resumed extended sequence number (its low
// 16 bits, the cycles carried on) and timestamp, and Position reports the
// new stream's place, cycles included.
func TestResume(t *testing.T) {
	r := newRun(t, newStream(t, pcmu(20), pcma(20)))
	r.script(audio20(5))
	seq, ts := r.s.Position(r.now + 10*ms)
	if last := r.out[len(r.out)-1]; seq != uint32(last.SequenceNumber)+1 || ts != last.Timestamp+FrameSamples*3 {
		t.Fatalf("position %d/%d after the packet %d/%d sent 10 ms before; want the next number and its timestamp + 30 ms",
			seq, ts, last.SequenceNumber, last.Timestamp)
	}

	resume := dataplane.Resume{Valid: true, Seq: 3<<16 | 0xfffe, Timestamp: 123456}
	s, err := New(dataplane.Transcode{In: pcmu(20), Out: pcma(20), Resume: resume}, outSSRC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if seq, ts := s.Position(t0); seq != resume.Seq || ts != resume.Timestamp {
		t.Errorf("position before any input %d/%d, want the resumed %d/%d", seq, ts, resume.Seq, resume.Timestamp)
	}
	r2 := newRun(t, s)
	r2.script(audio20(4))
	for i, p := range r2.out {
		if want := uint16(resume.Seq) + uint16(i); p.SequenceNumber != want || p.Timestamp != resume.Timestamp+uint32(i)*2*FrameSamples {
			t.Errorf("packet %d: %d/%d, want %d/%d", i, p.SequenceNumber, p.Timestamp, want, resume.Timestamp+uint32(i)*2*FrameSamples)
		}
	}
	if seq, _ := s.Position(r2.now); seq != resume.Seq+uint32(len(r2.out)) || seq>>16 != 4 {
		t.Errorf("position %#x after %d packets from %#x; want the cycles carried (4)", seq, len(r2.out), resume.Seq)
	}

	// Installed 600 ms before its first input: the timestamps follow the
	// clock from the resume point, not from the first frame.
	resume.At = t0 - 600*ms
	s3, err := New(dataplane.Transcode{In: pcmu(20), Out: pcma(20), Resume: resume}, outSSRC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s3.Close)
	want := resume.Timestamp + 600*8
	if _, ts := s3.Position(t0); ts != want {
		t.Errorf("position 600 ms after the resume point: timestamp %d, want %d", ts, want)
	}
	r3 := newRun(t, s3)
	r3.script(audio20(2))
	if first := r3.out[0]; first.Timestamp != want {
		t.Errorf("first packet 600 ms after the resume point: timestamp %d, want %d", first.Timestamp, want)
	}
}
