package bench

import (
	"slices"
	"testing"

	"github.com/relayd/relayd/lab/labrelay"
)

// TestRelaydModeIO: --userspace-io reaches relayd's userspace workers in
// the modes that have them (userspace, srtp, transcode), not XDP's or
// rtpengine's, nor those of the modes that name their own (-xsk,
// xdp-srtp). The xdp-srtp modes run relayd's XDP data plane with its
// workers.
func TestRelaydModeIO(t *testing.T) {
	cfg := Config{userspaceIO: "afxdp"}
	for name, want := range map[string]string{"userspace": "afxdp", "srtp": "afxdp", transcodeRelayd: "afxdp", "xdp": "", "rtpengine": ""} {
		if got := cfg.relaydMode(name).IO; got != want {
			t.Errorf("mode %s: io %q, want %q", name, got, want)
		}
	}
	if got := (Config{}).relaydMode("userspace").IO; got != "" {
		t.Errorf("no --userspace-io: io %q, want relayd's default", got)
	}
	// The -xsk modes receive through AF_XDP whatever --userspace-io says.
	for _, cfg := range []Config{{}, {userspaceIO: "socket"}} {
		for _, name := range []string{userspaceXSK, srtpXSK} {
			if got := cfg.relaydMode(name).IO; got != "afxdp" {
				t.Errorf("mode %s, --userspace-io %q: io %q, want afxdp", name, cfg.userspaceIO, got)
			}
		}
	}
	if m := benchMode(srtpXSK); m.Kind != "srtp" || m.Suite != benchMode("srtp").Suite {
		t.Errorf("srtp-xsk: %+v, want srtp's kind and suite", m)
	}
	for _, c := range []struct{ name, io, mode string }{
		{"srtp", "afxdp", "userspace"}, {xdpSRTP, "socket", ""}, {xdpSRTPXSK, "afxdp", ""}, {"xdp", "", ""},
	} {
		m := cfg.relaydMode(c.name)
		var o labrelay.Options
		m.setRelayd(&o)
		if o.UserspaceIO != c.io || o.Mode != c.mode || (c.name != "xdp") != (o.Workers > 0) {
			t.Errorf("mode %s, --userspace-io afxdp: relayd's options %+v, want io %q, mode %q (\"\": xdp), workers unless xdp", c.name, o, c.io, c.mode)
		}
		if c.name != "xdp" && (m.Kind != "srtp" || m.Suite != benchMode("srtp").Suite) {
			t.Errorf("%s: %+v, want srtp's kind and suite", c.name, m)
		}
	}
}

// TestStreamOrders checks the orders the sweeps give relayd its flows in:
// each a fixed permutation of its range, and no block of consecutive
// indexes kept together, so that a relay packing flows onto few workers
// in the order they come meets them in every one of the sender's slots.
func TestStreamOrders(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to int
		order    func() []int
	}{
		{"callOrder(2000)", 0, 2000, func() []int { return callOrder(2000) }},
		{"installOrder(0, 2048)", 0, 2048, func() []int { return installOrder(0, 2048) }},
		{"installOrder(1000, 5000)", 1000, 5000, func() []int { return installOrder(1000, 5000) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order := tc.order()
			if again := tc.order(); !slices.Equal(order, again) {
				t.Fatal("not the same order twice")
			}
			sorted := slices.Sorted(slices.Values(order))
			for k, i := range sorted {
				if i != tc.from+k {
					t.Fatalf("not a permutation of %d..%d: %d at %d", tc.from, tc.to-1, i, k)
				}
			}
			// The first half of the order (what a worker packed first
			// would carry) takes from both halves of the range alike.
			n := len(order)
			low := 0
			for _, i := range order[:n/2] {
				if i < tc.from+n/2 {
					low++
				}
			}
			if low < n/2*2/5 || low > n/2*3/5 {
				t.Errorf("first half of the order: %d of %d from the range's lower half", low, n/2)
			}
		})
	}
}
