package fwpair

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero", Config{}, true},
		{"v2 1s", Config{VRRPVersion: 2, Advert: time.Second}, true},
		{"v2 100ms", Config{VRRPVersion: 2, Advert: 100 * time.Millisecond}, false},
		{"v2 1.5s", Config{VRRPVersion: 2, Advert: 1500 * time.Millisecond}, false},
		{"v3 10ms", Config{Advert: 10 * time.Millisecond}, true},
		{"v3 15ms", Config{Advert: 15 * time.Millisecond}, false},
		{"v3 41s", Config{Advert: 41 * time.Second}, false},
		{"v4", Config{VRRPVersion: 4}, false},
		{"xdp", Config{Forwarder: ForwarderXDP}, true},
		{"dpdk", Config{Forwarder: "dpdk"}, false},
		{"hosts 200", Config{HostAddrs: 200}, true},
		{"hosts 201", Config{HostAddrs: 201}, false},
		{"hosts -1", Config{HostAddrs: -1}, false},
		{"prefix slash", Config{Prefix: "a/b"}, false},
		{"prefix long", Config{Prefix: strings.Repeat("a", 41)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.setDefaults()
			if err := cfg.validate(); (err == nil) != tc.ok {
				t.Errorf("validate: %v, want ok %t", err, tc.ok)
			}
		})
	}
}

func TestAdvertString(t *testing.T) {
	got := []string{}
	for _, d := range []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, time.Second, 3 * time.Second} {
		got = append(got, advertString(d))
	}
	want := []string{"0.01", "0.1", "0.25", "1", "3"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("advert strings (-want +got):\n%s", diff)
	}
}

// TestConfFiles: the generated files say what the package documents, and
// keepalived accepts its configuration.
func TestConfFiles(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Conntrackd: true, VRRPVersion: 3, Advert: 100 * time.Millisecond}
	cfg.setDefaults()
	f := newFWFiles(dir, 1)
	ka := keepalivedConf(&cfg, f, 1)
	for _, want := range []string{"version 3", "advert_int 0.1", "priority 100", "198.18.10.1/24 dev lan", "198.18.20.1/24 dev wan", "notify " + f.notify, "file " + f.track} {
		if !strings.Contains(ka, want) {
			t.Errorf("keepalived.conf lacks %q:\n%s", want, ka)
		}
	}
	ct := conntrackdConf(f, 1)
	for _, want := range []string{"IPv4_address 198.18.30.2\n", "IPv4_Destination_Address 198.18.30.1", "\t\t\tUDP\n", "IPv4_address 198.18.10.3", "Path " + f.ctlSocket, "LockFile " + f.lock} {
		if !strings.Contains(ct, want) {
			t.Errorf("conntrackd.conf lacks %q:\n%s", want, ct)
		}
	}
	ns := notifyScript(&cfg, f)
	if !strings.Contains(ns, "for opt in -c -f -R -B") || !strings.Contains(ns, `conntrackd -C "$conf" -n`) {
		t.Errorf("notify script does not drive conntrackd primary-backup style:\n%s", ns)
	}
	if s := nftRules(&Config{Stateless: true}); !strings.Contains(s, "notrack") || !strings.Contains(s, "meta l4proto udp accept") {
		t.Errorf("stateless rules:\n%s", s)
	}
	if s := nftRules(&Config{}); strings.Contains(s, "notrack") || !strings.Contains(s, `iifname "lan" oifname "wan" ct state new accept`) {
		t.Errorf("stateful rules:\n%s", s)
	}
	if _, err := exec.LookPath("keepalived"); err != nil {
		t.Log("keepalived not installed: its configuration is not checked")
		return
	}
	for _, v := range []Config{{VRRPVersion: 2, Advert: time.Second}, cfg} {
		v.setDefaults()
		path := filepath.Join(dir, "k.conf")
		if err := os.WriteFile(path, []byte(keepalivedConf(&v, f, 0)), 0o600); err != nil {
			t.Fatal(err)
		}
		// The interfaces exist only in a pair's namespaces: complaints
		// about them are expected here, nothing else is.
		out, err := exec.Command("keepalived", "--config-test", "-f", path).CombinedOutput()
		var other []string
		for l := range strings.Lines(string(out)) {
			if !strings.Contains(l, "doesn't exist") && !strings.Contains(l, "Non-existent interface") {
				other = append(other, l)
			}
		}
		if len(other) > 0 || err != nil && len(out) == 0 {
			t.Errorf("keepalived --config-test (VRRPv%d): %v\n%s", v.VRRPVersion, err, out)
		}
	}
}
