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
