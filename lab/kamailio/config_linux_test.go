package kamailio

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relayd/relayd/lab"
)

func testLab() *lab.Lab {
	return &lab.Lab{RelayMedia4: netip.MustParseAddr("198.18.1.1")}
}

// TestConfig: the rendered configuration names the nodes with their
// weights and the flags, and Kamailio's syntax check (-c) accepts it.
func TestConfig(t *testing.T) {
	o := Options{
		Destination: netip.MustParseAddrPort("198.18.2.2:5060"),
		RTPEngines:  []Node{{Addr: netip.MustParseAddrPort("127.0.0.1:2223"), Weight: 2}, {Addr: netip.MustParseAddrPort("198.18.6.2:2223")}},
		CalleeFlags: []string{"transport-protocol=RTP/SAVP"},
	}
	cfg := render(t, o,
		`modparam("rtpengine", "rtpengine_sock", "udp:127.0.0.1:2223=2 udp:198.18.6.2:2223")`,
		`modparam("rtpengine", "rtpengine_disable_tout", 2)`,
		`rtpengine_offer("replace-origin replace-session-connection ICE=remove transport-protocol=RTP/SAVP")`,
		`listen=udp:198.18.1.1:5060`,
		`$du = "sip:198.18.2.2:5060";`,
	)
	checkSyntax(t, cfg)
}

// TestConfigFallbacksNoMedia: fallback destinations are tried in turn from
// the failure route, and without media no rtpengine call is left.
func TestConfigFallbacksNoMedia(t *testing.T) {
	o := Options{
		Destination: netip.MustParseAddrPort("198.18.2.2:5062"),
		Fallbacks:   []netip.AddrPort{netip.MustParseAddrPort("198.18.2.2:5064"), netip.MustParseAddrPort("198.18.2.2:5060")},
		NoMedia:     true,
	}
	cfg := render(t, o,
		`$du = "sip:198.18.2.2:5062";`,
		"$avp(next) == 0) {\n\t\t$avp(next) = 0 + 1;\n\t\t$du = \"sip:198.18.2.2:5064\";",
		"$avp(next) == 1) {\n\t\t$avp(next) = 1 + 1;\n\t\t$du = \"sip:198.18.2.2:5060\";",
	)
	if strings.Contains(string(cfg), "rtpengine") {
		t.Errorf("configuration without media names rtpengine:\n%s", cfg)
	}
	checkSyntax(t, cfg)
}

// render validates o and renders its configuration, which must hold each
// of wants.
func render(t *testing.T, o Options, wants ...string) []byte {
	t.Helper()
	if err := o.validate(testLab()); err != nil {
		t.Fatal(err)
	}
	cfg, err := config(&o, DefaultModulePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range wants {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("configuration lacks %s:\n%s", want, cfg)
		}
	}
	return cfg
}

// checkSyntax runs Kamailio's syntax check (-c) on cfg.
func checkSyntax(t *testing.T, cfg []byte) {
	t.Helper()
	if Available("", "") != nil {
		t.Skip("kamailio not installed: configuration not checked")
	}
	path := filepath.Join(t.TempDir(), "kamailio.cfg")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(DefaultBin, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Errorf("kamailio -c: %v\n%s", err, out)
	}
}

func TestOptionsValidate(t *testing.T) {
	node := []Node{{Addr: netip.MustParseAddrPort("127.0.0.1:2223")}}
	dest := netip.MustParseAddrPort("198.18.2.2:5060")
	for name, o := range map[string]Options{
		"no destination":   {RTPEngines: node},
		"no node":          {Destination: dest},
		"fallback outside": {Destination: dest, RTPEngines: node, Fallbacks: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:5060")}},
		"outside the lab":  {Destination: netip.MustParseAddrPort("192.0.2.1:5060"), RTPEngines: node},
		"node outside":     {Destination: dest, RTPEngines: []Node{{Addr: netip.MustParseAddrPort("192.0.2.1:2223")}}},
		"negative weight":  {Destination: dest, RTPEngines: []Node{{Addr: node[0].Addr, Weight: -1}}},
		"negative timeout": {Destination: dest, RTPEngines: node, TimeoutMS: -1},
	} {
		if err := o.validate(testLab()); err == nil {
			t.Errorf("%s: validated", name)
		}
	}
	o := Options{Destination: dest, RTPEngines: node, Flags: []string{"bad flag"}}
	if err := o.validate(testLab()); err != nil {
		t.Fatal(err)
	}
	if _, err := config(&o, DefaultModulePath); err == nil {
		t.Error("a flag with a space rendered")
	}
}
