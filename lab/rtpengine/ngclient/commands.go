package ngclient

import (
	"context"
	"fmt"

	"github.com/relayd/relayd/control/ng/bencode"
)

// Request holds the parameters of offer, answer, delete and query. Empty
// fields are left out of the message.
type Request struct {
	CallID    string // call-id: the SIP Call-ID
	FromTag   string // from-tag: the caller's tag
	ToTag     string // to-tag: the callee's tag (answer; delete of one branch)
	ViaBranch string // via-branch
	SDP       string // sdp: the body to rewrite (offer, answer)

	Flags     []string // flags, such as "trust-address", "strict-source"
	Replace   []string // replace, such as "origin", "session-connection"
	Direction []string // direction: logical interface names, caller's first
	ICE       string   // ice: "remove", "force", ...
	RTCPMux   []string // rtcp-mux: "offer", "demux", ...
	// TransportProtocol (transport-protocol) changes the profile, such as
	// "RTP/AVP" or "RTP/SAVP".
	TransportProtocol string
	// Extra holds any other keys, added as they are; a key also set by a
	// field above is an error when the message is encoded.
	Extra []bencode.Entry
}

// Message returns the request as the dictionary of command.
func (r *Request) Message(command string) bencode.Value {
	e := make([]bencode.Entry, 0, 12+len(r.Extra))
	e = append(e, bencode.Entry{Key: "command", Value: bencode.String(command)})
	str := func(k, v string) {
		if v != "" {
			e = append(e, bencode.Entry{Key: k, Value: bencode.String(v)})
		}
	}
	list := func(k string, v []string) {
		if len(v) > 0 {
			e = append(e, bencode.Entry{Key: k, Value: bencode.Strings(v...)})
		}
	}
	str("call-id", r.CallID)
	str("from-tag", r.FromTag)
	str("to-tag", r.ToTag)
	str("via-branch", r.ViaBranch)
	str("sdp", r.SDP)
	list("flags", r.Flags)
	list("replace", r.Replace)
	list("direction", r.Direction)
	str("ICE", r.ICE)
	list("rtcp-mux", r.RTCPMux)
	str("transport-protocol", r.TransportProtocol)
	e = append(e, r.Extra...)
	return bencode.Dict(e...)
}

// SDPReply is the reply to offer or answer.
type SDPReply struct {
	SDP string        // the rewritten body, for the other side
	Raw bencode.Value // the whole reply
}

// Ping sends ping and expects pong.
func (c *Client) Ping(ctx context.Context) error {
	v, err := c.Do(ctx, bencode.Dict(bencode.Entry{Key: "command", Value: bencode.String("ping")}))
	if err != nil {
		return err
	}
	if r := v.GetString("result"); r != "pong" {
		return fmt.Errorf("ng ping: result %q, want pong", r)
	}
	return nil
}

// Offer sends the caller's SDP and returns it rewritten for the callee.
func (c *Client) Offer(ctx context.Context, r Request) (*SDPReply, error) {
	return c.sdpCommand(ctx, "offer", r)
}

// Answer sends the callee's SDP (r.ToTag set) and returns it rewritten
// for the caller.
func (c *Client) Answer(ctx context.Context, r Request) (*SDPReply, error) {
	return c.sdpCommand(ctx, "answer", r)
}

func (c *Client) sdpCommand(ctx context.Context, command string, r Request) (*SDPReply, error) {
	if r.CallID == "" || r.FromTag == "" || r.SDP == "" {
		return nil, fmt.Errorf("ng %s: call-id, from-tag and sdp are required", command)
	}
	if command == "answer" && r.ToTag == "" {
		return nil, fmt.Errorf("ng answer: to-tag is required")
	}
	v, err := c.Do(ctx, r.Message(command))
	if err != nil {
		return nil, err
	}
	sdp := v.GetString("sdp")
	if sdp == "" {
		return nil, fmt.Errorf("ng %s: reply without sdp: %v", command, v)
	}
	return &SDPReply{SDP: sdp, Raw: v}, nil
}

// Delete ends the call r.CallID (or only the branch of r.FromTag and
// r.ToTag when set) and returns its final statistics.
func (c *Client) Delete(ctx context.Context, r Request) (*CallStats, error) {
	return c.statsCommand(ctx, "delete", r)
}

// Query returns the statistics of the call r.CallID.
func (c *Client) Query(ctx context.Context, r Request) (*CallStats, error) {
	return c.statsCommand(ctx, "query", r)
}

func (c *Client) statsCommand(ctx context.Context, command string, r Request) (*CallStats, error) {
	if r.CallID == "" {
		return nil, fmt.Errorf("ng %s: call-id is required", command)
	}
	v, err := c.Do(ctx, r.Message(command))
	if err != nil {
		return nil, err
	}
	return parseStats(v), nil
}

// List returns the Call-IDs of the server's calls (command list), at most
// limit of them if limit > 0.
func (c *Client) List(ctx context.Context, limit int) ([]string, error) {
	e := []bencode.Entry{{Key: "command", Value: bencode.String("list")}}
	if limit > 0 {
		e = append(e, bencode.Entry{Key: "limit", Value: bencode.Int(int64(limit))})
	}
	v, err := c.Do(ctx, bencode.Dict(e...))
	if err != nil {
		return nil, err
	}
	calls, _ := v.Get("calls")
	l, ok := calls.AsList()
	if !ok {
		return nil, fmt.Errorf("ng list: reply without a list of calls: %v", v)
	}
	ids := make([]string, 0, len(l))
	for _, id := range l {
		s, ok := id.AsString()
		if !ok {
			return nil, fmt.Errorf("ng list: call %v not a string", id)
		}
		ids = append(ids, s)
	}
	return ids, nil
}
