// Package ng is relayd's server of rtpengine's ng control protocol, the
// one Kamailio's rtpengine module (and OpenSIPS's) speaks: each request is
// a cookie, a space and a bencode (or JSON) dictionary; the reply repeats
// the cookie. It is the wire side only: it listens (UDP, TCP, HTTP),
// checks the sender against an allow list, answers a resent request from
// its cookie cache, parses and normalises the dictionary into a Request,
// hands it to an Engine and encodes the Engine's Reply, or its error, in
// rtpengine 10.5's layout and wording. docs/ng.md describes the protocol
// surface.
package ng

import (
	"context"
	"errors"
	"net/netip"
	"time"
)

// Engine does the work of the commands. Implementations are safe for
// concurrent use. ping never reaches it. A method returns a Reply (nil
// means an empty "ok") or an error: one of the sentinel errors below
// (possibly wrapped) for the failures rtpengine words in a fixed way, any
// other error for "result: error" with the error's text.
type Engine interface {
	Offer(ctx context.Context, r *Request) (*Reply, error)
	Answer(ctx context.Context, r *Request) (*Reply, error)
	Delete(ctx context.Context, r *Request) (*Reply, error)
	Query(ctx context.Context, r *Request) (*Reply, error)
	List(ctx context.Context, r *Request) (*Reply, error)
	Statistics(ctx context.Context, r *Request) (*Reply, error)
}

// Errors an Engine returns (wrapped or not), answered with rtpengine's
// exact wording.
var (
	// ErrSessionLimit: the offer of a new call would exceed the session
	// limit. A client that sent "supports": ["load limit"] gets
	// "result: load limit" with this message, others
	// "result: error"; Kamailio tries the next relay either way.
	ErrSessionLimit = errors.New("Parallel session limit reached")
	// ErrCPULimit, ErrLoadLimit, ErrBandwidthLimit: the other load
	// limits; "result: load limit" for a client that supports it,
	// else "Parallel session limit reached" as rtpengine does.
	ErrCPULimit       = errors.New("CPU usage limit exceeded")
	ErrLoadLimit      = errors.New("Load limit exceeded")
	ErrBandwidthLimit = errors.New("Bandwidth limit exceeded")
	// ErrNoPorts: no media ports left; Kamailio tries the next relay.
	ErrNoPorts = errors.New("Ran out of ports")
	// ErrUnknownCall: no such call-id (answer, query). For delete the
	// server turns it into "ok" with the warning "Call-ID not found or
	// tags didn't match", unless the request has the flag "fatal".
	ErrUnknownCall = errors.New("Unknown call-id")
	// ErrTagMismatch: delete found the call but not the tags; answered
	// like ErrUnknownCall on delete.
	ErrTagMismatch = errors.New("Call-ID not found or tags didn't match")
	// ErrBadSDP: the SDP does not parse.
	ErrBadSDP = errors.New("Failed to parse SDP")
	// ErrIncompleteSDP: the SDP parses but lacks what is needed.
	ErrIncompleteSDP = errors.New("Incomplete SDP specification")
	// ErrDialogue: the tags do not fit the call's dialogue.
	ErrDialogue = errors.New("Invalid dialogue association")
	// ErrRewriteSDP: the reply SDP could not be made.
	ErrRewriteSDP = errors.New("Error rewriting SDP")
)

// Errors of the wire side: replies the server makes itself, with
// rtpengine's wording.
var (
	ErrNoCommand      = errors.New(`Dictionary contains no key "command"`)
	ErrNotDict        = errors.New("Could not decode bencode dictionary")
	ErrNoPayload      = errors.New("Invalid data (no payload)")
	ErrFormat         = errors.New("Invalid NG data format")
	ErrJSON           = errors.New("Failed to parse JSON document")
	ErrNoCallID       = errors.New("No call-id in message")
	ErrNoFromTag      = errors.New("No from-tag in message")
	ErrNoToTag        = errors.New("No to-tag in message")
	ErrNoSDP          = errors.New("No SDP body in message")
	ErrUnknownCommand = errors.New("Unrecognized command")
	ErrUnsupported    = errors.New("Unsupported command")
	ErrLimit          = errors.New("invalid limit, must be >= 0")
)

// Result is a reply's "result".
type Result string

// The results rtpengine sends.
const (
	ResultOK        Result = "ok"
	ResultPong      Result = "pong"
	ResultError     Result = "error"
	ResultLoadLimit Result = "load limit"
)

// Reply is what an Engine answers. The zero value is a plain "ok". The
// server sets result, error-reason and message from the Engine's error;
// a Reply is only read by the server, after the Engine returned it.
type Reply struct {
	// Warning is sent as "warning" (delete of an unknown call, for
	// example).
	Warning string
	// SDP is the rewritten SDP of offer and answer.
	SDP string
	// Call is the call's state for query, and for delete when the
	// Engine reports it (rtpengine does on every delete that found the
	// call).
	Call *CallStats
	// Calls are list's call-ids. A list reply always has "calls".
	Calls []string
	// Statistics is the reply to statistics.
	Statistics *Statistics
}

// CallStats is a call as query reports it (rtpengine's ng_call_stats).
type CallStats struct {
	Created    time.Time // "created" and "created_us"
	LastSignal time.Time // "last signal", seconds
	// Tags are the call's parties, sent as "tags" keyed by tag (an
	// empty tag becomes "<untagged N>").
	Tags []TagStats
	// SSRC holds the RTCP-derived quality of each SSRC that has some,
	// keyed by SSRC in decimal.
	SSRC []SSRCStats
	// Totals are the call's packets, "totals" {"RTP", "RTCP"}. When
	// zero the server sums the streams' stats.
	TotalRTP, TotalRTCP Counters
}

// TagStats is one party (rtpengine's monologue).
type TagStats struct {
	Tag       string
	ViaBranch string
	Label     string
	Created   time.Time // seconds
	// Subscriptions and Subscribers are the tags this one receives
	// media from and sends media to; offer/answer parties list each
	// other.
	Subscriptions, Subscribers []Subscription
	Medias                     []MediaStats
}

// Subscription is an entry of "subscriptions" or "subscribers".
type Subscription struct {
	Tag  string
	Type string // "offer/answer" or "pub/sub"; empty means offer/answer
}

// MediaStats is one m= line of a party.
type MediaStats struct {
	Index    int    // from 1
	Type     string // "audio"
	Protocol string // "RTP/AVP"; omitted when empty
	Codec    string // "PCMU/8000"; omitted when empty
	Streams  []StreamStats
	// Flags, such as "initialized", "send", "recv", "rtcp-mux", "SDES",
	// "ICE", "ICE controlling", "asymmetric", "transcoding".
	Flags []string
}

// StreamStats is one socket of a media (RTP, or RTCP).
type StreamStats struct {
	Local netip.AddrPort // "local port", "local address", "family"; omitted when invalid
	// Endpoint is where the party's packets come from (after latching);
	// Advertised what its SDP said. Invalid ones encode as {}.
	Endpoint, Advertised netip.AddrPort
	CryptoSuite          string    // "crypto suite"; omitted when empty
	LastPacket           time.Time // seconds; zero encodes 0
	// Flags, such as "RTP", "RTCP", "filled", "confirmed", "kernelized",
	// "strict source address", "media handover", "ICE".
	Flags []string
	SSRC  uint32 // "SSRC"; omitted when 0
	Stats Counters
}

// Counters count packets received.
type Counters struct {
	Packets, Bytes, Errors int64
}

// SSRCStats is the RTCP-derived quality of one SSRC, from which
// Kamailio's mos_* variables are filled (rtpengine_query_v, MOS
// variables): it reads "average MOS", "lowest MOS" and "highest MOS",
// each with MOS, packet loss, jitter, round-trip time and "reported at"
// or "samples".
type SSRCStats struct {
	SSRC           uint32
	CumulativeLoss int64
	Average        MOS // "average MOS", with Samples
	Lowest         MOS // "lowest MOS"
	Highest        MOS // "highest MOS"
	// ProgressionInterval and Progression are "MOS progression":
	// interval in seconds, entries.
	ProgressionInterval time.Duration
	Progression         []MOS
	Samples             int // of the average
}

// MOS is one quality report, in rtpengine's units.
type MOS struct {
	MOS          int64     // MOS times 10 (43 is 4.3)
	RoundTrip    int64     // "round-trip time", microseconds
	RoundTripLeg int64     // "round-trip time leg", microseconds
	Jitter       int64     // milliseconds
	PacketLoss   int64     // percent
	ReportedAt   time.Time // "reported at"; not sent for the average
}

// Statistics is the reply to statistics, in the sections of rtpengine's
// statistics_ng that relayd fills. Sections rtpengine has and relayd
// does not (intervalstatistics, transcoders) are omitted; the server
// adds controlstatistics from its own counters.
type Statistics struct {
	// currentstatistics
	SessionsOwn, SessionsForeign, TranscodedMedia int64
	PacketRate, ByteRate, ErrorRate               int64 // per second
	// totalstatistics
	Uptime                                             time.Duration
	ManagedSessions, RejectedSessions, TimeoutSessions int64
	SilentTimeoutSessions, FinalTimeoutSessions        int64
	OfferTimeoutSessions, RegularTerminatedSessions    int64
	ForcedTerminatedSessions                           int64
	RelayedPackets, RelayedPacketErrors, RelayedBytes  int64
	ZeroWayStreams, OneWayStreams                      int64
	AverageCallDuration, TotalCallsDuration            time.Duration
	Interfaces                                         []InterfaceStats
}

// InterfaceStats is one media interface of "interfaces".
type InterfaceStats struct {
	Name      string
	Address   netip.Addr
	PortMin   int
	PortMax   int
	PortsUsed int
	LastPort  int
}
