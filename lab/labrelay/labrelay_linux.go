// Package labrelay runs a real relayd inside a lab's relay namespace, for
// integration tests, the demo and benchmarks: it builds the binary, mounts
// a private bpf filesystem for its pins, writes its config, starts it,
// waits for readiness and talks to its admin API over a unix socket (which
// reaches across network namespaces).
package labrelay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/control/admin"
	calls "github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/lab"
)

// Options configure a lab relay.
type Options struct {
	Bin        string // relayd binary; Build makes one
	Dir        string // working directory: config, socket, log, bpffs mount
	Mode       string // dataplane.mode: xdp (default) | userspace
	XDPMode    string // native (default) | generic
	LogLevel   string // default info
	ExtraMedia string // extra TOML appended to [media]
	Ports      string // media.ports; default 30000-39999
	Timeout    string // media.timeout; default 60s
	Workers    int    // dataplane.workers; 0 (default): one per online CPU
	Coalesce   string // dataplane.coalesce; "" (default): relayd's default
	// UserspaceIO is dataplane.userspace_io (socket | afxdp); ""
	// (default): relayd's default.
	UserspaceIO string
	// ControlProcs is dataplane.control_procs; 0 (default): relayd's
	// default.
	ControlProcs int
	// WorkerScheduling and WorkerPriority are dataplane.worker_scheduling
	// and dataplane.worker_priority; "" (default): relayd's default.
	WorkerScheduling string
	WorkerPriority   int
	// RateCaps keeps relayd's packet-rate caps ([media] rate_limit_*) on.
	// Off by default: the lab's senders run far faster than any codec to
	// keep tests short. ExtraMedia may then set the rate_limit_ keys.
	RateCaps bool
	// NS is the namespace relayd runs in; default the lab's relay. The
	// bpffs and the admin socket live in the test's mount namespace, so
	// they work from any network namespace.
	NS *lab.NS
	// Interfaces are dataplane.interfaces, where XDP attaches; default
	// the relay's two veths (toward the caller and the callee).
	Interfaces []string
	// Media4 and Media6 are media.address and media.address6; default the
	// lab's relay media addresses. Both unset: the relay's.
	Media4, Media6 netip.Addr
	// Extra is TOML appended after the [media] section: whole sections
	// such as [ng].
	Extra string
	// Profile builds relayd with its test-only pprof endpoint (unless Bin
	// is set) for Relay.Profile and Relay.HeapAfterGC.
	Profile bool
}

// Relay is a relayd process in a lab namespace (the relay's unless
// Options.NS says otherwise). Not safe for
// concurrent Start/Kill/Stop; the API methods are.
type Relay struct {
	Lab  *lab.Lab
	opts Options

	ConfigPath string
	Socket     string
	PinPath    string
	LogPath    string

	client *http.Client
	pprof  *http.Client // with Options.Profile
	cmd    *exec.Cmd
	exited chan struct{}
}

var (
	buildMu   sync.Mutex
	buildDirs = map[string]string{} // by build tags
)

// pprofTag builds a relayd that serves net/http/pprof on the unix socket
// named by RELAYD_PPROF (cmd/relayd/pprof.go).
const pprofTag = "relaydpprof"

// Build compiles relayd into a temporary directory the first time it is
// called in a process (and again if the binary was removed) and returns its
// path. RemoveBuild removes it. With RELAYD_TEST_BIN set it returns that
// binary instead: the VM tests build relayd on the host and run the lab
// tests under another kernel, where no Go toolchain needs to run.
func Build() (string, error) { return build("") }

// build is Build with Go build tags ("" none); each set of tags has its
// own binary.
func build(tags string) (string, error) {
	if bin := os.Getenv("RELAYD_TEST_BIN"); bin != "" {
		return bin, nil
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if dir := buildDirs[tags]; dir != "" {
		bin := filepath.Join(dir, "relayd")
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
	}
	dir, err := os.MkdirTemp("", "relayd-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "relayd")
	out, err := exec.Command("go", "build", "-tags", tags, "-o", bin, "github.com/relayd/relayd/cmd/relayd").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go build relayd (tags %q): %w\n%s", tags, err, out)
	}
	buildDirs[tags] = dir
	return bin, nil
}

// RemoveBuild removes the binaries Build made, if any.
func RemoveBuild() {
	buildMu.Lock()
	defer buildMu.Unlock()
	for tags, dir := range buildDirs {
		os.RemoveAll(dir)
		delete(buildDirs, tags)
	}
}

// New prepares a relay in l (config, bpffs) without starting it.
func New(l *lab.Lab, o Options) (*Relay, error) {
	if o.Mode == "" {
		o.Mode = "xdp"
	}
	if o.XDPMode == "" {
		o.XDPMode = "native"
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	if o.Ports == "" {
		o.Ports = "30000-39999"
	}
	if o.Timeout == "" {
		o.Timeout = "60s"
	}
	if o.NS == nil {
		o.NS = l.Relay
	}
	if len(o.Interfaces) == 0 {
		o.Interfaces = []string{lab.RelayCallerIfName, lab.RelayCalleeIfName}
	}
	if !o.Media4.IsValid() && !o.Media6.IsValid() {
		o.Media4, o.Media6 = l.RelayMedia4, l.RelayMedia6
	}
	if o.Bin == "" {
		tags := ""
		if o.Profile {
			tags = pprofTag
		}
		bin, err := build(tags)
		if err != nil {
			return nil, err
		}
		o.Bin = bin
	}
	r := &Relay{
		Lab:        l,
		opts:       o,
		ConfigPath: filepath.Join(o.Dir, "relayd.toml"),
		Socket:     filepath.Join(o.Dir, "admin.sock"),
		PinPath:    filepath.Join(o.Dir, "bpf"),
		LogPath:    filepath.Join(o.Dir, "relayd.log"),
	}
	r.client = unixClient(r.Socket, 10*time.Second)
	if o.Profile {
		r.pprof = unixClient(r.pprofSocket(), 2*time.Minute)
	}
	// A bpffs of our own, outside /sys: `ip netns exec` remounts /sys in
	// the namespace it creates, which would hide /sys/fs/bpf, and a bpffs
	// mounted inside that namespace would die with the process and take
	// the pinned links with it.
	if err := os.MkdirAll(r.PinPath, 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mount("bpffs", r.PinPath, "bpf", 0, "mode=0700"); err != nil {
		return nil, fmt.Errorf("mount bpffs on %s: %w", r.PinPath, err)
	}
	ifaces := make([]string, len(o.Interfaces))
	for i, name := range o.Interfaces {
		ifaces[i] = strconv.Quote(name)
	}
	addr := func(a netip.Addr) string {
		if !a.IsValid() {
			return ""
		}
		return a.String()
	}
	rateCaps := "rate_limit_factor = 0\n"
	if o.RateCaps {
		rateCaps = ""
	}
	coalesce := ""
	if o.Coalesce != "" {
		coalesce = fmt.Sprintf("coalesce = %q\n", o.Coalesce)
	}
	if o.UserspaceIO != "" {
		coalesce += fmt.Sprintf("userspace_io = %q\n", o.UserspaceIO)
	}
	if o.ControlProcs > 0 {
		coalesce += fmt.Sprintf("control_procs = %d\n", o.ControlProcs)
	}
	if o.WorkerScheduling != "" {
		coalesce += fmt.Sprintf("worker_scheduling = %q\nworker_priority = %d\n", o.WorkerScheduling, o.WorkerPriority)
	}
	cfg := fmt.Sprintf(`[log]
level = %q
format = "json"
[admin]
listen = "unix:%s"
[dataplane]
mode = %q
xdp_mode = %q
interfaces = [%s]
enable_forwarding = true
pin_path = %q
workers = %d
%s[media]
address = %q
address6 = %q
ports = %q
timeout = %q
%s%s
%s
`, o.LogLevel, r.Socket, o.Mode, o.XDPMode, strings.Join(ifaces, ", "),
		r.PinPath, o.Workers, coalesce, addr(o.Media4), addr(o.Media6), o.Ports, o.Timeout, rateCaps, o.ExtraMedia, o.Extra)
	if err := os.WriteFile(r.ConfigPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	return r, nil
}

// Start starts relayd and waits until its admin API answers.
func (r *Relay) Start() error {
	logf, err := os.OpenFile(r.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	r.cmd = r.opts.NS.Command(r.opts.Bin, "-config", r.ConfigPath)
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	if r.pprof != nil {
		r.cmd.Env = append(os.Environ(), "RELAYD_PPROF="+r.pprofSocket())
	}
	// Its own process group: a terminal's Ctrl-C goes to the caller, which
	// stops relayd in order.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start relayd: %w", err)
	}
	r.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		cmd.Wait()
		logf.Close()
		close(done)
	}(r.cmd, r.exited)

	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-r.exited:
			return fmt.Errorf("relayd exited during start: %s", r.tail())
		default:
		}
		if resp, err := r.client.Get("http://relayd/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("relayd not ready after 15s: %s", r.tail())
}

func (r *Relay) tail() string {
	b, _ := os.ReadFile(r.LogPath)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// Log returns relayd's log so far.
func (r *Relay) Log() string { b, _ := os.ReadFile(r.LogPath); return string(b) }

// Pid returns relayd's process id, 0 when not running.
func (r *Relay) Pid() int {
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// Kill kills relayd with SIGKILL, as a crash would, and waits for it.
func (r *Relay) Kill() error { return r.signal(syscall.SIGKILL) }

// Stop stops relayd with SIGTERM and waits for it.
func (r *Relay) Stop() error { return r.signal(syscall.SIGTERM) }

func (r *Relay) signal(sig syscall.Signal) error {
	if r.cmd == nil {
		return nil
	}
	select {
	case <-r.exited:
		return nil
	default:
	}
	if err := r.cmd.Process.Signal(sig); err != nil {
		return err
	}
	select {
	case <-r.exited:
		return nil
	case <-time.After(15 * time.Second):
		r.cmd.Process.Kill()
		return errors.New("relayd did not exit within 15s")
	}
}

// Close stops relayd, removes its pinned state (relayd -detach) and
// unmounts the bpffs.
func (r *Relay) Close() error {
	errs := []error{r.Stop()}
	cmd := r.opts.NS.Command(r.opts.Bin, "-config", r.ConfigPath, "-detach")
	if out, err := cmd.CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("relayd -detach: %w: %s", err, out))
	}
	if err := unix.Unmount(r.PinPath, unix.MNT_DETACH); err != nil {
		errs = append(errs, fmt.Errorf("unmount %s: %w", r.PinPath, err))
	}
	return errors.Join(errs...)
}

// AddFlow installs a static flow.
func (r *Relay) AddFlow(req admin.FlowRequest) (admin.Flow, error) {
	var f admin.Flow
	err := r.do(http.MethodPost, "/v1/flows", req, &f, http.StatusCreated)
	return f, err
}

// DeleteFlow removes a flow.
func (r *Relay) DeleteFlow(id uint64) error {
	return r.do(http.MethodDelete, fmt.Sprintf("/v1/flows/%d", id), nil, nil, http.StatusOK, http.StatusNoContent)
}

// Flows lists the flows with their statistics.
func (r *Relay) Flows() ([]admin.Flow, error) {
	var l admin.FlowList
	err := r.do(http.MethodGet, "/v1/flows", nil, &l, http.StatusOK)
	return l.Flows, err
}

// Calls lists the calls relayd carries (GET /v1/calls), whichever front
// end set them up.
func (r *Relay) Calls() ([]calls.Info, error) {
	var l admin.CallList
	err := r.do(http.MethodGet, "/v1/calls", nil, &l, http.StatusOK)
	return l.Calls, err
}

// Metrics returns the Prometheus exposition.
func (r *Relay) Metrics() (string, error) {
	resp, err := r.client.Get("http://relayd/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Metric returns the value of the sample whose line starts with prefix
// (name and labels); a sample that is not there is an error.
func (r *Relay) Metric(prefix string) (float64, error) {
	m, err := r.Metrics()
	if err != nil {
		return 0, err
	}
	return sample(m, prefix)
}

// sample finds the sample whose line starts with prefix in an exposition.
func sample(exposition, prefix string) (float64, error) {
	for _, line := range strings.Split(exposition, "\n") {
		if rest, ok := strings.CutPrefix(line, prefix+" "); ok {
			var v float64
			_, err := fmt.Sscan(rest, &v)
			return v, err
		}
	}
	return 0, fmt.Errorf("no metric %s", prefix)
}

func (r *Relay) do(method, path string, in, out any, want ...int) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://relayd"+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	ok := false
	for _, w := range want {
		ok = ok || resp.StatusCode == w
	}
	if !ok {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil && len(b) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}

func unixClient(path string, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}},
	}
}

func (r *Relay) pprofSocket() string { return filepath.Join(r.opts.Dir, "pprof.sock") }

// Profile fetches a pprof profile from relayd (Options.Profile): name is
// what follows /debug/pprof/ ("profile?seconds=10", "heap?gc=1",
// "allocs", "goroutine"). The result is what go tool pprof reads.
func (r *Relay) Profile(name string) ([]byte, error) {
	return r.debugGet("pprof/" + name)
}

// HeapDump has relayd write its heap dump, after a GC, to path
// (Options.Profile; read it with SizeClasses).
func (r *Relay) HeapDump(path string) error {
	_, err := r.debugGet("heapdump?path=" + url.QueryEscape(path))
	return err
}

// debugGet fetches /debug/ + what from relayd's profiling socket.
func (r *Relay) debugGet(what string) ([]byte, error) {
	if r.pprof == nil {
		return nil, errors.New("relayd runs without its pprof endpoint (Options.Profile)")
	}
	resp, err := r.pprof.Get("http://relayd/debug/" + what)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", what, resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

// HeapAfterGC returns relayd's heap right after a garbage collection,
// which the heap profile's gc=1 forces (Options.Profile): HeapInuse, the
// spans holding live objects, and HeapAlloc, the live objects themselves
// (the GC swept every span before it returned). The difference is what
// fragmentation keeps.
func (r *Relay) HeapAfterGC() (inuse, live float64, err error) {
	if _, err := r.Profile("heap?gc=1"); err != nil {
		return 0, 0, err
	}
	m, err := r.Metrics()
	if err != nil {
		return 0, 0, err
	}
	for name, v := range map[string]*float64{"go_memstats_heap_inuse_bytes": &inuse, "go_memstats_heap_alloc_bytes": &live} {
		if *v, err = sample(m, name); err != nil {
			return 0, 0, err
		}
	}
	return inuse, live, nil
}
