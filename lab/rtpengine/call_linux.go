package rtpengine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/lab/rtpengine/ngclient"
)

// CallSpec describes a call for SetupCall. The zero value is a G.711
// µ-law call from the lab's caller at 198.18.0.2:4000 to its callee at
// 198.18.2.2:5000.
type CallSpec struct {
	CallID  string         // default: random
	FromTag string         // default: random
	ToTag   string         // default: random
	Caller  netip.AddrPort // the caller's media address; default lab caller, port 4000
	Callee  netip.AddrPort // the callee's media address; default lab callee, port 5000
	// PayloadTypes of the audio stream, static types only; default [0]
	// (PCMU).
	PayloadTypes []uint8
	// Flags are added to the offer's and the answer's flags.
	Flags []string
}

// Call is a call set up on the engine.
type Call struct {
	CallID, FromTag, ToTag string
	Caller, Callee         netip.AddrPort // the parties' media addresses
	// CallerToCallee is where the caller sends RTP (from the rewritten
	// answer): rtpengine relays it to Callee. CalleeToCaller is where
	// the callee sends RTP (from the rewritten offer), relayed to
	// Caller. RTCP goes to the odd port above each.
	CallerToCallee, CalleeToCaller netip.AddrPort
	OfferSDP, AnswerSDP            string // as rewritten by rtpengine
}

// SetupCall sends the offer with the caller's SDP and the answer with the
// callee's, and returns the relay's ports for each direction. The
// rewritten SDPs must carry the engine's media address of the callers'
// family and a port inside the engine's range.
func (e *Engine) SetupCall(ctx context.Context, spec CallSpec) (*Call, error) {
	l := e.Lab
	if !spec.Caller.IsValid() {
		spec.Caller = netip.AddrPortFrom(l.CallerAddr4, 4000)
	}
	if !spec.Callee.IsValid() {
		spec.Callee = netip.AddrPortFrom(l.CalleeAddr4, 5000)
	}
	if spec.Caller.Addr().Is4() != spec.Callee.Addr().Is4() {
		return nil, fmt.Errorf("call %s: caller %s and callee %s of different families", spec.CallID, spec.Caller, spec.Callee)
	}
	if len(spec.PayloadTypes) == 0 {
		spec.PayloadTypes = []uint8{0}
	}
	for _, p := range []*string{&spec.CallID, &spec.FromTag, &spec.ToTag} {
		if *p == "" {
			*p = randomID()
		}
	}
	c := &Call{CallID: spec.CallID, FromTag: spec.FromTag, ToTag: spec.ToTag, Caller: spec.Caller, Callee: spec.Callee}
	relay := e.Relay4
	if spec.Caller.Addr().Is6() {
		relay = e.Relay6
	}
	client := e.Client()
	offer, err := client.Offer(ctx, ngclient.Request{
		CallID: spec.CallID, FromTag: spec.FromTag, Flags: spec.Flags,
		SDP: AudioSDP(spec.Caller, 1, spec.PayloadTypes...),
	})
	if err != nil {
		return nil, fmt.Errorf("call %s: %w", spec.CallID, err)
	}
	c.OfferSDP = offer.SDP
	if c.CalleeToCaller, err = e.checkSDP(offer.SDP, relay); err != nil {
		return nil, fmt.Errorf("call %s: offer: %w", spec.CallID, err)
	}
	answer, err := client.Answer(ctx, ngclient.Request{
		CallID: spec.CallID, FromTag: spec.FromTag, ToTag: spec.ToTag, Flags: spec.Flags,
		SDP: AudioSDP(spec.Callee, 2, spec.PayloadTypes...),
	})
	if err != nil {
		return c, fmt.Errorf("call %s: %w", spec.CallID, err)
	}
	c.AnswerSDP = answer.SDP
	if c.CallerToCallee, err = e.checkSDP(answer.SDP, relay); err != nil {
		return c, fmt.Errorf("call %s: answer: %w", spec.CallID, err)
	}
	return c, nil
}

// DeleteCall ends the call.
func (e *Engine) DeleteCall(ctx context.Context, c *Call) error {
	_, err := e.Client().Delete(ctx, ngclient.Request{CallID: c.CallID, FromTag: c.FromTag})
	return err
}

// QueryCall returns the call's statistics.
func (e *Engine) QueryCall(ctx context.Context, c *Call) (*ngclient.CallStats, error) {
	return e.Client().Query(ctx, ngclient.Request{CallID: c.CallID, FromTag: c.FromTag})
}

// checkSDP returns the audio stream's RTP address of a rewritten SDP after
// checking that it is relay and a port of the engine's range.
func (e *Engine) checkSDP(body string, relay netip.Addr) (netip.AddrPort, error) {
	d, err := sdp.Parse([]byte(body))
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(d.Streams) != 1 {
		return netip.AddrPort{}, fmt.Errorf("%d streams in rewritten SDP, want 1: %q", len(d.Streams), body)
	}
	ap := d.Streams[0].RTP()
	if ap.Addr() != relay {
		return ap, fmt.Errorf("rewritten SDP carries %s, want the relay's %s: %q", ap, relay, body)
	}
	if p := int(ap.Port()); p < e.opts.PortMin || p > e.opts.PortMax {
		return ap, fmt.Errorf("rewritten SDP carries port %d outside %d-%d", p, e.opts.PortMin, e.opts.PortMax)
	}
	return ap, nil
}

// AudioSDP returns a minimal SDP offering one audio stream at media with
// the given static payload types (PCMU if none). version numbers the o=
// line's session.
func AudioSDP(media netip.AddrPort, version int, payloadTypes ...uint8) string {
	if len(payloadTypes) == 0 {
		payloadTypes = []uint8{0}
	}
	family := "IP4"
	if media.Addr().Is6() {
		family = "IP6"
	}
	pts := make([]string, len(payloadTypes))
	for i, pt := range payloadTypes {
		pts[i] = strconv.Itoa(int(pt))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "v=0\r\no=- %d %d IN %s %s\r\ns=-\r\nc=IN %s %s\r\nt=0 0\r\n", version, version, family, media.Addr(), family, media.Addr())
	fmt.Fprintf(&b, "m=audio %d RTP/AVP %s\r\n", media.Port(), strings.Join(pts, " "))
	return b.String()
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
