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
// exact wording (see ReplyText), which the comments quote.
var (
	// ErrSessionLimit: the offer of a new call would exceed the session
	// limit. A client that sent "supports": ["load limit"] gets
	// "result: load limit" with this message, others
	// "result: error"; Kamailio tries the next relay either way.
	ErrSessionLimit = errors.New("parallel session limit reached")
	// ErrCPULimit, ErrLoadLimit, ErrBandwidthLimit: the other load
	// limits; "result: load limit" for a client that supports it,
	// else "Parallel session limit reached" as rtpengine does.
	ErrCPULimit       = errors.New("cpu usage limit exceeded")
	ErrLoadLimit      = errors.New("load limit exceeded")
	ErrBandwidthLimit = errors.New("bandwidth limit exceeded")
	// ErrNoPorts: no media ports left; Kamailio tries the next relay.
	ErrNoPorts = errors.New("ran out of ports")
	// ErrUnknownCall: no such call-id (answer, query). For delete the
	// server turns it into "ok" with the warning "Call-ID not found or
	// tags didn't match", unless the request has the flag "fatal".
	ErrUnknownCall = errors.New("unknown call-id")
	// ErrTagMismatch: delete found the call but not the tags; answered
	// like ErrUnknownCall on delete.
	ErrTagMismatch = errors.New("call-id not found or tags did not match")
	// ErrBadSDP: the SDP does not parse.
	ErrBadSDP = errors.New("failed to parse sdp")
	// ErrIncompleteSDP: the SDP parses but lacks what is needed.
	ErrIncompleteSDP = errors.New("incomplete sdp specification")
	// ErrDialogue: the tags do not fit the call's dialogue.
	ErrDialogue = errors.New("invalid dialogue association")
	// ErrRewriteSDP: the reply SDP could not be made.
	ErrRewriteSDP = errors.New("error rewriting sdp")
	// ErrTranscode: the offer needs a codec only transcoding provides,
	// and relayd cannot transcode (no userspace data plane, or built
	// without G.729).
	ErrTranscode = errors.New("transcoding is not available")
)

// Errors of the wire side: replies the server makes itself, with
// rtpengine's wording.
var (
	ErrNoCommand      = errors.New(`dictionary contains no key "command"`)
	ErrNotDict        = errors.New("could not decode bencode dictionary")
	ErrNoPayload      = errors.New("invalid data (no payload)")
	ErrFormat         = errors.New("invalid ng data format")
	ErrJSON           = errors.New("failed to parse JSON document")
	ErrNoCallID       = errors.New("no call-id in message")
	ErrNoFromTag      = errors.New("no from-tag in message")
	ErrNoToTag        = errors.New("no to-tag in message")
	ErrNoSDP          = errors.New("no sdp body in message")
	ErrUnknownCommand = errors.New("unrecognized command")
	ErrUnsupported    = errors.New("unsupported command")
	ErrLimit          = errors.New("invalid limit, must be >= 0")
)

// wording is the reply text of each sentinel error: rtpengine's exact
// words, which clients such as Kamailio compare.
var wording = []struct {
	err  error
	text string
}{
	{ErrSessionLimit, "Parallel session limit reached"},
	{ErrCPULimit, "CPU usage limit exceeded"},
	{ErrLoadLimit, "Load limit exceeded"},
	{ErrBandwidthLimit, "Bandwidth limit exceeded"},
	{ErrNoPorts, "Ran out of ports"},
	{ErrUnknownCall, "Unknown call-id"},
	{ErrTagMismatch, "Call-ID not found or tags didn't match"},
	{ErrBadSDP, "Failed to parse SDP"},
	{ErrIncompleteSDP, "Incomplete SDP specification"},
	{ErrDialogue, "Invalid dialogue association"},
	{ErrRewriteSDP, "Error rewriting SDP"},
	{ErrNoCommand, `Dictionary contains no key "command"`},
	{ErrNotDict, "Could not decode bencode dictionary"},
	{ErrNoPayload, "Invalid data (no payload)"},
	{ErrFormat, "Invalid NG data format"},
	{ErrJSON, "Failed to parse JSON document"},
	{ErrNoCallID, "No call-id in message"},
	{ErrNoFromTag, "No from-tag in message"},
	{ErrNoToTag, "No to-tag in message"},
	{ErrNoSDP, "No SDP body in message"},
	{ErrUnknownCommand, "Unrecognized command"},
	{ErrUnsupported, "Unsupported command"},
	{ErrLimit, "invalid limit, must be >= 0"},
	{ErrTranscode, "transcoding is not available"},
}

// ReplyText returns the error-reason (or load-limit message) the server
// sends for err: rtpengine's wording for a sentinel error, wrapped or
// not, and the error's own text for any other.
func ReplyText(err error) string {
	for _, w := range wording {
		if errors.Is(err, w.err) {
			return w.text
		}
	}
	return err.Error()
}

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
	// Codec is the codec received most ("PCMU/8000"): for relayd, the
	// one a transcoding flow decodes from the party; omitted when empty.
	Codec   string
	Streams []StreamStats
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
