package sdp

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// FuzzRewrite feeds arbitrary bodies through the path a SIP INVITE's SDP
// takes: parse, filter codecs, rewrite for a leg. Nothing may panic, and
// whatever relayd renders must parse again with the relay's address on
// every enabled stream.
func FuzzRewrite(f *testing.F) {
	f.Add(offer)
	seeds, _ := filepath.Glob("testdata/*.sdp")
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	relay := netip.MustParseAddr("198.18.1.1")
	f.Fuzz(func(t *testing.T, body []byte) {
		d, err := Parse(body)
		if err != nil {
			return
		}
		_ = d.FilterCodecs([]string{"PCMU", "PCMA", "telephone-event"})
		plan := Plan{Addr: relay}
		for i := range d.Streams {
			plan.Streams = append(plan.Streams, StreamPlan{Port: 30000 + 2*i, RTCPMux: i%2 == 0, KeepCrypto: true})
		}
		o := NewOrigin()
		out, err := d.Rewrite(plan, &o)
		if err != nil {
			return
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("rewritten SDP does not parse: %v\n%q\nfrom %q", err, out, body)
		}
		for i, st := range back.Streams {
			if st.Port != 0 && !st.Addr.IsUnspecified() && st.Addr != relay {
				t.Fatalf("stream %d address %v, want %v\n%q", i, st.Addr, relay, out)
			}
		}
	})
}
