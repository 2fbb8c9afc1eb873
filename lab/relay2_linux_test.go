package lab

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRelay2: the caller reaches relay2's media addresses through the
// relay, relay2 reaches the callee, and Close removes relay2.
func TestRelay2(t *testing.T) {
	t.Parallel()
	l := NewT(t)
	if err := l.AddRelay2(); err != nil {
		t.Fatal(err)
	}
	if err := l.AddRelay2(); err != nil {
		t.Fatalf("second AddRelay2: %v", err)
	}
	for _, tc := range []struct {
		name string
		dst  netip.Addr
	}{
		{"ipv4/media", l.Relay2Media4},
		{"ipv6/media", l.Relay2Media6},
		{"ipv4/link", l.Relay2Addr4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectDelivery(t, l, l.Relay2, tc.dst, 5000)
		})
	}
	t.Run("to-callee", func(t *testing.T) {
		if _, _, err := sendRecv(t, l.Relay2, l.Callee, l.Relay2Media4, l.CalleeAddr4, 5001, []byte("x"), 5*time.Second); err != nil {
			t.Fatalf("relay2 media address to the callee: %v", err)
		}
	})
	t.Run("relay-to-control", func(t *testing.T) {
		if _, _, err := sendRecv(t, l.Relay, l.Relay2, relay2LinkRelay4, l.Relay2Addr4, 5002, []byte("x"), 5*time.Second); err != nil {
			t.Fatalf("relay to relay2's control address: %v", err)
		}
	})
	path := filepath.Join(netnsDir, l.Prefix()+"relay2")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("relay2 namespace: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("relay2 namespace after Close: %v", err)
	}
}
