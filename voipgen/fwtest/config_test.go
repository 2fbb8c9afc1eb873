package fwtest

import (
	"io"
	"slices"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	cfg, err := Parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Calls != 100 || cfg.Reps != 3 || len(cfg.Failures) != 4 || len(cfg.VRRP) != 2 || !slices.Equal(cfg.Conntrackd, []bool{true, false}) ||
		len(cfg.Streams) != 2 || !slices.Equal(cfg.Forwarders, []string{"kernel", "xdp"}) || len(cfg.Sizes) != 3 ||
		cfg.Search.Trials != 3 || cfg.Trial != 2*time.Second {
		t.Errorf("defaults: %+v", cfg)
	}
	q, err := Parse([]string{"--quick"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if q.Calls != 40 || q.Reps != 1 || !slices.Equal(q.Failures, []FailureKind{AdminStop, CrashLinks}) ||
		!slices.Equal(q.VRRP, []VRRPSetting{{3, 100 * time.Millisecond}}) || q.Search.Trials != 1 || q.Trial != time.Second || !slices.Equal(q.Sizes, []string{"g711"}) {
		t.Errorf("--quick: %+v", q)
	}
	n, err := Parse([]string{"--failures", "none", "--throughput", "none"}, io.Discard)
	if err != nil || len(n.Failures) != 0 || len(n.Forwarders) != 0 {
		t.Errorf("none: %+v %v", n, err)
	}
	for _, args := range [][]string{
		{"--failures", "reboot"}, {"--failures", "recovery-preempt"}, {"--vrrp", "4/1s"}, {"--vrrp", "2/500ms"}, {"--vrrp", "3"},
		{"--conntrackd", "maybe"}, {"--streams", "sideways"}, {"--throughput", "dpdk"}, {"--sizes", "opus"},
		{"--calls", "-1"}, {"--calls", "5000"}, {"--ptime", "5ms"}, {"--transport", "tcp"}, {"--trial", "10ms"}, {"extra"},
		{"--search-lo", "100", "--search-hi", "50"},
	} {
		if _, err := Parse(args, io.Discard); err == nil {
			t.Errorf("Parse(%q) succeeded", args)
		}
	}
}
