package fwpair

import (
	"net/netip"
	"testing"
	"time"
)

// received reports whether a datagram sent from src (in the from host) to
// dst (in the to host) arrives within timeout.
func crosses(t *testing.T, p *Pair, fromLAN bool, src, dst netip.AddrPort, timeout time.Duration) bool {
	t.Helper()
	from, to := p.LAN, p.WAN
	if !fromLAN {
		from, to = p.WAN, p.LAN
	}
	rx, err := to.ListenUDP("udp4", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := from.DialUDP("udp4", src.String(), dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 64)
	for time.Now().Before(deadline) {
		tx.Write([]byte("crosses"))
		rx.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if n, err := rx.Read(buf); err == nil && string(buf[:n]) == "crosses" {
			return true
		}
	}
	return false
}

// TestStateful: the pair comes up with fw1 as master, forwards a flow the
// LAN opens both ways, and the WAN cannot open one.
func TestStateful(t *testing.T) {
	p := newPairT(t, Config{HostAddrs: 2, Advert: 100 * time.Millisecond})
	m, err := p.Master()
	if err != nil {
		t.Fatal(err)
	}
	if m != 0 {
		t.Errorf("master is fw%d, want fw1 (higher priority)", m+1)
	}
	lan := netip.AddrPortFrom(p.LANAddrs[1], 5000)
	wan := netip.AddrPortFrom(p.WANAddrs[1], 6000)
	before, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if !crosses(t, p, false, wan, netip.AddrPortFrom(p.LANAddrs[0], 5002), 300*time.Millisecond) {
		t.Log("as it should, the WAN cannot open a flow")
	} else {
		t.Error("a flow opened from the WAN crossed the stateful pair")
	}
	if !crosses(t, p, true, lan, wan, time.Second) {
		t.Fatal("LAN to WAN: nothing crossed")
	}
	if !crosses(t, p, false, wan, lan, time.Second) {
		t.Error("WAN to LAN on the flow the LAN opened: nothing crossed")
	}
	after, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if d := after[0][LANIfName].RxPackets - before[0][LANIfName].RxPackets; d == 0 {
		t.Errorf("fw1's lan counted no packets in")
	}
	if d := after[0][WANIfName].TxPackets - before[0][WANIfName].TxPackets; d == 0 {
		t.Errorf("fw1's wan counted no packets out")
	}
}
