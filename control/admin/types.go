package admin

// Wire types of the admin API (docs/api.md). relayctl uses them too.

import "github.com/relayd/relayd/control/call"

// Crypto is an SRTP transform in a flow request: suite and base64 master
// key||salt. Flows as returned carry the suite only.
type Crypto struct {
	Suite string `json:"suite"`
	Key   string `json:"key,omitempty"`
}

// FlowRequest is the body of POST /v1/flows.
type FlowRequest struct {
	Match        string  `json:"match"`
	ExpectSource string  `json:"expect_source,omitempty"`
	SendFrom     string  `json:"send_from,omitempty"`
	SendTo       string  `json:"send_to,omitempty"`
	Mode         string  `json:"mode,omitempty"`       // xdp (default) | userspace
	Action       string  `json:"action,omitempty"`     // forward (default) | drop | reflect
	ClockRate    *uint32 `json:"clock_rate,omitempty"` // default 8000; 0 = no RTP statistics
	Decrypt      *Crypto `json:"decrypt,omitempty"`
	Encrypt      *Crypto `json:"encrypt,omitempty"`
	Latch        bool    `json:"latch,omitempty"`   // symmetric RTP: learn, then lock the source
	Reverse      string  `json:"reverse,omitempty"` // match of the flow that follows the learned source
	// Transcode converts the flow's RTP between codecs (in userspace).
	Transcode *Transcode `json:"transcode,omitempty"`
	// RateCapPPS caps the flow's packet rate (a second's worth may come
	// at once); default media.rate_limit_default_pps (none when caps are
	// off); 0 = no cap.
	RateCapPPS *uint32 `json:"rate_cap_pps,omitempty"`
}

// Transcode is the codec conversion of a flow: from is the codec arriving
// at match, to the codec sent to send_to. Payload types default to the
// static ones (PCMU 0, PCMA 8, G729 18), ptimes to 20 ms.
type Transcode struct {
	From      string `json:"from"`
	To        string `json:"to"`
	PtimeFrom uint8  `json:"ptime_from,omitempty"`
	PtimeTo   uint8  `json:"ptime_to,omitempty"`
	PTFrom    *uint8 `json:"pt_from,omitempty"`
	PTTo      *uint8 `json:"pt_to,omitempty"`
	// Telephone-event (RFC 4733) and comfort noise (RFC 3389) payload
	// types on each side; 0 or absent: none.
	EventFrom uint8 `json:"event_from,omitempty"`
	EventTo   uint8 `json:"event_to,omitempty"`
	CNFrom    uint8 `json:"cn_from,omitempty"`
	CNTo      uint8 `json:"cn_to,omitempty"`
	// G.729 Annex B on each side: SID frames and silence suppression.
	VADFrom bool `json:"vad_from,omitempty"`
	VADTo   bool `json:"vad_to,omitempty"`
	// SSRC of the stream sent to send_to; 0 or absent: relayd picks one.
	SSRC uint32 `json:"ssrc,omitempty"`
	// Where relayd sends its own RTCP reports about the send_to leg.
	RTCPFrom string `json:"rtcp_from,omitempty"`
	RTCPTo   string `json:"rtcp_to,omitempty"`
}

// TranscodeStats are a transcoding flow's counters.
type TranscodeStats struct {
	FramesIn    uint64  `json:"frames_in"`
	FramesOut   uint64  `json:"frames_out"`
	Concealed   uint64  `json:"concealed"`
	SentPackets uint64  `json:"sent_packets"`
	Events      uint64  `json:"events"`
	RTCPSent    uint64  `json:"rtcp_sent"`
	MaxHoldMS   float64 `json:"max_hold_ms"`
}

// Flow is a flow as the API returns it.
type Flow struct {
	ID           uint64  `json:"id"`
	Match        string  `json:"match"`
	ExpectSource string  `json:"expect_source,omitempty"`
	SendFrom     string  `json:"send_from,omitempty"`
	SendTo       string  `json:"send_to,omitempty"`
	Mode         string  `json:"mode"`
	Action       string  `json:"action"`
	ClockRate    uint32  `json:"clock_rate"`
	Decrypt      *Crypto `json:"decrypt,omitempty"`
	Encrypt      *Crypto `json:"encrypt,omitempty"`
	Latch        bool    `json:"latch,omitempty"`
	Reverse      string  `json:"reverse,omitempty"`
	// RateCapPPS is the flow's packet-rate cap (packets per second; a
	// second's worth may come at once); absent: none.
	RateCapPPS uint32 `json:"rate_cap_pps,omitempty"`
	// Transcode and its counters, for a transcoding flow.
	Transcode      *Transcode      `json:"transcode,omitempty"`
	TranscodeStats *TranscodeStats `json:"transcode_stats,omitempty"`

	Path     string  `json:"path"`
	Packets  uint64  `json:"packets"`
	Bytes    uint64  `json:"bytes"`
	Dropped  uint64  `json:"dropped"`
	Lost     int64   `json:"lost"`
	JitterMS float64 `json:"jitter_ms"`
	LastSeen *string `json:"last_seen"` // RFC 3339 with milliseconds, UTC; null if never seen
	SSRC     uint32  `json:"ssrc"`
	Received uint64  `json:"received"`
}

// FlowList is the body of GET /v1/flows.
type FlowList struct {
	Flows []Flow `json:"flows"`
}

// ErrorBody is the body of every error response.
type ErrorBody struct {
	Error string `json:"error"`
}

// TimeFormat is the format of last_seen.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// CallList is the body of GET /v1/calls; GET /v1/calls/{id} returns one
// call.Info.
type CallList struct {
	Calls []call.Info `json:"calls"`
}

// DrainRequest is the body of POST /v1/drain (optional).
type DrainRequest struct {
	// Timeout is how long calls in progress may go on, as a Go duration
	// ("10m"); default 10m.
	Timeout string `json:"timeout,omitempty"`
}

// DrainStatus is the body of GET /v1/drain and of POST /v1/drain's answer.
type DrainStatus struct {
	Draining bool   `json:"draining"`
	Calls    int    `json:"calls"`             // calls still in progress
	Timeout  string `json:"timeout,omitempty"` // in POST's answer: the timeout applied
}
