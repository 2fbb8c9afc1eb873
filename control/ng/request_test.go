package ng

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/relayd/relayd/control/ng/bencode"
)

func mustParse(t *testing.T, raw []byte) *Request {
	t.Helper()
	v, err := bencode.Unmarshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRequest(v)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var ignoreRaw = cmpopts.IgnoreFields(Request{}, "Raw", "limitGiven")

func TestParseKamailioOffer(t *testing.T) {
	r := mustParse(t, kamailioOffer("call-1"))
	want := &Request{
		Command:            "offer",
		CallID:             "call-1",
		FromTag:            "ftag1",
		ViaBranch:          "z9hG4bK-1",
		SDP:                testSDP,
		ReceivedFromFamily: "IP4",
		ReceivedFrom:       netip.MustParseAddr("198.18.0.10"),
		SupportsLoadLimit:  true,
		Flags:              FlagSet{"trust-address"},
		Replace:            []string{"origin", "session-connection"},
		TransportProtocol:  "RTP/AVP",
		ICE:                "remove",
		TOS:                -1,
		DeleteDelay:        -1,
	}
	if diff := cmp.Diff(want, r, ignoreRaw, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
}

func TestParseKeySpellings(t *testing.T) {
	for _, key := range []string{"call-id", "call id", "call_id", "Call-ID", "CALL_ID"} {
		for _, ft := range []string{"from-tag", "from tag", "from_tag"} {
			r := mustParse(t, kdict("command", "query", key, "abc", ft, "f1", "to tag", "t1", "via_branch", "b1"))
			if r.CallID != "abc" || r.FromTag != "f1" || r.ToTag != "t1" || r.ViaBranch != "b1" {
				t.Errorf("%q/%q: call-id %q from-tag %q to-tag %q via-branch %q", key, ft, r.CallID, r.FromTag, r.ToTag, r.ViaBranch)
			}
		}
	}
	r := mustParse(t, kdict("command", "offer", "received from", []string{"IP6", "2001:2::1"}, "media address", "198.18.1.1",
		"address family", "IP4", "transport protocol", "RTP/SAVP", "rtcp mux", []string{"demux", "offer", "bogus"}, "DTLS", "off",
		"SDES", []string{"off"}, "TOS", 184, "ptime", "20", "delete_delay", 5, "ICE lite", "fwd", "DTLS-reverse", "passive"))
	if r.ReceivedFrom != netip.MustParseAddr("2001:2::1") || r.ReceivedFromFamily != "IP6" || r.MediaAddress != "198.18.1.1" ||
		r.AddressFamily != "IP4" || r.TransportProtocol != "RTP/SAVP" || r.DTLS != "off" || r.TOS != 184 || r.PTime != 20 ||
		r.DeleteDelay != 5 || r.ICELite != "forward" || r.DTLSReverse != "passive" {
		t.Errorf("spaced keys: %+v", r)
	}
	if diff := cmp.Diff([]string{"demux", "offer"}, r.RTCPMux); diff != "" {
		t.Errorf("rtcp-mux (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"rtcp-mux-bogus"}, r.UnknownFlags); diff != "" {
		t.Errorf("unknown (-want +got):\n%s", diff)
	}
}

// Flags may come in the flags list, as dictionary keys, or in rtpp-flags;
// every spelling folds to the canonical name.
func TestFlagsThreeWays(t *testing.T) {
	want := FlagSet{"asymmetric", "generate-mid", "loop-protect", "no-rtcp-attribute", "port-latching", "record-call", "strict-source", "symmetric", "trust-address"}
	ways := map[string][]byte{
		"list": kdict("command", "offer", "flags", []string{"trust-address", "SYMMETRIC", "asymmetric", "strict_source", "record call",
			"port-latching", "no-RTCP-attribute", "loop-protect", "generate-mid"}),
		"keys": kdict("command", "offer", "trust-address", "yes", "symmetric", 1, "asymmetric", "true", "strict source", "on",
			"port_latching", "", "no-rtcp-attribute", "yes", "loop-protect", 1, "generate-mid", "yes", "record-call-flag-is-not", 1,
			"flags", []string{"record-call"}, "debug", 0),
		"rtpp-flags": kdict("command", "offer", "rtpp-flags", "trust-address symmetric asymmetric strict-source record-call port-latching no-rtcp-attribute loop-protect generate-mid"),
	}
	for name, raw := range ways {
		r := mustParse(t, raw)
		if diff := cmp.Diff(want, r.Flags); diff != "" {
			t.Errorf("%s: flags (-want +got):\n%s", name, diff)
		}
		if r.Flags.Has("debug") {
			t.Errorf("%s: a flag key with value 0 is set", name)
		}
	}
}

func TestFlagAliasesAndPrefixes(t *testing.T) {
	r := mustParse(t, kdict("command", "offer", "flags", []string{
		"reject-ICE", "mirror-RTCP", "debugging", "no-codec-renegotiation", "always-transcode",
		"codec-strip-PCMA", "codec-strip-all", "codec-offer-opus", "codec-mask-G722", "transcode-PCMU", "codec-except-telephone-event",
		"codec-set-opus/48000/2", "codec-accept-PCMA", "codec-consume-G729", "SDES-no-AES_CM_128_HMAC_SHA1_32", "SDES-off",
		"OSRTP-offer", "replace-origin", "replace-session-connection", "from-tags-ab", "codec-strip-opus--useinbandfec--1",
		"SIP-source-address", "frobnicate", "fatal",
	}, "codec", kdict("strip", []string{"G729"}, "transcode", []string{"PCMA"}, "bogus", []string{"x"})))
	wantFlags := FlagSet{"always-transcode", "debug", "fatal", "ice-reject", "reuse-codecs", "rtcp-mirror", "sip-source-address"}
	if diff := cmp.Diff(wantFlags, r.Flags); diff != "" {
		t.Errorf("flags (-want +got):\n%s", diff)
	}
	wantCodec := Codec{
		Strip:     []string{"PCMA", "all", "opus=useinbandfec=1", "G729"},
		Offer:     []string{"opus"},
		Mask:      []string{"G722"},
		Transcode: []string{"PCMU", "PCMA"},
		Except:    []string{"telephone-event"},
		Accept:    []string{"all", "PCMA"},
		Consume:   []string{"G729"},
		Set:       []string{"opus/48000/2"},
	}
	if diff := cmp.Diff(wantCodec, r.Codec); diff != "" {
		t.Errorf("codec (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"no-AES_CM_128_HMAC_SHA1_32", "off"}, r.SDES); diff != "" {
		t.Errorf("SDES (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"origin", "session-connection"}, r.Replace); diff != "" {
		t.Errorf("replace (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"frobnicate"}, r.UnknownFlags); diff != "" {
		t.Errorf("unknown flags (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"codec/bogus"}, r.UnknownKeys); diff != "" {
		t.Errorf("unknown keys (-want +got):\n%s", diff)
	}
	if len(r.OSRTP) != 1 || len(r.FromTags) != 1 || r.FromTags[0] != "ab" {
		t.Errorf("OSRTP %v from-tags %v", r.OSRTP, r.FromTags)
	}
	// sip-source-address undoes trust-address and the other way round.
	r = mustParse(t, kdict("command", "offer", "flags", []string{"trust-address", "SIP-source-address"}))
	if r.Flags.Has("trust-address") {
		t.Errorf("trust-address kept after SIP-source-address: %v", r.Flags)
	}
}

func TestRTPPFlags(t *testing.T) {
	r := mustParse(t, kdict("command", "offer", "call-id", "c", "rtpp-flags",
		"replace-origin replace-session-connection codec-strip=PCMA codec-offer=opus ICE=remove internal external SRTP AVPF "+
			"trust-address to-tag=t9 rtcp-mux-demux TOS=46 label=callee [bad] media-address=198.18.1.1 delete-delay=3 sdes=off"))
	if r.TransportProtocol != "RTP/SAVPF" {
		t.Errorf("transport %q, want RTP/SAVPF", r.TransportProtocol)
	}
	if diff := cmp.Diff([]string{"internal", "external"}, r.Direction); diff != "" {
		t.Errorf("direction (-want +got):\n%s", diff)
	}
	if r.ICE != "remove" || r.ToTag != "t9" || r.TOS != 46 || r.Label != "callee" || r.MediaAddress != "198.18.1.1" || r.DeleteDelay != 3 {
		t.Errorf("key=value: %+v", r)
	}
	if diff := cmp.Diff(Codec{Strip: []string{"PCMA"}, Offer: []string{"opus"}}, r.Codec); diff != "" {
		t.Errorf("codec (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"origin", "session-connection"}, r.Replace); diff != "" {
		t.Errorf("replace (-want +got):\n%s", diff)
	}
	if !r.Flags.Has("trust-address") || len(r.RTCPMux) != 1 || len(r.SDES) != 1 {
		t.Errorf("flags %v rtcp-mux %v sdes %v", r.Flags, r.RTCPMux, r.SDES)
	}
	if diff := cmp.Diff([]string{"[bad]"}, r.UnknownFlags); diff != "" {
		t.Errorf("unknown (-want +got):\n%s", diff)
	}
	for words, want := range map[string]string{
		"RTP/AVP": "RTP/AVP", "UDP/TLS/RTP/SAVPF": "UDP/TLS/RTP/SAVPF", "RTP AVP": "RTP/AVP", "DTLS SRTP AVPF": "UDP/TLS/RTP/SAVPF",
		"SRTP": "RTP/SAVP", "AVPF SRTP RTP": "RTP/AVPF",
	} {
		if r := mustParse(t, kdict("command", "offer", "rtpp_flags", words)); r.TransportProtocol != want {
			t.Errorf("rtpp-flags %q: transport %q, want %q", words, r.TransportProtocol, want)
		}
	}
}

func TestParseWrongTypes(t *testing.T) {
	r := mustParse(t, kdict("command", "delete", "call-id", []string{"x"}, "from-tag", 7, "flags", "fatal", "received-from", "IP4",
		"TOS", "high", "codec", []string{"x"}, "sdp", kdict("a", 1), "direction", []byte("li1ee")))
	if r.CallID != "" || r.FromTag != "" || r.TOS != -1 || r.SDP != "" || r.Flags.Has("fatal") {
		t.Errorf("wrong types taken: %+v", r)
	}
	if len(r.Problems) != 8 {
		t.Errorf("problems %q, want 8", r.Problems)
	}
	for _, raw := range [][]byte{kdict("call-id", "x"), kdict("command", 5), []byte("li1ee")} {
		v, err := bencode.Unmarshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseRequest(v); err == nil {
			t.Errorf("%q: parsed without a command", raw)
		}
	}
}

// Kamailio does not sort the keys; the decoder and the parser must not
// care, but a duplicate key is still an error.
func TestParseUnsortedKeys(t *testing.T) {
	raw := kdict("sdp", "v=0", "command", "offer", "call-id", "c1", "from-tag", "f")
	r := mustParse(t, raw)
	if r.Command != "offer" || r.CallID != "c1" || r.SDP != "v=0" || r.FromTag != "f" {
		t.Errorf("unsorted: %+v", r)
	}
	if _, err := bencode.Unmarshal(kdict("command", "offer", "call-id", "a", "command", "delete")); err == nil {
		t.Error("duplicate key decoded")
	}
}

func TestKnownFlags(t *testing.T) {
	known := KnownFlags()
	for _, f := range []string{"trust-address", "symmetric", "asymmetric", "strict-source", "record-call", "port-latching",
		"no-rtcp-attribute", "full-rtcp-attribute", "loop-protect", "generate-mid", "all"} {
		if !FlagSet(known).Has(f) {
			t.Errorf("%s not known", f)
		}
		if r := mustParse(t, kdict("command", "offer", "flags", []string{f})); !r.Flags.Has(f) || len(r.UnknownFlags) > 0 {
			t.Errorf("%s: flags %v unknown %v", f, r.Flags, r.UnknownFlags)
		}
	}
}
