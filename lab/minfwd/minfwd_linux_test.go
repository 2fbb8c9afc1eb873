package minfwd

import (
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
)

// forwarded reads Ip: ForwDatagrams, the kernel's forwarded packet count,
// in the relay namespace.
func forwarded(t *testing.T, l *lab.Lab) int {
	t.Helper()
	var n int
	err := l.Relay.Do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		names := strings.Fields(lines[0])
		vals := strings.Fields(lines[1])
		for i, name := range names {
			if name == "ForwDatagrams" {
				n, err = strconv.Atoi(vals[i])
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestForwarder: with the minimal forwarder on r0, caller-to-callee packets
// arrive and the kernel forwards none of them.
func TestForwarder(t *testing.T) {
	l := lab.NewT(t)
	f, err := Attach(l.Relay.Path(), lab.RelayCallerIfName, lab.RelayCalleeIfName)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rx, err := l.Callee.ListenUDP("udp4", netip.AddrPortFrom(l.CalleeAddr4, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := l.Caller.DialUDP("udp4", "", netip.AddrPortFrom(l.CalleeAddr4, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	before := forwarded(t, l)
	const n = 200
	for i := range n {
		if _, err := tx.Write([]byte{0x80, 0, 0, byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 64)
	got := 0
	for got < n {
		rx.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := rx.Read(buf); err != nil {
			break
		}
		got++
	}
	if got != n {
		t.Errorf("received %d of %d", got, n)
	}
	if k := forwarded(t, l) - before; k > 2 { // the first may go to the kernel while ARP resolves
		t.Errorf("the kernel forwarded %d packets: the XDP forwarder did not", k)
	}
}
