package labrelay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/lab"
)

// startRelay builds a lab and starts relayd in it with XDP on r0 and r1.
func startRelay(t *testing.T, xdpMode string) (*lab.Lab, *Relay) {
	t.Helper()
	l := lab.NewT(t)
	return l, startRelayIn(t, l, Options{XDPMode: xdpMode})
}

// startRelayIn starts relayd with o in l (o.Dir defaults to a test
// directory), logs it if the test failed, and closes it at the end.
func startRelayIn(t *testing.T, l *lab.Lab, o Options) *Relay {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	r, err := New(l, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relayd log:\n%s", r.tail())
		}
		if err := r.Close(); err != nil {
			t.Errorf("close relay: %v", err)
		}
	})
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	return r
}

// leg is one endpoint of a call: a socket in the caller or callee
// namespace and the relay address it talks to.
type leg struct {
	conn  *net.UDPConn
	local netip.AddrPort
	relay netip.AddrPort // where it sends and what it hears from
}

func openLeg(t *testing.T, ns *lab.NS, local, relay netip.AddrPort) *leg {
	t.Helper()
	network := "udp4"
	if local.Addr().Is6() {
		network = "udp6"
	}
	c, err := ns.ListenUDP(network, local.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Control(func(fd uintptr) {
		syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 16<<20)
		syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, 4<<20)
	})
	return &leg{conn: c, local: local, relay: relay}
}

// rtpFrame fills b with an RTP packet whose payload is derived from seq, so
// the receiver can check it byte for byte.
func rtpFrame(b []byte, ssrc uint32, seq uint16) []byte {
	b = b[:172]
	b[0], b[1] = 0x80, 0
	binary.BigEndian.PutUint16(b[2:], seq)
	binary.BigEndian.PutUint32(b[4:], uint32(seq)*160)
	binary.BigEndian.PutUint32(b[8:], ssrc)
	for i := 12; i < len(b); i++ {
		b[i] = byte(int(seq)*7 + i)
	}
	return b
}

// send sends n packets from l to its relay address at about pps packets
// per second, in bursts of one millisecond's worth.
func (l *leg) send(n, pps int, ssrc uint32, first uint16) error {
	pps = max(pps/rateDivisor, 1)
	buf := make([]byte, 1500)
	burst := max(pps/1000, 1)
	start := time.Now()
	for i := 0; i < n; i++ {
		if i%burst == 0 {
			due := start.Add(time.Duration(i) * time.Second / time.Duration(pps))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		if _, err := l.conn.WriteToUDPAddrPort(rtpFrame(buf, ssrc, first+uint16(i)), l.relay); err != nil {
			return fmt.Errorf("send packet %d: %w", i, err)
		}
	}
	return nil
}

// recv receives until n packets arrived or idle passes without one, and
// checks each is from the relay address and carries the exact payload.
func (l *leg) recv(n int, ssrc uint32, first uint16, idle time.Duration) (int, error) {
	buf := make([]byte, 2048)
	want := make([]byte, 1500)
	seen := make(map[uint16]bool, n)
	for len(seen) < n {
		l.conn.SetReadDeadline(time.Now().Add(idle))
		m, from, err := l.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return len(seen), nil
			}
			return len(seen), err
		}
		if from.Addr().Unmap() != l.relay.Addr() || from.Port() != l.relay.Port() {
			return len(seen), fmt.Errorf("packet from %s, want %s", from, l.relay)
		}
		seq := binary.BigEndian.Uint16(buf[2:])
		if !bytes.Equal(buf[:m], rtpFrame(want, ssrc, seq)) {
			return len(seen), fmt.Errorf("packet seq %d: payload differs", seq)
		}
		if seen[seq] {
			return len(seen), fmt.Errorf("duplicate seq %d", seq)
		}
		seen[seq] = true
	}
	return len(seen), nil
}

// call installs the two flows of a call between caller and callee through
// the relay, each expecting its source, and opens both legs.
func call(t *testing.T, l *lab.Lab, r *Relay, v6 bool, port uint16) (caller, callee *leg, flows [2]admin.Flow) {
	t.Helper()
	return callMode(t, l, r, v6, port, "xdp")
}

// callMode is call with the flows in the given mode.
func callMode(t *testing.T, l *lab.Lab, r *Relay, v6 bool, port uint16, mode string) (caller, callee *leg, flows [2]admin.Flow) {
	t.Helper()
	media, callerA, calleeA := l.RelayMedia4, l.CallerAddr4, l.CalleeAddr4
	if v6 {
		media, callerA, calleeA = l.RelayMedia6, l.CallerAddr6, l.CalleeAddr6
	}
	a, b := netip.AddrPortFrom(media, port), netip.AddrPortFrom(media, port+2)
	callerEP, calleeEP := netip.AddrPortFrom(callerA, 4000+port%1000), netip.AddrPortFrom(calleeA, 5000+port%1000)
	var err error
	flows[0], err = r.AddFlow(admin.FlowRequest{Match: a.String(), ExpectSource: callerEP.String(), SendFrom: b.String(), SendTo: calleeEP.String(), Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	flows[1], err = r.AddFlow(admin.FlowRequest{Match: b.String(), ExpectSource: calleeEP.String(), SendFrom: a.String(), SendTo: callerEP.String(), Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	return openLeg(t, l.Caller, callerEP, a), openLeg(t, l.Callee, calleeEP, b), flows
}

// exchange sends n packets each way at once and returns what arrived.
func exchange(t *testing.T, caller, callee *leg, n, pps int) (toCallee, toCaller int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	wg.Add(4)
	go func() { defer wg.Done(); errs <- caller.send(n, pps, 1, 0) }()
	go func() { defer wg.Done(); errs <- callee.send(n, pps, 2, 100) }()
	go func() {
		defer wg.Done()
		var err error
		toCallee, err = callee.recv(n, 1, 0, 2*time.Second)
		errs <- err
	}()
	go func() {
		defer wg.Done()
		var err error
		toCaller, err = caller.recv(n, 2, 100, 2*time.Second)
		errs <- err
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	return toCallee, toCaller
}

func flowByID(t *testing.T, r *Relay, id uint64) admin.Flow {
	t.Helper()
	fs, err := r.Flows()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.ID == id {
			return f
		}
	}
	t.Fatalf("flow %d not listed", id)
	return admin.Flow{}
}

// TestRelayForwarding relays 10,000 packets each way (a twentieth under
// emulation), IPv4 and IPv6,
// through relayd's XDP program in native and generic mode. Packets reach
// the far side only through XDP: the kernel would deliver them locally to
// the relay's media address, where nothing listens.
func TestRelayForwarding(t *testing.T) {
	for _, mode := range []string{"native", "generic"} {
		t.Run(mode, func(t *testing.T) {
			l, r := startRelay(t, mode)
			if v, err := r.Metric(fmt.Sprintf(`relayd_xdp_attached{interface="r0",mode=%q}`, mode)); err != nil || v != 1 {
				m, _ := r.Metrics()
				t.Fatalf("r0 not attached in %s mode:\n%s", mode, m)
			}
			// Under emulation (lab/vm) the senders are slower by
			// rateDivisor: as many fewer packets keep the run short.
			n := 10000 / rateDivisor
			for i, v6 := range []bool{false, true} {
				name := map[bool]string{false: "ipv4", true: "ipv6"}[v6]
				t.Run(name, func(t *testing.T) {
					caller, callee, flows := call(t, l, r, v6, uint16(30000+8*i))
					toCallee, toCaller := exchange(t, caller, callee, n, 20000)
					if toCallee != n || toCaller != n {
						t.Errorf("received %d at callee and %d at caller, want %d each", toCallee, toCaller, n)
					}
					for _, fl := range flows {
						f := flowByID(t, r, fl.ID)
						// Lost below zero is reordering before the relay: an XDP
						// veth spreads a sender that changes CPU over its queues,
						// and RFC 3550 counts from the first packet seen.
						if f.Packets != uint64(n) || f.Path != "xdp" || f.Lost > 0 || f.Dropped != 0 || f.Received != uint64(n) {
							t.Errorf("flow %s: %+v, want %d packets on xdp, none lost or dropped", f.Match, f, n)
						}
					}
				})
			}
			for _, reason := range []string{"fib_no_neigh", "fib_other", "no_egress", "over_mtu", "not_rtp"} {
				if v, err := r.Metric(fmt.Sprintf(`relayd_packets_total{reason=%q,verdict="punt"}`, reason)); err != nil || v != 0 {
					t.Errorf("%v packets punted for %s (%v)", v, reason, err)
				}
			}
		})
	}
}

// TestRelayWrongSource checks a packet from an unexpected source is dropped
// and counted, and the call's own packets still flow.
func TestRelayWrongSource(t *testing.T) {
	l, r := startRelay(t, "native")
	caller, callee, flows := call(t, l, r, false, 30100)
	intruder := openLeg(t, l.Caller, netip.AddrPortFrom(l.CallerAddr4, 6666), caller.relay)
	if err := intruder.send(5, 1000, 9, 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := callee.recv(1, 9, 0, 300*time.Millisecond); got != 0 {
		t.Fatalf("callee received %d packets from the intruder", got)
	}
	if f := flowByID(t, r, flows[0].ID); f.Dropped != 5 || f.Packets != 0 {
		t.Errorf("flow after intruder: dropped %d packets %d, want 5 and 0", f.Dropped, f.Packets)
	}
	if a, b := exchange(t, caller, callee, 100, 5000); a != 100 || b != 100 {
		t.Errorf("call after intruder: %d and %d packets, want 100", a, b)
	}
}

// TestRelayRestartKeepsMedia kills relayd with SIGKILL in the middle of a
// stream and starts it again: pinned program, maps and links keep
// forwarding, not one packet is lost, and the flows come back with their
// ids and counters.
func TestRelayRestartKeepsMedia(t *testing.T) {
	l, r := startRelay(t, "native")
	caller, callee, flows := call(t, l, r, false, 30200)
	const n, pps = 4000, 1000
	var sendErr error
	done := make(chan struct{})
	go func() { defer close(done); sendErr = caller.send(n, pps, 1, 0) }()
	var got int
	var recvErr error
	recvDone := make(chan struct{})
	go func() { defer close(recvDone); got, recvErr = callee.recv(n, 1, 0, 2*time.Second) }()

	time.Sleep(time.Second)
	pid := r.Pid()
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("relayd %d still alive after SIGKILL: %v", pid, err)
	}
	time.Sleep(500 * time.Millisecond) // media keeps flowing with no daemon
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	<-done
	<-recvDone
	if sendErr != nil || recvErr != nil {
		t.Fatal(sendErr, recvErr)
	}
	if got != n {
		t.Errorf("received %d of %d packets across the restart", got, n)
	}
	f := flowByID(t, r, flows[0].ID)
	if f.Packets != n || f.Match != flows[0].Match || f.SendTo != flows[0].SendTo {
		t.Errorf("flow after restart %+v, want %d packets and the same addresses", f, n)
	}
	if log := r.Log(); !bytes.Contains([]byte(log), []byte(`"adopted":true`)) {
		t.Errorf("restarted relayd did not take over the pinned links:\n%s", r.tail())
	}
	// New flows still work after the takeover.
	caller2, callee2, _ := call(t, l, r, true, 30300)
	if a, b := exchange(t, caller2, callee2, 200, 5000); a != 200 || b != 200 {
		t.Errorf("new call after restart: %d and %d packets, want 200", a, b)
	}
}

// TestRelayUnresolvedNeighbour: the first packet of a call still arrives
// when the relay has no neighbour entry for the next hop. Before the flow is
// installed: installing it resolves the next hop, and XDP forwards the
// first packet. After (the entry expired or was flushed): XDP punts the
// packet with fib_no_neigh, the userspace worker relays it (the kernel
// resolves the neighbour on that send), and later packets go through XDP.
func TestRelayUnresolvedNeighbour(t *testing.T) {
	l, r := startRelay(t, "native")
	metric := func(name string) float64 {
		t.Helper()
		v, err := r.Metric(name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	const noNeigh = `relayd_packets_total{reason="fib_no_neigh",verdict="punt"}`
	for _, v6 := range []bool{false, true} {
		if err := l.Relay.FlushNeighbors(""); err != nil {
			t.Fatal(err)
		}
		caller, callee, _ := call(t, l, r, v6, map[bool]uint16{false: 30400, true: 30500}[v6])
		if err := caller.send(1, 1000, 1, 0); err != nil {
			t.Fatal(err)
		}
		if got, err := callee.recv(1, 1, 0, 2*time.Second); got != 1 || err != nil {
			t.Errorf("v6=%v, flushed before install: first packet: received %d (%v)", v6, got, err)
		}
	}
	if v := metric(noNeigh); v != 0 {
		t.Errorf("%v packets punted for an unresolved neighbour, want 0", v)
	}

	for i, v6 := range []bool{false, true} {
		caller, callee, flows := call(t, l, r, v6, map[bool]uint16{false: 30600, true: 30700}[v6])
		if err := l.Relay.FlushNeighbors(""); err != nil {
			t.Fatal(err)
		}
		before := metric(noNeigh)
		if err := caller.send(1, 1000, 1, 0); err != nil {
			t.Fatal(err)
		}
		if got, err := callee.recv(1, 1, 0, 2*time.Second); got != 1 || err != nil {
			t.Errorf("v6=%v, flushed after install: first packet: received %d (%v)", v6, got, err)
		}
		if v := metric(noNeigh); v != before+1 {
			t.Errorf("v6=%v: fib_no_neigh punts %v -> %v, want one more", v6, before, v)
		}
		// The neighbour is resolved now: the rest goes through XDP.
		time.Sleep(100 * time.Millisecond)
		if err := caller.send(99, 5000, 1, 1); err != nil {
			t.Fatal(err)
		}
		if got, _ := callee.recv(99, 1, 1, 2*time.Second); got != 99 {
			t.Errorf("v6=%v: %d of the next 99 packets arrived", v6, got)
		}
		if v := metric(noNeigh); v != before+1 {
			t.Errorf("v6=%v: %v packets punted after resolution", v6, v-before-1)
		}
		if f := flowByID(t, r, flows[0].ID); f.Packets != 100 {
			t.Errorf("flow %d: %d packets counted, want 100 (99 by XDP, 1 relayed from the punt)", i, f.Packets)
		}
	}
}

// rateDivisor slows every test sender down: RELAYD_TEST_RATE_DIVISOR=20
// under an emulated CPU (the VM tests run these under TCG), where 20,000
// packets a second overflow socket buffers before anything is relayed.
var rateDivisor = 1

func TestMain(m *testing.M) {
	if d, err := strconv.Atoi(os.Getenv("RELAYD_TEST_RATE_DIVISOR")); err == nil && d > 0 {
		rateDivisor = d
	}
	if os.Geteuid() == 0 {
		if _, err := Build(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	RemoveBuild()
	os.Exit(code)
}

// xdpAttached reports whether an XDP program is attached to the relay's
// interface.
func xdpAttached(t *testing.T, l *lab.Lab, ifname string) bool {
	t.Helper()
	var attached bool
	err := l.Relay.Do(func() error {
		link, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		attached = link.Attrs().Xdp != nil && link.Attrs().Xdp.Attached
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return attached
}

// TestRelayStopAndDetach: a graceful stop (SIGTERM) leaves XDP attached and
// forwarding; relayd -detach removes program, links and maps, after which
// nothing is forwarded and the pin directory is empty.
func TestRelayStopAndDetach(t *testing.T) {
	l, r := startRelay(t, "native")
	caller, callee, _ := call(t, l, r, false, 30600)
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if !xdpAttached(t, l, lab.RelayCallerIfName) {
		t.Fatal("XDP detached by a graceful stop")
	}
	if err := caller.send(100, 5000, 1, 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := callee.recv(100, 1, 0, time.Second); got != 100 {
		t.Errorf("with relayd stopped: %d of 100 packets forwarded", got)
	}

	out, err := l.Relay.Command(r.opts.Bin, "-config", r.ConfigPath, "-detach").CombinedOutput()
	if err != nil {
		t.Fatalf("relayd -detach: %v\n%s", err, out)
	}
	for _, ifname := range []string{lab.RelayCallerIfName, lab.RelayCalleeIfName} {
		if xdpAttached(t, l, ifname) {
			t.Errorf("XDP still attached to %s after -detach", ifname)
		}
	}
	ents, _ := os.ReadDir(r.PinPath)
	for _, e := range ents {
		if e.IsDir() {
			t.Errorf("pinned state left after -detach: %s", e.Name())
		}
	}
	if err := caller.send(10, 5000, 1, 200); err != nil {
		t.Fatal(err)
	}
	if got, _ := callee.recv(10, 1, 200, 300*time.Millisecond); got != 0 {
		t.Errorf("%d packets forwarded after -detach", got)
	}
}

// TestRelayUserspace relays 10,000 packets each way (a twentieth under emulation), IPv4 and IPv6, through
// the userspace worker pool: with relayd in userspace mode, receiving
// through UDP sockets and through AF_XDP (dataplane.userspace_io), and with
// flows in mode userspace next to XDP.
func TestRelayUserspace(t *testing.T) {
	for _, c := range []struct{ name, mode, io string }{
		{"dataplane_userspace", "userspace", ""},
		{"dataplane_userspace_afxdp", "userspace", "afxdp"},
		{"dataplane_xdp", "xdp", ""},
	} {
		dpMode := c.mode
		t.Run(c.name, func(t *testing.T) {
			l := lab.NewT(t)
			r := startRelayIn(t, l, Options{Mode: dpMode, UserspaceIO: c.io})
			// One worker per CPU, each on a thread pinned to its CPU.
			pinned := pinnedThreads(t, r.Pid())
			for cpu := range runtime.NumCPU() {
				if pinned[strconv.Itoa(cpu)] == 0 {
					t.Errorf("no relayd thread pinned to CPU %d (threads by affinity: %v)", cpu, pinned)
				}
			}
			// Under emulation (lab/vm) the senders are slower by
			// rateDivisor: as many fewer packets keep the run short.
			n := 10000 / rateDivisor
			for i, v6 := range []bool{false, true} {
				caller, callee, flows := callMode(t, l, r, v6, uint16(31000+8*i), "userspace")
				toCallee, toCaller := exchange(t, caller, callee, n, 20000)
				if toCallee != n || toCaller != n {
					t.Errorf("v6=%v: received %d at callee and %d at caller, want %d each", v6, toCallee, toCaller, n)
				}
				for _, fl := range flows {
					f := flowByID(t, r, fl.ID)
					// Lost below zero: reordering before the relay (see above).
					if f.Packets != uint64(n) || f.Path != "userspace" || f.Lost > 0 || f.Dropped != 0 || f.Received != uint64(n) {
						t.Errorf("flow %s: %+v, want %d packets in userspace, none lost or dropped", f.Match, f, n)
					}
				}
			}
			// Every packet of the flows through AF_XDP, or none.
			want := 0.0
			if c.io == "afxdp" {
				want = float64(4 * n)
			}
			if v, err := r.Metric("relayd_userspace_afxdp_packets_total"); err != nil || v != want {
				t.Errorf("relayd_userspace_afxdp_packets_total %v (%v), want %v", v, err, want)
			}
		})
	}
}

// pinnedThreads counts pid's threads by CPU affinity list (Cpus_allowed_list).
func pinnedThreads(t *testing.T, pid int) map[string]int {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				out[strings.TrimSpace(v)]++
			}
		}
	}
	return out
}
