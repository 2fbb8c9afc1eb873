package sip

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/control/route"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

// FuzzDatagram throws datagrams at a running B2BUA's UDP listener, as a
// stranger on the internet can: sipgo's parser and relayd's handlers
// behind it (routing, SDP, calls on fake data planes, toward a
// destination that never answers). Nothing may crash, and after each
// datagram the B2BUA must still answer an OPTIONS. The seeds are the RFC
// 4475 torture messages (testdata/torture) and what SIPp sends (lab's
// scenarios, as testdata/fuzz/FuzzDatagram holds them).
//
// Responses go to the datagram's source (loopback) and requests relayd
// makes to the route's destination (loopback); still, run the mutating
// fuzzer in a network namespace of its own, so that no mutation can make
// anything leave the machine:
//
//	unshare -n sh -c 'ip link set lo up && go test -run ^$ -fuzz FuzzDatagram ./control/sip/'
func FuzzDatagram(f *testing.F) {
	files, _ := filepath.Glob("testdata/torture/*/*.dat")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	log := zap.NewNop()
	// The destination reads INVITEs and never answers: calls end at the
	// route's attempt timeout, and nothing leaves loopback.
	sink, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer sink.Close()
	go func() {
		b := make([]byte, 65536)
		for {
			if _, _, err := sink.ReadFrom(b); err != nil {
				return
			}
		}
	}()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`[dataplane]
mode = "userspace"
[media]
address = "198.18.1.1"
[[route]]
name = "fuzz"
match = "."
attempt_timeout = "300ms"
destinations = ["sip:%s"]
`, sink.LocalAddr())))
	if err != nil {
		f.Fatal(err)
	}
	router, err := route.New(cfg.Routes, cfg.RouteServer, log)
	if err != nil {
		f.Fatal(err)
	}
	reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{{Addr: relayIP, PortMin: 30000, PortMax: 39999}}},
		log, dataplanetest.New(dataplane.PathXDP), dataplanetest.New(dataplane.PathUserspace))
	if err != nil {
		f.Fatal(err)
	}
	calls := call.NewTable(reg, log)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	srv, err := New(Config{
		Listeners: []config.Listener{{Network: "udp", Addr: netip.MustParseAddrPort(addr)}},
		Router:    router, Calls: calls, MediaTimeout: time.Second, SweepInterval: 100 * time.Millisecond,
		RateLimit: 1e6, RateBurst: 1e6,
	}, log)
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx)
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		srv.Shutdown(sctx)
	}()

	ua, _ := sipgo.NewUA(sipgo.WithUserAgent("fuzz-probe"))
	defer ua.Close()
	client, _ := sipgo.NewClient(ua, sipgo.WithClientHostname("127.0.0.1"))
	host, port, _ := sip.ParseAddr(addr)
	alive := func() error {
		var err error
		for range 3 {
			req := sip.NewRequest(sip.OPTIONS, sip.Uri{Scheme: "sip", User: "probe", Host: host, Port: port})
			rctx, c := context.WithTimeout(context.Background(), 2*time.Second)
			var res *sip.Response
			res, err = client.Do(rctx, req)
			c()
			if err == nil && res.StatusCode == 200 {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("OPTIONS answered %d", res.StatusCode)
			}
		}
		return err
	}
	if err := alive(); err != nil {
		f.Fatalf("B2BUA not answering before any datagram: %v", err)
	}
	conn, err := net.Dial("udp", addr)
	if err != nil {
		f.Fatal(err)
	}
	defer conn.Close()
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 65000 {
			return
		}
		conn.Write(b)
		if err := alive(); err != nil {
			t.Fatalf("after %q the B2BUA does not answer OPTIONS: %v", b, err)
		}
	})
}
