package call

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/relayd/relayd/dataplane"
)

// State is a call's state.
type State string

const (
	StateTrying   State = "trying"   // INVITE received, no answer yet
	StateEarly    State = "early"    // a provisional answer with SDP (early media)
	StateAnswered State = "answered" // 200 OK relayed
	StateEnded    State = "ended"
)

// Disposition says how a call ended, for CDRs.
type Disposition string

const (
	Answered     Disposition = "answered"      // answered and ended normally (BYE)
	Failed       Disposition = "failed"        // every destination failed
	Canceled     Disposition = "canceled"      // caller canceled before the answer
	Rejected     Disposition = "rejected"      // refused by relayd (400, 415, 488, 503...)
	MediaTimeout Disposition = "media_timeout" // no media for media.timeout
	MaxDuration  Disposition = "max_duration"  // the maximum call duration passed
	Shutdown     Disposition = "shutdown"      // relayd stopped (calls not kept: no store, or not answered yet)
	Hangup       Disposition = "hangup"        // ended by the operator (admin API)
	Drained      Disposition = "drained"       // still up when a drain timed out
)

// Leg is the signalling identity of one leg.
type Leg struct {
	CallID    string `json:"call_id"`
	FromTag   string `json:"from_tag,omitempty"`
	ToTag     string `json:"to_tag,omitempty"`
	Remote    string `json:"remote,omitempty"`    // peer's signalling address
	Transport string `json:"transport,omitempty"` // udp | tcp
}

// Attempt is one try of one destination.
type Attempt struct {
	Destination string    `json:"destination"`
	Start       time.Time `json:"start"`
	// Code is the final SIP status (0 on timeout or transport error).
	Code int `json:"code"`
	// Result is "answered", "failed", "timeout", "canceled" or "error".
	Result string `json:"result"`
	// FirstResponseMS is the time to the first response in ms, -1 if none.
	FirstResponseMS float64 `json:"first_response_ms"`
	// DurationMS is the time to the final outcome in ms.
	DurationMS float64 `json:"duration_ms"`
}

// Call is one call. Its exported fields are set at creation and never
// change; the rest is read through methods. Safe for concurrent use.
type Call struct {
	ID      string
	Created time.Time
	Source  netip.AddrPort // caller's signalling address
	From    string         // From URI of the incoming INVITE
	To      string         // To URI
	Media   *Media         // media, part of the call's allocation

	media Media

	mu sync.Mutex // guards the following
	// done is closed when the call ends or is let go (Detach). Made on
	// demand (Done): a held call nobody waits on has none (a context of
	// its own was two objects of the sizes the setups' garbage fills).
	done        chan struct{}
	over        bool // ended or let go: done is (or is made) closed
	state       State
	route       string
	legs        [2]Leg
	attempts    []Attempt
	answered    time.Time
	ended       time.Time
	disposition Disposition
	code        int
	reason      string
	final       []FlowStat // flow statistics at the end
}

// Keep returns s as one of the call's strings: in the call's own
// allocation when there is room (the same bytes when the call has s
// already), else a copy of its own. A string the call keeps for as long
// as it lasts should be kept so (Media.keep).
func (c *Call) Keep(s string) string { return c.media.keep(s) }

// Done is closed when the call ends, or when relayd lets go of it
// (Detach).
func (c *Call) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.over {
			close(c.done)
		}
	}
	return c.done
}

// finishLocked closes done, once. c.mu must be held.
func (c *Call) finishLocked() {
	if c.over {
		return
	}
	c.over = true
	if c.done != nil {
		close(c.done)
	}
}

// State returns the call's state.
func (c *Call) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// SetState moves the call to s; StateAnswered also records the answer
// time. A call that ended stays ended.
func (c *Call) SetState(s State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == StateEnded {
		return
	}
	c.state = s
	if s == StateAnswered && c.answered.IsZero() {
		c.answered = time.Now()
	}
}

// SetLeg records a leg's signalling identity. The transport may be in
// any case (it is kept in lower case).
func (c *Call) SetLeg(s Side, l Leg) {
	l = c.media.keepLeg(l)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.legs[s] = l
}

// keepLeg returns l with its strings in the room (keep) and its transport
// in lower case.
func (m *Media) keepLeg(l Leg) Leg {
	l.CallID, l.FromTag, l.ToTag, l.Remote = m.keep(l.CallID), m.keep(l.FromTag), m.keep(l.ToTag), m.keep(l.Remote)
	l.Transport = lowerTransport(l.Transport)
	return l
}

// lowerTransport returns t in lower case, without an allocation for the
// transports SIP knows.
func lowerTransport(t string) string {
	for _, k := range [...]string{"udp", "tcp", "tls", "ws", "wss", "sctp"} {
		if strings.EqualFold(t, k) {
			return k
		}
	}
	return strings.ToLower(t)
}

// Leg returns a leg's signalling identity.
func (c *Call) Leg(s Side) Leg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.legs[s]
}

// SetRoute records the route that matched.
func (c *Call) SetRoute(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.route = name
}

// AddAttempt records an attempt.
func (c *Call) AddAttempt(a Attempt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts = append(c.attempts, a)
}

// Compact copies the call's attempts into an allocation of their own
// length. The slice grew while the call was set up, among the setup's
// garbage and its transactions' messages; its last array (room for four
// attempts after a third, 320 bytes) was the only object of its size a
// held call kept, and it kept a page of those in use for as long as the
// call lasted. The copy is of another size (240 bytes for three), one
// the held call already has an object of. The SIP server calls it when
// it compacts a quiet call.
func (c *Call) Compact() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts = slices.Clone(c.attempts)
}

// End marks the call ended with a disposition and SIP code, closes its
// media and cancels its context. It reports false if the call had ended
// already (the first end wins).
func (c *Call) End(d Disposition, code int, reason string) bool {
	c.mu.Lock()
	if c.state == StateEnded {
		c.mu.Unlock()
		return false
	}
	c.state = StateEnded
	c.ended = time.Now()
	c.disposition, c.code, c.reason = d, code, reason
	c.mu.Unlock()
	final := c.Media.Close()
	c.mu.Lock()
	c.final = final
	c.finishLocked()
	c.mu.Unlock()
	return true
}

// LegStats are the media statistics of one leg: what relayd received from
// that leg's peer.
type LegStats struct {
	Packets  uint64  `json:"packets"`
	Bytes    uint64  `json:"bytes"`
	Dropped  uint64  `json:"dropped"`
	Lost     int64   `json:"lost"`
	JitterMS float64 `json:"jitter_ms"`
	Path     string  `json:"path,omitempty"` // xdp | userspace
	SRTP     string  `json:"srtp,omitempty"` // suite when relayd decrypts or encrypts this leg
	Mux      bool    `json:"rtcp_mux"`
	// Transcoding, when relayd converts what this leg sends: the codec
	// pair ("PCMU>G729": this leg's codec, then the other's) and the
	// frames it synthesised for lost or late packets from this leg.
	Transcode string `json:"transcode,omitempty"`
	Concealed uint64 `json:"concealed,omitempty"`
}

// FlowInfo is a call's flow for the admin API.
type FlowInfo struct {
	ID       uint64  `json:"id"`
	Leg      string  `json:"leg"` // a or b: where the packets come from
	Match    string  `json:"match"`
	SendTo   string  `json:"send_to"`
	Path     string  `json:"path"`
	Packets  uint64  `json:"packets"`
	Bytes    uint64  `json:"bytes"`
	Lost     int64   `json:"lost"`
	JitterMS float64 `json:"jitter_ms"`
	// Transcode is the codec pair of a transcoding flow ("PCMU>G729").
	Transcode string `json:"transcode,omitempty"`
	Concealed uint64 `json:"concealed,omitempty"`
}

// Info is a snapshot of a call, as the admin API shows it and CDRs record
// it.
type Info struct {
	ID          string      `json:"id"`
	State       State       `json:"state"`
	Source      string      `json:"source"`
	From        string      `json:"from"`
	To          string      `json:"to"`
	Route       string      `json:"route,omitempty"`
	Legs        [2]Leg      `json:"legs"`
	Attempts    []Attempt   `json:"attempts"`
	Start       time.Time   `json:"start"`
	Answer      *time.Time  `json:"answer,omitempty"`
	End         *time.Time  `json:"end,omitempty"`
	DurationS   float64     `json:"duration_s"` // answer to end (or now)
	Disposition Disposition `json:"disposition,omitempty"`
	Code        int         `json:"code,omitempty"`
	Reason      string      `json:"reason,omitempty"`
	Media       [2]LegStats `json:"media"`
	Flows       []FlowInfo  `json:"flows"`
}

// FlowStats returns the call's flows with their statistics: current
// ones, or the final ones once the call ended.
func (c *Call) FlowStats() []FlowStat {
	c.mu.Lock()
	final, ended := c.final, c.state == StateEnded
	c.mu.Unlock()
	if ended {
		return slices.Clone(final)
	}
	return c.Media.Flows()
}

// Info returns a snapshot with current media statistics (final ones once
// the call ended).
func (c *Call) Info() Info {
	c.mu.Lock()
	info := Info{
		ID:          c.ID,
		State:       c.state,
		Source:      c.Source.String(),
		From:        c.From,
		To:          c.To,
		Route:       c.route,
		Legs:        c.legs,
		Attempts:    slices.Clone(c.attempts),
		Start:       c.Created,
		Disposition: c.disposition,
		Code:        c.code,
		Reason:      c.reason,
	}
	if info.Attempts == nil {
		info.Attempts = []Attempt{}
	}
	end := time.Now()
	if !c.ended.IsZero() {
		e := c.ended
		info.End, end = &e, e
	}
	if !c.answered.IsZero() {
		a := c.answered
		info.Answer = &a
		info.DurationS = end.Sub(a).Seconds()
	}
	flows := c.final
	ended := c.state == StateEnded
	c.mu.Unlock()
	if !ended {
		flows = c.Media.Flows()
	}
	streams := c.Media.Streams()
	info.Flows = make([]FlowInfo, 0, len(flows))
	for _, f := range flows {
		fi := FlowInfo{
			ID: f.Flow.ID, Leg: f.Side.String(), Match: f.Flow.Match.String(), SendTo: f.Flow.SendTo.String(),
			Path: string(f.Path), Packets: f.Stats.Packets, Bytes: f.Stats.Bytes, Lost: f.Stats.Lost,
			JitterMS: f.Stats.JitterMillis(f.Flow.ClockRate),
		}
		ls := &info.Media[f.Side]
		if t := f.Flow.Transcode; t != nil {
			fi.Transcode, fi.Concealed = t.In.Name+">"+t.Out.Name, f.Stats.Concealed
			ls.Transcode = fi.Transcode
			ls.Concealed += f.Stats.Concealed
		}
		info.Flows = append(info.Flows, fi)
		ls.Packets += f.Stats.Packets
		ls.Bytes += f.Stats.Bytes
		ls.Dropped += f.Stats.Dropped
		if f.Flow.ClockRate != 0 {
			ls.Lost += f.Stats.Lost
			ls.JitterMS = max(ls.JitterMS, f.Stats.JitterMillis(f.Flow.ClockRate))
		}
		if ls.Path == "" || f.Path == dataplane.PathUserspace {
			ls.Path = string(f.Path)
		}
	}
	for _, st := range streams {
		for s := range st.Ends {
			e := &st.Ends[s]
			info.Media[s].Mux = info.Media[s].Mux || st.muxed(Side(s))
			if e.Recv != nil {
				info.Media[s].SRTP = e.Recv.Suite.String()
			}
		}
	}
	return info
}
