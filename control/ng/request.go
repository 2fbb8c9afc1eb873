package ng

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/relayd/relayd/control/ng/bencode"
)

// Commands relayd answers. Any other command gets "Unrecognized command",
// except the other commands of rtpengine 10.5, which get "Unsupported
// command" (see docs/ng.md).
const (
	CmdPing       = "ping"
	CmdOffer      = "offer"
	CmdAnswer     = "answer"
	CmdDelete     = "delete"
	CmdQuery      = "query"
	CmdList       = "list"
	CmdStatistics = "statistics"
)

// rtpengineOnly are the commands of rtpengine 10.5 that relayd does not
// implement.
var rtpengineOnly = []string{
	"start recording", "stop recording", "start forwarding", "stop forwarding",
	"block DTMF", "unblock DTMF", "block media", "unblock media",
	"silence media", "unsilence media", "play media", "stop media", "play DTMF",
	"publish", "subscribe request", "subscribe answer", "unsubscribe",
}

// Request is one ng command, parsed and normalised: keys spelled with
// spaces, hyphens or underscores in any letter case, flags given in the
// "flags" list, as dictionary keys or in "rtpp-flags" all land in the same
// fields. Fields of keys the message did not carry keep their zero value
// (or -1 where 0 is meaningful, as documented). The zero Request is an
// empty command. A Request is not changed by the server once handed to
// the Engine; the Engine must not change it either, so it is safe to read
// from several goroutines.
type Request struct {
	Command   string
	CallID    string
	FromTag   string
	ToTag     string
	ViaBranch string
	// Label is "label" or "from-label"; SetLabel is "set-label" or
	// "to-label".
	Label, SetLabel string
	SDP             string
	// ReceivedFrom is the address the SIP proxy received the message
	// from ("received-from": [family, address]); the family is "IP4" or
	// "IP6" as sent, the address is invalid when it does not parse.
	ReceivedFromFamily string
	ReceivedFrom       netip.Addr
	SIPMessageType     string // "sip-message-type": "SIP request" or "SIP reply"
	// SupportsLoadLimit is set by "supports": ["load limit"]: the client
	// understands result "load limit" (Kamailio sends it always).
	SupportsLoadLimit bool
	// Flags are the canonical names of the simple flags set (see
	// KnownFlags), sorted. Flags that carry a value ("codec-strip-PCMA",
	// "SDES-no-...", "replace-origin") go to their fields instead.
	Flags FlagSet
	// UnknownFlags are flags relayd does not know, as given; like
	// rtpengine it ignores them (and logs them).
	UnknownFlags []string
	// Replace lists canonical "replace" items: origin,
	// session-connection, session-name, sdp-version, username,
	// zero-address.
	Replace []string
	// Direction is the pair of interface names ["internal", "external"].
	Direction []string
	Interface string
	// MediaAddress is "media-address": the address to put in the SDP.
	MediaAddress string
	// AddressFamily is "address-family": "IP4" or "IP6".
	AddressFamily string
	// TransportProtocol is "transport-protocol", such as "RTP/AVP",
	// "RTP/SAVP" or "accept".
	TransportProtocol string
	// ICE is remove, force, default, optional or force-relay; ICELite
	// off, forward, backward or both.
	ICE, ICELite string
	// DTLS is passive, active or off; DTLSReverse passive or active.
	DTLS, DTLSReverse string
	DTLSFingerprint   string
	// SDES are the "SDES" options, such as "off", "no-AES_CM_128_HMAC_SHA1_32",
	// "pad"; OSRTP the "OSRTP" ones ("offer", "accept").
	SDES, OSRTP []string
	// RTCPMux lists offer, require, demux, accept, reject.
	RTCPMux []string
	Codec   Codec
	// PTime and PTimeReverse are in milliseconds, 0 when not given;
	// rtpengine reads them on offer only, relayd hands them on always.
	PTime, PTimeReverse int
	// TOS is 0-255, or -1 when not given.
	TOS int
	// DeleteDelay is in seconds, -1 when not given.
	DeleteDelay int
	// Limit is list's maximum number of calls; the server sets
	// rtpengine's default, 32, when none is given, and refuses a
	// negative one.
	Limit      int
	limitGiven bool
	// RecordCall is "record-call": "yes", "no", "on" or "off".
	RecordCall string
	// FromTags are delete's or block's "from-tags".
	FromTags         []string
	EndpointLearning []string
	MediaEcho        string
	DropTraffic      string // start or stop
	GenerateRTCP     string // on or off
	Metadata         string
	// RTPPFlags is the raw "rtpp-flags" string, already parsed into the
	// fields above.
	RTPPFlags string
	// UnknownKeys are dictionary keys relayd does not know (normalised);
	// like rtpengine it ignores them.
	UnknownKeys []string
	// Problems are keys of a known name but the wrong type, such as a
	// "call-id" that is a list; the key is then ignored, as rtpengine
	// does.
	Problems []string
	// Raw is the whole dictionary as received.
	Raw bencode.Value
}

// Codec holds the "codec" dictionary and the codec-* flags. Each list
// holds codec names (or "all") in the order given.
type Codec struct {
	Strip, Offer, Mask, Transcode, Except, Accept, Consume, Set []string
}

// IsZero reports whether no codec operation was given.
func (c Codec) IsZero() bool {
	return len(c.Strip)+len(c.Offer)+len(c.Mask)+len(c.Transcode)+len(c.Except)+len(c.Accept)+len(c.Consume)+len(c.Set) == 0
}

// FlagSet is a sorted set of canonical flag names. The zero value is the
// empty set.
type FlagSet []string

// Has reports whether name (canonical) is in the set.
func (f FlagSet) Has(name string) bool {
	_, ok := slices.BinarySearch(f, name)
	return ok
}

func (f *FlagSet) add(name string) {
	i, ok := slices.BinarySearch(*f, name)
	if !ok {
		*f = slices.Insert(*f, i, name)
	}
}

func (f *FlagSet) remove(name string) {
	if i, ok := slices.BinarySearch(*f, name); ok {
		*f = slices.Delete(*f, i, i+1)
	}
}

// norm folds a key or flag name: ASCII letters to lower case, spaces and
// underscores to hyphens. It keeps the length, so a prefix of the folded
// form is a prefix of the original of the same length.
func norm(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == ' ' || c == '_' || (c >= 'A' && c <= 'Z') {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		switch {
		case c == ' ' || c == '_':
			b[i] = '-'
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// flagAliases maps the folded spelling of each simple flag rtpengine 10.5
// accepts (and a few later ones) to its canonical name.
var flagAliases = map[string]string{
	"trust-address":          "trust-address",
	"sip-source-address":     "sip-source-address",
	"symmetric":              "symmetric",
	"asymmetric":             "asymmetric",
	"no-redis-update":        "no-redis-update",
	"unidirectional":         "unidirectional",
	"strict-source":          "strict-source",
	"media-handover":         "media-handover",
	"reset":                  "reset",
	"all":                    "all",
	"egress":                 "egress",
	"siprec":                 "siprec",
	"fragment":               "fragment",
	"port-latching":          "port-latching",
	"no-port-latching":       "no-port-latching",
	"generate-mid":           "generate-mid",
	"strip-extmap":           "strip-extmap",
	"record-call":            "record-call",
	"debug":                  "debug",
	"debugging":              "debug",
	"no-rtcp-attribute":      "no-rtcp-attribute",
	"full-rtcp-attribute":    "full-rtcp-attribute",
	"generate-rtcp":          "generate-rtcp",
	"trickle-ice":            "trickle-ice",
	"ice-reject":             "ice-reject",
	"reject-ice":             "ice-reject",
	"loop-protect":           "loop-protect",
	"original-sendrecv":      "original-sendrecv",
	"always-transcode":       "always-transcode",
	"asymmetric-codecs":      "asymmetric-codecs", // obsolete, ignored by rtpengine
	"symmetric-codecs":       "symmetric-codecs",  // obsolete
	"reorder-codecs":         "reorder-codecs",    // obsolete
	"reuse-codecs":           "reuse-codecs",
	"no-codec-renegotiation": "reuse-codecs",
	"single-codec":           "single-codec",
	"allow-transcoding":      "allow-transcoding",
	"inject-dtmf":            "inject-dtmf",
	"detect-dtmf":            "detect-dtmf",
	"pad-crypto":             "pad-crypto",
	"passthrough":            "passthrough",
	"no-passthrough":         "no-passthrough",
	"no-jitter-buffer":       "no-jitter-buffer",
	"pierce-nat":             "pierce-nat",
	"nat-wait":               "nat-wait",
	"rtcp-mirror":            "rtcp-mirror",
	"mirror-rtcp":            "rtcp-mirror",
	"fatal":                  "fatal",
	"directional":            "directional",
	"discard-recording":      "discard-recording",
}

// KnownFlags returns the canonical names of the simple flags, sorted.
func KnownFlags() []string {
	var out FlagSet
	for _, c := range flagAliases {
		out.add(c)
	}
	return out
}

// A prefixed flag carries a value after its prefix: "codec-strip-PCMA".
type flagPrefix struct {
	prefix string // folded
	apply  func(r *Request, value string)
}

// flagPrefixes are tried in order; longer prefixes first where one is a
// prefix of another ("SDES-no-" before "SDES-").
var flagPrefixes = []flagPrefix{
	{"from-tags-", func(r *Request, v string) { r.FromTags = append(r.FromTags, unescape(v)) }},
	{"sdes-no-", func(r *Request, v string) { r.SDES = append(r.SDES, "no-"+unescape(v)) }},
	{"sdes-", func(r *Request, v string) { r.SDES = append(r.SDES, unescape(v)) }},
	{"osrtp-", func(r *Request, v string) { r.OSRTP = append(r.OSRTP, v) }},
	{"codec-strip-", func(r *Request, v string) { r.Codec.Strip = append(r.Codec.Strip, unescape(v)) }},
	{"codec-offer-", func(r *Request, v string) { r.Codec.Offer = append(r.Codec.Offer, unescape(v)) }},
	{"codec-except-", func(r *Request, v string) { r.Codec.Except = append(r.Codec.Except, unescape(v)) }},
	{"endpoint-learning-", func(r *Request, v string) { r.EndpointLearning = append(r.EndpointLearning, v) }},
	{"codec-transcode-", func(r *Request, v string) { r.Codec.Transcode = append(r.Codec.Transcode, unescape(v)) }},
	{"transcode-", func(r *Request, v string) { r.Codec.Transcode = append(r.Codec.Transcode, unescape(v)) }},
	{"codec-mask-", func(r *Request, v string) { r.Codec.Mask = append(r.Codec.Mask, unescape(v)) }},
	{"codec-set-", func(r *Request, v string) { r.Codec.Set = append(r.Codec.Set, unescape(v)) }},
	{"codec-accept-", func(r *Request, v string) { r.Codec.Accept = append(r.Codec.Accept, unescape(v)) }},
	{"codec-consume-", func(r *Request, v string) { r.Codec.Consume = append(r.Codec.Consume, unescape(v)) }},
	// Kamailio's and the rtpp-flags spellings of list items.
	{"replace-", func(r *Request, v string) { r.addReplace(v) }},
	{"rtcp-mux-", func(r *Request, v string) { r.addRTCPMux(v) }},
}

// unescape turns rtpengine's "--" escape into "=" ("codec-strip-opus--x"
// means opus=x).
func unescape(s string) string { return strings.ReplaceAll(s, "--", "=") }

// addFlag applies one item of "flags" (or a flag of rtpp-flags).
func (r *Request) addFlag(s string) {
	n := norm(s)
	if c, ok := flagAliases[n]; ok {
		switch c {
		case "sip-source-address":
			r.Flags.remove("trust-address")
		case "trust-address":
			r.Flags.remove("sip-source-address")
		case "always-transcode":
			r.Codec.Accept = append(r.Codec.Accept, "all")
		}
		r.Flags.add(c)
		return
	}
	for _, p := range flagPrefixes {
		if strings.HasPrefix(n, p.prefix) && len(n) > len(p.prefix) {
			p.apply(r, s[len(p.prefix):])
			return
		}
	}
	r.UnknownFlags = append(r.UnknownFlags, s)
}

var replaceAliases = map[string]string{
	"origin":             "origin",
	"session-connection": "session-connection",
	"session-name":       "session-name",
	"sdp-version":        "sdp-version",
	"username":           "username",
	"zero-address":       "zero-address",
}

func (r *Request) addReplace(s string) {
	c, ok := replaceAliases[norm(s)]
	if !ok {
		r.UnknownFlags = append(r.UnknownFlags, "replace-"+s)
		return
	}
	if !slices.Contains(r.Replace, c) {
		r.Replace = append(r.Replace, c)
	}
}

func (r *Request) addRTCPMux(s string) {
	switch c := norm(s); c {
	case "offer", "require", "demux", "accept", "reject":
		if !slices.Contains(r.RTCPMux, c) {
			r.RTCPMux = append(r.RTCPMux, c)
		}
	default:
		r.UnknownFlags = append(r.UnknownFlags, "rtcp-mux-"+s)
	}
}

// ParseRequest turns a decoded ng dictionary into a Request. It fails
// only when dict is not a dictionary or has no string "command" (with
// rtpengine's wording, see ErrNoCommand); everything else that is wrong
// is recorded in the Request (UnknownKeys, UnknownFlags, Problems) and
// left to the Engine, as rtpengine does.
func ParseRequest(dict bencode.Value) (*Request, error) {
	if dict.Kind() != bencode.KindDict {
		return nil, ErrNotDict
	}
	r := &Request{TOS: -1, DeleteDelay: -1, Raw: dict}
	for k, v := range dict.Entries() {
		r.applyKey(k, v)
	}
	if r.Command == "" {
		return nil, ErrNoCommand
	}
	return r, nil
}

func (r *Request) problem(key, want string, v bencode.Value) {
	r.Problems = append(r.Problems, key+": "+v.Kind().String()+", not "+want)
}

// str returns v as a string, or records a problem.
func (r *Request) str(key string, v bencode.Value) (string, bool) {
	s, ok := v.AsString()
	if !ok {
		r.problem(key, "a string", v)
	}
	return s, ok
}

// strList calls f for each string of the list v, recording a problem for
// anything else.
func (r *Request) strList(key string, v bencode.Value, f func(string)) {
	l, ok := v.AsList()
	if !ok {
		r.problem(key, "a list", v)
		return
	}
	for _, e := range l {
		if s, ok := e.AsString(); ok {
			f(s)
		} else {
			r.problem(key, "a list of strings", v)
		}
	}
}

// integer reads an integer given as a bencode integer or a decimal string
// (rtpengine's bencode_get_integer_str).
func (r *Request) integer(key string, v bencode.Value) (int, bool) {
	if n, ok := v.AsInt(); ok {
		if n < -1<<31 || n > 1<<31-1 {
			r.problem(key, "an integer in range", v)
			return 0, false
		}
		return int(n), true
	}
	if s, ok := v.AsString(); ok {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err == nil && n >= -1<<31 && n <= 1<<31-1 {
			return n, true
		}
	}
	r.problem(key, "an integer", v)
	return 0, false
}

// truthy reports whether a flag given as a dictionary key is on.
func truthy(v bencode.Value) bool {
	if n, ok := v.AsInt(); ok {
		return n != 0
	}
	if s, ok := v.AsString(); ok {
		switch norm(s) {
		case "", "yes", "true", "on", "1", "enable", "enabled":
			return true
		}
	}
	return false
}

func (r *Request) setStr(dst *string, key string, v bencode.Value) {
	if s, ok := r.str(key, v); ok {
		*dst = s
	}
}

// applyKey applies one dictionary entry.
func (r *Request) applyKey(key string, v bencode.Value) {
	switch k := norm(key); k {
	case "command":
		// A command that is not a string is no command (rtpengine:
		// "Dictionary contains no key \"command\"").
		if s, ok := v.AsString(); ok {
			r.Command = s
		}
	case "call-id":
		r.setStr(&r.CallID, k, v)
	case "from-tag":
		r.setStr(&r.FromTag, k, v)
	case "to-tag":
		r.setStr(&r.ToTag, k, v)
	case "via-branch":
		r.setStr(&r.ViaBranch, k, v)
	case "label", "from-label":
		r.setStr(&r.Label, k, v)
	case "set-label", "to-label":
		r.setStr(&r.SetLabel, k, v)
	case "sdp":
		r.setStr(&r.SDP, k, v)
	case "interface":
		r.setStr(&r.Interface, k, v)
	case "sip-message-type":
		r.setStr(&r.SIPMessageType, k, v)
	case "flags":
		r.strList(k, v, r.addFlag)
	case "replace":
		r.strList(k, v, r.addReplace)
	case "supports":
		r.strList(k, v, func(s string) {
			if s == "load limit" {
				r.SupportsLoadLimit = true
			}
		})
	case "from-tags":
		r.strList(k, v, func(s string) { r.FromTags = append(r.FromTags, s) })
	case "rtcp-mux":
		r.strList(k, v, r.addRTCPMux)
	case "sdes":
		r.strList(k, v, func(s string) { r.SDES = append(r.SDES, s) })
	case "osrtp":
		r.strList(k, v, func(s string) { r.OSRTP = append(r.OSRTP, s) })
	case "endpoint-learning":
		r.strList(k, v, func(s string) { r.EndpointLearning = append(r.EndpointLearning, s) })
	case "direction":
		r.Direction = r.Direction[:0]
		r.strList(k, v, func(s string) {
			if len(r.Direction) < 2 {
				r.Direction = append(r.Direction, s)
			}
		})
	case "received-from":
		l, ok := v.AsList()
		if !ok || len(l) < 2 {
			r.problem(k, "a list of family and address", v)
			return
		}
		fam, ok1 := l[0].AsString()
		addr, ok2 := l[1].AsString()
		if !ok1 || !ok2 {
			r.problem(k, "a list of strings", v)
			return
		}
		r.ReceivedFromFamily = fam
		r.ReceivedFrom, _ = netip.ParseAddr(addr)
	case "ice":
		if s, ok := r.str(k, v); ok {
			switch n := norm(s); n {
			case "remove", "force", "default", "optional", "force-relay":
				r.ICE = n
			default:
				r.UnknownFlags = append(r.UnknownFlags, "ICE="+s)
			}
		}
	case "ice-lite":
		if s, ok := r.str(k, v); ok {
			switch n := norm(s); n {
			case "off", "none", "no":
				r.ICELite = "off"
			case "forward", "offer", "fwd", "fw":
				r.ICELite = "forward"
			case "backward", "backwards", "reverse", "answer", "back", "bkw", "bk":
				r.ICELite = "backward"
			case "both":
				r.ICELite = "both"
			default:
				r.UnknownFlags = append(r.UnknownFlags, "ICE-lite="+s)
			}
		}
	case "dtls":
		if s, ok := r.str(k, v); ok {
			switch n := norm(s); n {
			case "passive", "active":
				r.DTLS = n
			case "no", "off", "disabled", "disable":
				r.DTLS = "off"
			default:
				r.UnknownFlags = append(r.UnknownFlags, "DTLS="+s)
			}
		}
	case "dtls-reverse":
		if s, ok := r.str(k, v); ok {
			switch n := norm(s); n {
			case "passive", "active":
				r.DTLSReverse = n
			default:
				r.UnknownFlags = append(r.UnknownFlags, "DTLS-reverse="+s)
			}
		}
	case "dtls-fingerprint":
		r.setStr(&r.DTLSFingerprint, k, v)
	case "passthrough", "passthru":
		if s, ok := r.str(k, v); ok {
			switch norm(s) {
			case "on", "yes", "enable", "enabled":
				r.Flags.add("passthrough")
			case "no", "off", "disable", "disabled":
				r.Flags.add("no-passthrough")
			default:
				r.UnknownFlags = append(r.UnknownFlags, "passthrough="+s)
			}
		}
	case "transport-protocol":
		r.setStr(&r.TransportProtocol, k, v)
	case "media-address":
		r.setStr(&r.MediaAddress, k, v)
	case "record-call":
		r.setStr(&r.RecordCall, k, v)
	case "address-family":
		r.setStr(&r.AddressFamily, k, v)
	case "metadata":
		r.setStr(&r.Metadata, k, v)
	case "tos":
		if n, ok := r.integer(k, v); ok && n >= 0 && n <= 255 {
			r.TOS = n
		}
	case "ptime":
		if n, ok := r.integer(k, v); ok && n > 0 {
			r.PTime = n
		}
	case "ptime-reverse", "reverse-ptime":
		if n, ok := r.integer(k, v); ok && n > 0 {
			r.PTimeReverse = n
		}
	case "delete-delay":
		if n, ok := r.integer(k, v); ok && n >= 0 {
			r.DeleteDelay = n
		}
	case "limit":
		if n, ok := r.integer(k, v); ok {
			r.Limit, r.limitGiven = n, true
		}
	case "codec":
		if v.Kind() != bencode.KindDict {
			r.problem(k, "a dictionary", v)
			return
		}
		for op, list := range v.Entries() {
			var dst *[]string
			switch norm(op) {
			case "strip":
				dst = &r.Codec.Strip
			case "offer":
				dst = &r.Codec.Offer
			case "mask":
				dst = &r.Codec.Mask
			case "transcode":
				dst = &r.Codec.Transcode
			case "except":
				dst = &r.Codec.Except
			case "accept":
				dst = &r.Codec.Accept
			case "consume":
				dst = &r.Codec.Consume
			case "set":
				dst = &r.Codec.Set
			default:
				r.UnknownKeys = append(r.UnknownKeys, "codec/"+op)
				continue
			}
			r.strList("codec/"+op, list, func(s string) { *dst = append(*dst, unescape(s)) })
		}
	case "media-echo":
		r.setStr(&r.MediaEcho, k, v)
	case "drop-traffic":
		r.setStr(&r.DropTraffic, k, v)
	case "generate-rtcp":
		r.setStr(&r.GenerateRTCP, k, v)
	case "rtpp-flags":
		if s, ok := r.str(k, v); ok {
			r.RTPPFlags = s
			r.parseRTPPFlags(s)
		}
	default:
		// A simple flag given as a key: rtpengine ignores these
		// ("Unknown dictionary key"); relayd takes them when the
		// value is true-ish.
		if c, ok := flagAliases[k]; ok {
			if truthy(v) {
				r.addFlag(c)
			}
			return
		}
		r.UnknownKeys = append(r.UnknownKeys, k)
	}
}

// transportWords are the rtpp-flags words that build the transport
// protocol, as Kamailio's flags do: bits 0 SRTP, 1 AVPF, 2 DTLS.
var transportProtocols = [...]string{
	0: "RTP/AVP", 1: "RTP/SAVP", 2: "RTP/AVPF", 3: "RTP/SAVPF",
	4: "UDP/TLS/RTP/SAVP", 5: "UDP/TLS/RTP/SAVP", 6: "UDP/TLS/RTP/SAVPF", 7: "UDP/TLS/RTP/SAVPF",
}

// parseRTPPFlags parses the space-separated "rtpp-flags" string the way
// rtpengine's rtpp_flags parser does, for its common subset: bare words
// are flags (or transport words: RTP, AVP, SRTP, AVPF, DTLS and whole
// protocol names; internal and external give the direction); key=value
// pairs are dictionary keys with a string value ("ICE=remove",
// "transport-protocol=RTP/AVP", "from-tag=x", "to-tag=y",
// "direction=internal"); "codec-strip=PCMA" style codec operations and
// "replace-origin" style list items are flags with a prefix. Lists in
// brackets are not supported: such a word is reported as unknown.
func (r *Request) parseRTPPFlags(s string) {
	transport, haveTransport := 0, false
	var dir []string
	for _, word := range strings.Fields(s) {
		key, val, hasVal := strings.Cut(word, "=")
		if strings.ContainsAny(word, "[]") {
			r.UnknownFlags = append(r.UnknownFlags, word)
			continue
		}
		if !hasVal {
			switch key {
			case "RTP":
				transport &^= 1
				haveTransport = true
				continue
			case "AVP":
				transport &^= 2
				haveTransport = true
				continue
			case "SRTP":
				transport |= 1
				haveTransport = true
				continue
			case "AVPF":
				transport |= 2
				haveTransport = true
				continue
			case "DTLS":
				transport |= 4
				haveTransport = true
				continue
			case "internal", "external":
				dir = append(dir, key)
				continue
			}
			if i := slices.Index(transportProtocols[:], key); i >= 0 {
				transport, haveTransport = i, true
				continue
			}
			r.addFlag(key)
			continue
		}
		n := norm(key)
		switch n {
		case "codec-strip", "codec-offer", "codec-mask", "codec-transcode", "transcode",
			"codec-except", "codec-accept", "codec-consume", "codec-set", "sdes", "osrtp",
			"replace", "rtcp-mux", "from-tags", "endpoint-learning":
			r.addFlag(n + "-" + val)
		case "direction":
			dir = append(dir, val)
		case "flags":
			r.addFlag(val)
		default:
			if _, ok := flagAliases[n]; ok {
				if truthy(bencode.String(val)) {
					r.addFlag(n)
				}
				continue
			}
			r.applyKey(key, bencode.String(val))
		}
	}
	if haveTransport {
		r.TransportProtocol = transportProtocols[transport]
	}
	if len(dir) > 0 {
		r.Direction = dir[:min(len(dir), 2)]
	}
}

// isRtpengineCommand reports whether c is a command of rtpengine 10.5
// that relayd does not implement.
func isRtpengineCommand(c string) bool { return slices.Contains(rtpengineOnly, c) }
