package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const minimal = `
[dataplane]
interfaces = ["eth0"]
[media]
address = "198.18.1.1"
`

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Log:   Log{Level: "info", Format: "json"},
		Admin: Admin{Listen: "127.0.0.1:9900"},
		Dataplane: Dataplane{
			Mode: "xdp", XDPMode: "native", Interfaces: []string{"eth0"},
			PinPath: "/sys/fs/bpf/relayd", MaxFlows: 65536, Coalesce: "200us", PackFlows: 1024, UserspaceIO: "socket", WorkerScheduling: "default", CoalesceDuration: 200 * time.Microsecond,
		},
		Media: Media{
			Address: "198.18.1.1", Ports: "30000-39999", Timeout: "60s", LatchWindow: "3s", RebindAfter: "5s", RTCPInterval: "5s",
			Addr: netip.MustParseAddr("198.18.1.1"), PortMin: 30000, PortMax: 39999,
			TimeoutDuration: 60 * time.Second, LatchDuration: 3 * time.Second, RebindDuration: 5 * time.Second, RTCPDuration: 5 * time.Second,
			RateLimitFactor: 4, RateLimitDefaultPPS: 2000, RateLimitRTCPPPS: 100,
		},
		SIP: SIP{AuthRealm: "relayd", AuthAlgorithms: []string{"SHA-256", "MD5"}},
	}
	if diff := cmp.Diff(c, want, cmpopts.EquateComparable(netip.Addr{}), cmpopts.IgnoreUnexported(Config{})); diff != "" {
		t.Errorf("config (-got +want):\n%s", diff)
	}
}

func TestParseFull(t *testing.T) {
	doc := `
[log]
level = "debug"
format = "console"
[admin]
listen = "unix:/run/relayd/admin.sock"
[dataplane]
mode = "xdp"
xdp_mode = "generic"
interfaces = ["eth0", "eth1"]
workers = 4
enable_forwarding = true
pin_path = "/sys/fs/bpf/test"
max_flows = 1024
userspace_io = "afxdp"
pack_flows = 0
[media]
address = "198.18.1.1"
address6 = "2001:2::1"
ports = "2000-2099"
timeout = "1m30s"
latch_window = "500ms"
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if c.Log.Level != "debug" || c.Log.Format != "console" || c.Admin.Listen != "unix:/run/relayd/admin.sock" {
		t.Errorf("log/admin = %+v %+v", c.Log, c.Admin)
	}
	d := c.Dataplane
	if d.XDPMode != "generic" || len(d.Interfaces) != 2 || d.Workers != 4 || !d.EnableForwarding ||
		d.PinPath != "/sys/fs/bpf/test" || d.MaxFlows != 1024 || d.UserspaceIO != "afxdp" || d.PackFlows != 0 {
		t.Errorf("dataplane = %+v", d)
	}
	m := c.Media
	if m.Addr6 != netip.MustParseAddr("2001:2::1") || m.PortMin != 2000 || m.PortMax != 2099 ||
		m.TimeoutDuration != 90*time.Second || m.LatchDuration != 500*time.Millisecond {
		t.Errorf("media = %+v", m)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		key  string
		line int
		msg  string // substring of the message
	}{
		{"unknown key", "[dataplane]\ninterfaces=[\"eth0\"]\nbogus = 1\n", "dataplane.bogus", 3, "unknown key"},
		{"unknown section", "[nosuch]\nlisten = \"x\"\n", "nosuch", 1, "unknown key"},
		{"type string for int", "[dataplane]\nworkers = \"x\"\n", "dataplane.workers", 2, "want an integer"},
		{"type string for array", "[dataplane]\ninterfaces = \"eth0\"\n", "dataplane.interfaces", 2, "want an array of strings"},
		{"type int for table", "log = 3\n", "log", 1, "want a table"},
		{"type string for bool", "[dataplane]\nenable_forwarding = \"yes\"\n", "dataplane.enable_forwarding", 2, "want a boolean"},
		{"syntax", "[log\n", "", 1, "expected ']'"},
		{"log level", minimal + "[log]\nlevel = \"loud\"\n", "log.level", 7, "not one of debug"},
		{"log format", minimal + "[log]\nformat = \"xml\"\n", "log.format", 7, "not one of json"},
		{"listen", minimal + "[admin]\nlisten = \"9900\"\n", "admin.listen", 7, "neither host:port"},
		{"listen port", minimal + "[admin]\nlisten = \"127.0.0.1:http\"\n", "admin.listen", 7, "not within 1-65535"},
		{"listen unix relative", minimal + "[admin]\nlisten = \"unix:admin.sock\"\n", "admin.listen", 7, "must be absolute"},
		{"listen everywhere without a token", minimal + "[admin]\nlisten = \":9900\"\n", "admin.listen", 7, "set admin.token_file"},
		{"listen on a lab address without a token", minimal + "[admin]\nlisten = \"198.18.1.1:9900\"\n", "admin.listen", 7, "reachable from other hosts"},
		{"listen on a name without a token", minimal + "[admin]\nlisten = \"relay.example:9900\"\n", "admin.listen", 7, "set admin.token_file"},
		{"token file relative", minimal + "[admin]\ntoken_file = \"admin.token\"\n", "admin.token_file", 7, "must be absolute"},
		{"token file missing", minimal + "[admin]\ntoken_file = \"/nonexistent/admin.token\"\n", "admin.token_file", 7, "no such file"},
		{"mode", "[dataplane]\nmode = \"dpdk\"\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.mode", 2, "not one of xdp"},
		{"xdp needs interfaces", "[media]\naddress = \"198.18.1.1\"\n", "dataplane.interfaces", 0, "mode xdp needs"},
		{"xdp mode", "[dataplane]\ninterfaces=[\"a\"]\nxdp_mode = \"offload\"\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.xdp_mode", 3, "native, generic"},
		{"duplicate interface", "[dataplane]\ninterfaces=[\"a\",\"a\"]\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.interfaces", 2, "listed twice"},
		{"long interface", "[dataplane]\ninterfaces=[\"abcdefghijklmnop\"]\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.interfaces", 2, "longer than 15"},
		{"workers", "[dataplane]\nmode=\"userspace\"\nworkers = -1\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.workers", 3, "negative"},
		{"control_procs", "[dataplane]\nmode=\"userspace\"\ncontrol_procs = -2\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.control_procs", 3, "negative"},
		{"cpu offline", "[dataplane]\nmode=\"userspace\"\ncpus = [0, 4096]\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.cpus", 3, "not online"},
		{"cpu twice", "[dataplane]\nmode=\"userspace\"\ncpus = [0, 0]\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.cpus", 3, "twice"},
		{"pin path", "[dataplane]\ninterfaces=[\"a\"]\npin_path = \"bpf\"\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.pin_path", 3, "absolute"},
		{"max flows", "[dataplane]\ninterfaces=[\"a\"]\nmax_flows = 0\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.max_flows", 3, "not within"},
		{"coalesce not a duration", "[dataplane]\ninterfaces=[\"a\"]\ncoalesce = \"fast\"\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.coalesce", 3, "not a duration"},
		{"userspace io", "[dataplane]\ninterfaces=[\"a\"]\nuserspace_io = \"dpdk\"\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.userspace_io", 3, "not one of socket, afxdp"},
		{"afxdp needs interfaces", "[dataplane]\nmode=\"userspace\"\nuserspace_io = \"afxdp\"\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.interfaces", 0, "afxdp needs at least one interface"},
		{"worker scheduling", "[dataplane]\ninterfaces=[\"a\"]\nworker_scheduling = \"deadline\"\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.worker_scheduling", 3, "not default, other, batch, fifo or rr"},
		{"fifo needs a priority", "[dataplane]\ninterfaces=[\"a\"]\nworker_scheduling = \"fifo\"\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.worker_priority", 0, "not a real-time priority (1 to 99)"},
		{"rr priority", "[dataplane]\ninterfaces=[\"a\"]\nworker_scheduling = \"rr\"\nworker_priority = 100\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.worker_priority", 4, "not a real-time priority"},
		{"nice", "[dataplane]\ninterfaces=[\"a\"]\nworker_priority = -21\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.worker_priority", 3, "not a nice value (-20, the highest, to 19)"},
		{"pack flows negative", "[dataplane]\ninterfaces=[\"a\"]\npack_flows = -1\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.pack_flows", 3, "not within"},
		{"coalesce too long", "[dataplane]\ninterfaces=[\"a\"]\ncoalesce = \"20ms\"\n[media]\naddress = \"198.18.1.1\"\n", "dataplane.coalesce", 3, "not within"},
		{"no address", "[dataplane]\ninterfaces=[\"a\"]\n", "media.address", 0, "need a relay media address"},
		{"bad address", "[dataplane]\ninterfaces=[\"a\"]\n[media]\naddress = \"198.18.1\"\n", "media.address", 4, "not an IP address"},
		{"v6 in address", "[dataplane]\ninterfaces=[\"a\"]\n[media]\naddress = \"2001:2::1\"\n", "media.address", 4, "not an IPv4"},
		{"v4 in address6", "[dataplane]\ninterfaces=[\"a\"]\n[media]\naddress6 = \"198.18.1.1\"\n", "media.address6", 4, "not an IPv6"},
		{"unspecified", "[dataplane]\ninterfaces=[\"a\"]\n[media]\naddress = \"0.0.0.0\"\n", "media.address", 4, "not a unicast"},
		{"ports format", minimal + "ports = \"30000\"\n", "media.ports", 6, "not a range"},
		{"ports odd start", minimal + "ports = \"30001-30003\"\n", "media.ports", 6, "must be even"},
		{"ports even end", minimal + "ports = \"30000-30002\"\n", "media.ports", 6, "must be odd"},
		{"ports reversed", minimal + "ports = \"30001-30000\"\n", "media.ports", 6, "below the last"},
		{"ports low", minimal + "ports = \"1000-2001\"\n", "media.ports", 6, "below 1024"},
		{"ports high", minimal + "ports = \"30000-70001\"\n", "media.ports", 6, "numbers within"},
		{"timeout", minimal + "timeout = \"60\"\n", "media.timeout", 6, "not a duration"},
		{"timeout zero", minimal + "timeout = \"0s\"\n", "media.timeout", 6, "not positive"},
		{"latch", minimal + "latch_window = \"-1s\"\n", "media.latch_window", 6, "negative"},
		{"rebind", minimal + "rebind_after = \"soon\"\n", "media.rebind_after", 6, "not a duration"},
		{"dotted key", "media.address = \"x\"\n[dataplane]\ninterfaces=[\"a\"]\n", "media.address", 1, "not an IP address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", c)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v (%T) is not a *config.Error", err, err)
			}
			if ce.Key != tt.key || ce.Line != tt.line || !strings.Contains(ce.Msg, tt.msg) {
				t.Errorf("got key %q line %d msg %q; want key %q line %d msg containing %q",
					ce.Key, ce.Line, ce.Msg, tt.key, tt.line, tt.msg)
			}
			if tt.line > 0 && !strings.Contains(err.Error(), "line ") {
				t.Errorf("error %q does not name the line", err)
			}
		})
	}
}

// TestAdminToken: a TCP listen address other than loopback needs a token
// file, one only its owner can read; loopback and unix sockets need none.
func TestAdminToken(t *testing.T) {
	dir := t.TempDir()
	good, open := filepath.Join(dir, "good"), filepath.Join(dir, "open")
	for path, mode := range map[string]os.FileMode{good: 0o600, open: 0o644} {
		if err := os.WriteFile(path, []byte("0123456789abcdef0123\n"), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(path, mode)
	}
	for _, listen := range []string{"127.0.0.1:9900", "[::1]:9900", "localhost:9900", "unix:/run/relayd/admin.sock"} {
		if _, err := Parse([]byte(minimal + "[admin]\nlisten = \"" + listen + "\"\n")); err != nil {
			t.Errorf("%s without a token: %v", listen, err)
		}
	}
	c, err := Parse([]byte(minimal + "[admin]\nlisten = \"198.18.1.1:9900\"\ntoken_file = \"" + good + "\"\n"))
	if err != nil || c.Admin.TokenFile != good {
		t.Errorf("a lab address with a token file: %+v, %v", c, err)
	}
	_, err = Parse([]byte(minimal + "[admin]\nlisten = \"198.18.1.1:9900\"\ntoken_file = \"" + open + "\"\n"))
	var ce *Error
	if !errors.As(err, &ce) || ce.Key != "admin.token_file" || !strings.Contains(ce.Msg, "mode 0644") {
		t.Errorf("a world-readable token file: %v; want admin.token_file refused for its mode", err)
	}
}

func TestParseSeveralErrors(t *testing.T) {
	_, err := Parse([]byte(minimal + "ports = \"1-2\"\ntimeout = \"x\"\n"))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"line 6: media.ports", "line 7: media.timeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "relayd.toml")
	if err := os.WriteFile(path, []byte(minimal), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(minimal+"bogus = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path+": line 6: media.bogus: unknown key") {
		t.Errorf("Load error = %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.toml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load missing file error = %v, want ErrNotExist", err)
	}
}

func TestExampleConfig(t *testing.T) {
	// The example shipped in systemd/ (the package's conffile) attaches to
	// nothing: it fails on exactly the keys an administrator must edit, with
	// their lines, and is valid once they are set.
	const path = "../systemd/relayd.toml"
	_, err := Load(path)
	if err == nil {
		t.Fatal("the shipped example loads; it must refuse until edited")
	}
	data, rerr := os.ReadFile(path)
	if rerr != nil {
		t.Fatal(rerr)
	}
	lines := keyLines(data)
	var want []string
	for _, key := range []string{"dataplane.interfaces", "media.address"} {
		if lines[key] == 0 {
			t.Fatalf("example has no %s line", key)
		}
		want = append(want, fmt.Sprintf("%s: line %d: %s: ", path, lines[key], key))
	}
	got := strings.Split(err.Error(), "\n")
	if len(got) != len(want) {
		t.Fatalf("errors:\n%v\nwant one each for %q", err, want)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("error %q, want prefix %q", got[i], want[i])
		}
	}
	edited := strings.Replace(string(data), "interfaces = []", `interfaces = ["eth1", "eth2"]`, 1)
	edited = strings.Replace(edited, `address = ""`, `address = "192.0.2.1"`, 1)
	if _, err := Parse([]byte(edited)); err != nil {
		t.Errorf("example with interfaces and address set: %v", err)
	}

	// The commented examples of an advertised address, named media
	// interfaces and a route using them are valid as they stand.
	c, err := Parse([]byte(uncomment(t, edited, "# deny_destinations =", "# advertise =", "# [[media.interface]]", "# [[route]]", "# auth_file =")))
	if err != nil {
		t.Fatalf("example with its [[media.interface]] and [[route]] examples: %v", err)
	}
	var names []string
	for _, in := range c.MediaInterfaces() {
		names = append(names, in.Name)
	}
	if diff := cmp.Diff(names, []string{"", "internal", "external"}); diff != "" {
		t.Errorf("example media interfaces (-got +want):\n%s", diff)
	}
	if len(c.Media.DenyPrefixes) != 1 {
		t.Errorf("example deny_destinations: %v", c.Media.DenyPrefixes)
	}
	if !c.Media.AdvertiseAddr.IsValid() {
		t.Error("example [media] advertise not set")
	}
	if len(c.Routes) != 1 || c.Routes[0].CallerInterface != "internal" || c.Routes[0].CalleeInterface != "external" {
		t.Errorf("example routes %+v", c.Routes)
	}
}

// uncomment strips "# " from each line of doc from the first line that
// starts with each of starts to the next empty line.
func uncomment(t *testing.T, doc string, starts ...string) string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	for _, start := range starts {
		i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, start) })
		if i < 0 {
			t.Fatalf("no line starts with %q", start)
		}
		for ; i < len(lines) && lines[i] != ""; i++ {
			lines[i] = strings.TrimPrefix(lines[i], "# ")
		}
	}
	return strings.Join(lines, "\n")
}

func TestParsePortRange(t *testing.T) {
	lo, hi, err := ParsePortRange("30000-39999")
	if err != nil || lo != 30000 || hi != 39999 {
		t.Errorf("ParsePortRange = %d, %d, %v", lo, hi, err)
	}
	if _, _, err := ParsePortRange("1024-65535"); err != nil {
		t.Errorf("full range: %v", err)
	}
}
