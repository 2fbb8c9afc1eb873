package slowpath

import (
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/slowpath/transcode"
)

// cname is the SDES CNAME of relayd's own RTCP reports.
const cname = "relayd"

// transcodeOne handles one packet of a transcoding flow or of a
// terminated RTCP port: it checks the source, decrypts, counts, consumes
// RTCP and feeds RTP to the flow's engine, then sends what the engine has
// ready. It allocates nothing.
func (w *worker) transcodeOne(f *flowState, payload []byte, src netip.AddrPort, now int64, counts *[vMax]uint64) {
	if !f.sourceOK(src) {
		f.dropped++
		counts[vDropSource]++
		return
	}
	if len(payload) > len(w.scratch) {
		f.dropped++
		counts[vDropTooBig]++
		return
	}
	body := w.scratch[:len(payload)]
	copy(body, payload)
	class := rtp.Demux(payload)
	body, v := f.decrypt(body, class)
	if v != vSend {
		f.dropped++
		counts[v]++
		return
	}
	f.count(body, class, src, len(payload), now)
	if f.flow.SinkRTCP || class == rtp.ClassRTCP {
		// Across a transcoder each leg's reports describe another
		// stream: relayd reports for itself (sendReport).
		f.consumed++
		counts[vConsumed]++
		return
	}
	if class != rtp.ClassRTP {
		f.dropped++
		counts[vDropTranscode]++
		return
	}
	if err := f.tc.Push(body, now); err != nil {
		f.dropped++
		counts[vDropTranscode]++
		return
	}
	w.pullOut(f, now, counts)
}

// pullOut sends every packet f's engine has ready at now, and notes when
// the engine next needs the worker.
func (w *worker) pullOut(f *flowState, now int64, counts *[vMax]uint64) {
	from, to := f.flow.SendFrom, f.flow.SendTo
	for {
		tx := w.txFor(to.Addr())
		if tx == nil || from.Addr().Is4() != to.Addr().Is4() || w.loops(to) {
			// Nothing can be sent: drain the engine so it does not hold
			// packets for ever.
			v := vDropNoRoute
			if w.loops(to) {
				v = vDropLoop
			}
			for w.tcOut(f, now) > 0 {
				counts[v]++
			}
			break
		}
		out := tx.next()
		if out == nil {
			w.flush(w.tx4, w.tx6)
			out = tx.next()
		}
		off := headerRoom(to)
		n := f.tc.Pull(out[off:len(out)-maxSRTPOverhead], now)
		if n == 0 {
			break
		}
		body := out[off : off+n]
		if f.enc != nil {
			var err error
			if body, err = f.enc.EncryptRTP(body, body); err != nil {
				f.dropped++
				counts[vDropCrypto]++
				continue
			}
		}
		writeHeaders(out[:off+len(body)], from, to)
		tx.commit(off+len(body), to.Addr())
		counts[vSend]++
		if f.rtcpDue == 0 {
			f.rtcpDue = now + w.nextReport()
		}
	}
	w.noteTimer(f.tc.Deadline())
	w.noteTimer(f.rtcpDue)
}

// tcOut pulls one packet into the worker's scratch buffer and discards
// it; it returns its length.
func (w *worker) tcOut(f *flowState, now int64) int {
	return f.tc.Pull(w.scratch[:transcode.MaxPacket], now)
}

// headerRoom is the IP and UDP header length in front of a payload sent
// to to.
func headerRoom(to netip.AddrPort) int {
	if to.Addr().Is4() {
		return ipv4HeaderLen + udpHeaderLen
	}
	return ipv6HeaderLen + udpHeaderLen
}

func (w *worker) txFor(a netip.Addr) *txBatch {
	if a.Is4() {
		return w.tx4
	}
	return w.tx6
}

// nextReport draws the interval to a leg's next RTCP report: from 0.5 to
// 1.5 times the configured mean, as RFC 3550 section 6.3.1 asks.
func (w *worker) nextReport() int64 {
	iv := w.rtcpInterval
	if iv <= 0 {
		iv = int64(5 * time.Second)
	}
	return iv/2 + rand.Int64N(iv)
}

// noteTimer records that the worker must run its timers at t (Unix ns;
// 0: never).
func (w *worker) noteTimer(t int64) {
	if t != 0 && (w.timer == 0 || t < w.timer) {
		w.timer = t
	}
}

// runTimers serves the transcoding flows whose engine or RTCP report is
// due at now, and finds the next time the worker must wake for them.
func (w *worker) runTimers(now int64, counts *[vMax]uint64) {
	if w.timer == 0 || now < w.timer {
		return
	}
	w.timer = 0
	for f := range w.tcFlows {
		if f.tc == nil {
			continue
		}
		if d := f.tc.Deadline(); d != 0 && d <= now {
			w.pullOut(f, now, counts)
		}
		if f.rtcpDue != 0 && f.rtcpDue <= now {
			w.sendReport(f, now, counts)
			f.rtcpDue = now + w.nextReport()
		}
		w.noteTimer(f.tc.Deadline())
		w.noteTimer(f.rtcpDue)
	}
}

// sendReport sends relayd's RTCP about the leg f sends to: a sender report
// for what f sent there and a reception report for what the reverse flow
// received from there.
func (w *worker) sendReport(f *flowState, now int64, counts *[vMax]uint64) {
	t := f.flow.Transcode
	from, to := t.RTCPFrom, t.RTCPTo
	if !to.IsValid() || !from.IsValid() || from.Addr().Is4() != to.Addr().Is4() {
		return
	}
	if w.loops(to) {
		counts[vDropLoop]++
		return
	}
	tx := w.txFor(to.Addr())
	if tx == nil {
		return
	}
	out := tx.next()
	if out == nil {
		w.flush(w.tx4, w.tx6)
		out = tx.next()
	}
	var recv *rtp.ReceiverStats
	if r := w.flows[f.flow.Reverse]; r != nil && r.rtp.Initialized {
		recv = &r.rtp
	}
	off := headerRoom(to)
	n := f.tc.Report(out[off:len(out)-maxSRTPOverhead], now, recv, &f.iv, cname)
	if n == 0 {
		return
	}
	body := out[off : off+n]
	if f.enc != nil {
		var err error
		if body, err = f.enc.EncryptRTCP(body, body); err != nil {
			counts[vDropCrypto]++
			return
		}
	}
	writeHeaders(out[:off+len(body)], from, to)
	tx.commit(off+len(body), to.Addr())
	f.rtcpSent++
}

// armTimer sets the deadline of the worker's wait: its next timer, or its
// latch retry if that is sooner.
func (w *worker) armTimer() {
	t := w.timer
	if w.latchWake != 0 && (t == 0 || w.latchWake < t) {
		t = w.latchWake
	}
	w.armed = t // the loop's wait ends then
}
