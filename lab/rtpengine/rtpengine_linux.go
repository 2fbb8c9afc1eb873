// Package rtpengine runs Debian's rtpengine-daemon inside a lab's relay
// namespace (or another, Options.NS), the anchor the lab comparison measures relayd against, and
// sets calls up on it over its ng control protocol.
//
// It runs in userspace (--table=-1: no kernel module, no iptables) unless
// Options.Kernel asks for its kernel module (kmod_linux.go: only in
// lab/vm's Debian 6.1 guest), in the foreground as a child of the test, with no configuration file
// (--config-file=none, so Debian's /etc/rtpengine/rtpengine.conf, which
// binds every address, is never read). Its media sockets are bound only to
// the lab's relay media addresses, 198.18.1.1 and 2001:2:0:1::1; its ng
// listener is 127.0.0.1:2223 of the relay namespace, which the Client
// reaches through a socket made inside that namespace. Nothing else
// listens: no CLI, HTTP or TCP control ports. It logs to a file.
//
// Install the package rtpengine-daemon without letting it start its
// service, which would bind every address with Debian's configuration:
//
//	printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
//	apt-get install -y --no-install-recommends rtpengine-daemon
//	systemctl disable rtpengine-daemon.service; systemctl mask rtpengine-daemon.service
//
// Tests skip when the daemon is missing (StartT).
package rtpengine

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/rtpengine/ngclient"
)

// DefaultBin is where the package rtpengine-daemon installs the daemon.
const DefaultBin = "/usr/bin/rtpengine"

// DefaultNGAddr is the ng listener inside the relay namespace: loopback
// there is private to the lab.
var DefaultNGAddr = netip.MustParseAddrPort("127.0.0.1:2223")

// ErrNotInstalled is returned by Start and Available when the daemon is
// missing.
var ErrNotInstalled = errors.New("rtpengine not installed (apt-get install rtpengine-daemon)")

// Options configure an Engine. The zero value is valid.
type Options struct {
	Bin string // the daemon; default DefaultBin
	// Dir holds the log (rtpengine.log). Default: a temporary directory
	// that Close removes.
	Dir string
	// PortMin and PortMax bound the media ports (--port-min,
	// --port-max); default 30000-39999. rtpengine takes an even RTP port
	// and the odd one above it for each stream.
	PortMin, PortMax int
	// Threads is --num-threads, the workers that relay media; 0 leaves
	// rtpengine's default, one per CPU.
	Threads int
	// NGAddr is the ng listener in the relay namespace; default
	// DefaultNGAddr. Only loopback or the lab's relay addresses are
	// allowed.
	NGAddr netip.AddrPort
	// LogLevel is rtpengine's --log-level (syslog levels: 6 info, 7
	// debug); default 6.
	LogLevel int
	// Client configures the ng client; the default waits 1 s per attempt
	// and retries twice.
	Client ngclient.Config
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
	// Kernel makes the daemon forward in the kernel through
	// xt_RTPENGINE's table Table (--table, --no-fallback: it does not
	// start without the module) instead of in userspace (--table=-1).
	// The module and the iptables rules must be in place (SetupKernel).
	Kernel bool
	Table  int
	// NS is the namespace to run in; default the lab's relay. With the
	// lab's relay2 (lab.AddRelay2), Media4 and Media6 default to its
	// media addresses.
	NS *lab.NS
	// Media4 and Media6 are the media addresses (--interface); default
	// the lab's relay media addresses, or relay2's when NS is relay2.
	Media4, Media6 netip.Addr
}

func (o *Options) validate(l *lab.Lab) error {
	if o.Bin == "" {
		o.Bin = DefaultBin
	}
	if o.PortMin == 0 && o.PortMax == 0 {
		o.PortMin, o.PortMax = 30000, 39999
	}
	if o.PortMin < 1024 || o.PortMax > 65535 || o.PortMin >= o.PortMax {
		return fmt.Errorf("port range %d-%d: want 1024 <= min < max <= 65535", o.PortMin, o.PortMax)
	}
	if o.Kernel && (o.Table < 0 || o.Table > 63) {
		return fmt.Errorf("kernel table %d: want 0-63", o.Table)
	}
	if o.Threads < 0 {
		return fmt.Errorf("threads %d: negative", o.Threads)
	}
	if !o.NGAddr.IsValid() {
		o.NGAddr = DefaultNGAddr
	}
	if o.NS == nil {
		o.NS = l.Relay
	}
	if !o.Media4.IsValid() && !o.Media6.IsValid() {
		o.Media4, o.Media6 = l.RelayMedia4, l.RelayMedia6
		if o.NS == l.Relay2 {
			o.Media4, o.Media6 = l.Relay2Media4, l.Relay2Media6
		}
	}
	switch a := o.NGAddr.Addr(); {
	case a.IsLoopback(), a == l.RelayMedia4, a == l.RelayMedia6, a == l.RelayCallerAddr4, a == l.RelayCalleeAddr4,
		l.Relay2 != nil && (a == l.Relay2Addr4 || a == l.Relay2Addr6):
	default:
		return fmt.Errorf("ng address %s: not loopback or a lab relay address", o.NGAddr)
	}
	if o.LogLevel == 0 {
		o.LogLevel = 6
	}
	if o.LogLevel < 1 || o.LogLevel > 7 {
		return fmt.Errorf("log level %d: want 1-7", o.LogLevel)
	}
	return nil
}

// Engine is an rtpengine process in a lab namespace (the relay's unless
// Options.NS says otherwise). Its exported
// fields are set by Start and must not be changed. It is safe for
// concurrent use.
type Engine struct {
	Lab     *lab.Lab
	Args    []string // the daemon's command line, program first
	LogPath string
	NS      *lab.NS        // where it runs
	NGAddr  netip.AddrPort // the ng listener, inside NS
	Relay4  netip.Addr     // media address in rewritten IPv4 SDP
	Relay6  netip.Addr     // and in IPv6 SDP

	opts    Options
	tempDir string // removed by Close
	cmd     *exec.Cmd
	exited  chan struct{}
	client  *ngclient.Client

	closeOnce sync.Once
	closeErr  error
}

// Available reports whether the daemon is installed at bin (DefaultBin
// if empty).
func Available(bin string) error {
	if bin == "" {
		bin = DefaultBin
	}
	if _, err := exec.LookPath(bin); err != nil {
		return fmt.Errorf("%w: %v", ErrNotInstalled, err)
	}
	return nil
}

// Version returns the daemon's version, such as "10.5.3.5-1+deb12u1".
func Version(bin string) (string, error) {
	if bin == "" {
		bin = DefaultBin
	}
	// rtpengine prints "Version: X" on stderr and exits before reading
	// any configuration.
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", bin, err, out)
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "Version: ")
	if !ok {
		return "", fmt.Errorf("%s --version: unexpected output %q", bin, out)
	}
	return v, nil
}

// StartT starts an Engine for a test and closes it in t.Cleanup. It skips
// the test, saying why, when the daemon is not installed; the lab skips
// it when not root.
func StartT(t testing.TB, l *lab.Lab, o Options) *Engine {
	t.Helper()
	if err := Available(o.Bin); err != nil {
		t.Skipf("rtpengine: %v", err)
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	e, err := Start(l, o)
	if err != nil {
		t.Fatalf("rtpengine: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rtpengine log:\n%s", e.tail(4000))
		}
		if err := e.Close(); err != nil {
			t.Errorf("rtpengine: close: %v", err)
		}
	})
	return e
}

// Start runs rtpengine in l's relay namespace and waits until it answers
// an ng ping.
func Start(l *lab.Lab, o Options) (_ *Engine, err error) {
	if err := o.validate(l); err != nil {
		return nil, fmt.Errorf("rtpengine options: %w", err)
	}
	if err := Available(o.Bin); err != nil {
		return nil, err
	}
	e := &Engine{
		Lab:    l,
		NS:     o.NS,
		NGAddr: o.NGAddr,
		Relay4: o.Media4,
		Relay6: o.Media6,
		opts:   o,
	}
	if o.Dir == "" {
		if e.tempDir, err = os.MkdirTemp("", "rtpengine-"); err != nil {
			return nil, err
		}
		o.Dir = e.tempDir
	} else if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Close())
		}
	}()
	e.LogPath = filepath.Join(o.Dir, "rtpengine.log")
	e.Args = append([]string{o.Bin}, e.args()...)

	logf, err := os.OpenFile(e.LogPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	e.cmd = o.NS.Command(e.Args[0], e.Args[1:]...)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	// Its own process group: a terminal's Ctrl-C goes to the caller,
	// which stops rtpengine in order.
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := e.cmd.Start(); err != nil {
		logf.Close()
		e.cmd = nil
		return nil, fmt.Errorf("start rtpengine: %w", err)
	}
	e.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		cmd.Wait()
		logf.Close()
		close(done)
	}(e.cmd, e.exited)

	network := "udp4"
	if o.NGAddr.Addr().Is6() {
		network = "udp6"
	}
	conn, err := o.NS.DialUDP(network, "", o.NGAddr.String())
	if err != nil {
		return nil, fmt.Errorf("ng socket in %s: %w", o.NS, err)
	}
	if e.client, err = ngclient.New(conn, o.Client); err != nil {
		conn.Close()
		return nil, err
	}
	if err := e.waitReady(15 * time.Second); err != nil {
		return nil, err
	}
	return e, nil
}

// args returns the daemon's arguments.
func (e *Engine) args() []string {
	o := e.opts
	a := []string{
		"--config-file=none", // never Debian's /etc/rtpengine/rtpengine.conf
		"--foreground",
		"--log-stderr",
		"--log-level=" + strconv.Itoa(o.LogLevel),
	}
	if o.Kernel {
		a = append(a, "--table="+strconv.Itoa(o.Table), "--no-fallback")
	} else {
		a = append(a, "--table=-1") // userspace forwarding, no kernel module
	}
	for _, m := range []netip.Addr{e.Relay4, e.Relay6} {
		if m.IsValid() {
			a = append(a, "--interface="+m.String())
		}
	}
	a = append(a, []string{
		"--listen-ng=" + o.NGAddr.String(),
		"--port-min=" + strconv.Itoa(o.PortMin),
		"--port-max=" + strconv.Itoa(o.PortMax),
		// Free a call's ports at delete, not 30 s later.
		"--delete-delay=0",
	}...)
	if o.Threads > 0 {
		a = append(a, "--num-threads="+strconv.Itoa(o.Threads))
	}
	return append(a, o.ExtraArgs...)
}

// waitReady pings until rtpengine answers, it exits or the time is up.
func (e *Engine) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-e.exited:
			return fmt.Errorf("rtpengine exited during start (%v): %s", e.cmd.ProcessState, e.tail(3000))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		last = e.client.Ping(ctx)
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("rtpengine not answering ng ping on %s after %v (%v): %s", e.NGAddr, limit, last, e.tail(3000))
}

func (e *Engine) tail(n int) string {
	b, _ := os.ReadFile(e.LogPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Log returns rtpengine's log so far.
func (e *Engine) Log() string { return e.tail(1 << 30) }

// Client returns the ng client, which reaches the daemon from inside the
// relay namespace. It is closed by Close.
func (e *Engine) Client() *ngclient.Client { return e.client }

// Pid returns the daemon's process id (the process itself: `ip netns
// exec` execs it), 0 if it is not running.
func (e *Engine) Pid() int {
	if e.cmd == nil || e.cmd.Process == nil {
		return 0
	}
	select {
	case <-e.exited:
		return 0
	default:
	}
	return e.cmd.Process.Pid
}

// Exited returns a channel closed when the daemon has exited.
func (e *Engine) Exited() <-chan struct{} { return e.exited }

// Close stops the daemon (SIGTERM, then SIGKILL after 10 s), closes the
// client and removes the temporary directory, if Start made one. It is
// idempotent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		var errs []error
		if e.client != nil {
			errs = append(errs, e.client.Close())
		}
		if e.cmd != nil {
			errs = append(errs, e.stop(10*time.Second))
		}
		if e.tempDir != "" {
			errs = append(errs, os.RemoveAll(e.tempDir))
		}
		e.closeErr = errors.Join(errs...)
	})
	return e.closeErr
}

func (e *Engine) stop(grace time.Duration) error {
	select {
	case <-e.exited:
		return nil
	default:
	}
	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop rtpengine: %w", err)
	}
	select {
	case <-e.exited:
		return nil
	case <-time.After(grace):
	}
	e.cmd.Process.Kill()
	<-e.exited
	return fmt.Errorf("rtpengine did not exit within %v of SIGTERM; killed", grace)
}
