// Package call is relayd's call model: the media of a call (streams, the
// flows that carry them, their statistics), the negotiation of that media and the table of calls that the front ends
// (the SIP B2BUA, the ng protocol), the admin API and CDRs share.
//
// A call has two legs, A (the caller, or the offerer of the first offer)
// and B. Each leg has media streams, one per m= line; each stream has a
// relay port pair per leg (RTP even, RTCP odd), taken in the flow
// registry (control/registry) from the media interface the leg uses, and,
// per direction, an RTP flow and an RTCP flow (just the RTP flow when the
// sending leg uses rtcp-mux), keyed by the relay address and port the packets arrive on.
// Flows are installed as soon as both ends of a direction are known and
// removed when the call ends.
//
// Session owns the offer/answer (RFC 3264) of a call's media: relayd's
// media address (Local), o= line and last SDP per leg, and the pending
// offer with what relayd decided per stream. Its Offer and Answer apply
// the policy a front end derives from its own syntax (a route's SRTP and
// codecs, ng flags) as OfferOptions and AnswerOptions: SRTP pass-through,
// termination or keying (Policy), codec selection (CodecPolicy), rtcp-mux
// (MuxPolicy), latching per leg (LatchPolicy) and how the SDP is rendered
// (Render); they set the streams' ends and render the SDP with control/sdp.
//
// See docs/architecture.md. control/call never imports cilium/ebpf or
// x/sys/unix.
package call

import "github.com/relayd/relayd/control/registry"

// ErrNoPorts is returned when every relay port pair of a media interface
// is in use; the SIP front end answers 503 with Retry-After.
var ErrNoPorts = registry.ErrNoPorts
