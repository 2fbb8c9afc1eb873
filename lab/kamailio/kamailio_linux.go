// Package kamailio runs Debian's Kamailio 5.6 in a lab namespace as the
// SIP proxy in front of one or more media relays that speak rtpengine's ng
// protocol (rtpengine itself, or relayd's ng front end): the deployment an
// operator swaps rtpengine for relayd in without touching Kamailio.
//
// Kamailio runs in the foreground as a child of the test (-DD -E), with a
// configuration the package writes from a template into its directory
// (never Debian's /etc/kamailio): a stateful, record-routing proxy that
// sends every new INVITE to Options.Destination and calls the rtpengine
// module (rtpengine_offer, rtpengine_answer, rtpengine_delete) with the
// flags an operator uses, "replace-origin replace-session-connection
// ICE=remove", plus per-direction extra flags. It handles early offers
// (SDP in the INVITE) and late offers (SDP in the 2xx, answer in the ACK),
// deletes the call on BYE, CANCEL and failed final responses, and logs the
// call's counters ($rtpstat) at BYE; see RTPStats.
//
// Install the package kamailio (it holds the rtpengine module) without
// letting it start its service:
//
//	apt-get install -y --no-install-recommends kamailio
//	systemctl disable kamailio.service; systemctl mask kamailio.service
package kamailio

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/lab"
)

// DefaultBin is where the package kamailio installs the daemon.
const DefaultBin = "/usr/sbin/kamailio"

// DefaultModulePath is where the package kamailio installs its modules.
const DefaultModulePath = "/usr/lib/x86_64-linux-gnu/kamailio/modules"

// ErrNotInstalled is returned by Start and Available when Kamailio or its
// rtpengine module is missing.
var ErrNotInstalled = errors.New("kamailio not installed (apt-get install kamailio)")

// Node is one ng server of the rtpengine module's set.
type Node struct {
	Addr netip.AddrPort // its ng listener as Kamailio reaches it (UDP)
	// Weight balances new calls over the set (the module's "=N"); 0 is 1.
	Weight int
}

func (n Node) sock() string {
	proto := "udp"
	if n.Addr.Addr().Is6() {
		proto = "udp6"
	}
	s := proto + ":" + n.Addr.String()
	if n.Weight > 0 {
		s += "=" + strconv.Itoa(n.Weight)
	}
	return s
}

// DefaultFlags are the rtpengine flags every offer and answer carries.
var DefaultFlags = []string{"replace-origin", "replace-session-connection", "ICE=remove"}

// Options configure a Kamailio. The zero value is not valid: RTPEngines
// and Destination are required.
type Options struct {
	Bin        string // default DefaultBin
	ModulePath string // default DefaultModulePath
	// Dir holds kamailio.cfg and kamailio.log. Default: a temporary
	// directory that Close removes.
	Dir string
	// Listen is the SIP (UDP) address, in the namespace Kamailio runs in;
	// default the lab's relay media address, port 5060.
	Listen netip.AddrPort
	// Destination is where every new INVITE goes (the callee), required.
	Destination netip.AddrPort
	// Fallbacks are tried in turn, each when the destination before it
	// failed (a final response of 300 or more, or none in time).
	Fallbacks []netip.AddrPort
	// RTPEngines is the module's set, at least one node (rtpengine_sock),
	// unless NoMedia.
	RTPEngines []Node
	// NoMedia leaves the rtpengine module out: a SIP-only proxy.
	NoMedia bool
	// DisableTimeout is how long, in seconds, the module leaves a node
	// that did not answer disabled before it pings it again
	// (rtpengine_disable_tout); default 2. The module's own default is 60.
	DisableTimeout int
	// TimeoutMS is how long the module waits for each reply
	// (rtpengine_tout_ms); default 300. The module's default is 1000.
	TimeoutMS int
	// Retries is how many more times it sends a command that got no reply
	// (rtpengine_retr) before it disables the node and tries the next;
	// default 1. The module's default is 5.
	Retries int
	// QueriedNodesLimit caps how many nodes one command tries
	// (queried_nodes_limit); 0 leaves the module's default, all.
	QueriedNodesLimit int
	// Flags replace DefaultFlags when not nil.
	Flags []string
	// CalleeFlags are added to the commands whose rewritten SDP goes to
	// the callee (the INVITE's offer, a late offer's answer in the ACK),
	// such as "transport-protocol=RTP/SAVP"; CallerFlags to those whose
	// SDP goes to the caller (the answer in a reply, a late offer).
	CalleeFlags, CallerFlags []string
	// FinalResponseTimeoutMS (tm fr_timer) and InviteTimeoutMS (tm
	// fr_inv_timer); defaults 2000 and 10000.
	FinalResponseTimeoutMS, InviteTimeoutMS int
	// Children is the number of SIP worker processes; default 2.
	Children int
	// Debug is Kamailio's log level (debug=; 2 info, 3 debug); default 2.
	Debug int
	// SharedMemoryMB is its shared memory (-m), which holds the
	// transactions; default 32, too little for hundreds of calls a second.
	SharedMemoryMB int
}

func (o *Options) validate(l *lab.Lab) error {
	if o.Bin == "" {
		o.Bin = DefaultBin
	}
	if o.ModulePath == "" {
		o.ModulePath = DefaultModulePath
	}
	if !o.Listen.IsValid() {
		o.Listen = netip.AddrPortFrom(l.RelayMedia4, 5060)
	}
	if !o.Destination.IsValid() {
		return errors.New("no destination")
	}
	if len(o.RTPEngines) == 0 && !o.NoMedia {
		return errors.New("no rtpengine node")
	}
	for _, n := range o.RTPEngines {
		if !n.Addr.IsValid() || n.Weight < 0 {
			return fmt.Errorf("rtpengine node %+v: want an address and a weight >= 0", n)
		}
	}
	for _, a := range append([]netip.AddrPort{o.Listen, o.Destination}, o.Fallbacks...) {
		if !a.IsValid() || !labAddr(a.Addr()) {
			return fmt.Errorf("address %s: not loopback or in 198.18.0.0/15, 2001:2::/48", a)
		}
	}
	for _, n := range o.RTPEngines {
		if !labAddr(n.Addr.Addr()) {
			return fmt.Errorf("rtpengine node %s: not loopback or in 198.18.0.0/15, 2001:2::/48", n.Addr)
		}
	}
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&o.DisableTimeout, 2)
	def(&o.TimeoutMS, 300)
	def(&o.Retries, 1)
	def(&o.FinalResponseTimeoutMS, 2000)
	def(&o.InviteTimeoutMS, 10000)
	def(&o.Children, 2)
	def(&o.Debug, 2)
	def(&o.SharedMemoryMB, 32)
	if o.Flags == nil {
		o.Flags = DefaultFlags
	}
	if o.DisableTimeout < 0 || o.TimeoutMS < 0 || o.Retries < 0 || o.QueriedNodesLimit < 0 || o.Children < 0 {
		return errors.New("negative timeout, retries, limit or children")
	}
	return nil
}

var labPrefixes = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:2::/48")}

func labAddr(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	for _, p := range labPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Kamailio is a Kamailio process in a lab namespace. Its exported fields
// are set by Start and must not be changed. It is safe for concurrent use.
type Kamailio struct {
	NS         *lab.NS
	Listen     netip.AddrPort // its SIP address
	Args       []string       // the command line, program first
	ConfigPath string
	LogPath    string

	tempDir string
	cmd     *exec.Cmd
	exited  chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// Available reports whether Kamailio and its rtpengine module are
// installed.
func Available(bin, modulePath string) error {
	if bin == "" {
		bin = DefaultBin
	}
	if modulePath == "" {
		modulePath = DefaultModulePath
	}
	if _, err := exec.LookPath(bin); err != nil {
		return fmt.Errorf("%w: %v", ErrNotInstalled, err)
	}
	if _, err := os.Stat(filepath.Join(modulePath, "rtpengine.so")); err != nil {
		return fmt.Errorf("%w: %v", ErrNotInstalled, err)
	}
	return nil
}

// StartT starts Kamailio for a test and closes it in t.Cleanup, logging
// the end of its log when the test failed. It skips the test when
// Kamailio is not installed (fails it in CI: see internal/testenv).
func StartT(t testing.TB, l *lab.Lab, ns *lab.NS, o Options) *Kamailio {
	t.Helper()
	if err := Available(o.Bin, o.ModulePath); err != nil {
		testenv.Skip(t, "kamailio: %v", err)
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	k, err := Start(l, ns, o)
	if err != nil {
		t.Fatalf("kamailio: %v", err)
	}
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Errorf("kamailio: close: %v", err)
		}
		if t.Failed() {
			t.Logf("kamailio log:\n%s", k.tail(6000))
		}
	})
	return k
}

// Start writes the configuration and runs Kamailio in ns (the lab's
// relay if nil) until it listens on its SIP address.
func Start(l *lab.Lab, ns *lab.NS, o Options) (_ *Kamailio, err error) {
	if err := o.validate(l); err != nil {
		return nil, fmt.Errorf("kamailio options: %w", err)
	}
	if err := Available(o.Bin, o.ModulePath); err != nil {
		return nil, err
	}
	if ns == nil {
		ns = l.Relay
	}
	k := &Kamailio{NS: ns, Listen: o.Listen}
	if o.Dir == "" {
		if k.tempDir, err = os.MkdirTemp("", "kamailio-"); err != nil {
			return nil, err
		}
		o.Dir = k.tempDir
	} else if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, k.Close())
		}
	}()
	cfg, err := config(&o, o.ModulePath)
	if err != nil {
		return nil, err
	}
	k.ConfigPath = filepath.Join(o.Dir, "kamailio.cfg")
	k.LogPath = filepath.Join(o.Dir, "kamailio.log")
	if err := os.WriteFile(k.ConfigPath, cfg, 0o644); err != nil {
		return nil, err
	}
	runDir := filepath.Join(o.Dir, "run")
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, err
	}
	k.Args = []string{o.Bin,
		"-DD", // stay in the foreground, a child of the test
		"-E",  // log to stderr, into the log file
		"-f", k.ConfigPath,
		"-Y", runDir,
		"-P", filepath.Join(runDir, "kamailio.pid"),
		"-w", o.Dir,
		"-m", strconv.Itoa(o.SharedMemoryMB), "-M", "4",
	}
	logf, err := os.OpenFile(k.LogPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	k.cmd = ns.Command(k.Args[0], k.Args[1:]...)
	k.cmd.Stdout, k.cmd.Stderr = logf, logf
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := k.cmd.Start(); err != nil {
		logf.Close()
		k.cmd = nil
		return nil, fmt.Errorf("start kamailio: %w", err)
	}
	k.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		cmd.Wait()
		logf.Close()
		close(done)
	}(k.cmd, k.exited)
	if err := k.waitReady(10 * time.Second); err != nil {
		return nil, err
	}
	return k, nil
}

// waitReady waits until Kamailio answers an OPTIONS on its address (with
// 405: the configuration proxies only INVITEs), it exits or the time is
// up.
func (k *Kamailio) waitReady(limit time.Duration) error {
	network := "udp4"
	if k.Listen.Addr().Is6() {
		network = "udp6"
	}
	conn, err := k.NS.DialUDP(network, "", k.Listen.String())
	if err != nil {
		return fmt.Errorf("probe socket in %s: %w", k.NS, err)
	}
	defer conn.Close()
	local := conn.LocalAddr().String()
	deadline := time.Now().Add(limit)
	buf := make([]byte, 4096)
	for n := 0; time.Now().Before(deadline); n++ {
		select {
		case <-k.exited:
			return fmt.Errorf("kamailio exited during start (%v): %s", k.cmd.ProcessState, k.tail(3000))
		default:
		}
		msg := fmt.Sprintf("OPTIONS sip:probe@%[1]s SIP/2.0\r\nVia: SIP/2.0/UDP %[2]s;branch=z9hG4bK-probe%[3]d\r\n"+
			"From: <sip:probe@%[2]s>;tag=probe\r\nTo: <sip:probe@%[1]s>\r\nCall-ID: probe-%[3]d@lab\r\nCSeq: 1 OPTIONS\r\n"+
			"Max-Forwards: 2\r\nContent-Length: 0\r\n\r\n", k.Listen, local, n)
		conn.Write([]byte(msg))
		conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if m, err := conn.Read(buf); err == nil && strings.HasPrefix(string(buf[:m]), "SIP/2.0 ") {
			return nil
		}
	}
	return fmt.Errorf("kamailio not answering on %s after %v: %s", k.Listen, limit, k.tail(3000))
}

func (k *Kamailio) tail(n int) string {
	b, _ := os.ReadFile(k.LogPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Log returns Kamailio's log so far.
func (k *Kamailio) Log() string { return k.tail(1 << 30) }

// CPU returns the user and system time of every process of Kamailio's:
// the main process and its children.
func (k *Kamailio) CPU() (time.Duration, error) {
	main := k.cmd.Process.Pid
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var ticks int64
	found := false
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		// After "pid (comm) ": state, ppid, ... utime and stime are the
		// 12th and 13th fields.
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			continue
		}
		if pid, _ := strconv.Atoi(d.Name()); pid == main {
			found = true
		} else if ppid, _ := strconv.Atoi(f[1]); ppid != main {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	if !found {
		return 0, fmt.Errorf("kamailio (%d) is gone", main)
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil // USER_HZ is 100
}

// Exited returns a channel closed when Kamailio has exited.
func (k *Kamailio) Exited() <-chan struct{} { return k.exited }

// Close stops Kamailio (SIGTERM to its process group, SIGKILL after 5 s)
// and removes the temporary directory, if Start made one. Idempotent.
func (k *Kamailio) Close() error {
	k.closeOnce.Do(func() {
		var errs []error
		if k.cmd != nil {
			errs = append(errs, k.stop(5*time.Second))
		}
		if k.tempDir != "" {
			errs = append(errs, os.RemoveAll(k.tempDir))
		}
		k.closeErr = errors.Join(errs...)
	})
	return k.closeErr
}

func (k *Kamailio) stop(grace time.Duration) error {
	select {
	case <-k.exited:
		return nil
	default:
	}
	// The main process stops its children; the group catches any left.
	pgid := -k.cmd.Process.Pid
	if err := syscall.Kill(pgid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop kamailio: %w", err)
	}
	select {
	case <-k.exited:
		return nil
	case <-time.After(grace):
	}
	syscall.Kill(pgid, syscall.SIGKILL)
	<-k.exited
	return fmt.Errorf("kamailio did not exit within %v of SIGTERM; killed", grace)
}

// Counters are packets, bytes and errors as $rtpstat reports them.
type Counters struct {
	Bytes, Packets, Errors int64
}

// RTPStat is one call's $rtpstat line, logged at its BYE: the relay's
// totals for the call (all streams, both directions) from an ng query.
type RTPStat struct {
	CallID string
	Node   string // the ng URL of the relay that anchors the call, as the module names it
	// OK is false when the query failed (the relay is gone): the counters
	// are then zero.
	OK        bool
	RTP, RTCP Counters
}

var rtpstatLine = regexp.MustCompile(`RTPSTAT ci=(\S+) node=(\S*) (?:RTP: (-?\d+) bytes, (-?\d+) packets, (-?\d+) errors; RTCP: (-?\d+) bytes, (-?\d+) packets, (-?\d+) errors)?`)

// RTPStats returns the $rtpstat lines logged so far, in order.
func (k *Kamailio) RTPStats() []RTPStat {
	var out []RTPStat
	sc := bufio.NewScanner(strings.NewReader(k.Log()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := rtpstatLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		s := RTPStat{CallID: m[1], Node: m[2], OK: m[3] != ""}
		if s.OK {
			n := make([]int64, 6)
			for i := range n {
				n[i], _ = strconv.ParseInt(m[3+i], 10, 64)
			}
			s.RTP = Counters{Bytes: n[0], Packets: n[1], Errors: n[2]}
			s.RTCP = Counters{Bytes: n[3], Packets: n[4], Errors: n[5]}
		}
		out = append(out, s)
	}
	return out
}

// Lines returns the log lines that contain word (such as "OFFER ci=",
// "DELETE ci=", "MOS ci=").
func (k *Kamailio) Lines(word string) []string {
	var out []string
	for _, line := range strings.Split(k.Log(), "\n") {
		if strings.Contains(line, word) {
			out = append(out, line)
		}
	}
	return out
}
