package transcode

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pion/rtcp"
	"github.com/relayd/relayd/rtp"
)

func TestReport(t *testing.T) {
	r := newRun(t, newStream(t, pcmu(20), pcma(20)))
	r.script(audio20(10)) // the last packet, frames 18-19, at t0+180 ms
	var recv rtp.ReceiverStats
	for i := range 50 {
		if i != 7 {
			recv.Update(0xabcd, uint16(100+i), uint32(160*i), uint32(160*i+i%3))
		}
	}
	now := t0 + 200*ms + 500 // 20 ms after the last release: 160 samples on
	dst := make([]byte, MaxPacket)
	for _, withRecv := range []bool{true, false} {
		rs := &recv
		if !withRecv {
			rs = nil
		}
		n := r.s.Report(dst, now, rs, &rtp.LossInterval{}, "relayd@198.18.0.1")
		if n == 0 || n%4 != 0 {
			t.Fatalf("report of %d bytes", n)
		}
		pkts, err := rtcp.Unmarshal(dst[:n])
		if err != nil {
			t.Fatalf("pion/rtcp refuses the report: %v", err)
		}
		if len(pkts) != 2 {
			t.Fatalf("%d packets, want SR and SDES", len(pkts))
		}
		sr, ok := pkts[0].(*rtcp.SenderReport)
		if !ok {
			t.Fatalf("first packet %T", pkts[0])
		}
		want := &rtcp.SenderReport{
			SSRC:        outSSRC,
			NTPTime:     uint64(now/1e9+2208988800)<<32 | uint64(now%1e9)<<32/1e9,
			RTPTime:     baseTs + 20*FrameSamples + 160,
			PacketCount: 10,
			OctetCount:  1600,
		}
		if withRecv {
			want.Reports = []rtcp.ReceptionReport{{SSRC: 0xabcd, FractionLost: 256 / 50, TotalLost: 1, LastSequenceNumber: 149, Jitter: recv.Jitter()}}
		}
		if diff := cmp.Diff(want, sr); diff != "" {
			t.Errorf("sender report (-want +got):\n%s", diff)
		}
		sdes, ok := pkts[1].(*rtcp.SourceDescription)
		if !ok || len(sdes.Chunks) != 1 || sdes.Chunks[0].Source != outSSRC || len(sdes.Chunks[0].Items) != 1 ||
			sdes.Chunks[0].Items[0].Type != rtcp.SDESCNAME || sdes.Chunks[0].Items[0].Text != "relayd@198.18.0.1" {
			t.Errorf("SDES: %+v", pkts[1])
		}
	}
	if r.s.Report(dst[:40], now, &recv, nil, "x") != 0 {
		t.Error("report into a short buffer")
	}
	if st := r.s.Stats(); st.RTCPSent != 2 {
		t.Errorf("%d reports counted, want 2", st.RTCPSent)
	}
}
