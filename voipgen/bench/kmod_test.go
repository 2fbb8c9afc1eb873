package bench

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestParseKmod(t *testing.T) {
	c, err := ParseKmod(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Calls != 5 || c.Repeat != 3 || c.VM || strings.Join(c.Relays, ",") != "forward,rtpengine,xdp" {
		t.Errorf("defaults: %+v", c)
	}
	c, err = ParseKmod([]string{"--vm", "--relays", " XDP, rtpengine,xdp", "--calls", "7"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.VM || c.Calls != 7 || strings.Join(c.Relays, ",") != "xdp,rtpengine" {
		t.Errorf("parsed %+v", c)
	}
	for _, bad := range [][]string{
		{"--relays", "kernel"}, {"--relays", ","}, {"--calls", "0"}, {"--duration", "100ms"},
		{"--warmup", "0s"}, {"--repeat", "0"}, {"--vm-cpus", "0"}, {"extra"},
	} {
		if _, err := ParseKmod(bad, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Rows take the medians and spreads of the runs that completed, per
// relay in the order they ran; the text says where it was measured and
// gives the ratios of the medians.
func TestKmodReport(t *testing.T) {
	rep := &KmodReport{Label: "TCG emulation (qemu, 1 vCPU)", Kernel: "6.1.0-57-amd64", CPUs: 1, Calls: 5, Duration: 10}
	for i, soft := range []float64{300, 100, 200} {
		rep.Runs = append(rep.Runs,
			KmodRun{Relay: kmodRtpengine, Repetition: i + 1, SentAll: 1200, Received: 1200, Relayed: 1000, SoftirqNs: 2 * soft, BusyNs: 1000, JitterP50Ms: 0.5},
			KmodRun{Relay: kmodXDP, Repetition: i + 1, SentAll: 1200, Received: 1199, Lost: 1, Relayed: 1000, SoftirqNs: soft, BusyNs: 500, MaxGapMs: float64(40 + i)})
	}
	rep.Runs = append(rep.Runs, KmodRun{Relay: kmodForward, Repetition: 1, Error: "boom", SoftirqNs: 1})
	rows := rep.Rows()
	if len(rows) != 2 || rows[0].Relay != kmodRtpengine || rows[1].Relay != kmodXDP {
		t.Fatalf("rows %+v", rows)
	}
	x := rows[1]
	if x.Runs != 3 || x.SoftirqNs != (Spread{200, 100, 300}) || x.Lost != 3 || x.Received != 3597 || x.MaxGapMs != 42 || x.RelayedP50 != 1000 {
		t.Errorf("xdp row %+v", x)
	}
	if r := kmodRatio(rows, kmodXDP, kmodRtpengine, func(r KmodRow) float64 { return r.SoftirqNs.P50 }); r != 0.5 {
		t.Errorf("ratio %v, want 0.5", r)
	}
	var b bytes.Buffer
	rep.WriteText(&b)
	for _, want := range []string{
		"measured under TCG emulation (qemu, 1 vCPU)",
		"xdp / rtpengine module (softirq): 0.50",
		"xdp / rtpengine module (busy): 0.50",
		"200 (100-300)",
		"boom",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "/ forward") {
		t.Errorf("ratio to a relay without a completed run:\n%s", b.String())
	}
}

func TestUDPRcvbufErrors(t *testing.T) {
	snmp := "Ip: Forwarding DefaultTTL\nIp: 1 64\n" +
		"Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n" +
		"Udp: 12000 0 7 12000 7 0 0 0 0\n" +
		"UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n" +
		"UdpLite: 0 0 0 0 3 0 0 0 0\n"
	if n, err := udpRcvbufErrors(snmp); err != nil || n != 7 {
		t.Errorf("RcvbufErrors %d, %v; want 7", n, err)
	}
	if _, err := udpRcvbufErrors("Ip: Forwarding\nIp: 1\n"); err == nil {
		t.Error("no Udp lines: no error")
	}
}
