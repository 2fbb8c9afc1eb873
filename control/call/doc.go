// Package call is relayd's call model: the media of a call (streams, the
// flows that carry them, their statistics), the table of calls that the
// front ends (the SIP B2BUA, the rtpengine ng protocol) and the admin API
// share, and the records CDRs are written from. The flows and relay ports
// themselves are in the flow registry (control/registry), which every
// front end shares; see docs/architecture.md.
//
// A call has two legs, A (the caller, or the ng offerer) and B (the
// callee, or the answerer). Each leg has media streams, one per m= line;
// each stream has a relay port pair per leg (RTP even, RTCP odd) taken
// from the media interface the leg uses and, per direction, an RTP flow
// and an RTCP flow (just the RTP flow with rtcp-mux), keyed by the relay
// address and port the packets arrive on. Flows are installed as soon as
// both ends of a direction are known and removed when the call ends.
// control/call never imports cilium/ebpf or x/sys/unix.
package call

import "github.com/relayd/relayd/control/registry"

// ErrNoPorts is returned when every relay port pair of a media interface
// is in use; the SIP front end answers 503 with Retry-After.
var ErrNoPorts = registry.ErrNoPorts
