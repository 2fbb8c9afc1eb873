package fwpair

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/minfwd"
)

// Pair is a built firewall pair; see the package documentation. Its
// exported fields are set by New and must not be changed. A Pair is safe
// for concurrent use; Close (or the end of New's context) tears it down.
// The zero value is not usable.
type Pair struct {
	LAN, WAN             *lab.NS    // the hosts: the caller side and the callee side
	FW                   [2]*lab.NS // fw1 and fw2
	LANSwitch, WANSwitch *lab.NS    // the bridges
	LANHostIf, WANHostIf lab.Iface  // the hosts' eth0, in LAN and WAN

	LANAddrs, WANAddrs   []netip.Addr  // the hosts' addresses (Config.HostAddrs each)
	LANVIP, WANVIP       netip.Addr    // the virtual addresses, the hosts' gateways
	LANPrefix, WANPrefix netip.Prefix  // the two subnets
	LANFWAddrs           [2]netip.Addr // fw1's and fw2's own addresses on the LAN
	WANFWAddrs           [2]netip.Addr // and on the WAN
	Dir                  string        // the daemons' configuration, logs and sockets

	cfg    Config
	prefix string
	files  [2]fwFiles
	fwd    []*minfwd.Forwarder
	stop   chan struct{} // closed by Close: ends the context watcher

	logMu sync.Mutex // serialises writes to cfg.Log

	mu      sync.Mutex // guards the following
	events  []Event
	state   [2]map[string]instState // instance name -> last transition
	changed chan struct{}           // closed and replaced on every transition
	procs   [2]map[string]*proc     // "keepalived", "conntrackd"
	failed  *injected
	closed  bool

	closeOnce sync.Once
	closeErr  error // set by the first Close
}

// instState is the last state keepalived logged for an instance.
type instState struct {
	state string // MASTER, BACKUP, FAULT or STOPPED
	at    time.Time
}

// injected is the failure in force.
type injected struct {
	kind Failure
	fw   int
}

// proc is a daemon the pair started, in its own process group.
type proc struct {
	cmd      *exec.Cmd
	done     chan struct{} // closed when it has exited
	readDone chan struct{} // closed when its output has been read to the end
}

var pairSeq atomic.Uint64

// roles are the namespace name suffixes.
var roles = [...]string{"lan", "wan", "fw1", "fw2", "lansw", "wansw"}

// staleName matches namespaces with a default prefix; the number after fp
// is the pid of the process that made them.
var staleName = regexp.MustCompile(`^fp([0-9]+)-[0-9]+-(lan|wan|fw1|fw2|lansw|wansw)$`)

// New builds the pair, starts its daemons and returns when one firewall
// is MASTER for both VIPs and a LAN-to-WAN probe (with its reply) crosses
// the pair. It first removes what a crashed earlier run with the same
// prefix left (namespaces, the processes in them, the directory). When ctx
// ends, the pair is torn down as by Close; on error New tears down what it
// built.
func New(ctx context.Context, cfg Config) (_ *Pair, err error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("fwpair config: %w", err)
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = fmt.Sprintf("fp%d-%d-", os.Getpid(), pairSeq.Add(1))
	}
	if err := removeStale(prefix); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fwpair-"+prefix)
	if err != nil {
		return nil, fmt.Errorf("fwpair: %w", err)
	}
	p := &Pair{
		LANAddrs:   hostAddrs(lanHost0, cfg.HostAddrs),
		WANAddrs:   hostAddrs(wanHost0, cfg.HostAddrs),
		LANVIP:     lanVIP,
		WANVIP:     wanVIP,
		LANPrefix:  netip.PrefixFrom(lanVIP, subnetBits).Masked(),
		WANPrefix:  netip.PrefixFrom(wanVIP, subnetBits).Masked(),
		LANFWAddrs: lanFW,
		WANFWAddrs: wanFW,
		Dir:        dir,
		cfg:        cfg,
		prefix:     prefix,
		stop:       make(chan struct{}),
		changed:    make(chan struct{}),
	}
	for fw := range 2 {
		p.files[fw] = newFWFiles(dir, fw)
		p.state[fw] = map[string]instState{}
		p.procs[fw] = map[string]*proc{}
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
		}
	}()
	if err := p.build(); err != nil {
		return nil, fmt.Errorf("build firewall pair %s: %w", prefix, err)
	}
	if err := p.start(ctx); err != nil {
		return nil, fmt.Errorf("start firewall pair %s: %w", prefix, err)
	}
	go func() {
		select {
		case <-ctx.Done():
			p.Close()
		case <-p.stop:
		}
	}()
	return p, nil
}

func hostAddrs(first netip.Addr, n int) []netip.Addr {
	addrs := make([]netip.Addr, n)
	a := first
	for i := range addrs {
		addrs[i] = a
		a = a.Next()
	}
	return addrs
}

// removeStale deletes the namespaces (and kills the processes in them) of
// prefix, and those with a default prefix whose process is gone, and their
// directories.
func removeStale(prefix string) error {
	var errs []error
	entries, err := os.ReadDir("/run/netns")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale namespaces: %w", err)
	}
	mine := map[string]bool{}
	for _, r := range roles {
		mine[prefix+r] = true
	}
	stalePrefixes := map[string]bool{prefix: true}
	for _, e := range entries {
		name := e.Name()
		if !mine[name] {
			m := staleName.FindStringSubmatch(name)
			if m == nil || !orphaned(m[1]) {
				continue
			}
			stalePrefixes[strings.TrimSuffix(name, m[2])] = true
		}
		killNS(filepath.Join("/run/netns", name))
		if err := lab.DeleteNS(name); err != nil {
			errs = append(errs, fmt.Errorf("remove stale namespace: %w", err))
		}
	}
	for sp := range stalePrefixes {
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "fwpair-"+sp+"[0-9]*"))
		for _, d := range dirs {
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, fmt.Errorf("remove stale directory: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// orphaned reports whether the process pid (decimal) no longer runs.
func orphaned(pid string) bool {
	n, err := strconv.Atoi(pid)
	if err != nil || n <= 0 || n == os.Getpid() {
		return false
	}
	return errors.Is(unix.Kill(n, 0), unix.ESRCH)
}

// nsPids returns the processes whose network namespace is the one bound
// at path, except this one (whose main thread may be visiting it).
func nsPids(path string) []int {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc", e.Name(), "ns/net"), &st) != nil {
			continue
		}
		if st.Ino == want.Ino && st.Dev == want.Dev {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killNS kills every process in the namespace at path and waits briefly
// for them to go.
func killNS(path string) {
	for range 50 {
		pids := nsPids(path)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// nlHandle returns an rtnetlink handle in ns; the caller closes it.
func nlHandle(ns *lab.NS) (*netlink.Handle, error) {
	fd, err := netns.GetFromPath(ns.Path())
	if err != nil {
		return nil, fmt.Errorf("open namespace %s: %w", ns, err)
	}
	defer fd.Close()
	h, err := netlink.NewHandleAt(fd, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", ns, err)
	}
	return h, nil
}

// link is one end of a veth.
type link struct {
	ns   *lab.NS
	name string
}

// build creates the namespaces, links, addresses, routes and rules.
func (p *Pair) build() error {
	for i, np := range []**lab.NS{&p.LAN, &p.WAN, &p.FW[0], &p.FW[1], &p.LANSwitch, &p.WANSwitch} {
		ns, err := lab.NewNS(p.prefix + roles[i])
		if err != nil {
			return err
		}
		*np = ns
	}
	// Each veth is made in a switch (or fw1) with its peer directly in the
	// other namespace.
	veths := []struct {
		ns         *lab.NS
		name, peer string
		peerNS     *lab.NS
	}{
		{p.LANSwitch, "host", HostIfName, p.LAN},
		{p.LANSwitch, "fw1", LANIfName, p.FW[0]},
		{p.LANSwitch, "fw2", LANIfName, p.FW[1]},
		{p.WANSwitch, "host", HostIfName, p.WAN},
		{p.WANSwitch, "fw1", WANIfName, p.FW[0]},
		{p.WANSwitch, "fw2", WANIfName, p.FW[1]},
		{p.FW[0], SyncIfName, SyncIfName, p.FW[1]},
	}
	var links []link
	for _, v := range veths {
		if err := v.ns.AddVeth(v.name, v.peer, v.peerNS); err != nil {
			return err
		}
		links = append(links, link{v.ns, v.name}, link{v.peerNS, v.peer})
	}
	for _, sw := range []*lab.NS{p.LANSwitch, p.WANSwitch} {
		if err := makeBridge(sw, "host", "fw1", "fw2"); err != nil {
			return err
		}
	}
	for _, ns := range []*lab.NS{p.LAN, p.WAN, p.FW[0], p.FW[1], p.LANSwitch, p.WANSwitch} {
		if err := ns.SetLinkUp("lo"); err != nil {
			return err
		}
	}
	// Tx checksum offload off, so locally generated UDP (the hosts',
	// VRRP's, conntrackd's) carries a full checksum even when XDP forwards
	// it; GRO on, so that a veth accepts frames XDP redirects into its peer.
	for _, k := range links {
		if err := k.ns.SetTxChecksum(k.name, false); err != nil {
			return err
		}
		if err := k.ns.SetLinkUp(k.name); err != nil {
			return err
		}
		if err := k.ns.SetGRO(k.name, true); err != nil {
			return err
		}
	}
	for fw, ns := range p.FW {
		for _, key := range []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/forwarding"} {
			if err := ns.SetSysctl(key, "1"); err != nil {
				return err
			}
		}
		for _, a := range []struct {
			ifname string
			addr   netip.Addr
		}{{LANIfName, lanFW[fw]}, {WANIfName, wanFW[fw]}, {SyncIfName, syncAddr[fw]}} {
			if err := ns.AddAddr(a.ifname, netip.PrefixFrom(a.addr, subnetBits)); err != nil {
				return err
			}
		}
	}
	for _, h := range []struct {
		ns    *lab.NS
		addrs []netip.Addr
		gw    netip.Addr
		iff   *lab.Iface
	}{{p.LAN, p.LANAddrs, lanVIP, &p.LANHostIf}, {p.WAN, p.WANAddrs, wanVIP, &p.WANHostIf}} {
		for _, a := range h.addrs {
			if err := h.ns.AddAddr(HostIfName, netip.PrefixFrom(a, subnetBits)); err != nil {
				return err
			}
		}
		if err := h.ns.AddRoute(HostIfName, netip.PrefixFrom(netip.IPv4Unspecified(), 0), h.gw); err != nil {
			return err
		}
		iff, err := h.ns.Iface(HostIfName)
		if err != nil {
			return err
		}
		*h.iff = iff
	}
	for fw, ns := range p.FW {
		f := p.files[fw]
		if err := os.MkdirAll(f.dir, 0o700); err != nil {
			return err
		}
		for _, w := range []struct {
			path, text string
			mode       os.FileMode
		}{
			{f.nftRules, nftRules(&p.cfg), 0o600},
			{f.track, "0\n", 0o600},
			{f.notify, notifyScript(&p.cfg, f), 0o700},
			{f.keepalivedConf, keepalivedConf(&p.cfg, f, fw), 0o600},
			{f.conntrackdConf, conntrackdConf(f, fw), 0o600},
		} {
			if err := os.WriteFile(w.path, []byte(w.text), w.mode); err != nil {
				return err
			}
		}
		if out, err := ns.Command("nft", "-f", f.nftRules).CombinedOutput(); err != nil {
			return fmt.Errorf("nft in %s: %w: %s", ns, err, bytesTrim(out))
		}
	}
	return nil
}

func bytesTrim(b []byte) string { return strings.TrimSpace(string(b)) }

// makeBridge creates the bridge in sw with ports and sets it up.
func makeBridge(sw *lab.NS, ports ...string) error {
	h, err := nlHandle(sw)
	if err != nil {
		return err
	}
	defer h.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: BridgeIfName}}
	if err := h.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge in %s: %w", sw, err)
	}
	for _, name := range ports {
		l, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("interface %s in %s: %w", name, sw, err)
		}
		if err := h.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attach %s to the bridge in %s: %w", name, sw, err)
		}
	}
	if err := h.LinkSetUp(br); err != nil {
		return fmt.Errorf("set bridge up in %s: %w", sw, err)
	}
	return nil
}

// start attaches the XDP forwarder, starts the daemons and waits until the
// pair forwards.
func (p *Pair) start(ctx context.Context) error {
	if p.cfg.Forwarder == ForwarderXDP {
		for _, ns := range p.FW {
			f, err := minfwd.Attach(ns.Path(), LANIfName, WANIfName)
			if err != nil {
				return fmt.Errorf("xdp forwarder in %s: %w", ns, err)
			}
			p.fwd = append(p.fwd, f)
		}
	}
	for fw := range 2 {
		if p.cfg.Conntrackd {
			if err := p.startConntrackd(ctx, fw); err != nil {
				return err
			}
		}
	}
	for fw := range 2 {
		if err := p.startKeepalived(fw); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second+5*p.cfg.Advert)
	defer cancel()
	// fw1, the higher priority, ends up master: wait for that steady
	// state, not for fw2 winning a race at start and being preempted.
	if _, err := p.WaitMaster(ctx, 0); err != nil {
		return err
	}
	if err := p.waitVIPs(ctx, 0); err != nil {
		return err
	}
	if p.cfg.Conntrackd {
		if err := p.waitNotify(ctx, 0, "MASTER done"); err != nil {
			return err
		}
	}
	return p.probe(ctx)
}

// startProc starts name with args in fw's namespace in its own process
// group, its output read line by line into events.
func (p *Pair) startProc(fw int, source string, args ...string) (*proc, error) {
	cmd := p.FW[fw].Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start %s in %s: %w", args[0], p.FW[fw], err)
	}
	w.Close()
	pr := &proc{cmd: cmd, done: make(chan struct{}), readDone: make(chan struct{})}
	go func() {
		defer close(pr.readDone)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.line(fw, source, sc.Text(), time.Now())
		}
	}()
	go func() {
		cmd.Wait()
		if source == SourceKeepalived {
			p.setState(fw, "LAN", "STOPPED", time.Now())
			p.setState(fw, "WAN", "STOPPED", time.Now())
		}
		close(pr.done)
	}()
	return pr, nil
}

func (p *Pair) startKeepalived(fw int) error {
	f := p.files[fw]
	// A killed keepalived leaves its pid files, and its children may
	// linger as zombies where nothing reaps orphans: keepalived would
	// take them for a running instance.
	for _, pf := range []string{f.pid, f.vrrpPid, f.checkersPid} {
		os.Remove(pf)
	}
	pr, err := p.startProc(fw, SourceKeepalived, "keepalived", "-n", "-l", "-D", "--vrrp",
		"-f", f.keepalivedConf, "-p", f.pid, "-r", f.vrrpPid, "-c", f.checkersPid)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.procs[fw][SourceKeepalived] = pr
	p.mu.Unlock()
	return nil
}

// startConntrackd starts conntrackd in console mode and waits for its
// control socket.
func (p *Pair) startConntrackd(ctx context.Context, fw int) error {
	f := p.files[fw]
	os.Remove(f.lock) // left by a killed one
	os.Remove(f.ctlSocket)
	pr, err := p.startProc(fw, SourceConntrackd, "conntrackd", "-C", f.conntrackdConf)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.procs[fw][SourceConntrackd] = pr
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		if _, err := os.Stat(f.ctlSocket); err == nil {
			return nil
		}
		select {
		case <-pr.done:
			return fmt.Errorf("conntrackd in %s exited: %v", p.FW[fw], pr.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("conntrackd in %s: control socket: %w", p.FW[fw], ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

var (
	keepalivedDate = regexp.MustCompile(`^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}: `)
	conntrackdDate = regexp.MustCompile(`^\[[^]]*\] \(pid=\d+\) `)
	transition     = regexp.MustCompile(`\((LAN|WAN)\) Entering (\w+) STATE`)
)

// line records one line of a daemon's output.
func (p *Pair) line(fw int, source, text string, at time.Time) {
	if p.cfg.Log != nil {
		p.logMu.Lock()
		fmt.Fprintf(p.cfg.Log, "fw%d %s: %s\n", fw+1, source, text)
		p.logMu.Unlock()
	}
	text = keepalivedDate.ReplaceAllString(text, "")
	text = conntrackdDate.ReplaceAllString(text, "")
	p.mu.Lock()
	p.events = append(p.events, Event{Time: at, FW: fw, Source: source, Text: text})
	p.mu.Unlock()
	if m := transition.FindStringSubmatch(text); m != nil {
		p.setState(fw, m[1], m[2], at)
	}
}

func (p *Pair) setState(fw int, instance, state string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state[fw][instance] = instState{state, at}
	close(p.changed)
	p.changed = make(chan struct{})
}

// masterSince reports whether keepalived of fw logged MASTER for both
// instances last, and since when.
func (p *Pair) masterSince(fw int) (time.Time, bool) {
	lan, wan := p.state[fw]["LAN"], p.state[fw]["WAN"]
	if lan.state != "MASTER" || wan.state != "MASTER" {
		return time.Time{}, false
	}
	if lan.at.After(wan.at) {
		return lan.at, true
	}
	return wan.at, true
}

// WaitMaster waits until keepalived of fw (0 or 1) has logged its entry
// into MASTER state for both instances (and has not left it), and returns
// when the later one arrived; at once when fw is MASTER already. It fails
// when fw's keepalived is not running.
func (p *Pair) WaitMaster(ctx context.Context, fw int) (time.Time, error) {
	if fw != 0 && fw != 1 {
		return time.Time{}, fmt.Errorf("firewall %d: want 0 or 1", fw)
	}
	for {
		p.mu.Lock()
		at, ok := p.masterSince(fw)
		ch := p.changed
		var exited chan struct{}
		if ka := p.procs[fw][SourceKeepalived]; ka != nil {
			exited = ka.done
		}
		p.mu.Unlock()
		if ok {
			return at, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("wait for fw%d to be master: %w", fw+1, ctx.Err())
		case <-exited:
			return time.Time{}, fmt.Errorf("wait for fw%d to be master: its keepalived is not running", fw+1)
		case <-ch:
		}
	}
}

// waitVIPs waits until fw holds both VIPs and the other firewall none
// (keepalived logs the transition before it adds the VIPs).
func (p *Pair) waitVIPs(ctx context.Context, fw int) error {
	for {
		m, err := p.Master()
		if err == nil && m == fw {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the VIPs on fw%d: %w", fw+1, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitNotify waits until fw's notify log has a line ending in text.
func (p *Pair) waitNotify(ctx context.Context, fw int, text string) error {
	for {
		for _, e := range p.notifyEvents(fw) {
			if strings.HasSuffix(e.Text, text) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for fw%d's notify script (%s): %w", fw+1, text, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// notifyEvents reads fw's notify log.
func (p *Pair) notifyEvents(fw int) []Event {
	b, err := os.ReadFile(p.files[fw].notifyLog)
	if err != nil {
		return nil
	}
	var evs []Event
	for l := range strings.Lines(string(b)) {
		ts, text, ok := strings.Cut(strings.TrimSpace(l), " ")
		if !ok {
			continue
		}
		ns, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			continue
		}
		evs = append(evs, Event{Time: time.Unix(0, ns), FW: fw, Source: SourceNotify, Text: text})
	}
	return evs
}

// probePort is the WAN host's UDP port New probes the pair with.
const probePort = 9999

// probe sends from the LAN host to the WAN host until a packet and its
// echo cross the pair.
func (p *Pair) probe(ctx context.Context) error {
	dst := netip.AddrPortFrom(p.WANAddrs[0], probePort)
	echo, err := p.WAN.ListenUDP("udp4", dst.String())
	if err != nil {
		return err
	}
	defer echo.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := echo.ReadFromUDPAddrPort(buf)
			if err != nil {
				return // closed
			}
			echo.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	c, err := p.LAN.DialUDP("udp4", netip.AddrPortFrom(p.LANAddrs[0], 0).String(), dst.String())
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 64)
	for {
		if _, err := c.Write([]byte("fwpair probe")); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("probe: %w", err)
		}
		c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if n, err := c.Read(buf); err == nil && string(buf[:n]) == "fwpair probe" {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("probe %s through the pair: %w", dst, ctx.Err())
		}
	}
}

// hasAddr reports whether ifname in ns has addr.
func hasAddr(h *netlink.Handle, ifname string, addr netip.Addr) (bool, error) {
	l, err := h.LinkByName(ifname)
	if err != nil {
		return false, err
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return false, err
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
			return true, nil
		}
	}
	return false, nil
}

// vips reports whether fw holds the LAN and the WAN VIP.
func (p *Pair) vips(fw int) (lanOK, wanOK bool, err error) {
	h, err := nlHandle(p.FW[fw])
	if err != nil {
		return false, false, err
	}
	defer h.Close()
	if lanOK, err = hasAddr(h, LANIfName, lanVIP); err != nil {
		return false, false, fmt.Errorf("addresses in %s: %w", p.FW[fw], err)
	}
	if wanOK, err = hasAddr(h, WANIfName, wanVIP); err != nil {
		return false, false, fmt.Errorf("addresses in %s: %w", p.FW[fw], err)
	}
	return lanOK, wanOK, nil
}

// Master returns which firewall (0 or 1) holds both VIPs, from the
// addresses in each namespace. It is an error when neither does, or both
// hold one (a split or a failover under way).
func (p *Pair) Master() (int, error) {
	var holds [2][2]bool
	for fw := range 2 {
		l, w, err := p.vips(fw)
		if err != nil {
			return -1, err
		}
		holds[fw] = [2]bool{l, w}
	}
	switch {
	case holds[0] == [2]bool{true, true} && holds[1] == [2]bool{}:
		return 0, nil
	case holds[1] == [2]bool{true, true} && holds[0] == [2]bool{}:
		return 1, nil
	}
	return -1, fmt.Errorf("no single master: fw1 holds lan/wan VIP %v, fw2 %v", holds[0], holds[1])
}

// Fail makes the current master fail in the way kind says and returns the
// instant the failure was injected (just before the first action). Only
// one failure can be in force; Recover undoes it. Fail is not meant to be
// called concurrently with itself or Recover.
func (p *Pair) Fail(ctx context.Context, kind Failure) (time.Time, error) {
	p.mu.Lock()
	closed, failed := p.closed, p.failed
	p.mu.Unlock()
	if closed {
		return time.Time{}, errors.New("fail: pair closed")
	}
	if failed != nil {
		return time.Time{}, fmt.Errorf("fail: %v of fw%d not recovered yet", failed.kind, failed.fw+1)
	}
	fw, err := p.Master()
	if err != nil {
		return time.Time{}, fmt.Errorf("fail: %w", err)
	}
	p.mu.Lock()
	ka, ct := p.procs[fw][SourceKeepalived], p.procs[fw][SourceConntrackd]
	p.mu.Unlock()
	var at time.Time
	switch kind {
	case StopKeepalived:
		at = time.Now()
		if err := ka.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			return time.Time{}, fmt.Errorf("fail: stop keepalived: %w", err)
		}
		if err := waitDone(ctx, ka); err != nil {
			return time.Time{}, fmt.Errorf("fail: stop keepalived: %w", err)
		}
	case LowerPriority:
		at = time.Now()
		if err := os.WriteFile(p.files[fw].track, []byte("1\n"), 0o600); err != nil {
			return time.Time{}, fmt.Errorf("fail: %w", err)
		}
	case CutLinks:
		h, err := nlHandle(p.FW[fw])
		if err != nil {
			return time.Time{}, fmt.Errorf("fail: %w", err)
		}
		defer h.Close()
		var ls []netlink.Link
		for _, name := range []string{LANIfName, WANIfName, SyncIfName} {
			l, err := h.LinkByName(name)
			if err != nil {
				return time.Time{}, fmt.Errorf("fail: interface %s in %s: %w", name, p.FW[fw], err)
			}
			ls = append(ls, l)
		}
		at = time.Now()
		for _, l := range ls {
			if err := h.LinkSetDown(l); err != nil {
				return time.Time{}, fmt.Errorf("fail: set %s down in %s: %w", l.Attrs().Name, p.FW[fw], err)
			}
		}
	case KillDaemons:
		at = time.Now()
		for _, pr := range []*proc{ka, ct} {
			if pr != nil {
				syscall.Kill(-pr.cmd.Process.Pid, syscall.SIGKILL)
			}
		}
		for _, pr := range []*proc{ka, ct} {
			if pr != nil {
				if err := waitDone(ctx, pr); err != nil {
					return time.Time{}, fmt.Errorf("fail: kill daemons: %w", err)
				}
			}
		}
	default:
		return time.Time{}, fmt.Errorf("fail: unknown failure %v", kind)
	}
	p.mu.Lock()
	p.failed = &injected{kind, fw}
	p.events = append(p.events, Event{Time: at, FW: fw, Source: SourceLab, Text: "fail " + kind.String()})
	p.mu.Unlock()
	return at, nil
}

func waitDone(ctx context.Context, pr *proc) error {
	select {
	case <-pr.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Recover undoes the failure in force and returns when it did so: the
// daemons are started again (conntrackd first, with a stale lock file
// removed), the priority restored or the links set up. With preemption the
// VIPs then move back to the recovered firewall; WaitMaster tells when.
func (p *Pair) Recover(ctx context.Context) (time.Time, error) {
	p.mu.Lock()
	f := p.failed
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return time.Time{}, errors.New("recover: pair closed")
	}
	if f == nil {
		return time.Time{}, errors.New("recover: no failure in force")
	}
	at := time.Now()
	var err error
	switch f.kind {
	case StopKeepalived:
		err = p.startKeepalived(f.fw)
	case LowerPriority:
		err = os.WriteFile(p.files[f.fw].track, []byte("0\n"), 0o600)
	case CutLinks:
		for _, name := range []string{SyncIfName, LANIfName, WANIfName} {
			if err = p.FW[f.fw].SetLinkUp(name); err != nil {
				break
			}
		}
	case KillDaemons:
		if p.cfg.Conntrackd {
			err = p.startConntrackd(ctx, f.fw)
		}
		if err == nil {
			err = p.startKeepalived(f.fw)
		}
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("recover from %v: %w", f.kind, err)
	}
	p.mu.Lock()
	p.failed = nil
	p.events = append(p.events, Event{Time: at, FW: f.fw, Source: SourceLab, Text: "recover " + f.kind.String()})
	p.mu.Unlock()
	return at, nil
}

// Events returns what happened so far, oldest first: the daemons' output
// lines (VRRP transitions among them), the notify script's steps and the
// failures and recoveries injected.
func (p *Pair) Events() []Event {
	p.mu.Lock()
	evs := slices.Clone(p.events)
	p.mu.Unlock()
	for fw := range 2 {
		evs = append(evs, p.notifyEvents(fw)...)
	}
	slices.SortStableFunc(evs, func(a, b Event) int { return a.Time.Compare(b.Time) })
	return evs
}

// Counters returns the statistics of each firewall's lan, wan and sync
// interfaces, indexed by firewall and interface name: a measure of what
// crossed the pair independent of the traffic's own.
func (p *Pair) Counters() ([2]map[string]Counters, error) {
	var out [2]map[string]Counters
	for fw := range 2 {
		h, err := nlHandle(p.FW[fw])
		if err != nil {
			return out, err
		}
		out[fw] = map[string]Counters{}
		for _, name := range []string{LANIfName, WANIfName, SyncIfName} {
			l, err := h.LinkByName(name)
			if err != nil {
				h.Close()
				return out, fmt.Errorf("interface %s in %s: %w", name, p.FW[fw], err)
			}
			s := l.Attrs().Statistics
			if s == nil {
				continue
			}
			out[fw][name] = Counters{RxPackets: s.RxPackets, TxPackets: s.TxPackets, RxDropped: s.RxDropped, TxDropped: s.TxDropped}
		}
		h.Close()
	}
	return out, nil
}

// Close stops the daemons (killing their process groups and whatever is
// left in the namespaces), detaches the XDP forwarders, deletes the
// namespaces and the directory. It is idempotent and safe to call
// concurrently: every call returns when the first is done, with its error.
func (p *Pair) Close() error {
	p.closeOnce.Do(func() { p.closeErr = p.close() })
	return p.closeErr
}

func (p *Pair) close() error {
	p.mu.Lock()
	p.closed = true
	close(p.stop)
	var procs []*proc
	for fw := range 2 {
		for _, pr := range p.procs[fw] {
			procs = append(procs, pr)
		}
	}
	p.mu.Unlock()

	var errs []error
	for _, pr := range procs {
		syscall.Kill(-pr.cmd.Process.Pid, syscall.SIGKILL)
	}
	nss := []*lab.NS{p.LAN, p.WAN, p.FW[0], p.FW[1], p.LANSwitch, p.WANSwitch}
	for _, ns := range nss {
		if ns != nil {
			killNS(ns.Path())
		}
	}
	timeout := time.After(5 * time.Second)
	for _, pr := range procs {
		select {
		case <-pr.done:
		case <-timeout:
			errs = append(errs, fmt.Errorf("close: %s (pid %d) does not exit", pr.cmd.Path, pr.cmd.Process.Pid))
		}
		select {
		case <-pr.readDone:
		case <-timeout:
		}
	}
	for _, f := range p.fwd {
		if err := f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close xdp forwarder: %w", err))
		}
	}
	// Delete the veths explicitly: a socket left open in a namespace
	// keeps it, and its interfaces, alive.
	for _, sw := range []*lab.NS{p.LANSwitch, p.WANSwitch} {
		if sw != nil {
			if err := sw.DeleteLinks("host", "fw1", "fw2", BridgeIfName); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if p.FW[0] != nil {
		if err := p.FW[0].DeleteLinks(SyncIfName); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ns := range nss {
		if ns != nil {
			if err := ns.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if p.Dir != "" {
		if err := os.RemoveAll(p.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// pids returns the daemons' process ids, for tests.
func (p *Pair) pids() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pids []int
	for fw := range 2 {
		for _, pr := range p.procs[fw] {
			pids = append(pids, pr.cmd.Process.Pid)
		}
	}
	return pids
}

// FlushState forgets every tracked connection on both firewalls: the
// kernel's conntrack tables and, with Config.Conntrackd, conntrackd's
// internal and external caches. Runs that follow each other on one pair
// call it in between, so a run's calls cannot live on state an earlier
// run left on the backup.
func (p *Pair) FlushState() error {
	var errs []error
	for fw := range p.FW {
		fd, err := netns.GetFromPath(p.FW[fw].Path())
		if err != nil {
			errs = append(errs, fmt.Errorf("fw%d: %w", fw+1, err))
			continue
		}
		h, err := netlink.NewHandleAt(fd, unix.NETLINK_NETFILTER)
		fd.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("fw%d: netlink: %w", fw+1, err))
			continue
		}
		if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
			errs = append(errs, fmt.Errorf("fw%d: flush conntrack: %w", fw+1, err))
		}
		h.Close()
		if p.cfg.Conntrackd {
			if out, err := p.FW[fw].Command("conntrackd", "-C", p.files[fw].conntrackdConf, "-f").CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("fw%d: conntrackd -f: %v: %s", fw+1, err, bytesTrim(out)))
			}
		}
	}
	return errors.Join(errs...)
}
