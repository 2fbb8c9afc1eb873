package sip

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/control/route"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
	"github.com/relayd/relayd/internal/sipgolog"
)

// TestListenReportsBindError: Listen binds synchronously and returns the
// error of a listener that cannot bind, naming it, and releases the ones
// it had bound; with every address free, the sockets are bound when Listen
// returns.
func TestListenReportsBindError(t *testing.T) {
	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	newServer := func(ls ...config.Listener) *Server {
		reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{{Addr: relayIP, PortMin: 30000, PortMax: 30099}}},
			testLogger(t, zap.DebugLevel), dataplanetest.New(dataplane.PathXDP))
		if err != nil {
			t.Fatal(err)
		}
		calls := call.NewTable(reg, testLogger(t, zap.DebugLevel))
		router, err := route.New(nil, config.RouteServer{}, testLogger(t, zap.DebugLevel))
		if err != nil {
			t.Fatal(err)
		}
		// No test logger for the stack: its readers log after the test.
		s, err := New(Config{Listeners: ls, Router: router, Calls: calls}, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		sipgolog.SetTarget(nil)
		t.Cleanup(func() { s.ua.Close() })
		return s
	}
	udp := config.Listener{Network: "udp", Addr: netip.MustParseAddrPort(free)}
	bad := config.Listener{Network: "tcp", Addr: netip.MustParseAddrPort(taken.Addr().String())}
	err = newServer(udp, bad).Listen()
	if err == nil || !strings.Contains(err.Error(), "tcp:"+taken.Addr().String()) {
		t.Fatalf("Listen with a taken address: %v, want an error naming tcp:%s", err, taken.Addr())
	}
	// The UDP socket bound before the failure was closed.
	pc, err := net.ListenPacket("udp4", free)
	if err != nil {
		t.Fatalf("UDP listener not released after the failed Listen: %v", err)
	}
	pc.Close()

	s := newServer(udp)
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	if pc, err := net.ListenPacket("udp4", free); err == nil {
		pc.Close()
		t.Error("UDP address still free after Listen returned")
	}
	for _, b := range s.bound {
		b.close()
	}
}
