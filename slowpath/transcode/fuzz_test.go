package transcode

import (
	"testing"
	"time"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// fuzzConfigs are the conversions FuzzPush drives, chosen by its first
// byte.
var fuzzConfigs = func() []dataplane.Transcode {
	ev := func(c dataplane.Codec, event, cn uint8) dataplane.Codec { c.Event, c.CN = event, cn; return c }
	return []dataplane.Transcode{
		{In: ev(pcmu(20), ptEvent, ptCN), Out: ev(g729c(20, true), ptEvOut, 0)},
		{In: ev(g729c(20, true), ptEvent, ptCN), Out: ev(pcmu(20), ptEvOut, 0)},
		{In: ev(g729c(30, true), ptEvent, 0), Out: ev(pcma(40), 0, ptCNOut)},
		{In: ev(pcmu(10), ptEvent, ptCN), Out: ev(pcma(30), ptEvOut, ptCNOut)},
		{In: ev(g729c(20, true), ptEvent, ptCN), Out: ev(g729c(40, true), ptEvOut, 0)},
		{In: ev(pcma(40), 0, ptCN), Out: ev(g729c(10, false), 0, 0)},
		{In: ev(g729c(20, true), 0, 0), Out: ev(g729c(20, false), 0, 0)},
	}
}()

// FuzzPush: packets built from the input (or taken raw) go into a Stream
// at times the input says, and Pull drains it after each Push and at
// deadlines. Invariants: no panic; output sequence numbers +1 each;
// every packet parses, fits MaxPacket, has the stream's SSRC and a
// payload type of the output side; audio timestamps strictly increase;
// the output queue never overflows.
//
// Each record: flags, then seq delta (int8), timestamp delta in frames
// (int8), time delta in ms, payload length; then the payload. flags bit 0:
// the record is a raw packet of that length instead; bits 1-2: payload
// type (audio, event, CN, other); bit 3: marker; bit 4: new SSRC.
func FuzzPush(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 20, 160})
	f.Add([]byte{1, 0, 1, 2, 20, 20, 0, 1, 2, 20, 20, 0, 2, 2, 20, 20, 0, 0xff, 0xfe, 80, 20, 0, 1, 2, 20, 2})
	f.Add([]byte{3, 0, 1, 1, 10, 80, 2, 1, 1, 10, 4, 4, 1, 1, 10, 1, 0, 3, 1, 100, 80})
	f.Add([]byte{4, 8, 0, 0, 0, 20, 16, 10, 30, 5, 20, 0, 1, 2, 200, 22})
	f.Add([]byte{5, 0, 1, 4, 40, 255, 1, 0, 0, 0, 12, 0x80, 18, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		watchdog := time.AfterFunc(10*time.Second, func() { panic("FuzzPush: one input ran 10 s: a loop that does not end") })
		defer watchdog.Stop()
		cfg := fuzzConfigs[int(data[0])%len(fuzzConfigs)]
		if (cfg.In.Name == "G729" || cfg.Out.Name == "G729") && !g729.Available {
			return
		}
		s, err := New(cfg, outSSRC)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		dst := make([]byte, MaxPacket)
		pkt := make([]byte, 0, MaxPacket)
		var h rtp.Header
		var seq uint16
		var ts uint32
		ssrc := uint32(inSSRC)
		now := t0
		var sent int
		var lastSeq uint16
		var lastAudio uint32
		var haveAudio bool
		drain := func(at int64) {
			for {
				n := s.Pull(dst, at)
				if n == 0 {
					return
				}
				var o rtp.Header
				if _, err := o.Unmarshal(dst[:n]); err != nil || n > MaxPacket {
					t.Fatalf("output of %d bytes: %v", n, err)
				}
				if sent > 0 && o.SequenceNumber != lastSeq+1 {
					t.Fatalf("output seq %d after %d", o.SequenceNumber, lastSeq)
				}
				if o.SSRC != outSSRC {
					t.Fatalf("output SSRC %x", o.SSRC)
				}
				switch o.PayloadType {
				case cfg.Out.PT:
					if haveAudio && int32(o.Timestamp-lastAudio) <= 0 {
						t.Fatalf("audio ts %d after %d", o.Timestamp, lastAudio)
					}
					lastAudio, haveAudio = o.Timestamp, true
				case cfg.Out.Event, cfg.Out.CN:
					if o.PayloadType == 0 {
						t.Fatal("payload type 0 for an event or CN")
					}
				default:
					t.Fatalf("output payload type %d", o.PayloadType)
				}
				lastSeq = o.SequenceNumber
				sent++
			}
		}
		for rest := data[1:]; len(rest) >= 5; {
			flags, dseq, dts, dt, plen := rest[0], int8(rest[1]), int8(rest[2]), rest[3], int(rest[4])
			rest = rest[5:]
			plen = min(plen, len(rest))
			body := rest[:plen]
			rest = rest[plen:]
			seq += uint16(int16(dseq))
			ts += uint32(int32(dts) * FrameSamples)
			now += int64(dt) * ms
			if flags&16 != 0 {
				ssrc++
			}
			if flags&1 != 0 {
				pkt = append(pkt[:0], body...)
			} else {
				pt := [4]uint8{cfg.In.PT, cfg.In.Event, cfg.In.CN, 77}[flags>>1&3]
				h = rtp.Header{PayloadType: pt, SequenceNumber: seq, Timestamp: ts, SSRC: ssrc, Marker: flags&8 != 0}
				pkt = pkt[:rtp.HeaderSize]
				_, _ = h.MarshalTo(pkt)
				pkt = append(pkt, body...)
			}
			for d := s.Deadline(); d != 0 && d <= now; d = s.Deadline() {
				before := s.Stats().SentPackets
				drain(d)
				if s.Deadline() == d && s.Stats().SentPackets == before {
					t.Fatalf("deadline %d does not move", d)
				}
			}
			before := s.Stats()
			if err := s.Push(pkt, now); err != nil && s.Stats() != before {
				t.Fatalf("refused packet (%v) changed the stats", err)
			}
			drain(now)
		}
		drain(now + int64(HoldLimit) + 200*ms)
		if st := s.Stats(); st.Overflow != 0 || st.SentPackets != uint64(sent) {
			t.Fatalf("stats %+v, %d sent", st, sent)
		}
	})
}
