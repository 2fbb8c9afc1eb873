// Package dataplane defines the contract between relayd's control plane and
// its data planes: what a flow is, the statistics a data plane keeps for it,
// and the small interface control/ uses to install, update and remove flows.
//
// The package holds types only. It imports neither cilium/ebpf nor
// golang.org/x/sys/unix, so control/ builds and tests anywhere and can be
// tested against the fake in dataplanetest.
package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Action says what a data plane does with a packet that matches a flow.
type Action uint8

// Actions. The numeric values are part of the BPF flow map layout
// (enum flow_action in bpf/relay.c); fastpath tests check they match.
const (
	// Forward rewrites source and destination and sends the packet on.
	Forward Action = iota
	// Userspace hands the packet to the userspace worker pool.
	Userspace
	// Drop discards the packet and counts it.
	Drop
	// Reflect sends the packet back to its sender from the relay address.
	Reflect
)

func (a Action) String() string {
	switch a {
	case Forward:
		return "forward"
	case Userspace:
		return "userspace"
	case Drop:
		return "drop"
	case Reflect:
		return "reflect"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ParseAction parses the names String returns.
func ParseAction(s string) (Action, error) {
	for a := Forward; a <= Reflect; a++ {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown action %q (want forward, userspace, drop or reflect)", s)
}

// Path is where a flow's packets are handled.
type Path string

const (
	PathXDP       Path = "xdp"
	PathUserspace Path = "userspace"
)

// Flow is one direction of one media stream: packets arriving at Match are
// sent from SendFrom to SendTo. The zero value is not a valid flow.
type Flow struct {
	// ID names the flow in the API. Assigned by the control plane, stored by
	// the data plane with the flow so that it survives a daemon restart.
	ID uint64
	// Match is the relay address and port the packets arrive on. It is the
	// flow's key: no two flows share it.
	Match netip.AddrPort
	// ExpectSource, when valid, is the only source accepted; packets from
	// anywhere else are dropped and counted. A zero port accepts any port
	// of that address.
	ExpectSource netip.AddrPort
	// SendFrom and SendTo are the rewritten source and destination. Unused
	// for Drop and Reflect.
	SendFrom netip.AddrPort
	SendTo   netip.AddrPort
	// Action is what happens to a matching packet.
	Action Action
	// ClockRate is the RTP clock rate in Hz used for interarrival jitter.
	// Zero means the flow carries no RTP (RTCP only): no RTP statistics.
	ClockRate uint32
	// Decrypt and Encrypt, when set, are SRTP transforms: arriving SRTP
	// and SRTCP is authenticated and decrypted, leaving RTP and RTCP
	// encrypted (both set: re-keyed between legs). Such a flow always runs
	// in userspace.
	Decrypt, Encrypt *SRTP
	// Latch turns on symmetric RTP for endpoints behind NAT: the source is
	// learned within the latch window from the flow's first packet, and
	// then locked. ExpectSource is the signalled address and port (port 0:
	// not known). RTP Bleed guard: the signalled address and port win at
	// once; when the signalled address is routable only sources
	// with that address are accepted, and one with another port is learned
	// only if the window ends without the exact one; otherwise (NAT) the
	// first source is learned. Within the window a source replaces the
	// learned one only if it ranks higher (exact, then address, then any):
	// the first of a rank wins. Until locked the flow's packets are handled
	// in userspace.
	Latch bool
	// LatchAddress, with Latch, trusts ExpectSource's address even when it
	// is not routable: it was learned (an RTCP flow's is the address its
	// stream's RTP flow learned), so sources from other addresses are
	// refused. XDP does not carry it: latching runs in userspace.
	LatchAddress bool
	// Reverse, when valid, is the match of the flow that carries media
	// back to this flow's source: its SendTo follows the learned source.
	Reverse netip.AddrPort
	// Transcode, when set, converts the RTP the flow carries from one
	// codec to another (and between packet times); RTCP arriving on the
	// flow (rtcp-mux) is consumed, and relayd sends its own reports about
	// the leg toward SendTo. Such a flow always runs in userspace.
	Transcode *Transcode
	// SinkRTCP: the flow is the RTCP port of a transcoded stream. Its
	// packets are counted and consumed, never sent on: across a
	// transcoder the two legs' reports describe different streams, so
	// relayd reports for itself on each leg (Transcode.RTCPFrom). Such a
	// flow runs in userspace.
	SinkRTCP bool
	// Owner says which part of the control plane installed the flow. Data
	// planes ignore it but keep it with the flow, so that a control plane
	// started again finds out which flows belong to calls.
	Owner Owner
	// RateCap bounds the packets the flow accepts, so that a flood of one
	// media port costs little and goes no further; the zero value is no
	// cap.
	RateCap RateCap
}

// RateCap is a token bucket: a flow accepts a packet when the bucket
// holds a token, and refills it at PPS tokens per second up to Burst. The
// bucket starts full. What it refuses is dropped and counted (Stats.Dropped,
// and the data plane's "rate" drop counter). Only packets that passed the
// source check take tokens: a flood from elsewhere cannot starve the flow.
type RateCap struct {
	PPS   uint32 // refill, packets per second; 0: no cap
	Burst uint32 // depth in packets: what may arrive at once after a quiet spell
}

// Bounds of a RateCap, as the XDP program stores it.
const (
	MaxRatePPS   = 1_000_000
	MaxRateBurst = 65535
)

func (r RateCap) validate() error {
	switch {
	case r.PPS == 0 && r.Burst != 0:
		return errors.New("rate cap: burst without a rate")
	case r.PPS > MaxRatePPS:
		return fmt.Errorf("rate cap: %d packets/s, at most %d", r.PPS, MaxRatePPS)
	case r.PPS != 0 && (r.Burst == 0 || r.Burst > MaxRateBurst):
		return fmt.Errorf("rate cap: burst %d, want 1 to %d", r.Burst, MaxRateBurst)
	}
	return nil
}

// Owner is the part of the control plane a flow belongs to.
type Owner uint8

const (
	// OwnerStatic: a static flow of the admin API.
	OwnerStatic Owner = iota
	// OwnerCall: a flow of a call (SIP B2BUA or ng).
	OwnerCall
)

func (o Owner) String() string {
	switch o {
	case OwnerStatic:
		return "static"
	case OwnerCall:
		return "call"
	}
	return fmt.Sprintf("owner(%d)", uint8(o))
}

// Routable reports whether a is a globally reachable unicast address: not
// private (RFC 1918, RFC 4193), shared (RFC 6598), loopback, link-local or
// unspecified. Latching trusts only a routable signalled address.
func Routable(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsUnspecified() || a.IsLoopback() || a.IsPrivate() ||
		a.IsLinkLocalUnicast() || a.IsMulticast() {
		return false
	}
	return !cgnat.Contains(a)
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// SRTP is the keying of one direction of an SRTP flow.
type SRTP struct {
	Suite string // RFC 4568 name, e.g. AES_CM_128_HMAC_SHA1_80
	Key   []byte // master key
	Salt  []byte // master salt
	MKI   []byte // master key identifier, usually empty
	// SSRC and ROC, when ROC is not zero, are where the stream's
	// rollover counter starts: a flow installed again after a restart
	// continues the packet index of its stream. Not compared by Equal.
	SSRC, ROC uint32
}

// Equal reports whether s and o key the same way (nil equals nil).
func (s *SRTP) Equal(o *SRTP) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.Suite == o.Suite && string(s.Key) == string(o.Key) &&
		string(s.Salt) == string(o.Salt) && string(s.MKI) == string(o.MKI)
}

// HasSRTP reports whether the flow needs an SRTP transform.
func (f *Flow) HasSRTP() bool { return f.Decrypt != nil || f.Encrypt != nil }

// NeedsUserspace reports whether only the userspace data plane can carry
// the flow: SRTP, transcoding, or a terminated RTCP port.
func (f *Flow) NeedsUserspace() bool { return f.HasSRTP() || f.Transcode != nil || f.SinkRTCP }

// Transcode is how a flow converts its RTP between codecs.
type Transcode struct {
	// In is the codec of the RTP arriving at Match; Out is the codec of
	// the RTP sent to SendTo.
	In, Out Codec
	// SSRC is the SSRC of the stream sent to SendTo, chosen by the control
	// plane so that it is the same after a restart; 0 lets the data plane
	// choose.
	SSRC uint32
	// RTCPFrom and RTCPTo are where relayd's own RTCP about the leg toward
	// SendTo goes: a sender report for what it sent there and a reception
	// report block for what the reverse flow (Reverse) received from
	// there. Under rtcp-mux they are SendFrom and SendTo. RTCPTo invalid:
	// no reports.
	RTCPFrom, RTCPTo netip.AddrPort
	// Resume, when Valid, is where the stream sent to SendTo starts: the
	// position an earlier engine of the same flow reached (Stats.OutSeq,
	// OutTimestamp), moved on by the time since, so that after a restart
	// the leg's receiver sees its stream continue. It is not part of the
	// conversion: Equal ignores it.
	Resume Resume
}

// Resume is where a transcoding flow's output stream starts.
type Resume struct {
	Valid bool
	// Seq is the extended sequence number of the first packet
	// (cycles<<16 | number): with SRTP on the output, the cycles are the
	// rollover counter of its encryption.
	Seq uint32
	// Timestamp is the RTP timestamp of the first frame, were it sent
	// at At (Unix ns; 0: whenever it is sent). A first frame sent later
	// moves it on by the time since, at 8 kHz, so that the timestamps
	// follow the clock across the outage however long the first packet
	// takes to arrive.
	Timestamp uint32
	At        int64
}

// Codec is one side of a transcoding flow.
type Codec struct {
	// Name is PCMU, PCMA or G729 (8 kHz clock, 10 ms frames).
	Name string
	// PT is the codec's RTP payload type on this side.
	PT uint8
	// Ptime is the packet time in ms: 10, 20, 30 or 40. On the output
	// side, how the frames are packed; on the input side, what the peer
	// signalled (any whole number of frames is accepted).
	Ptime uint8
	// Event is the telephone-event (RFC 4733) payload type on this side;
	// 0: none. Events pass through with their payload type mapped and
	// their timestamps translated.
	Event uint8
	// CN is the comfort noise (RFC 3389) payload type on this side; 0:
	// none.
	CN uint8
	// VAD is G.729 Annex B on this side: SID frames and silence
	// suppression (annexb=yes or absent in the SDP). Ignored for G.711.
	VAD bool
}

// Codecs that transcoding flows can convert between.
var transcodeCodecs = map[string]bool{"PCMU": true, "PCMA": true, "G729": true}

// TranscodeCodec reports whether a codec name (any case) is one a
// transcoding flow can carry, and returns its canonical name.
func TranscodeCodec(name string) (string, bool) {
	n := strings.ToUpper(name)
	return n, transcodeCodecs[n]
}

func (c Codec) validate() error {
	if !transcodeCodecs[c.Name] {
		return fmt.Errorf("codec %q: want PCMU, PCMA or G729", c.Name)
	}
	if c.PT > 127 || c.Event > 127 || c.CN > 127 {
		return errors.New("payload types are 0 to 127")
	}
	switch c.Ptime {
	case 10, 20, 30, 40:
	default:
		return fmt.Errorf("ptime %d: want 10, 20, 30 or 40", c.Ptime)
	}
	if c.Event != 0 && (c.Event == c.PT || c.Event == c.CN) || c.CN != 0 && c.CN == c.PT {
		return errors.New("codec, telephone-event and comfort noise need distinct payload types")
	}
	return nil
}

// Equal reports whether t and o convert the same way (nil equals nil).
func (t *Transcode) Equal(o *Transcode) bool {
	if t == nil || o == nil {
		return t == o
	}
	a, b := *t, *o
	a.Resume, b.Resume = Resume{}, Resume{}
	return a == b
}

// Validate reports whether f is complete and consistent.
func (f *Flow) Validate() error {
	if !f.Match.IsValid() || f.Match.Port() == 0 {
		return errors.New("match: need address and non-zero port")
	}
	if f.Match.Addr().Zone() != "" {
		return errors.New("match: zoned addresses are not supported")
	}
	if f.ExpectSource.IsValid() && f.ExpectSource.Addr().Is4() != f.Match.Addr().Is4() {
		return errors.New("expect_source: address family differs from match")
	}
	switch f.Action {
	case Forward, Userspace:
		if !f.SendFrom.IsValid() || f.SendFrom.Port() == 0 {
			return errors.New("send_from: need address and non-zero port")
		}
		if !f.SendTo.IsValid() || f.SendTo.Port() == 0 {
			return errors.New("send_to: need address and non-zero port")
		}
		if f.SendFrom.Addr().Is4() != f.SendTo.Addr().Is4() {
			return errors.New("send_from and send_to: address families differ")
		}
		if f.SendTo.Addr().IsUnspecified() || f.SendTo.Addr().IsMulticast() {
			return fmt.Errorf("send_to: %s is not a unicast address", f.SendTo.Addr())
		}
	case Drop, Reflect:
	default:
		return fmt.Errorf("unknown action %d", f.Action)
	}
	if t := f.Transcode; t != nil {
		if f.Action != Forward && f.Action != Userspace {
			return fmt.Errorf("transcode: action %s does not send", f.Action)
		}
		if err := t.In.validate(); err != nil {
			return fmt.Errorf("transcode from: %w", err)
		}
		if err := t.Out.validate(); err != nil {
			return fmt.Errorf("transcode to: %w", err)
		}
		if t.RTCPTo.IsValid() && (!t.RTCPFrom.IsValid() || t.RTCPFrom.Addr().Is4() != t.RTCPTo.Addr().Is4()) {
			return errors.New("transcode: rtcp_from must be set, in the family of rtcp_to")
		}
		if f.SinkRTCP {
			return errors.New("a flow cannot both transcode and sink RTCP")
		}
	}
	if f.ClockRate > MaxClockRate {
		return fmt.Errorf("clock rate %d: at most %d", f.ClockRate, MaxClockRate)
	}
	return f.RateCap.validate()
}

// Stats are a flow's counters. The same fields mean the same thing whichever
// data plane carries the flow.
type Stats struct {
	Packets  uint64    // packets that matched the flow and were handled
	Bytes    uint64    // their bytes at the IP layer (IP header included)
	Dropped  uint64    // packets dropped (wrong source, drop action, over the rate cap, ...)
	LastSeen time.Time // arrival of the last matching packet; zero if none

	// RTP statistics (RFC 3550 appendix A), zero when ClockRate is 0.
	SSRC          uint32 // SSRC of the current source
	ExtHighestSeq uint32 // extended highest sequence number received
	BaseSeq       uint32 // first sequence number of the current source
	Received      uint64 // RTP packets counted for the current source
	Lost          int64  // cumulative packets lost (expected - received); may be negative with duplicates
	Jitter        uint32 // interarrival jitter in RTP timestamp units
	SSRCChanges   uint32 // times the SSRC changed on this flow

	// Transcoding (Flow.Transcode set), zero otherwise.
	FramesIn     uint64 // 10 ms frames decoded from arriving packets
	FramesOut    uint64 // 10 ms frames encoded into sent packets (SID frames included)
	Concealed    uint64 // frames synthesised for lost or late input
	SentPackets  uint64 // RTP packets sent (repacketizing: not Packets)
	Events       uint64 // telephone-event packets passed through
	RTCPSent     uint64 // RTCP reports relayd sent about the leg
	MaxHoldNanos uint64 // the longest a packet was held for reordering
	// Where the output stream is (see Transcode.Resume): the extended
	// sequence number of its next packet, and its RTP timestamp at
	// OutAt (Unix ns, when the stats were read).
	OutSeq       uint32
	OutTimestamp uint32
	OutAt        int64
}

// JitterMillis converts Jitter to milliseconds with the flow's clock rate.
func (s Stats) JitterMillis(clockRate uint32) float64 {
	if clockRate == 0 {
		return 0
	}
	return float64(s.Jitter) * 1000 / float64(clockRate)
}

// Errors data planes return that callers branch on.
var (
	ErrExists       = errors.New("a flow with this match already exists")
	ErrNotFound     = errors.New("no such flow")
	ErrFull         = errors.New("flow table full")
	ErrNotSupported = errors.New("not supported by this data plane")
)

// DataPlane carries flows. Implementations are safe for concurrent use.
type DataPlane interface {
	// Install adds f. It fails with ErrExists if a flow with f.Match exists.
	Install(f Flow) error
	// Update replaces the flow with f.Match, keeping its statistics.
	Update(f Flow) error
	// Remove deletes the flow with this match and returns its last statistics.
	Remove(match netip.AddrPort) (Stats, error)
	// Stats returns the statistics of the flow with this match.
	Stats(match netip.AddrPort) (Stats, error)
	// List returns every flow and its statistics.
	List() ([]FlowStats, error)
	// Path says where this data plane carries a flow.
	Path() Path
}

// SharedInstaller is implemented by data planes that can keep the
// caller's flow instead of a copy of their own (the XDP data plane hands
// it to its PuntRelay's dormant shadow). The caller never changes *f
// after the call: an update passes another flow.
type SharedInstaller interface {
	InstallShared(f *Flow) error
	UpdateShared(f *Flow) error
}

// StatsReader is implemented by data planes that can read every flow's
// statistics without building the flows as List does: the periodic
// sweeps over every flow (media timeouts, rebinding) need no more, and
// with tens of thousands of flows List's copies are most of their cost.
type StatsReader interface {
	// EachStats calls fn with the match and statistics of every flow List
	// would return. fn must not call the data plane.
	EachStats(fn func(match netip.AddrPort, st Stats)) error
}

// FlowStats pairs a flow with its statistics.
type FlowStats struct {
	Flow  Flow
	Stats Stats
}

// Counter is one global data plane counter: packets and bytes that got one
// verdict for one reason, summed over CPUs.
type Counter struct {
	Verdict string // "forward", "punt", "drop" or "pass"
	Reason  string // e.g. "tx", "redirect", "no_flow", "ip_options", "wrong_source"
	Packets uint64
	Bytes   uint64
}

// Interface is a network interface a data plane is attached to.
type Interface struct {
	Name    string
	Index   int
	Mode    string // "native" or "generic" for XDP
	Adopted bool   // attachment taken over from a previous run
	// Gone: the interface was deleted while relayd runs; the program is
	// on it again when it comes back.
	Gone bool
}

// Observer is implemented by data planes that expose global counters and
// their attachments, for /metrics.
type Observer interface {
	Counters() ([]Counter, error)
	Interfaces() []Interface
}

// EgressObserver is implemented by data planes that see the frames the
// kernel refuses to send out of a device after XDP redirected them.
type EgressObserver interface {
	Egress() []Egress
}

// Egress is the redirect health of one egress device.
type Egress struct {
	Device         string
	RedirectErrors uint64 // frames redirected toward the device that the kernel refused (and dropped)
	Fallback       bool   // the flows toward the device are relayed in userspace for now
}

// PuntRelay relays, in userspace, the packets of XDP flows that the XDP
// program passes to the kernel (next hop not resolved yet, fragments, IP
// options, over MTU, a change of address family, STUN/DTLS). The XDP data
// plane installs a shadow of each of its flows there; shadows are not
// listed as flows of their own.
//
// InstallShadow and UpdateShadow may keep f itself, not a copy: the
// caller never changes *f after the call (an update passes another).
type PuntRelay interface {
	InstallShadow(f *Flow) error
	UpdateShadow(f *Flow) error
	RemoveShadow(match netip.AddrPort) (Stats, error)
	// ShadowStat returns the statistics of one shadow.
	ShadowStat(match netip.AddrPort) (Stats, error)
	// ShadowStats returns the statistics of the shadows that carried or
	// dropped a packet, by match; those of the others are zero and left
	// out.
	ShadowStats() (map[netip.AddrPort]Stats, error)
}

// Add adds the packet counters of o to s (for a flow carried partly by
// two data planes); RTP statistics stay s's.
func (s *Stats) Add(o Stats) {
	s.Packets += o.Packets
	s.Bytes += o.Bytes
	s.Dropped += o.Dropped
	if o.LastSeen.After(s.LastSeen) {
		s.LastSeen = o.LastSeen
	}
}

// MaxClockRate bounds Flow.ClockRate: arrival times in RTP timestamp units
// are computed by multiplication (see TicksMult) within 64 bits.
const MaxClockRate = 96000

// TicksMult is the reciprocal both data planes convert nanoseconds to RTP
// timestamp units with: ticks = ns * TicksMult(rate) >> 32. Its rounding
// (under 1/30,000 relative at 8 kHz) is far below a tick between packets.
func TicksMult(clockRate uint32) uint64 {
	return (uint64(clockRate)<<32 + 5e8) / 1e9
}

// ArrivalTicks converts d nanoseconds since a stream's first packet to RTP
// timestamp units; d must stay under ArrivalRebase.
func ArrivalTicks(d, mult uint64) uint32 { return uint32((d * mult) >> 32) }

// ArrivalRebase is how long an arrival origin lasts before the data planes
// move it forward (and start the next jitter sample afresh), so that
// d * TicksMult stays within 64 bits up to MaxClockRate.
const ArrivalRebase = 12 * 3600 * 1e9

// WorkerObserver is implemented by data planes whose workers read packets
// from sockets (the userspace pool): how often they woke, and how long
// packets waited in the receive queue before a worker read them.
type WorkerObserver interface {
	WorkerStats() WorkerStats
}

// DelayBounds are the upper bounds, in seconds, of WorkerStats.Delay's
// buckets; a last bucket holds what is above the last bound.
var DelayBounds = []float64{5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 200e-6, 300e-6, 500e-6, 750e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3}

// WorkerStats sums the workers' wake-ups and the delay they added.
type WorkerStats struct {
	Wakeups uint64 // waits the socket ended (a packet arrived)
	Naps    uint64 // naps taken while coalescing (dataplane.coalesce)
	// Interrupts are waits a signal ended without a packet: the Go
	// runtime preempting a busy worker's wait (an idle one waits where
	// the runtime does not preempt it).
	Interrupts uint64
	Batches    uint64 // reads that returned packets
	AFXDP      uint64 // packets read from AF_XDP sockets (dataplane.userspace_io afxdp)
	// AFXDPNoFrame and AFXDPRingFull are packets the kernel dropped on
	// their way into an AF_XDP socket: no free frame (the fill ring was
	// empty, or the packet longer than a frame), or the worker's RX ring
	// full. AFXDPFillFrames are the frames the fill rings are kept at.
	AFXDPNoFrame, AFXDPRingFull uint64
	AFXDPFillFrames             int
	// LockWaits are latching flows whose lock waited over 20 ms for
	// their worker to drain its receive queue (a lock is reported, and
	// an XDP flow handed back to XDP, only then).
	LockWaits uint64
	// Flows are the flows each worker carries (XDP flows' shadows
	// included), by worker: dataplane.pack_flows packs them onto the first.
	Flows []int
	// Delay counts packets by the time from the kernel's receive
	// timestamp to the worker's read: per bucket of DelayBounds (not
	// cumulative), the last one above them; DelaySum is their sum.
	Delay    [15]uint64
	DelaySum time.Duration
}
