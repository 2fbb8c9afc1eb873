package slowpath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/relayd/relayd/sdes"
)

// FuzzProcess feeds arbitrary payloads through the worker's packet path for
// a plain flow and SRTP flows in both directions: it never panics, never
// writes past its buffer, and whatever it sends is a well-formed IP/UDP
// packet whose lengths match.
func FuzzProcess(f *testing.F) {
	f.Add(rtpPayload(1, 1, 160), uint16(4000))
	f.Add([]byte{0x80, 200, 0, 1, 0, 0, 0, 1}, uint16(4000))        // RTCP
	f.Add([]byte{0, 1, 0, 0, 0x21, 0x12, 0xa4, 0x42}, uint16(4000)) // STUN
	f.Add([]byte{}, uint16(1))
	p := srtpParams(f, sdes.AES_CM_128_HMAC_SHA1_80, 9)
	g := srtpParams(f, sdes.AEAD_AES_128_GCM, 3)
	plain := newSRTPFlow(f, nil, nil)
	dec := newSRTPFlow(f, p, nil)
	enc := newSRTPFlow(f, nil, g)
	both := newSRTPFlow(f, p, g)
	out := make([]byte, maxPacket)
	f.Fuzz(func(t *testing.T, payload []byte, port uint16) {
		if len(payload) > 1500 {
			return
		}
		src := netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), port)
		for _, fl := range []*flowState{plain, dec, enc, both} {
			n, to, v := fl.process(out, payload, src, 1)
			if v != vSend {
				continue
			}
			if n < 28 || n > len(out) || to != fl.flow.SendTo {
				t.Fatalf("sent %d bytes to %s", n, to)
			}
			if int(binary.BigEndian.Uint16(out[2:])) != n || int(binary.BigEndian.Uint16(out[24:])) != n-20 {
				t.Fatalf("lengths: IP %d UDP %d for a %d-byte packet", binary.BigEndian.Uint16(out[2:]), binary.BigEndian.Uint16(out[24:]), n)
			}
		}
	})
}
