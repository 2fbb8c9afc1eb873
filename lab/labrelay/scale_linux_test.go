package labrelay

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/lab"
)

// TestRelayUserspaceScale installs 20,000 userspace flows (10,000 calls
// both ways) and sends one packet through each: every one arrives. The
// workers carry them all on one socket each.
func TestRelayUserspaceScale(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: installs 20,000 flows")
	}
	l := lab.NewT(t)
	r := startRelayIn(t, l, Options{Mode: "userspace", LogLevel: "warn", Ports: "20000-59999"})
	const calls = 10000
	callerEP := netip.AddrPortFrom(l.CallerAddr4, 4000)
	calleeEP := netip.AddrPortFrom(l.CalleeAddr4, 5000)
	relayPort := func(call, dir int) netip.AddrPort {
		return netip.AddrPortFrom(l.RelayMedia4, uint16(20000+2*(2*call+dir)))
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := w; c < calls; c += 8 {
				up, down := relayPort(c, 0), relayPort(c, 1)
				if _, err := r.AddFlow(admin.FlowRequest{Match: up.String(), ExpectSource: callerEP.String(), SendFrom: down.String(), SendTo: calleeEP.String()}); err != nil {
					errs <- err
					return
				}
				if _, err := r.AddFlow(admin.FlowRequest{Match: down.String(), ExpectSource: calleeEP.String(), SendFrom: up.String(), SendTo: callerEP.String()}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("installed %d flows in %v", 2*calls, time.Since(start).Round(time.Millisecond))

	caller := openLeg(t, l.Caller, callerEP, netip.AddrPort{})
	callee := openLeg(t, l.Callee, calleeEP, netip.AddrPort{})
	for dir, pair := range [][2]*leg{{caller, callee}, {callee, caller}} {
		from, to := pair[0], pair[1]
		// One packet through call 0 first, and its arrival awaited: the
		// relay's workers send through the kernel's neighbour table, which
		// holds what it sends to a host not yet resolved in a queue of
		// unres_qlen_bytes (about 200 of these packets) and drops the
		// rest; the burst below would overflow it while the relay asks
		// for the far host's address. Call 0's packet counts as its
		// delivery; it is sent again in the burst.
		warm := make([]byte, 1500)
		if _, err := from.conn.WriteToUDPAddrPort(rtpFrame(warm, 0, 0), relayPort(0, dir)); err != nil {
			t.Fatal(err)
		}
		to.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, src, err := to.conn.ReadFromUDPAddrPort(warm); err != nil || src != relayPort(0, 1-dir) {
			t.Fatalf("direction %d: the first packet through the relay: from %v, %v", dir, src, err)
		}
		got := make(chan int, 1)
		go func() {
			seen := make(map[uint32]bool, calls)
			buf := make([]byte, 2048)
			for len(seen) < calls {
				to.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				n, src, err := to.conn.ReadFromUDPAddrPort(buf)
				if err != nil || n < 12 {
					break
				}
				c := binary.BigEndian.Uint32(buf[8:]) // the SSRC carries the call
				if src != relayPort(int(c), 1-dir) {
					continue
				}
				seen[c] = true
			}
			got <- len(seen)
		}()
		buf := make([]byte, 1500)
		for c := range calls {
			if _, err := from.conn.WriteToUDPAddrPort(rtpFrame(buf, uint32(c), 1), relayPort(c, dir)); err != nil {
				t.Fatal(err)
			}
			if c%200 == 199 {
				time.Sleep(2 * time.Millisecond)
			}
		}
		if n := <-got; n != calls {
			t.Errorf("direction %d: %d of %d flows delivered their packet; where they went:\n%s", dir, n, calls, scaleLossState(r, l))
		}
	}
	flows, err := r.Flows()
	if err != nil {
		t.Fatal(err)
	}
	var packets uint64
	for _, f := range flows {
		packets += f.Packets
	}
	// Every call's packet each way, and the two first packets.
	if len(flows) != 2*calls || packets != 2*calls+2 {
		t.Errorf("%d flows listed carrying %d packets, want %d and %d", len(flows), packets, 2*calls, 2*calls+2)
	}
}

// scaleLossState is what says where lost packets went: relayd's packet
// counters by verdict and reason, and the relay namespace's UDP counters
// (a worker socket's full receive buffer shows as RcvbufErrors), and
// the machine's neighbour-queue and backlog drops.
func scaleLossState(r *Relay, l *lab.Lab) string {
	var b strings.Builder
	m, err := r.Metrics()
	if err != nil {
		fmt.Fprintf(&b, "relayd metrics: %v\n", err)
	}
	for line := range strings.Lines(m) {
		if strings.HasPrefix(line, "relayd_packets_total{") && !strings.HasSuffix(line, " 0\n") {
			b.WriteString(line)
		}
	}
	err = l.Relay.Do(func() error {
		snmp, err := os.ReadFile("/proc/thread-self/net/snmp") // this thread's namespace
		for line := range strings.Lines(string(snmp)) {
			if strings.HasPrefix(line, "Udp:") {
				b.WriteString("relay " + line)
			}
		}
		return err
	})
	if err != nil {
		fmt.Fprintf(&b, "relay snmp: %v\n", err)
	}
	// What the neighbour tables (one per family, for every namespace)
	// dropped while resolving: the last column but one, per CPU.
	for _, f := range []string{"arp_cache", "ndisc_cache"} {
		st, err := os.ReadFile("/proc/net/stat/" + f)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", f, err)
			continue
		}
		var dropped uint64
		for i, line := range slices.Collect(strings.Lines(string(st))) {
			if fs := strings.Fields(line); i > 0 && len(fs) > 2 {
				n, _ := strconv.ParseUint(fs[len(fs)-2], 16, 64)
				dropped += n
			}
		}
		fmt.Fprintf(&b, "%s unresolved_discards since boot: %d\n", f, dropped)
	}
	// The backlog queues' drops (netdev_max_backlog), all CPUs: a veth
	// hands its frames to the receiving CPU's backlog.
	if ss, err := os.ReadFile("/proc/net/softnet_stat"); err == nil {
		var dropped uint64
		for line := range strings.Lines(string(ss)) {
			if f := strings.Fields(line); len(f) > 1 {
				n, _ := strconv.ParseUint(f[1], 16, 64)
				dropped += n
			}
		}
		fmt.Fprintf(&b, "backlog drops since boot (softnet_stat): %d\n", dropped)
	}
	return b.String()
}
