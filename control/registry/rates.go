package registry

import "github.com/relayd/relayd/dataplane"

// RatePolicy is how the control plane caps the packet rate of its flows
// ([media] rate_limit_*): a multiple of the codec's packet rate where the
// SDP tells it, a ceiling of its own for RTCP ports, and a default ceiling
// for every other flow. Each cap lets a second's worth of packets through
// at once (its burst), so jitter, a backlog after a stall and RFC 4733
// event bursts pass.
type RatePolicy struct {
	// Factor multiplies an audio stream's packet rate; 0 turns every cap
	// off.
	Factor uint32
	// DefaultPPS caps a flow whose packet rate relayd does not know:
	// video and other streams, static flows of the admin API.
	DefaultPPS uint32
	// RTCPPPS caps an RTCP port's flow (a leg without rtcp-mux).
	RTCPPPS uint32
}

// Packet times MediaCap assumes: at most 20 ms, so that a peer sending at
// 10 ms while it signals more is within the cap; 10 ms when the SDP gives
// none (RFC 3551's 20 ms default is often not what is sent); at least 5 ms.
const (
	maxCapPtime     = 20
	defaultCapPtime = 10
	minCapPtime     = 5
)

// CapOf returns the cap of pps packets per second with a second's worth
// of burst (as much as a data plane holds); 0: no cap. Over
// dataplane.MaxRatePPS it is a cap the flow's validation refuses.
func CapOf(pps uint32) dataplane.RateCap {
	return dataplane.RateCap{PPS: pps, Burst: min(pps, dataplane.MaxRateBurst)}
}

func rateCap(pps uint32) dataplane.RateCap { return CapOf(min(pps, dataplane.MaxRatePPS)) }

// MediaCap returns the cap of a stream's RTP flow: audio (kind "audio")
// with a packet time of ptime ms (0: none signalled) gets Factor times its
// packet rate; any other kind the default ceiling. Zero when caps are off.
func (p RatePolicy) MediaCap(kind string, ptime int) dataplane.RateCap {
	if p.Factor == 0 {
		return dataplane.RateCap{}
	}
	if kind != "audio" {
		return p.DefaultCap()
	}
	if ptime <= 0 {
		ptime = defaultCapPtime
	}
	ptime = min(max(ptime, minCapPtime), maxCapPtime)
	return rateCap(p.Factor * ((1000 + uint32(ptime) - 1) / uint32(ptime)))
}

// RTCPCap returns the cap of an RTCP port's flow; zero when caps are off.
func (p RatePolicy) RTCPCap() dataplane.RateCap {
	if p.Factor == 0 {
		return dataplane.RateCap{}
	}
	return rateCap(p.RTCPPPS)
}

// DefaultCap returns the cap of a flow whose rate relayd does not know;
// zero when caps are off.
func (p RatePolicy) DefaultCap() dataplane.RateCap {
	if p.Factor == 0 {
		return dataplane.RateCap{}
	}
	return rateCap(p.DefaultPPS)
}

// Rates returns the registry's rate policy.
func (r *Registry) Rates() RatePolicy { return r.cfg.Rates }
