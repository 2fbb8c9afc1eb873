// Package sdp reads and rewrites the SDP bodies relayd anchors: it learns
// each media stream's address, ports, rtcp-mux, direction, codecs and SDES
// keys from a peer's offer or answer, and renders the SDP relayd sends to
// the other peer with the relay's address and ports, ICE attributes
// removed, codecs filtered and a=crypto set per a Plan. What goes in the
// Plan (the SRTP policy, rtcp-mux, codecs) is decided by the call layer
// (control/call's Session), not here.
//
// It is built on github.com/pion/sdp/v3. Parse never panics on any input;
// what it cannot use is an error wrapping ErrMalformed (SIP 400) or
// ErrNotAcceptable (SIP 488).
package sdp

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	psdp "github.com/pion/sdp/v3"

	"github.com/relayd/relayd/sdes"
)

// Errors callers branch on.
var (
	// ErrMalformed: the body is not SDP relayd can parse (SIP 400).
	ErrMalformed = errors.New("malformed SDP")
	// ErrNotAcceptable: the SDP parses but offers nothing relayd can
	// relay: no usable stream, no allowed codec (SIP 488).
	ErrNotAcceptable = errors.New("SDP not acceptable")
)

// NotAcceptableError is an SDP relayd parses but cannot honour, with why
// in a few words for the peer (a SIP Warning, an ng error-reason). It
// wraps ErrNotAcceptable.
type NotAcceptableError struct {
	Reason string
}

func (e *NotAcceptableError) Error() string { return ErrNotAcceptable.Error() + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrNotAcceptable) hold.
func (e *NotAcceptableError) Unwrap() error { return ErrNotAcceptable }

// NotAcceptable returns a *NotAcceptableError with the formatted reason.
// The arguments should be what relayd decided or short tokens of the SDP
// (a transport, an address), never whole lines of it.
func NotAcceptable(format string, args ...any) error {
	return &NotAcceptableError{Reason: fmt.Sprintf(format, args...)}
}

// Reason returns the reason of the first *NotAcceptableError in err's
// chain, or "" if there is none.
func Reason(err error) string {
	var na *NotAcceptableError
	if errors.As(err, &na) {
		return na.Reason
	}
	return ""
}

// MaxSize is the largest SDP body Parse accepts.
const MaxSize = 32 << 10

// MaxStreams is the largest number of m= lines Parse accepts.
const MaxStreams = 16

// Codec is one payload format of a stream.
type Codec struct {
	PT        uint8
	Name      string // encoding name as in a=rtpmap, or the static name
	ClockRate uint32
	// Fmtp is the format's a=fmtp parameters ("annexb=no", "0-16"); empty
	// when it has none.
	Fmtp string
}

// Stream is what relayd learns from one m= line.
type Stream struct {
	Index     int        // position of the m= line
	Media     string     // audio, video, ...
	Proto     string     // RTP/AVP, RTP/SAVP, ...
	Port      int        // m= port; 0 means the stream is disabled
	Addr      netip.Addr // connection address (media level, else session level); unspecified for old-style hold
	RTCPPort  int        // from a=rtcp, else Port+1 (used when rtcp-mux is not agreed)
	RTCPAddr  netip.Addr // from a=rtcp, else Addr
	RTCPMux   bool       // a=rtcp-mux present
	Direction string     // sendrecv, sendonly, recvonly or inactive
	Codecs    []Codec    // in m= order
	// Ptime and MaxPtime are a=ptime and a=maxptime in ms; 0 when absent.
	Ptime, MaxPtime int
	// Crypto lists the a=crypto attributes with a supported suite and
	// session parameters, in order. Others are skipped.
	Crypto []*sdes.Crypto
}

// Enabled reports whether the stream carries media relayd relays: a
// non-zero port on an RTP profile.
func (s *Stream) Enabled() bool { return s.Port != 0 && isRTPProto(s.Proto) }

// RTP returns the peer's RTP address and port; invalid if unknown.
func (s *Stream) RTP() netip.AddrPort {
	if !s.Addr.IsValid() || s.Addr.IsUnspecified() || s.Port == 0 {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(s.Addr, uint16(s.Port))
}

// RTCP returns the peer's RTCP address and port without rtcp-mux (with
// it, RTCP goes to the RTP address); invalid if unknown.
func (s *Stream) RTCP() netip.AddrPort {
	if !s.RTCPAddr.IsValid() || s.RTCPAddr.IsUnspecified() || s.RTCPPort == 0 {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(s.RTCPAddr, uint16(s.RTCPPort))
}

// ClockRate returns the clock rate of the first codec that is not
// telephone-event or comfort noise, 8000 if none.
func (s *Stream) ClockRate() uint32 {
	for _, c := range s.Codecs {
		switch strings.ToLower(c.Name) {
		case "telephone-event", "cn":
			continue
		}
		if c.ClockRate != 0 {
			return c.ClockRate
		}
	}
	return 8000
}

// SRTP reports whether the stream's profile is secure (RTP/SAVP, RTP/SAVPF).
func (s *Stream) SRTP() bool { return strings.Contains(s.Proto, "SAVP") }

// CodecNames returns the codec names, for logs and CDRs.
func (s *Stream) CodecNames() []string {
	out := make([]string, 0, len(s.Codecs))
	for _, c := range s.Codecs {
		out = append(out, c.Name)
	}
	return out
}

// Description is a parsed SDP body. It is not safe for concurrent use.
type Description struct {
	sd      *psdp.SessionDescription
	Streams []Stream
}

// Parse parses an SDP body and extracts its streams.
func Parse(body []byte) (*Description, error) {
	if len(body) == 0 {
		return nil, fmt.Errorf("%w: empty body", ErrMalformed)
	}
	if len(body) > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrMalformed, len(body), MaxSize)
	}
	if media := unknownMedia(body); media != "" {
		// pion refuses media types it does not know (T.38's image)
		// as a syntax error; relayd relays none of them either way.
		return nil, NotAcceptable("media %s is not supported", media)
	}
	// pion is strict about line endings; SIP peers send CRLF, some LF.
	sd := &psdp.SessionDescription{}
	if err := unmarshal(sd, body); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if len(sd.MediaDescriptions) > MaxStreams {
		return nil, fmt.Errorf("%w: %d m= lines, more than %d", ErrMalformed, len(sd.MediaDescriptions), MaxStreams)
	}
	d := &Description{sd: sd}
	if err := d.extract(); err != nil {
		return nil, err
	}
	return d, nil
}

// unknownMedia returns the media type of the first m= line whose type is
// none pion parses (audio, video, text, application, message), or "".
func unknownMedia(body []byte) string {
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		rest, ok := bytes.CutPrefix(line, []byte("m="))
		if !ok {
			continue
		}
		media, _, _ := bytes.Cut(rest, []byte(" "))
		switch string(media) {
		case "audio", "video", "text", "application", "message":
			continue
		}
		if len(media) == 0 || len(media) > 16 || bytes.ContainsFunc(media, func(r rune) bool { return r <= ' ' || r > '~' || r == '"' || r == '\\' }) {
			return "" // not a token: the parser says what is wrong
		}
		return string(media)
	}
	return ""
}

func unmarshal(sd *psdp.SessionDescription, body []byte) (err error) {
	defer func() {
		// pion/sdp has had index panics on hostile input; never let one
		// take the daemon down.
		if v := recover(); v != nil {
			err = fmt.Errorf("parser panic: %v", v)
		}
	}()
	return sd.Unmarshal(body)
}

func (d *Description) extract() error {
	var sessAddr netip.Addr
	if c := d.sd.ConnectionInformation; c != nil {
		a, err := connAddr(c)
		if err != nil {
			return err
		}
		sessAddr = a
	}
	sessDir := direction(d.sd.Attributes, "sendrecv")
	d.Streams = make([]Stream, 0, len(d.sd.MediaDescriptions))
	for i, md := range d.sd.MediaDescriptions {
		st := Stream{
			Index:     i,
			Media:     md.MediaName.Media,
			Proto:     strings.Join(md.MediaName.Protos, "/"),
			Port:      md.MediaName.Port.Value,
			Addr:      sessAddr,
			Direction: direction(md.Attributes, sessDir),
		}
		if st.Port < 0 || st.Port > 65535 {
			return fmt.Errorf("%w: m=%s port %d", ErrMalformed, st.Media, st.Port)
		}
		if md.ConnectionInformation != nil {
			a, err := connAddr(md.ConnectionInformation)
			if err != nil {
				return err
			}
			st.Addr = a
		}
		if st.Port != 0 && !st.Addr.IsValid() {
			return fmt.Errorf("%w: m=%s has no connection address", ErrMalformed, st.Media)
		}
		st.RTCPAddr, st.RTCPPort = st.Addr, st.Port+1
		if st.Port == 0 {
			st.RTCPPort = 0
		}
		rtpmap := make(map[string]Codec)
		fmtp := make(map[string]string)
		for _, a := range md.Attributes {
			switch a.Key {
			case "rtcp-mux":
				st.RTCPMux = true
			case "rtcp":
				port, addr, err := parseRTCP(a.Value)
				if err != nil {
					return err
				}
				st.RTCPPort = port
				if addr.IsValid() {
					st.RTCPAddr = addr
				}
			case "rtpmap":
				pt, c, ok := parseRTPMap(a.Value)
				if ok {
					rtpmap[pt] = c
				}
			case "fmtp":
				if pt, params, ok := strings.Cut(strings.TrimSpace(a.Value), " "); ok {
					fmtp[pt] = strings.TrimSpace(params)
				}
			case "ptime", "maxptime":
				// Fractions (a=ptime:20.0) are read as their whole part.
				whole, _, _ := strings.Cut(strings.TrimSpace(a.Value), ".")
				if n, err := strconv.ParseUint(whole, 10, 16); err == nil {
					if a.Key == "ptime" {
						st.Ptime = int(n)
					} else {
						st.MaxPtime = int(n)
					}
				}
			case "crypto":
				c, err := sdes.Parse(a.Value)
				if err != nil || c.Supported() != nil {
					continue // an unknown suite or parameter is skipped (RFC 4568 6.1)
				}
				st.Crypto = append(st.Crypto, c)
			}
		}
		for _, f := range md.MediaName.Formats {
			if c, ok := rtpmap[f]; ok {
				c.Fmtp = fmtp[f]
				st.Codecs = append(st.Codecs, c)
				continue
			}
			n, err := strconv.ParseUint(f, 10, 8)
			if err != nil || n > 127 {
				if isRTPProto(st.Proto) {
					return fmt.Errorf("%w: m=%s format %q is not a payload type", ErrMalformed, st.Media, trunc(f))
				}
				continue
			}
			c := staticCodec(uint8(n))
			c.Fmtp = fmtp[f]
			st.Codecs = append(st.Codecs, c)
		}
		d.Streams = append(d.Streams, st)
	}
	return nil
}

// Usable reports a *NotAcceptableError unless at least one stream is
// enabled; it names the transport of a stream relayd does not relay
// (DTLS-SRTP's UDP/TLS/RTP/SAVP, T.38's udptl) when there is one.
func (d *Description) Usable() error {
	for i := range d.Streams {
		if d.Streams[i].Enabled() {
			return nil
		}
	}
	for i := range d.Streams {
		if st := &d.Streams[i]; st.Port != 0 && !isRTPProto(st.Proto) {
			return NotAcceptable("transport %s is not supported", trunc(st.Proto))
		}
	}
	return NotAcceptable("no media stream")
}

func connAddr(c *psdp.ConnectionInformation) (netip.Addr, error) {
	if c.NetworkType != "IN" || c.Address == nil {
		return netip.Addr{}, fmt.Errorf("%w: c=%s: want IN IP4/IP6 address", ErrMalformed, trunc(c.String()))
	}
	host, _, _ := strings.Cut(c.Address.Address, "/") // multicast TTL/count
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: c= address %q is not an IP address (host names are not resolved)", ErrMalformed, trunc(c.Address.Address))
	}
	a = a.Unmap()
	switch {
	case c.AddressType == "IP4" && !a.Is4(), c.AddressType == "IP6" && !a.Is6():
		return netip.Addr{}, fmt.Errorf("%w: c= address %s does not match %s", ErrMalformed, a, c.AddressType)
	case c.AddressType != "IP4" && c.AddressType != "IP6":
		return netip.Addr{}, fmt.Errorf("%w: c= address type %q", ErrMalformed, trunc(c.AddressType))
	case a.IsMulticast():
		return netip.Addr{}, NotAcceptable("multicast c= address %s", a)
	case a.Zone() != "":
		return netip.Addr{}, fmt.Errorf("%w: zoned c= address", ErrMalformed)
	}
	return a, nil
}

// parseRTCP parses "port [IN IP4 addr]" (RFC 3605).
func parseRTCP(v string) (int, netip.Addr, error) {
	f := strings.Fields(v)
	if len(f) == 0 {
		return 0, netip.Addr{}, fmt.Errorf("%w: empty a=rtcp", ErrMalformed)
	}
	port, err := strconv.ParseUint(f[0], 10, 16)
	if err != nil || port == 0 {
		return 0, netip.Addr{}, fmt.Errorf("%w: a=rtcp port %q", ErrMalformed, trunc(f[0]))
	}
	if len(f) >= 4 && f[0] != "" {
		a, err := netip.ParseAddr(f[3])
		if err == nil && a.Zone() == "" && !a.IsMulticast() {
			return int(port), a.Unmap(), nil
		}
	}
	return int(port), netip.Addr{}, nil
}

// parseRTPMap parses "PT name/rate[/channels]".
func parseRTPMap(v string) (string, Codec, bool) {
	pt, rest, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok {
		return "", Codec{}, false
	}
	n, err := strconv.ParseUint(pt, 10, 8)
	if err != nil || n > 127 {
		return "", Codec{}, false
	}
	parts := strings.Split(strings.TrimSpace(rest), "/")
	c := Codec{PT: uint8(n), Name: parts[0]}
	if len(parts) > 1 {
		if r, err := strconv.ParseUint(parts[1], 10, 32); err == nil {
			c.ClockRate = uint32(r)
		}
	}
	if c.Name == "" {
		return "", Codec{}, false
	}
	return pt, c, true
}

// staticCodec returns the RFC 3551 static payload type's codec.
func staticCodec(pt uint8) Codec {
	switch pt {
	case 0:
		return Codec{PT: 0, Name: "PCMU", ClockRate: 8000}
	case 3:
		return Codec{PT: 3, Name: "GSM", ClockRate: 8000}
	case 4:
		return Codec{PT: 4, Name: "G723", ClockRate: 8000}
	case 8:
		return Codec{PT: 8, Name: "PCMA", ClockRate: 8000}
	case 9:
		return Codec{PT: 9, Name: "G722", ClockRate: 8000}
	case 13:
		return Codec{PT: 13, Name: "CN", ClockRate: 8000}
	case 18:
		return Codec{PT: 18, Name: "G729", ClockRate: 8000}
	}
	return Codec{PT: pt, Name: strconv.Itoa(int(pt))}
}

func direction(attrs []psdp.Attribute, def string) string {
	for _, a := range attrs {
		switch a.Key {
		case "sendrecv", "sendonly", "recvonly", "inactive":
			return a.Key
		}
	}
	return def
}

func isRTPProto(p string) bool {
	switch p {
	case "RTP/AVP", "RTP/SAVP", "RTP/AVPF", "RTP/SAVPF":
		return true
	}
	return false
}

// FilterCodecs keeps only the codecs named in allowed (case-insensitive)
// in every stream; an empty list keeps all. A stream left without codecs
// is disabled (port 0). If no stream stays enabled, it returns an error
// wrapping ErrNotAcceptable.
func (d *Description) FilterCodecs(allowed []string) error {
	if len(allowed) == 0 {
		return d.Usable()
	}
	return d.FilterCodecsFunc(func(_ int, c Codec) bool {
		return slices.ContainsFunc(allowed, func(a string) bool { return strings.EqualFold(a, c.Name) })
	})
}

// FilterCodecsFunc keeps the codecs of each enabled stream for which keep
// (given the stream's index) reports true, with their a=rtpmap, a=fmtp
// and a=rtcp-fb lines. A stream left without codecs is disabled (port 0).
// If no stream stays enabled, it returns an error wrapping
// ErrNotAcceptable.
func (d *Description) FilterCodecsFunc(keepCodec func(stream int, c Codec) bool) error {
	filtered := false // a stream was disabled for its codecs
	for i := range d.Streams {
		st := &d.Streams[i]
		md := d.sd.MediaDescriptions[i]
		if !st.Enabled() {
			continue
		}
		var keep []Codec
		drop := make(map[string]bool)
		for _, c := range st.Codecs {
			if keepCodec(i, c) {
				keep = append(keep, c)
			} else {
				drop[strconv.Itoa(int(c.PT))] = true
			}
		}
		if len(keep) == 0 {
			d.disable(i)
			filtered = true
			continue
		}
		st.Codecs = keep
		md.MediaName.Formats = slices.DeleteFunc(md.MediaName.Formats, func(f string) bool { return drop[f] })
		md.Attributes = slices.DeleteFunc(md.Attributes, func(a psdp.Attribute) bool {
			switch a.Key {
			case "rtpmap", "fmtp", "rtcp-fb":
				pt, _, _ := strings.Cut(a.Value, " ")
				return drop[pt]
			}
			return false
		})
	}
	err := d.Usable()
	if err != nil && filtered {
		return NotAcceptable("no codec left to relay")
	}
	return err
}

// AddCodecs appends codecs to enabled stream i, after the ones it has:
// their payload types on the m= line, an a=rtpmap each (static types
// too) and an a=fmtp for those with parameters, after the stream's last
// a=rtpmap or a=fmtp. The payload types must be free in the stream.
func (d *Description) AddCodecs(i int, cs []Codec) {
	if i < 0 || i >= len(d.Streams) || len(cs) == 0 {
		return
	}
	st, md := &d.Streams[i], d.sd.MediaDescriptions[i]
	at := 0
	for k, a := range md.Attributes {
		if a.Key == "rtpmap" || a.Key == "fmtp" {
			at = k + 1
		}
	}
	add := make([]psdp.Attribute, 0, 2*len(cs))
	// Audio codecs go before the offer's telephone-event and comfort
	// noise, so that an answerer that takes the first codec takes one.
	pos, fpos := len(st.Codecs), len(md.MediaName.Formats)
	for k, c := range st.Codecs {
		if strings.EqualFold(c.Name, "telephone-event") || strings.EqualFold(c.Name, "CN") {
			pos = k
			if f := slices.Index(md.MediaName.Formats, strconv.Itoa(int(c.PT))); f >= 0 {
				fpos = f
			}
			break
		}
	}
	var pts []string
	for _, c := range cs {
		if strings.EqualFold(c.Name, "telephone-event") || strings.EqualFold(c.Name, "CN") {
			st.Codecs = append(st.Codecs, c)
			md.MediaName.Formats = append(md.MediaName.Formats, strconv.Itoa(int(c.PT)))
		} else {
			st.Codecs = slices.Insert(st.Codecs, pos, c)
			pos++
			pts = append(pts, strconv.Itoa(int(c.PT)))
		}
		add = append(add, codecAttrs(c)...)
	}
	md.MediaName.Formats = slices.Insert(md.MediaName.Formats, fpos, pts...)
	md.Attributes = slices.Insert(slices.Clone(md.Attributes), at, add...)
}

// SetCodecs replaces the codecs of stream i with cs (their a=rtpmap,
// a=fmtp and a=rtcp-fb lines go, cs's a=rtpmap and a=fmtp come where
// the first of them was) and its a=ptime and a=maxptime with a=ptime:ptime
// (none when ptime is 0): the answer relayd sends the offerer of a
// transcoded stream.
func (d *Description) SetCodecs(i int, cs []Codec, ptime int) {
	if i < 0 || i >= len(d.Streams) || len(cs) == 0 {
		return
	}
	st, md := &d.Streams[i], d.sd.MediaDescriptions[i]
	at := -1
	attrs := make([]psdp.Attribute, 0, len(md.Attributes)+2*len(cs))
	for _, a := range md.Attributes {
		switch a.Key {
		case "rtpmap", "fmtp", "rtcp-fb", "ptime", "maxptime":
			if at < 0 {
				at = len(attrs)
			}
			continue
		}
		attrs = append(attrs, a)
	}
	if at < 0 {
		at = 0
	}
	add := make([]psdp.Attribute, 0, 2*len(cs)+1)
	st.Codecs = slices.Clone(cs)
	md.MediaName.Formats = md.MediaName.Formats[:0:0]
	for _, c := range cs {
		md.MediaName.Formats = append(md.MediaName.Formats, strconv.Itoa(int(c.PT)))
		add = append(add, codecAttrs(c)...)
	}
	st.Ptime, st.MaxPtime = ptime, 0
	if ptime > 0 {
		add = append(add, psdp.NewAttribute("ptime", strconv.Itoa(ptime)))
	}
	md.Attributes = slices.Insert(attrs, at, add...)
}

func codecAttrs(c Codec) []psdp.Attribute {
	out := []psdp.Attribute{psdp.NewAttribute("rtpmap", fmt.Sprintf("%d %s/%d", c.PT, c.Name, c.ClockRate))}
	if c.Fmtp != "" {
		out = append(out, psdp.NewAttribute("fmtp", fmt.Sprintf("%d %s", c.PT, c.Fmtp)))
	}
	return out
}

// disable sets stream i's port to 0, as a rejected or refused stream.
func (d *Description) disable(i int) {
	d.Streams[i].Port = 0
	d.Streams[i].RTCPPort = 0
	d.sd.MediaDescriptions[i].MediaName.Port = psdp.RangedPort{Value: 0}
}

// Disable marks stream i disabled (port 0) in the description.
func (d *Description) Disable(i int) {
	if i >= 0 && i < len(d.Streams) {
		d.disable(i)
	}
}

// Clone returns a deep copy, by marshalling and parsing again.
func (d *Description) Clone() *Description {
	b, err := d.sd.Marshal()
	if err != nil {
		return nil
	}
	c, err := Parse(b)
	if err != nil {
		return nil
	}
	// Keep the filtered view: disabled streams stay disabled.
	return c
}

func trunc(s string) string {
	if len(s) > 48 {
		return s[:48] + "..."
	}
	return s
}

// iceAttrs are removed from session and media level: relayd terminates
// media on plain UDP and does no ICE.
var iceAttrs = map[string]bool{
	"candidate": true, "ice-ufrag": true, "ice-pwd": true, "ice-options": true, "ice-lite": true,
	"ice-mismatch": true, "end-of-candidates": true, "remote-candidates": true, "ice-pacing": true,
}

// StreamPlan is how one stream appears in the SDP relayd sends.
type StreamPlan struct {
	// Port is the relay's RTP port for this stream on this leg (RTCP is
	// Port+1). 0 disables the stream in the output.
	Port int
	// RTCPMux adds a=rtcp-mux.
	RTCPMux bool
	// Proto overrides the transport profile (RTP/AVP, RTP/SAVP); empty
	// keeps the peer's.
	Proto string
	// Crypto, when set, is the only a=crypto line written. Otherwise
	// KeepCrypto keeps the peer's a=crypto lines verbatim (end-to-end
	// SRTP through the relay), else none is written.
	Crypto     *sdes.Crypto
	KeepCrypto bool
	// MoreCrypto are written after Crypto: more suites offered at once,
	// the answer picks one.
	MoreCrypto []*sdes.Crypto
}

// Plan is the SDP relayd sends on one leg.
type Plan struct {
	// Addr is the relay media address for this leg as the SDP advertises
	// it (c=, a=rtcp, o=): the address the peer sends to, which may be a
	// 1:1 NAT's public address rather than the one the flows match on.
	Addr netip.Addr
	// KeepSessionConnection leaves the peer's session-level c= line as it
	// is; every enabled stream then gets a media-level c= with Addr. The
	// zero value replaces the session-level c= with Addr.
	KeepSessionConnection bool
	// OriginAddress, when Rewrite keeps the peer's o= line (a nil
	// Origin), puts Addr in it: rtpengine's "replace origin".
	OriginAddress bool
	// RTPEngineLayout writes a=rtcp as rtpengine does (the port alone
	// when the address is the c= one) and moves a=ptime after the
	// attributes relayd adds, so that a proxy sees the layout it knows.
	RTPEngineLayout bool
	// Streams has one entry per m= line of the description; missing
	// entries disable the stream.
	Streams []StreamPlan
}

// Origin is the o= line relayd owns on one leg (RFC 3264 section 8: the
// session ID stays, the version goes up by one whenever the SDP changes).
// The zero value is ready to use: NewOrigin picks IDs. Not safe for
// concurrent use.
type Origin struct {
	SessionID uint64
	Version   uint64
	last      []byte // last body rendered, with the version it had
}

// Rewrite renders the SDP to send on a leg: the description with the
// relay's address and ports, ICE removed, a=rtcp and a=crypto per plan and
// the leg's o= line. o.Version goes up by one when the body differs from
// the last one rendered for o. A nil o keeps the peer's o= line as it is.
func (d *Description) Rewrite(p Plan, o *Origin) ([]byte, error) {
	if !p.Addr.IsValid() {
		return nil, errors.New("rewrite SDP: no relay address")
	}
	addrType := "IP4"
	if p.Addr.Is6() {
		addrType = "IP6"
	}
	// Work on a shallow copy of the session: attributes and media are
	// rebuilt, the parsed description stays as it was.
	sd := *d.sd
	switch {
	case o != nil:
		sd.Origin = psdp.Origin{
			Username: "relayd", SessionID: o.SessionID, SessionVersion: o.Version,
			NetworkType: "IN", AddressType: addrType, UnicastAddress: p.Addr.String(),
		}
	case p.OriginAddress:
		sd.Origin.NetworkType, sd.Origin.AddressType, sd.Origin.UnicastAddress = "IN", addrType, p.Addr.String()
	}
	relayConn := func() *psdp.ConnectionInformation {
		return &psdp.ConnectionInformation{NetworkType: "IN", AddressType: addrType, Address: &psdp.Address{Address: p.Addr.String()}}
	}
	if !p.KeepSessionConnection || sd.ConnectionInformation == nil {
		sd.ConnectionInformation = relayConn()
	}
	sd.Attributes = slices.DeleteFunc(slices.Clone(d.sd.Attributes), func(a psdp.Attribute) bool {
		return iceAttrs[a.Key] || a.Key == "fingerprint" || a.Key == "setup"
	})
	sd.MediaDescriptions = make([]*psdp.MediaDescription, len(d.sd.MediaDescriptions))
	for i, src := range d.sd.MediaDescriptions {
		md := *src
		md.MediaName.Protos = slices.Clone(src.MediaName.Protos)
		md.MediaName.Formats = slices.Clone(src.MediaName.Formats)
		var sp StreamPlan
		if i < len(p.Streams) {
			sp = p.Streams[i]
		}
		st := &d.Streams[i]
		if sp.Port == 0 || !st.Enabled() {
			md.MediaName.Port = psdp.RangedPort{Value: 0}
			md.ConnectionInformation = nil
			md.Attributes = slices.DeleteFunc(slices.Clone(src.Attributes), func(a psdp.Attribute) bool {
				return iceAttrs[a.Key] || a.Key == "crypto" || a.Key == "rtcp" || a.Key == "rtcp-mux"
			})
			if len(md.MediaName.Formats) == 0 {
				md.MediaName.Formats = []string{"0"}
			}
			sd.MediaDescriptions[i] = &md
			continue
		}
		md.MediaName.Port = psdp.RangedPort{Value: sp.Port}
		if sp.Proto != "" {
			md.MediaName.Protos = strings.Split(sp.Proto, "/")
		}
		hold := st.Addr.IsUnspecified()
		if md.ConnectionInformation != nil || hold || p.KeepSessionConnection {
			md.ConnectionInformation = relayConn()
			if hold {
				// RFC 2543 hold (c=0.0.0.0) stays hold.
				unspec := "0.0.0.0"
				if p.Addr.Is6() {
					unspec = "::"
				}
				md.ConnectionInformation.Address = &psdp.Address{Address: unspec}
			}
		}
		attrs := make([]psdp.Attribute, 0, len(src.Attributes)+2)
		var ptime []psdp.Attribute
		for _, a := range src.Attributes {
			switch {
			case iceAttrs[a.Key], a.Key == "rtcp", a.Key == "rtcp-mux", a.Key == "fingerprint", a.Key == "setup":
				continue
			case a.Key == "crypto" && !(sp.KeepCrypto && sp.Crypto == nil):
				continue
			case a.Key == "ptime" && p.RTPEngineLayout:
				ptime = append(ptime, a)
				continue
			}
			attrs = append(attrs, a)
		}
		if p.RTPEngineLayout && !hold {
			attrs = append(attrs, psdp.NewAttribute("rtcp", strconv.Itoa(sp.Port+1)))
		} else {
			attrs = append(attrs, psdp.NewAttribute("rtcp", fmt.Sprintf("%d IN %s %s", sp.Port+1, addrType, p.Addr)))
		}
		if sp.RTCPMux {
			attrs = append(attrs, psdp.NewPropertyAttribute("rtcp-mux"))
		}
		if sp.Crypto != nil {
			for _, c := range append([]*sdes.Crypto{sp.Crypto}, sp.MoreCrypto...) {
				v, err := c.Marshal()
				if err != nil {
					return nil, fmt.Errorf("rewrite SDP: stream %d crypto: %w", i, err)
				}
				attrs = append(attrs, psdp.NewAttribute("crypto", v))
			}
		}
		md.Attributes = append(attrs, ptime...)
		sd.MediaDescriptions[i] = &md
	}
	out, err := sd.Marshal()
	if err != nil {
		return nil, fmt.Errorf("rewrite SDP: %w", err)
	}
	if o == nil {
		return out, nil
	}
	if o.last != nil && !bytes.Equal(out, o.last) {
		o.Version++
		sd.Origin.SessionVersion = o.Version
		if out, err = sd.Marshal(); err != nil {
			return nil, fmt.Errorf("rewrite SDP: %w", err)
		}
	}
	o.last = out
	return out, nil
}

// ShareLast makes b the origin's record of the last body rendered if
// it holds the same bytes, so that a caller keeping its own copy of that
// body keeps the only one.
func (o *Origin) ShareLast(b []byte) {
	if o.last != nil && bytes.Equal(o.last, b) {
		o.last = b
	}
}

// NewOrigin returns an origin with a random session ID and version.
func NewOrigin() Origin {
	id := rand.Uint64() >> 2 // fits in the 63 bits some parsers expect
	return Origin{SessionID: id, Version: id}
}
