package rtpengine

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/rtpengine/ngclient"
)

// The real rtpengine in the lab, through the ng client: ping, offer and
// answer with rewritten SDPs, RTP relayed both ways in userspace between
// sockets in the caller and callee namespaces, query statistics, delete.
// IPv4 and IPv6.
func TestCall(t *testing.T) {
	l := lab.NewT(t)
	e := StartT(t, l, Options{PortMin: 30000, PortMax: 39999})
	t.Logf("rtpengine: %s", strings.Join(e.Args, " "))
	ctx := context.Background()
	if err := e.Client().Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	checkSockets(t, e, false)

	for _, tc := range []struct {
		name           string
		caller, callee netip.AddrPort
		relay          netip.Addr
		network        string
	}{
		{"ipv4", netip.AddrPortFrom(l.CallerAddr4, 4000), netip.AddrPortFrom(l.CalleeAddr4, 5000), l.RelayMedia4, "udp4"},
		{"ipv6", netip.AddrPortFrom(l.CallerAddr6, 4000), netip.AddrPortFrom(l.CalleeAddr6, 5000), l.RelayMedia6, "udp6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			callerConn, err := l.Caller.ListenUDP(tc.network, tc.caller.String())
			if err != nil {
				t.Fatal(err)
			}
			defer callerConn.Close()
			calleeConn, err := l.Callee.ListenUDP(tc.network, tc.callee.String())
			if err != nil {
				t.Fatal(err)
			}
			defer calleeConn.Close()

			c, err := e.SetupCall(ctx, CallSpec{CallID: "call-" + tc.name, FromTag: "caller-tag", ToTag: "callee-tag", Caller: tc.caller, Callee: tc.callee})
			if err != nil {
				t.Fatalf("setup: %v", err)
			}
			// The rewritten SDPs carry the relay's address and ports
			// from the range (SetupCall checks too; here in the raw text).
			family := "IP4"
			if tc.relay.Is6() {
				family = "IP6"
			}
			for _, s := range []struct {
				name, sdp string
				port      uint16
			}{{"offer", c.OfferSDP, c.CalleeToCaller.Port()}, {"answer", c.AnswerSDP, c.CallerToCallee.Port()}} {
				if want := fmt.Sprintf("c=IN %s %s\r\n", family, tc.relay); !strings.Contains(s.sdp, want) {
					t.Errorf("rewritten %s lacks %q:\n%s", s.name, want, s.sdp)
				}
				if want := fmt.Sprintf("m=audio %d RTP/AVP 0\r\n", s.port); !strings.Contains(s.sdp, want) || s.port < 30000 || s.port > 39999 {
					t.Errorf("rewritten %s lacks %q in 30000-39999:\n%s", s.name, want, s.sdp)
				}
			}
			if c.CallerToCallee.Addr() != tc.relay || c.CalleeToCaller.Addr() != tc.relay || c.CallerToCallee == c.CalleeToCaller {
				t.Fatalf("relay ports %s (caller sends) and %s (callee sends)", c.CallerToCallee, c.CalleeToCaller)
			}
			checkSockets(t, e, true)

			const n = 20
			relayRTP(t, callerConn, calleeConn, c.CallerToCallee, c.CalleeToCaller, 0x1111, n)
			relayRTP(t, calleeConn, callerConn, c.CalleeToCaller, c.CallerToCallee, 0x2222, n)

			st, err := e.QueryCall(ctx, c)
			if err != nil {
				t.Fatalf("query: %v", err)
			}
			if st.RTP.Packets != 2*n || st.RTP.Bytes != 2*n*rtpSize || st.RTP.Errors != 0 {
				t.Errorf("query totals RTP %+v, want %d packets of %d bytes", st.RTP, 2*n, rtpSize)
			}
			for _, w := range []struct {
				tag           string
				local, remote netip.AddrPort
			}{{c.FromTag, c.CallerToCallee, c.Caller}, {c.ToTag, c.CalleeToCaller, c.Callee}} {
				s, ok := st.Stream(w.tag, 1)
				if !ok {
					t.Errorf("query: no RTP stream of %s: %v", w.tag, st.Streams)
					continue
				}
				if s.Local != w.local || s.Endpoint != w.remote || s.Packets != n {
					t.Errorf("query: stream of %s = %+v, want local %s, endpoint %s, %d packets", w.tag, s, w.local, w.remote, n)
				}
			}
			if st.Created.IsZero() || time.Since(st.Created) > time.Minute {
				t.Errorf("query: created %v", st.Created)
			}

			if err := e.DeleteCall(ctx, c); err != nil {
				t.Fatalf("delete: %v", err)
			}
			_, err = e.QueryCall(ctx, c)
			var re *ngclient.ReplyError
			if !errors.As(err, &re) || re.Result != "error" {
				t.Errorf("query after delete: %v, want an error reply", err)
			}
			// With --delete-delay=0 the media sockets close at once.
			checkSockets(t, e, false)
		})
	}
}

// Calls set up concurrently get distinct ports from the range, and
// deleting them frees every media socket.
func TestConcurrentCalls(t *testing.T) {
	l := lab.NewT(t)
	e := StartT(t, l, Options{PortMin: 32000, PortMax: 32999, Threads: 2})
	ctx := context.Background()
	const workers, perWorker = 8, 25
	var (
		mu    sync.Mutex
		calls []*Call
		wg    sync.WaitGroup
		errs  = make(chan error, workers)
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				c, err := e.SetupCall(ctx, CallSpec{
					CallID: fmt.Sprintf("w%d-c%d", w, i),
					Caller: netip.AddrPortFrom(l.CallerAddr4, uint16(10000+2*(w*perWorker+i))),
					Callee: netip.AddrPortFrom(l.CalleeAddr4, uint16(20000+2*(w*perWorker+i))),
				})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[uint16]string{}
	for _, c := range calls {
		for _, ap := range []netip.AddrPort{c.CallerToCallee, c.CalleeToCaller} {
			if p := ap.Port(); p < 32000 || p > 32999 || p%2 != 0 {
				t.Errorf("call %s: port %d outside 32000-32999 or odd", c.CallID, p)
			}
			if other, dup := seen[ap.Port()]; dup {
				t.Errorf("port %d given to %s and %s", ap.Port(), other, c.CallID)
			}
			seen[ap.Port()] = c.CallID
		}
	}
	if len(calls) != workers*perWorker {
		t.Fatalf("%d calls, want %d", len(calls), workers*perWorker)
	}
	for _, c := range calls {
		if err := e.DeleteCall(ctx, c); err != nil {
			t.Fatalf("delete %s: %v", c.CallID, err)
		}
	}
	checkSockets(t, e, false)
	if s := e.Client().Stats(); s.Malformed != 0 {
		t.Errorf("client stats %+v", s)
	}
}

// Close stops the daemon and is idempotent; the options are checked.
func TestLifecycle(t *testing.T) {
	l := lab.NewT(t)
	if err := Available(""); err != nil {
		t.Skipf("rtpengine: %v", err)
	}
	v, err := Version("")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rtpengine version %s", v)

	for _, o := range []Options{
		{PortMin: 40000, PortMax: 30000},
		{PortMin: 80, PortMax: 90},
		{Threads: -1},
		{NGAddr: netip.MustParseAddrPort("198.18.0.2:2223")}, // the caller's, not the relay's
		{LogLevel: 9},
	} {
		if e, err := Start(l, o); err == nil {
			e.Close()
			t.Errorf("Start(%+v) succeeded", o)
		}
	}

	// The default temporary directory goes with Close.
	e, err := Start(l, Options{NGAddr: netip.AddrPortFrom(l.RelayMedia4, 2223)})
	if err != nil {
		t.Fatal(err)
	}
	pid, dir := e.Pid(), filepath.Dir(e.LogPath)
	if pid == 0 {
		t.Fatal("no pid")
	}
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != "rtpengine" {
		t.Errorf("pid %d is %q, want rtpengine itself", pid, comm)
	}
	if err := e.Client().Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if e.Pid() != 0 {
		t.Error("pid after close")
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Errorf("process %d still there", pid)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("temporary directory %s still there", dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := e.Client().Ping(ctx); !errors.Is(err, net.ErrClosed) {
		t.Errorf("ping after close: %v, want net.ErrClosed", err)
	}
}

// rtpSize is the size of the test's RTP packets: G.711 20 ms.
const rtpSize = 12 + 160

// relayRTP sends n RTP packets from src to the relay at dst and checks
// that dstConn receives each one unchanged from the relay's socket from.
func relayRTP(t *testing.T, src, dstConn *net.UDPConn, dst, from netip.AddrPort, ssrc uint32, n int) {
	t.Helper()
	buf := make([]byte, 2048)
	for i := range n {
		pkt := make([]byte, rtpSize)
		pkt[0] = 0x80 // V=2, PT 0
		binary.BigEndian.PutUint16(pkt[2:], uint16(i))
		binary.BigEndian.PutUint32(pkt[4:], uint32(160*i))
		binary.BigEndian.PutUint32(pkt[8:], ssrc)
		for j := 12; j < rtpSize; j++ {
			pkt[j] = byte(i + j)
		}
		if _, err := src.WriteToUDPAddrPort(pkt, dst); err != nil {
			t.Fatalf("send to %s: %v", dst, err)
		}
		dstConn.SetReadDeadline(time.Now().Add(3 * time.Second))
		m, got, err := dstConn.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("packet %d sent to %s: %v", i, dst, err)
		}
		got = netip.AddrPortFrom(got.Addr().Unmap(), got.Port())
		if got != from {
			t.Fatalf("packet %d sent to %s arrived from %s, want %s", i, dst, got, from)
		}
		if string(buf[:m]) != string(pkt) {
			t.Fatalf("packet %d sent to %s changed: %x, want %x", i, dst, buf[:m], pkt)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// checkSockets fails the test unless every inet socket of the daemon is
// bound to the lab's relay media addresses (and, for the ng listener
// only, its ng address), and there are media sockets exactly when media
// is true.
func checkSockets(t *testing.T, e *Engine, media bool) {
	t.Helper()
	// rtpengine closes a deleted call's sockets shortly after it answers
	// the delete: wait up to 2 s for the media sockets to match.
	var socks []inetSocket
	deadline := time.Now().Add(2 * time.Second)
	for {
		var err error
		socks, err = inetSockets(e.Pid())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range socks {
			if s.proto == "udp" && (s.local.Addr() == e.Relay4 || s.local.Addr() == e.Relay6) {
				n++
			}
		}
		if media == (n > 0) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	ng, nmedia := false, 0
	for _, s := range socks {
		switch {
		case s.proto == "udp" && s.local == e.NGAddr:
			ng = true
		case s.proto == "udp" && (s.local.Addr() == e.Relay4 || s.local.Addr() == e.Relay6):
			nmedia++
			if p := int(s.local.Port()); p < e.opts.PortMin || p > e.opts.PortMax {
				t.Errorf("media socket %s outside %d-%d", s.local, e.opts.PortMin, e.opts.PortMax)
			}
		default:
			t.Errorf("rtpengine socket %s %s: not the ng listener nor a relay media address", s.proto, s.local)
		}
	}
	if !ng {
		t.Errorf("no ng listener on %s among %v", e.NGAddr, socks)
	}
	if media != (nmedia > 0) {
		t.Errorf("%d media sockets, want some: %t (%v)", nmedia, media, socks)
	}
}

type inetSocket struct {
	proto string
	local netip.AddrPort
}

// inetSockets lists the TCP and UDP sockets process pid holds, from its
// file descriptors and its namespace's /proc/PID/net tables.
func inetSockets(pid int) ([]inetSocket, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var out []inetSocket
	for _, table := range []string{"udp", "udp6", "tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			ap, err := parseProcAddr(fields[1])
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", table, err)
			}
			out = append(out, inetSocket{strings.TrimSuffix(table, "6"), ap})
		}
		f.Close()
	}
	return out, nil
}

// parseProcAddr parses an address of /proc/net/udp: hex address in host
// (little-endian) 32-bit words, colon, hex port.
func parseProcAddr(s string) (netip.AddrPort, error) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	b, err := hex.DecodeString(h)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	for i := 0; i < len(b); i += 4 {
		binary.BigEndian.PutUint32(b[i:], binary.LittleEndian.Uint32(b[i:]))
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q", s)
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), nil
}
