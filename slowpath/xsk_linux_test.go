package slowpath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/pktio"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

// startLabPool starts a pool of workers on cpus in the lab's relay
// namespace, receiving through io (AF_XDP on both of the relay's
// interfaces, in generic mode if generic is set).
func startLabPool(t *testing.T, l *lab.Lab, io string, generic bool, cpus []int) *Pool {
	t.Helper()
	var p *Pool
	err := l.Relay.Do(func() (err error) {
		p, err = New(Config{CPUs: cpus, IO: io, Interfaces: []string{lab.RelayCallerIfName, lab.RelayCalleeIfName},
			Coalesce: 200 * time.Microsecond, XDPGeneric: generic}, zaptest.NewLogger(t))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func counter(t *testing.T, p *Pool, reason string) uint64 {
	t.Helper()
	cs, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Reason == reason {
			return c.Packets
		}
	}
	t.Fatalf("no counter %s", reason)
	return 0
}

// TestPoolIO: the same packets through a pool receiving on its UDP socket
// and through one receiving on AF_XDP sockets give the same packets at
// the callee and the same statistics, for IPv4 and IPv6, plain and SRTP
// (decrypted by the relay); in mode afxdp every packet came through the
// XDP sockets, in mode socket none. Frames with a bad UDP checksum are
// relayed by neither (the kernel drops them before the socket; the AF_XDP
// worker counts them as userspace_malformed). With two workers the flows go
// to the second, whose XDP sockets share the first's UMEM and fill ring.
// Without the receive time in front of the packets (a kernel that refuses
// bpf_xdp_adjust_meta in XDP) the same holds.
func TestPoolIO(t *testing.T) {
	second := 1 % runtime.NumCPU()
	for _, m := range []struct {
		name, io string
		generic  bool
		cpus     []int
		noMeta   bool
	}{
		{"socket", IOSocket, false, []int{0}, false},
		{"afxdp", IOAFXDP, false, []int{0}, false},
		{"afxdp-generic", IOAFXDP, true, []int{0}, false},
		{"afxdp-w2", IOAFXDP, false, []int{0, second}, false},
		// As on a kernel that refuses bpf_xdp_adjust_meta in XDP.
		{"afxdp-no-receive-time", IOAFXDP, false, []int{0}, true},
	} {
		io := m.io
		t.Run(m.name, func(t *testing.T) {
			xskNoMeta = m.noMeta
			t.Cleanup(func() { xskNoMeta = false })
			l := lab.NewT(t)
			p := startLabPool(t, l, io, m.generic, m.cpus)
			if want := io == IOAFXDP && !m.noMeta && xskMetaSupported(); p.XSKReceiveTime() != want {
				t.Errorf("XSKReceiveTime() = %t, want %t", p.XSKReceiveTime(), want)
			}
			ifaces := p.Interfaces()
			if io == IOSocket && len(ifaces) != 0 || io == IOAFXDP && (len(ifaces) != 2 || ifaces[0].Name != lab.RelayCallerIfName ||
				ifaces[1].Name != lab.RelayCalleeIfName || ifaces[0].Mode != map[bool]string{false: "native", true: "generic"}[m.generic]) {
				t.Errorf("Interfaces() = %+v", ifaces)
			}
			if len(m.cpus) > 1 {
				// A flow on worker 0: the test's flows go to worker 1.
				hold := netip.AddrPortFrom(l.RelayMedia4, 29998)
				if err := p.Install(dataplane.Flow{Match: hold, SendFrom: netip.AddrPortFrom(l.RelayCalleeAddr4, 29998),
					SendTo: netip.AddrPortFrom(l.CalleeAddr4, 9), ClockRate: 8000}); err != nil {
					t.Fatal(err)
				}
				if p.owner[hold].worker != 0 {
					t.Fatalf("the first flow went to worker %d", p.owner[hold].worker)
				}
			}
			for i, c := range []struct {
				name string
				v6   bool
				srtp bool
			}{{"v4", false, false}, {"v6", true, false}, {"v4-srtp", false, true}, {"v6-srtp", true, true}} {
				t.Run(c.name, func(t *testing.T) {
					testPoolIOFlow(t, l, p, io, uint16(30000+4*i), c.v6, c.srtp)
				})
			}
		})
	}
}

// TestPoolInterfaceRecreated: once the caller's side interface was
// deleted and created again, the pool (whose program is its own, as in
// mode userspace) notices and moves AF_XDP receive to the new device
// (InterfaceRecreated): its program attached there, the workers reading
// new sockets (every packet of a flow through AF_XDP again, none lost,
// plain and SRTP), the old sockets closed; the pool closes cleanly
// after. Without it the flows' packets would take the socket path.
func TestPoolInterfaceRecreated(t *testing.T) {
	l := lab.NewT(t)
	p := startLabPool(t, l, IOAFXDP, false, []int{0, 1 % runtime.NumCPU()})
	// A flow on worker 0: the test's flows go to worker 1, whose sockets
	// share worker 0's UMEMs.
	hold := netip.AddrPortFrom(l.RelayMedia4, 29998)
	if err := p.Install(dataplane.Flow{Match: hold, SendFrom: netip.AddrPortFrom(l.RelayCalleeAddr4, 29998),
		SendTo: netip.AddrPortFrom(l.CalleeAddr4, 9), ClockRate: 8000}); err != nil {
		t.Fatal(err)
	}
	testPoolIOFlow(t, l, p, IOAFXDP, 30000, false, false)
	old, socks := l.RelayCallerIf.Index, len(p.xsk.socks)
	if err := l.RecreateCallerLink(); err != nil {
		t.Fatal(err)
	}
	now := l.RelayCallerIf.Index
	for deadline := time.Now().Add(5 * time.Second); p.Interfaces()[0].Index != now; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("AF_XDP receive still on ifindex %d, not moved to %d", p.Interfaces()[0].Index, now)
		}
	}
	// The old sockets close after the interface's new index is
	// published.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		p.xsk.mu.Lock()
		n := len(p.xsk.socks)
		p.xsk.mu.Unlock()
		if n == socks || time.Now().After(deadline) {
			break
		}
	}
	if got := p.Interfaces(); len(got) != 2 || got[0].Index != now || got[0].Name != lab.RelayCallerIfName || got[0].Mode != "native" {
		t.Errorf("Interfaces() = %+v, want %s at ifindex %d (was %d), native", got, lab.RelayCallerIfName, now, old)
	}
	p.xsk.mu.Lock()
	open := slices.Clone(p.xsk.socks)
	p.xsk.mu.Unlock()
	if len(open) != socks {
		t.Errorf("%d sockets open after the move, want %d", len(open), socks)
	}
	for _, s := range open {
		if s.u.ifindex == old {
			t.Errorf("a socket on the old ifindex %d is still open", old)
		}
	}
	for _, w := range p.workers {
		for _, s := range w.xsks {
			if s.u.ifindex == old {
				t.Errorf("worker %d still reads a socket on the old ifindex %d", w.id, old)
			}
		}
	}
	var dev uint32
	if err := p.xsk.devMap.Lookup(uint32(now), &dev); err != nil || dev != 0 {
		t.Errorf("devices map: ifindex %d -> %d, %v; want 0", now, dev, err)
	}
	if err := p.xsk.devMap.Lookup(uint32(old), &dev); err == nil {
		t.Errorf("devices map still holds the old ifindex %d", old)
	}
	t.Run("v4", func(t *testing.T) { testPoolIOFlow(t, l, p, IOAFXDP, 30004, false, false) })
	t.Run("v6-srtp", func(t *testing.T) { testPoolIOFlow(t, l, p, IOAFXDP, 30008, true, true) })
}

func testPoolIOFlow(t *testing.T, l *lab.Lab, p *Pool, io string, port uint16, v6, srtp bool) {
	media, gw, caller, callee, network := l.RelayMedia4, l.RelayCalleeAddr4, l.CallerAddr4, l.CalleeAddr4, "udp4"
	if v6 {
		media, gw, caller, callee, network = l.RelayMedia6, l.RelayCalleeAddr6, l.CallerAddr6, l.CalleeAddr6, "udp6"
	}
	match := netip.AddrPortFrom(media, port)
	to := netip.AddrPortFrom(callee, 5000+port)
	from := netip.AddrPortFrom(caller, 4000+port)
	fl := dataplane.Flow{Match: match, ExpectSource: from, SendFrom: netip.AddrPortFrom(gw, port+2), SendTo: to, ClockRate: 8000}
	var enc *srtpflow.Encrypter
	if srtp {
		sp := srtpParams(t, sdes.AES_CM_128_HMAC_SHA1_80, 3)
		fl.Decrypt = sp
		var err error
		if enc, err = srtpflow.NewEncrypter(srtpCfg(t, sp)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Install(fl); err != nil {
		t.Fatal(err)
	}
	defer p.Remove(match)
	owner := p.owner[match].worker
	if want := len(p.workers) - 1; owner != want {
		t.Fatalf("flow on worker %d, want %d", owner, want)
	}
	rc, err := l.Callee.ListenUDP(network, to.String())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	sc, err := l.Caller.DialUDP(network, from.String(), match.String())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	xskBefore, badBefore := p.WorkerStats().AFXDP, counter(t, p, "userspace_malformed")

	const n = 200
	var want [][]byte
	got := make(chan []byte, n)
	go func() {
		buf := make([]byte, 2048)
		for {
			rc.SetReadDeadline(time.Now().Add(3 * time.Second))
			k, err := rc.Read(buf)
			if err != nil {
				close(got)
				return
			}
			got <- bytes.Clone(buf[:k])
		}
	}()
	for i := range n {
		pkt := rtpPayload(0x1234, uint16(i), uint32(160*i))
		want = append(want, pkt)
		if enc != nil {
			if pkt, err = enc.EncryptRTP(make([]byte, len(pkt)+enc.RTPOverhead()), pkt); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := sc.Write(pkt); err != nil {
			t.Fatal(err)
		}
		if i%20 == 19 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	// A datagram with a bad UDP checksum, which must not be relayed.
	sendBadChecksum(t, l, from, match, rtpPayload(0x1234, n, 160*n))
	var recv [][]byte
	for b := range got {
		recv = append(recv, b)
		if len(recv) == n {
			// Anything more (the bad datagram) would come at once.
			time.Sleep(100 * time.Millisecond)
			if len(got) > 0 {
				recv = append(recv, <-got)
			}
			break
		}
	}
	if len(recv) != n {
		cs, _ := p.Counters()
		t.Logf("counters %v, worker stats %+v", cs, p.WorkerStats())
		t.Fatalf("callee received %d packets, want %d", len(recv), n)
	}
	for i := range recv {
		if !bytes.Equal(recv[i], want[i]) {
			t.Fatalf("packet %d: %x, want %x", i, recv[i], want[i])
		}
	}
	st, err := p.Stats(match)
	if err != nil {
		t.Fatal(err)
	}
	if st.Packets != n || st.Dropped != 0 || st.Received != n || st.Lost != 0 {
		t.Errorf("stats %+v: want %d packets received, none dropped or lost", st, n)
	}
	xsk, bad := p.WorkerStats().AFXDP-xskBefore, counter(t, p, "userspace_malformed")-badBefore
	switch io {
	case IOAFXDP:
		if xsk != n || bad != 1 {
			t.Errorf("%d packets through AF_XDP, %d malformed; want %d and 1", xsk, bad, n)
		}
		if got := p.workers[owner].xskPackets.Load(); got < n {
			t.Errorf("the flow's worker read %d packets from AF_XDP, want at least %d", got, n)
		}
		// The tick reads the sockets' statistics and takes the queues'
		// rates (it has counted the frames given back), every queue's
		// fill ring is at its least (a few packets), none dropped.
		queues, tuned := 0, uint64(0)
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(fillTick / 4) {
			queues, tuned = 0, 0
			p.xsk.mu.Lock()
			for _, s := range p.xsk.socks {
				if s.own {
					queues++
					s.u.mu.Lock()
					tuned += s.u.tune.released
					s.u.mu.Unlock()
				}
			}
			p.xsk.mu.Unlock()
			if tuned >= uint64(n) || time.Now().After(deadline) {
				break
			}
		}
		if tuned < uint64(n) {
			t.Errorf("the fill rings' tick counted %d frames given back, want at least the %d packets'", tuned, n)
		}
		ws := p.WorkerStats()
		if ws.AFXDPFillFrames != queues*fillMin || ws.AFXDPNoFrame != 0 || ws.AFXDPRingFull != 0 {
			t.Errorf("fill rings at %d frames (%d queues), %d and %d packets dropped; want %d, none", ws.AFXDPFillFrames, queues, ws.AFXDPNoFrame, ws.AFXDPRingFull, queues*fillMin)
		}
	default:
		if xsk != 0 || bad != 0 {
			t.Errorf("%d packets through AF_XDP, %d malformed in mode socket; want none", xsk, bad)
		}
	}
	if srtp {
		return
	}
	// A datagram larger than the MTU arrives in fragments, which the XDP
	// program passes: the kernel reassembles it and the worker reads it
	// from its socket, counted by the flow like any other.
	if _, err := sc.Write(append(rtpPayload(0x1234, n+1, 160*(n+1)), make([]byte, 1600)...)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		if st, err = p.Stats(match); err != nil {
			t.Fatal(err)
		}
		if st.Packets == n+1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st.Packets != n+1 {
		t.Errorf("the fragmented datagram: the flow counted %d packets, want %d", st.Packets, n+1)
	}
	if got := p.WorkerStats().AFXDP - xskBefore; got != xsk {
		t.Errorf("the fragmented datagram came through AF_XDP (%d packets, %d before it)", got, xsk)
	}
}

// sendBadChecksum sends payload from -> to out of the caller's interface
// with a UDP checksum off by one, through a packet socket (the kernel
// would compute a raw IP socket's right).
func sendBadChecksum(t *testing.T, l *lab.Lab, from, to netip.AddrPort, payload []byte) {
	t.Helper()
	err := l.Caller.Do(func() error {
		ifi, err := net.InterfaceByName(lab.CallerIfName)
		if err != nil {
			return err
		}
		peer, err := l.Relay.Iface(lab.RelayCallerIfName)
		if err != nil {
			return err
		}
		frame := make([]byte, 14, 2048)
		copy(frame, peer.HardwareAddr)
		copy(frame[6:], ifi.HardwareAddr)
		hdr := ipv4HeaderLen
		proto := uint16(unix.ETH_P_IP)
		if !to.Addr().Is4() {
			hdr, proto = ipv6HeaderLen, unix.ETH_P_IPV6
		}
		binary.BigEndian.PutUint16(frame[12:], proto)
		pkt := make([]byte, hdr+udpHeaderLen+len(payload))
		copy(pkt[hdr+udpHeaderLen:], payload)
		writeHeaders(pkt, from, to)
		ipChecksum(pkt)
		c := binary.BigEndian.Uint16(pkt[hdr+6:])
		binary.BigEndian.PutUint16(pkt[hdr+6:], c^0x0100)
		frame = append(frame, pkt...)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6, Protocol: htons(proto)})
	})
	if err != nil {
		t.Fatal("send a bad checksum:", err)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// frame builds an Ethernet frame holding an IP/UDP datagram with payload.
func frame(from, to netip.AddrPort, payload []byte) []byte {
	hdr, proto := ipv4HeaderLen, uint16(0x0800)
	if !to.Addr().Is4() {
		hdr, proto = ipv6HeaderLen, 0x86dd
	}
	f := make([]byte, 14+hdr+udpHeaderLen+len(payload))
	binary.BigEndian.PutUint16(f[12:], proto)
	copy(f[14+hdr+udpHeaderLen:], payload)
	writeHeaders(f[14:], from, to)
	ipChecksum(f[14:])
	return f
}

// ipChecksum fills in the IPv4 header checksum of pkt, which the raw
// socket the workers send on computes (writeHeaders leaves it 0).
func ipChecksum(pkt []byte) {
	if pkt[0]>>4 == 4 {
		binary.BigEndian.PutUint16(pkt[10:], 0)
		binary.BigEndian.PutUint16(pkt[10:], ^pktio.Fold(pktio.Sum(0, pkt[:ipv4HeaderLen])))
	}
}

// TestParseFrame: the frames the kernel would deliver to a socket parse,
// with their addresses and payload; the ones it would drop or that the
// XDP program passes do not.
func TestParseFrame(t *testing.T) {
	v4from, v4to := netip.MustParseAddrPort("198.18.0.2:4000"), netip.MustParseAddrPort("198.18.1.1:30000")
	v6from, v6to := netip.MustParseAddrPort("[2001:2::2]:4000"), netip.MustParseAddrPort("[2001:2:0:1::1]:30000")
	payload := []byte("0123456789abcdefX") // odd length
	good4, good6 := frame(v4from, v4to, payload), frame(v6from, v6to, payload)
	for _, g := range []struct {
		f        []byte
		from, to netip.AddrPort
	}{{good4, v4from, v4to}, {good6, v6from, v6to}} {
		pl, src, dst, ok := parseFrame(g.f)
		if !ok || src != g.from || dst != g.to || !bytes.Equal(pl, payload) {
			t.Errorf("parseFrame(%x) = %q %v %v %t, want %q %v %v", g.f, pl, src, dst, ok, payload, g.from, g.to)
		}
	}
	// No UDP checksum over IPv4 is none; with a trailer (Ethernet
	// padding) after the datagram the lengths say where it ends.
	nocsum := bytes.Clone(good4)
	binary.BigEndian.PutUint16(nocsum[14+20+6:], 0)
	padded := append(bytes.Clone(good4), 0, 0, 0)
	for _, f := range [][]byte{nocsum, padded} {
		if pl, _, _, ok := parseFrame(f); !ok || !bytes.Equal(pl, payload) {
			t.Errorf("parseFrame(%x) = %q %t, want %q", f, pl, ok, payload)
		}
	}
	mod := func(f []byte, off int, fn func(b []byte)) []byte {
		f = bytes.Clone(f)
		fn(f[off:])
		return f
	}
	flip := func(f []byte, off int) []byte { return mod(f, off, func(b []byte) { b[0] ^= 0x40 }) }
	for name, f := range map[string][]byte{
		"empty":            nil,
		"short eth":        good4[:13],
		"arp":              mod(good4, 12, func(b []byte) { b[0], b[1] = 0x08, 0x06 }),
		"ip options":       mod(good4, 14, func(b []byte) { b[0] = 0x46 }),
		"fragment":         mod(good4, 14+6, func(b []byte) { b[0] |= 0x20 }),
		"tcp":              mod(good4, 14+9, func(b []byte) { b[0] = 6 }),
		"ip checksum":      flip(good4, 14+10),
		"ip too long":      mod(good4, 14+2, func(b []byte) { binary.BigEndian.PutUint16(b, 1500) }),
		"udp checksum":     flip(good4, 14+20+6),
		"udp too long":     mod(good4, 14+20+4, func(b []byte) { binary.BigEndian.PutUint16(b, 200) }),
		"udp too short":    mod(good4, 14+20+4, func(b []byte) { binary.BigEndian.PutUint16(b, 7) }),
		"payload":          flip(good4, len(good4)-1),
		"truncated":        good4[:len(good4)-1],
		"v6 no checksum":   mod(good6, 14+40+6, func(b []byte) { b[0], b[1] = 0, 0 }),
		"v6 checksum":      flip(good6, 14+40+7),
		"v6 ext header":    mod(good6, 14+6, func(b []byte) { b[0] = 0 }),
		"v6 version":       mod(good6, 14, func(b []byte) { b[0] = 0x40 }),
		"v6 payload short": mod(good6, 14+4, func(b []byte) { binary.BigEndian.PutUint16(b, 4) }),
		"v6 truncated":     good6[:14+40+4],
		"v6 source":        flip(good6, 14+8),
	} {
		if pl, src, dst, ok := parseFrame(f); ok {
			t.Errorf("%s: parseFrame(%x) = %q %v %v, want not ok", name, f, pl, src, dst)
		}
	}
}

// FuzzParseFrame: any frame parses or not without a panic, and what
// parses has a payload inside the frame and addresses of one family.
func FuzzParseFrame(f *testing.F) {
	f.Add(frame(netip.MustParseAddrPort("198.18.0.2:4000"), netip.MustParseAddrPort("198.18.1.1:30000"), []byte("rtp")))
	f.Add(frame(netip.MustParseAddrPort("[2001:2::2]:4000"), netip.MustParseAddrPort("[2001:2:0:1::1]:30000"), []byte("rtp")))
	f.Fuzz(func(t *testing.T, b []byte) {
		pl, src, dst, ok := parseFrame(b)
		if !ok {
			return
		}
		if src.Addr().Is4() != dst.Addr().Is4() || len(pl) > len(b)-14-28 {
			t.Fatalf("parseFrame(%x) = %x %v %v", b, pl, src, dst)
		}
	})
}

// fakeXSK is an XDP socket without a kernel: a UMEM of frames, an RX ring
// and a fill ring in Go memory, for the worker's side of the rings.
type fakeXSK struct {
	s              *xskSock
	rxProd, rxCons uint32
	fqProd, fqCons *uint32 // the fill ring's (fakeUmem)
	rxDesc         []unix.XDPDesc
	fqAddr         []uint64
	frames         int
}

func newFakeXSK(frames int) *fakeXSK {
	u, prod, cons := fakeUmem(frames)
	f := &fakeXSK{frames: frames, rxDesc: make([]unix.XDPDesc, frames), fqAddr: u.fqAddr, fqProd: prod, fqCons: cons}
	f.s = &xskSock{fd: -1, u: u, rxDesc: f.rxDesc, rx: xskRing{producer: &f.rxProd, consumer: &f.rxCons, mask: uint32(frames - 1)}}
	return f
}

// deliver puts frame fr into UMEM frame i, as the kernel's copy does
// (behind the headroom, the receive time in front), and publishes its
// descriptor on the RX ring.
func (f *fakeXSK) deliver(i int, fr []byte, mono int64) {
	addr := uint64(i*xskFrameSize + 256)
	copy(f.s.u.mem[addr:], fr)
	binary.NativeEndian.PutUint64(f.s.u.mem[addr-xskMetaLen:], uint64(mono))
	f.publish(unix.XDPDesc{Addr: addr, Len: uint32(len(fr))})
}

func (f *fakeXSK) publish(d unix.XDPDesc) {
	f.rxDesc[f.rxProd&uint32(f.frames-1)] = d
	f.rxProd++
}

// TestRelayXSK: the worker takes the frames off the RX ring, relays the
// well-formed ones through the per-packet path (receive times from the
// program's metadata), counts the rest as malformed without touching
// memory outside the UMEM, gives every frame back to the fill ring, and
// allocates nothing.
func TestRelayXSK(t *testing.T) {
	w := &worker{log: zaptest.NewLogger(t), flows: map[netip.AddrPort]*flowState{}, relays: &relaySet{}}
	match := netip.MustParseAddrPort("198.18.1.1:30000")
	w.flows[match] = &flowState{flow: dataplane.Flow{Match: match, SendFrom: netip.MustParseAddrPort("198.18.2.1:30002"),
		SendTo: netip.MustParseAddrPort("198.18.2.2:5000"), ClockRate: 8000}}
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	fx := newFakeXSK(8)
	w.xsks = []*xskSock{fx.s}
	w.xb = newXSKBatch()
	var mono unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono); err != nil {
		t.Fatal(err)
	}
	good := [][]byte{frame(src, match, rtpPayload(1, 1, 160)), frame(src, match, rtpPayload(1, 2, 320))}
	bad := frame(src, match, rtpPayload(1, 3, 480))
	bad[len(bad)-1] ^= 1 // UDP checksum no longer holds
	round := func() {
		fx.deliver(0, good[0], mono.Nano())
		fx.deliver(1, good[1], mono.Nano())
		fx.deliver(2, bad, mono.Nano())
		fx.publish(unix.XDPDesc{Addr: uint64(len(fx.s.u.mem)) - 4, Len: 100}) // past the UMEM's end
		fx.publish(unix.XDPDesc{Addr: 3 * xskFrameSize, Len: 60})             // no room for the metadata
		fx.publish(unix.XDPDesc{Addr: 5*xskFrameSize + 256, Len: 1 << 31})    // longer than the UMEM
		fx.publish(unix.XDPDesc{Addr: 1 << 40, Len: 100})                     // outside it: no frame to give back
		*fx.fqCons += 6                                                       // the frames the kernel took for the six above
	}
	// fd -1: the sends fail, which exercises the whole path without a socket.
	tx := newTxBatch(-1, false)
	round()
	if read, drained := w.relayXSK(tx, nil); !read || !drained {
		t.Fatalf("relayXSK: read %v, drained %v; want both (a few frames)", read, drained)
	}
	if got := w.counters[vSend].Load(); got != 2 {
		t.Errorf("%d packets relayed, want 2", got)
	}
	if got, bad := w.xskPackets.Load(), w.malformed.Load(); got != 2 || bad != 5 {
		t.Errorf("%d packets and %d malformed frames from the ring, want 2 and 5", got, bad)
	}
	// The fill ring started with all 8 frames (fewer than fillMin).
	if fx.rxCons != 7 || fx.rxProd != 7 || *fx.fqProd != 8+6 {
		t.Errorf("RX ring consumer %d (producer %d), fill ring producer %d; want 7 descriptors taken, 6 frames back", fx.rxCons, fx.rxProd, *fx.fqProd)
	}
	// Back in the ring the last given back first.
	for i, want := range []uint64{5 * xskFrameSize, 3 * xskFrameSize, 7 * xskFrameSize, 2 * xskFrameSize, xskFrameSize, 0} {
		if got := fx.fqAddr[(8+i)%8]; got != want {
			t.Errorf("fill ring entry %d: %d, want frame address %d", 8+i, got, want)
		}
	}
	st := w.flows[match].stats()
	now := time.Now().UnixNano()
	if st.Packets != 2 || st.LastSeen.UnixNano() > now || now-st.LastSeen.UnixNano() > int64(time.Second) {
		t.Errorf("flow stats %+v: want 2 packets seen just now (%v)", st, time.Unix(0, now))
	}
	if read, _ := w.relayXSK(tx, nil); read {
		t.Error("relayXSK read an empty ring")
	}
	allocs := testing.AllocsPerRun(100, func() {
		round()
		w.relayXSK(tx, nil)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per batch, want 0", allocs)
	}
}

// fakeUmem is a UMEM of n frames with its fill ring in Go memory.
func fakeUmem(n int) (*xskUmem, *uint32, *uint32) {
	var prod, cons uint32
	u := &xskUmem{mem: make([]byte, n*xskFrameSize), fqAddr: make([]uint64, n)}
	u.fq = xskRing{producer: &prod, consumer: &cons, mask: uint32(n - 1)}
	u.initFill()
	return u, &prod, &cons
}

// TestFillRingReuse: the fill ring holds fillMin frames, not all of them,
// and gets back the frames given back last, so that steady traffic keeps
// to the same fillMin frames (the caches') and never touches the others.
func TestFillRingReuse(t *testing.T) {
	const n = 4 * fillMin
	u, prod, cons := fakeUmem(n)
	if *prod != fillMin || len(u.free) != n-fillMin {
		t.Fatalf("a new fill ring holds %d frames (%d waiting), want %d", *prod, len(u.free), fillMin)
	}
	used := map[uint64]bool{}
	b := &xskBatch{}
	for round := range 10 * n / 20 {
		// The kernel fills 20 frames, in the ring's order; the worker
		// relays them and gives them back.
		b.nAddr = 0
		for range 20 {
			a := u.fqAddr[*cons&u.fq.mask]
			*cons++
			used[a] = true
			b.addrs[b.nAddr] = a
			b.nAddr++
		}
		b.release(&xskSock{u: u})
		if got := *prod - *cons; got != fillMin {
			t.Fatalf("round %d: fill ring holds %d frames, want %d", round, got, fillMin)
		}
	}
	if len(used) != fillMin {
		t.Errorf("steady traffic went through %d frames, want the ring's %d", len(used), fillMin)
	}
	if got := testing.AllocsPerRun(100, func() {
		*cons += 4
		b.nAddr = 4
		for i := range 4 {
			b.addrs[i] = u.fqAddr[(*cons-4+uint32(i))&u.fq.mask]
		}
		b.release(&xskSock{u: u})
	}); got != 0 {
		t.Errorf("release allocates %v times, want 0", got)
	}
}

// TestFillRingTune: the ring's level follows the rate (fillCover of it,
// rounded up to a power of two), doubles when the kernel found it empty
// and stays there for fillDecay, then halves back one step per fillDecay.
func TestFillRingTune(t *testing.T) {
	const n = xskFrames
	u, prod, cons := fakeUmem(n)
	now := time.Unix(1000, 0)
	tick := func(released int, empty uint64) int {
		t.Helper()
		u.mu.Lock()
		u.released += uint64(released) // frames given back (and taken again) this tick
		u.mu.Unlock()
		now = now.Add(fillTick)
		u.tuneFill(now, fillTick, empty)
		// A lower level leaves frames in the ring until the kernel
		// takes them; a higher one tops it up at once.
		if got := int(*prod - *cons); got < u.level {
			t.Fatalf("fill ring holds %d frames after tuneFill, want at least its level %d", got, u.level)
		}
		return u.level
	}
	for _, step := range []struct {
		what     string
		released int    // frames given back in the tick
		empty    uint64 // the kernel's count of packets that found the ring empty
		want     int
	}{
		{"100k packets a second (20 ms: 2,000 frames)", 10000, 0, 2048},
		{"idle", 0, 0, fillMin},
		{"5k a second (100 frames in 20 ms)", 500, 0, fillMin},
		{"100k again", 10000, 0, 2048},
		{"the ring ran dry: twice the level it had", 10000, 3, 4096},
		{"idle, no new drops: the floor holds", 0, 3, 4096},
		{"dry again: doubled, up to every frame", 0, 4, n},
		{"and again", 0, 9, n},
	} {
		if got := tick(step.released, step.empty); got != step.want {
			t.Errorf("%s: level %d, want %d", step.what, got, step.want)
		}
	}
	// fillDecay without drops halves the floor, step by step. The kernel
	// fills every frame in the ring, the worker gives them back.
	u.mu.Lock()
	for ; *cons != *prod; *cons++ {
		u.free = append(u.free, u.fqAddr[*cons&u.fq.mask])
	}
	u.tune.raised = now.Add(-fillDecay)
	u.mu.Unlock()
	if got := tick(0, 9); got != n/2 {
		t.Errorf("level a decay after the last drop %d, want %d", got, n/2)
	}
	if got := tick(0, 9); got != n/2 {
		t.Errorf("level a tick later %d, want %d (one step a decay)", got, n/2)
	}
	for want := n / 4; want >= fillMin; want /= 2 {
		u.mu.Lock()
		u.tune.raised = now.Add(-fillDecay)
		u.mu.Unlock()
		if got := tick(0, 9); got != want {
			t.Errorf("level after another decay %d, want %d", got, want)
		}
	}
}
