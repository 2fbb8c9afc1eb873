package bench

import "testing"

// TestRelaydModeIO: --userspace-io reaches relayd's userspace workers in
// the modes that have them (userspace, srtp, transcode), not XDP's or
// rtpengine's.
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
}
