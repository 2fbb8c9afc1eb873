package slowpath

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/pktio"
	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
	"github.com/relayd/relayd/slowpath/transcode"
)

// verdict is what the worker does with one packet.
type verdict uint8

const (
	vSend          verdict = iota // out holds an IP packet to send
	vDropSource                   // not from the expected source
	vDropFlow                     // the flow's action is drop
	vDropTooBig                   // does not fit the output buffer
	vDropNoRoute                  // address family of the output differs
	vDropCrypto                   // SRTP: authentication failed, truncated or malformed
	vDropReplay                   // SRTP: replayed packet
	vDropTranscode                // transcoding: not RTP of a payload type the flow converts, or malformed
	vDropLoop                     // the destination is relayd itself (a relay address) or loopback
	vDropRate                     // over the flow's packet-rate cap
	vConsumed                     // RTCP that relayd terminates (transcoding): counted, not sent on
	vMax
)

var verdictNames = [vMax]string{"send", "wrong_source", "flow", "too_big", "family", "srtp_auth", "srtp_replay", "transcode", "loop", "rate", "rtcp_terminated"}

const (
	ipv4HeaderLen = 20
	ipv6HeaderLen = 40
	udpHeaderLen  = 8
	defaultTTL    = 64
	// maxPacket bounds an output packet (IP header included).
	maxPacket = 2048
	// maxSRTPOverhead bounds what encryption adds: a 16-byte GCM tag or
	// a 10-byte HMAC tag, the 4-byte SRTCP index and an MKI.
	maxSRTPOverhead = 16 + 4 + 16
)

// flowState is one flow as the worker that owns it holds it: the flow, its
// counters and RFC 3550 state. Only that worker touches it.
type flowState struct {
	flow   dataplane.Flow
	shadow bool // relays what XDP punts of an XDP flow
	dec    *srtpflow.Decrypter
	enc    *srtpflow.Encrypter

	// Symmetric RTP latching (flow.Latch).
	latchUntil  int64          // end of the window (Unix ns); 0 before the first packet
	learned     netip.AddrPort // the source learned so far (media goes back to it)
	pending     netip.AddrPort // accepted, learned if the window ends without a better one
	learnedRank int8           // rank of learned or pending
	locked      bool           // learning is over: only learned is accepted
	lockHeld    bool           // locked, not yet reported: the worker is catching up (holdLock)
	lockedAt    int64          // arrival of the packet that locked it (Unix ns)

	// The rate cap (flow.RateCap) as a generic cell rate algorithm: the
	// theoretical arrival time of the next packet, and the step and
	// tolerance of the cap they were computed for.
	rateTAT, rateStep, rateTol int64
	rateFor                    dataplane.RateCap

	packets, bytes, dropped uint64
	lastSeen                int64 // receive time (Unix ns) of the last packet, 0 if none
	rtpBase                 int64 // receive time of the first RTP packet
	rtp                     rtp.ReceiverStats

	// Transcoding (flow.Transcode): the engine, and relayd's own RTCP
	// toward the leg the flow sends to.
	tc       *transcode.Stream
	rtcpDue  int64 // next report (Unix ns); 0 until the first packet is sent
	rtcpSent uint64
	iv       rtp.LossInterval
	consumed uint64 // RTCP terminated (SinkRTCP, or RTCP on a transcoding flow)
}

// dest returns where a packet from src goes: the flow's send_to, or src
// for a reflecting flow; invalid for a flow that sends nothing (drop, a
// terminated RTCP port).
func (f *flowState) dest(src netip.AddrPort) netip.AddrPort {
	switch {
	case f.flow.Action == dataplane.Drop || f.flow.SinkRTCP:
		return netip.AddrPort{}
	case f.flow.Action == dataplane.Reflect:
		return src
	}
	return f.flow.SendTo
}

// outIs4 reports whether the flow sends IPv4 (reflected packets go back
// in the family they came in).
func (f *flowState) outIs4() bool {
	if f.flow.Action == dataplane.Reflect || !f.flow.SendTo.IsValid() {
		return f.flow.Match.Addr().Is4()
	}
	return f.flow.SendTo.Addr().Is4()
}

// stats returns the flow's statistics.
func (f *flowState) stats() dataplane.Stats {
	st := dataplane.Stats{Packets: f.packets, Bytes: f.bytes, Dropped: f.dropped}
	if f.lastSeen != 0 {
		st.LastSeen = time.Unix(0, f.lastSeen)
	}
	if f.rtp.Initialized {
		st.SSRC = f.rtp.SSRC
		st.ExtHighestSeq = f.rtp.ExtendedMax()
		st.BaseSeq = f.rtp.BaseSeq
		st.Received = f.rtp.Received
		st.Lost = f.rtp.Lost()
		st.Jitter = f.rtp.Jitter()
		st.SSRCChanges = f.rtp.SSRCChanges
	}
	if f.tc != nil {
		ts := f.tc.Stats()
		st.FramesIn, st.FramesOut, st.Concealed = ts.FramesIn, ts.FramesOut, ts.Concealed
		st.SentPackets, st.Events, st.MaxHoldNanos = ts.SentPackets, ts.Events, uint64(ts.MaxHold)
		st.RTCPSent = f.rtcpSent
		st.OutAt = time.Now().UnixNano()
		st.OutSeq, st.OutTimestamp = f.tc.Position(st.OutAt)
	}
	return st
}

// admit applies the flow's rate cap to a packet arriving at now (Unix ns):
// it reports whether the packet may go on. The generic cell rate
// algorithm (ITU-T I.371), the XDP program's token bucket kept as one
// timestamp: a
// packet is refused when it comes earlier than one step per packet since
// the bucket was last full allows, beyond the burst.
func (f *flowState) admit(now int64) bool {
	rc := f.flow.RateCap
	if rc.PPS == 0 {
		return true
	}
	if rc != f.rateFor {
		f.rateFor = rc
		f.rateStep = int64(1e9) / int64(rc.PPS)
		f.rateTol = int64(rc.Burst-1) * f.rateStep
	}
	// The receive timestamps are wall clock time: after it stepped back,
	// the next arrival would be beyond any the cap can have set.
	if f.rateTAT-now > f.rateTol+f.rateStep {
		f.rateTAT = now
	}
	if now < f.rateTAT-f.rateTol {
		return false
	}
	f.rateTAT = max(f.rateTAT, now) + f.rateStep
	return true
}

// sourceOK reports whether a packet from src passes the flow's source
// check. A latching flow's source is checked by latch() in the worker.
func (f *flowState) sourceOK(src netip.AddrPort) bool {
	fl := &f.flow
	return fl.Latch || !fl.ExpectSource.IsValid() ||
		src.Addr() == fl.ExpectSource.Addr() && (fl.ExpectSource.Port() == 0 || src.Port() == fl.ExpectSource.Port())
}

// decrypt authenticates and decrypts the SRTP or SRTCP packet body in
// place when the flow decrypts; it returns the plain packet and vSend, or
// the verdict that drops it.
func (f *flowState) decrypt(body []byte, class rtp.Class) ([]byte, verdict) {
	if f.dec == nil || (class != rtp.ClassRTP && class != rtp.ClassRTCP) {
		return body, vSend
	}
	var err error
	if class == rtp.ClassRTCP {
		body, err = f.dec.DecryptRTCP(body, body)
	} else {
		body, err = f.dec.DecryptRTP(body, body)
	}
	switch {
	case err == srtpflow.ErrReplay:
		return nil, vDropReplay
	case err != nil:
		return nil, vDropCrypto
	}
	return body, vSend
}

// count records a packet that was accepted: counters, arrival, and RTP
// statistics for RTP of a flow with a clock rate. body is the packet as
// decrypted; inLen its length as it arrived.
func (f *flowState) count(body []byte, class rtp.Class, src netip.AddrPort, inLen int, now int64) {
	fl := &f.flow
	f.packets++
	f.lastSeen = now
	// Bytes at the IP layer as they arrived, like the XDP counters.
	inHdr := ipv4HeaderLen
	if !src.Addr().Is4() {
		inHdr = ipv6HeaderLen
	}
	f.bytes += uint64(inHdr + udpHeaderLen + inLen)
	if fl.ClockRate != 0 && class == rtp.ClassRTP && len(body) >= rtp.HeaderSize {
		if !f.rtp.Initialized {
			f.rtpBase = now
		}
		d := uint64(now - f.rtpBase)
		if d >= dataplane.ArrivalRebase {
			f.rtpBase, d = now, 0
			f.rtp.HaveTransit = false
		}
		arrival := dataplane.ArrivalTicks(d, dataplane.TicksMult(fl.ClockRate))
		f.rtp.Update(binary.BigEndian.Uint32(body[8:]), binary.BigEndian.Uint16(body[2:]),
			binary.BigEndian.Uint32(body[4:]), arrival)
	}
}

// latchResult says what latching did with a packet: bits.
type latchResult uint8

const (
	latchNone    latchResult = 0
	latchLearned latchResult = 1 << iota // a new source was learned
	latchLocked                          // learning is over: only the learned source is accepted
)

// The ranks of a source against the signalled one, best last.
const (
	rankNone  int8 = iota // refused: another address than a routable signalled one
	rankAny               // any source: the signalled address is not routable (NAT) or unknown
	rankAddr              // the signalled address, another port
	rankExact             // the signalled address and port
)

// rank ranks src against the flow's signalled address (ExpectSource).
func (f *flowState) rank(src netip.AddrPort) int8 {
	sig := f.flow.ExpectSource
	switch {
	case !sig.IsValid():
		return rankAny
	case sig.Port() != 0 && src == sig:
		return rankExact
	case src.Addr() == sig.Addr():
		return rankAddr
	case f.trusted():
		return rankNone
	}
	return rankAny
}

// trusted reports whether only the signalled address may be learned: it
// is routable, or the control plane vouches for it (LatchAddress).
func (f *flowState) trusted() bool {
	return f.flow.LatchAddress || dataplane.Routable(f.flow.ExpectSource.Addr())
}

// resetLatch forgets what latching learned: the next packet opens a new
// window.
func (f *flowState) resetLatch() {
	f.latchUntil, f.learned, f.pending, f.learnedRank = 0, netip.AddrPort{}, netip.AddrPort{}, rankNone
	f.locked, f.lockHeld, f.lockedAt = false, false, 0
}

// latch applies symmetric RTP learning to a packet from src at now: it
// reports whether the packet is accepted and what changed. It guards
// against RTP Bleed (an attacker's packets making relayd send a stream to
// the attacker):
//   - the signalled address and port win at once (nothing outranks
//     them) and lock the flow when the window ends;
//   - a routable signalled address admits only itself: a source with its
//     address and another port is accepted but learned (media sent to it)
//     only when the window ends without the exact one;
//   - otherwise (behind NAT) the first source is learned at once;
//   - within the window a source replaces the learned one only if it
//     ranks higher: the first of a rank wins, later ones are dropped;
//   - after the window the learned source is locked.
func (f *flowState) latch(src netip.AddrPort, now, window int64) (bool, latchResult) {
	if f.locked {
		return src == f.learned, latchNone
	}
	if f.latchUntil == 0 {
		f.latchUntil = now + window
	}
	var res latchResult
	if now > f.latchUntil {
		if f.pending.IsValid() {
			f.learned, f.pending = f.pending, netip.AddrPort{}
			res |= latchLearned
		}
		if f.learned.IsValid() {
			f.locked = true
			return src == f.learned, res | latchLocked
		}
	}
	r := f.rank(src)
	switch {
	case r == rankNone:
		return false, res
	case src == f.learned || src == f.pending:
		return true, res
	case r == rankExact:
		// Learned at once, locked when the window ends (or now, if it
		// has): nothing can outrank it, and the flow stays in userspace
		// until then. Locking at once would also move the flow into XDP
		// at its first packet; on a veth whose peer has GRO, XDP_TX from
		// the very first frame stalled the peer's queue (ng replies and
		// media lost: the two-relay Kamailio lab).
		f.learned, f.pending, f.learnedRank = src, netip.AddrPort{}, r
		if now > f.latchUntil {
			f.locked = true
			return true, res | latchLearned | latchLocked
		}
		return true, res | latchLearned
	case r <= f.learnedRank:
		return false, res
	case r == rankAddr && f.trusted():
		// Media keeps going to the signalled address and port, where
		// the real party is, until the window shows it does not send
		// from there.
		f.pending, f.learnedRank = src, r
		return true, res
	}
	f.learned, f.pending, f.learnedRank = src, netip.AddrPort{}, r
	return true, res | latchLearned
}

// process handles one UDP payload that arrived at the flow's match from
// src at now (Unix ns, the kernel's receive timestamp). For vSend it writes the complete IP packet
// (header, UDP header, payload) into out and returns its length and the
// destination. It allocates nothing.
func (f *flowState) process(out, payload []byte, src netip.AddrPort, now int64) (int, netip.AddrPort, verdict) {
	fl := &f.flow
	if fl.Action == dataplane.Drop {
		f.dropped++
		return 0, netip.AddrPort{}, vDropFlow
	}
	if !f.sourceOK(src) {
		f.dropped++
		return 0, netip.AddrPort{}, vDropSource
	}
	from, to := fl.SendFrom, fl.SendTo
	if fl.Action == dataplane.Reflect {
		from, to = fl.Match, src
	}
	if from.Addr().Is4() != to.Addr().Is4() {
		f.dropped++
		return 0, netip.AddrPort{}, vDropNoRoute
	}
	hdr := ipv4HeaderLen
	if !to.Addr().Is4() {
		hdr = ipv6HeaderLen
	}
	off := hdr + udpHeaderLen
	if off+len(payload)+maxSRTPOverhead > len(out) {
		f.dropped++
		return 0, netip.AddrPort{}, vDropTooBig
	}
	body := out[off : off+len(payload)] // capacity to the end of out
	copy(body, payload)
	class := rtp.Demux(payload)

	// Authenticate before anything is counted: a forged packet must not
	// touch the statistics.
	body, v := f.decrypt(body, class)
	if v != vSend {
		f.dropped++
		return 0, netip.AddrPort{}, v
	}

	f.count(body, class, src, len(payload), now)

	if f.enc != nil && (class == rtp.ClassRTP || class == rtp.ClassRTCP) {
		var err error
		if class == rtp.ClassRTCP {
			body, err = f.enc.EncryptRTCP(body, body)
		} else {
			body, err = f.enc.EncryptRTP(body, body)
		}
		if err != nil {
			f.dropped++
			return 0, netip.AddrPort{}, vDropCrypto
		}
	}

	n := off + len(body)
	writeHeaders(out[:n], from, to)
	return n, to, vSend
}

// writeHeaders fills the IP and UDP headers of pkt, whose payload is in
// place, for a datagram from -> to. Both must be of one family.
func writeHeaders(pkt []byte, from, to netip.AddrPort) {
	var udp []byte
	var sum uint64
	if to.Addr().Is4() {
		ip := pkt[:ipv4HeaderLen]
		ip[0] = 0x45
		ip[1] = 0
		binary.BigEndian.PutUint16(ip[2:], uint16(len(pkt)))
		binary.BigEndian.PutUint16(ip[4:], 0) // id: set by the send batch (txBatch.commit)
		binary.BigEndian.PutUint16(ip[6:], 0) // no DF: the kernel fragments what XDP punted for its size
		ip[8] = defaultTTL
		ip[9] = 17
		binary.BigEndian.PutUint16(ip[10:], 0) // checksum: filled in by the kernel
		a, b := from.Addr().As4(), to.Addr().As4()
		copy(ip[12:16], a[:])
		copy(ip[16:20], b[:])
		sum = pktio.Sum(sum, ip[12:20])
		udp = pkt[ipv4HeaderLen:]
	} else {
		ip := pkt[:ipv6HeaderLen]
		binary.BigEndian.PutUint32(ip[0:], 6<<28)
		binary.BigEndian.PutUint16(ip[4:], uint16(len(pkt)-ipv6HeaderLen))
		ip[6] = 17
		ip[7] = defaultTTL
		a, b := from.Addr().As16(), to.Addr().As16()
		copy(ip[8:24], a[:])
		copy(ip[24:40], b[:])
		sum = pktio.Sum(sum, ip[8:40])
		udp = pkt[ipv6HeaderLen:]
	}
	binary.BigEndian.PutUint16(udp[0:], from.Port())
	binary.BigEndian.PutUint16(udp[2:], to.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	udp[6], udp[7] = 0, 0
	sum += 17 + uint64(len(udp))
	sum = pktio.Sum(sum, udp)
	binary.BigEndian.PutUint16(udp[6:], pktio.Checksum(sum))
}

// newTransforms builds the SRTP contexts of fl.
func newTransforms(fl *dataplane.Flow) (*srtpflow.Decrypter, *srtpflow.Encrypter, error) {
	var dec *srtpflow.Decrypter
	var enc *srtpflow.Encrypter
	if fl.Decrypt != nil {
		cfg, err := srtpConfig(fl.Decrypt)
		if err != nil {
			return nil, nil, fmt.Errorf("decrypt: %w", err)
		}
		if dec, err = srtpflow.NewDecrypter(cfg); err != nil {
			return nil, nil, fmt.Errorf("decrypt: %w", err)
		}
	}
	if fl.Encrypt != nil {
		cfg, err := srtpConfig(fl.Encrypt)
		if err != nil {
			return nil, nil, fmt.Errorf("encrypt: %w", err)
		}
		if enc, err = srtpflow.NewEncrypter(cfg); err != nil {
			return nil, nil, fmt.Errorf("encrypt: %w", err)
		}
	}
	return dec, enc, nil
}

func srtpConfig(s *dataplane.SRTP) (srtpflow.Config, error) {
	suite, err := sdes.ParseSuite(s.Suite)
	if err != nil {
		return srtpflow.Config{}, err
	}
	return srtpflow.Config{Suite: suite, Key: s.Key, Salt: s.Salt, MKI: s.MKI, SSRC: s.SSRC, ROC: s.ROC}, nil
}
