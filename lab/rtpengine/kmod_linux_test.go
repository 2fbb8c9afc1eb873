package rtpengine

import (
	"strings"
	"testing"

	"github.com/relayd/relayd/lab"
)

// The kernel table's list, as xt_RTPENGINE 10.5 prints it
// (proc_list_show): the stats lines of every target are summed, targets
// without outputs have none.
func TestParseKernelList(t *testing.T) {
	list := `local inet4 198.18.1.1:30000
    expect inet4 198.18.0.2:4000
    stats:                 8600 bytes,                   50 packets,                    0 errors
        RTP payload type   0:                 8600 bytes,                   50 packets
    SSRC in: 4b000000
    option: RTP stats
    output #0
         src inet4 198.18.1.1:30002
         dst inet4 198.18.2.2:5000
local inet4 198.18.1.1:30002
    stats:                17200 bytes,                  100 packets,                    3 errors
local inet4 198.18.1.1:30004
    outputs not fully filled (1 missing)
`
	got, err := parseKernelList(strings.NewReader(list))
	if err != nil {
		t.Fatal(err)
	}
	want := KernelStats{Targets: 3, Packets: 150, Bytes: 25800, Errors: 3}
	if got != want {
		t.Errorf("parsed %+v, want %+v", got, want)
	}
	for _, bad := range []string{
		"local inet4 198.18.1.1:30000\n    stats: 1 bytes, x packets, 0 errors\n",
		"local inet4 198.18.1.1:30000\n    stats: 1 bytes, 2 packets\n",
	} {
		if _, err := parseKernelList(strings.NewReader(bad)); err == nil {
			t.Errorf("parsed %q without an error", bad)
		}
	}
	if got, err := parseKernelList(strings.NewReader("")); err != nil || got != (KernelStats{}) {
		t.Errorf("empty list: %+v, %v", got, err)
	}
}

// The daemon's command line asks for the kernel table only with
// Options.Kernel, and then refuses to fall back to userspace.
func TestKernelArgs(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want []string
		not  []string
	}{
		{Options{}, []string{"--table=-1"}, []string{"--no-fallback"}},
		{Options{Kernel: true, Table: 3}, []string{"--table=3", "--no-fallback"}, []string{"--table=-1"}},
	} {
		e := &Engine{opts: tc.o}
		args := strings.Join(e.args(), " ")
		for _, w := range tc.want {
			if !strings.Contains(args, w) {
				t.Errorf("%+v: args %q lack %s", tc.o, args, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(args, n) {
				t.Errorf("%+v: args %q have %s", tc.o, args, n)
			}
		}
	}
	o := Options{Kernel: true, Table: 64}
	if err := o.validate(&lab.Lab{}); err == nil || !strings.Contains(err.Error(), "kernel table 64") {
		t.Errorf("table 64 accepted: %v", err)
	}
}
