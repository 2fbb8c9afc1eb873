package watchdog

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/internal/testcert"
)

// pinger is a fake userspace worker pool: Ping answers unless stuck, and
// then blocks until ctx is done (as slowpath.Pool.Ping does when a worker
// does not answer).
type pinger struct{ stuck atomic.Bool }

func (p *pinger) Ping(ctx context.Context) error {
	if p.stuck.Load() {
		<-ctx.Done()
		return fmt.Errorf("worker 1 did not answer: %w", ctx.Err())
	}
	return nil
}

func TestCheckWorkerNotAnswering(t *testing.T) {
	var pool pinger
	ok := Probe{Name: "healthz", Check: func(context.Context) error { return nil }}
	c := NewChecker(100*time.Millisecond, ok, Probe{Name: "workers", Check: pool.Ping})
	if err := c.Check(context.Background()); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	pool.stuck.Store(true)
	t0 := time.Now()
	err := c.Check(context.Background())
	if err == nil || !strings.Contains(err.Error(), "workers:") || !strings.Contains(err.Error(), "worker 1") || strings.Contains(err.Error(), "healthz") {
		t.Fatalf("stuck worker: %v, want the workers probe (only) named", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("check took %v with a 100ms bound", d)
	}
	pool.stuck.Store(false)
	if err := c.Check(context.Background()); err != nil {
		t.Fatalf("worker answers again: %v", err)
	}
}

// TestCheckProbeIgnoringContext: a probe that does not return is late
// within the bound, and reported as still running instead of being started
// a second time.
func TestCheckProbeIgnoringContext(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var started atomic.Int32
	c := NewChecker(50*time.Millisecond, Probe{Name: "sip", Check: func(context.Context) error {
		started.Add(1)
		<-release
		return nil
	}})
	if err := c.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "sip: no answer within 50ms") {
		t.Fatalf("first check: %v", err)
	}
	if err := c.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "still running") {
		t.Fatalf("second check: %v", err)
	}
	if n := started.Load(); n != 1 {
		t.Errorf("probe started %d times", n)
	}
}

// TestRunPetsOnlyWhileHealthy: Run pets after every good check and stops
// while a worker does not answer.
func TestRunPetsOnlyWhileHealthy(t *testing.T) {
	var pool pinger
	var pets atomic.Int32
	c := NewChecker(20*time.Millisecond, Probe{Name: "workers", Check: pool.Ping})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, c, 10*time.Millisecond, func() error { pets.Add(1); return nil }, zaptest.NewLogger(t))
	}()
	waitFor(t, func() bool { return pets.Load() >= 3 })
	pool.stuck.Store(true)
	time.Sleep(50 * time.Millisecond) // a check in progress may still pet
	n := pets.Load()
	time.Sleep(200 * time.Millisecond)
	if got := pets.Load(); got != n {
		t.Errorf("petted %d times while a worker did not answer", got-n)
	}
	pool.stuck.Store(false)
	waitFor(t, func() bool { return pets.Load() > n })
	cancel()
	<-done
}

func TestBounds(t *testing.T) {
	if i, to := Bounds(20 * time.Second); i != 5*time.Second || to != 5*time.Second {
		t.Errorf("20s: %v %v", i, to)
	}
	if i, to := Bounds(60 * time.Second); i != 15*time.Second || to != MaxTimeout {
		t.Errorf("60s: %v %v", i, to)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sipServer serves OPTIONS with code on UDP and TCP on one port of
// 127.0.0.1.
func sipServer(t *testing.T, code int) netip.AddrPort {
	t.Helper()
	// A free UDP port may be a TCP port in use: try another.
	var pc net.PacketConn
	var ln net.Listener
	var ap netip.AddrPort
	for try := 0; ln == nil; try++ {
		var err error
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		ap = netip.MustParseAddrPort(pc.LocalAddr().String())
		if ln, err = net.Listen("tcp4", ap.String()); err != nil {
			pc.Close()
			if try == 20 {
				t.Fatal(err)
			}
		}
	}
	ua, _ := sipgo.NewUA()
	srv, _ := sipgo.NewServer(ua)
	srv.OnOptions(func(req *sip.Request, tx sip.ServerTransaction) {
		tx.Respond(sip.NewResponseFromRequest(req, code, "Test", nil))
	})
	go srv.ServeUDP(pc)
	go srv.ServeTCP(ln)
	t.Cleanup(func() { pc.Close(); ln.Close(); ua.Close() })
	return ap
}

func TestSIPOptions(t *testing.T) {
	good := sipServer(t, 200)
	bad := sipServer(t, 503)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, network := range []string{"udp", "tcp"} {
		if err := SIPOptions(network, good)(ctx); err != nil {
			t.Errorf("%s to a server answering 200: %v", network, err)
		}
		if err := SIPOptions(network, bad)(ctx); err == nil || !strings.Contains(err.Error(), "503") {
			t.Errorf("%s to a server answering 503: %v", network, err)
		}
	}
	// Nothing listening on UDP: no answer within the bound.
	pc, _ := net.ListenPacket("udp4", "127.0.0.1:0")
	silent := netip.MustParseAddrPort(pc.LocalAddr().String())
	sctx, scancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer scancel()
	if err := SIPOptions("udp", silent)(sctx); err == nil {
		t.Error("OPTIONS to a socket that never answers passed")
	}
	pc.Close()
	// An unspecified listen address is probed on loopback.
	any := netip.AddrPortFrom(netip.IPv4Unspecified(), good.Port())
	if err := SIPOptions("udp", any)(ctx); err != nil {
		t.Errorf("0.0.0.0:%d: %v", good.Port(), err)
	}
}

// TestSIPOptionsTLS: the probe of a tls: listener speaks TLS to it,
// whatever certificate it shows (relayd's own listener).
func TestSIPOptionsTLS(t *testing.T) {
	pair := testcert.NewCA(t).Issue(t, "127.0.0.1")
	ln, err := tls.Listen("tcp4", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair.TLS}})
	if err != nil {
		t.Fatal(err)
	}
	ua, _ := sipgo.NewUA()
	srv, _ := sipgo.NewServer(ua)
	srv.OnOptions(func(req *sip.Request, tx sip.ServerTransaction) {
		tx.Respond(sip.NewResponseFromRequest(req, 200, "OK", nil))
	})
	go srv.ServeTLS(ln)
	t.Cleanup(func() { ln.Close(); ua.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ap := netip.MustParseAddrPort(ln.Addr().String())
	if err := SIPOptions("tls", ap)(ctx); err != nil {
		t.Errorf("OPTIONS over TLS: %v", err)
	}
	if err := SIPOptions("tcp", ap)(ctx); err == nil {
		t.Error("plain OPTIONS to a TLS listener passed")
	}
}

func TestAdmin(t *testing.T) {
	code := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(code)
	}))
	defer srv.Close()
	probe := Admin(srv.Listener.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := probe(ctx); err != nil {
		t.Errorf("healthy: %v", err)
	}
	code = http.StatusInternalServerError
	if err := probe(ctx); err == nil {
		t.Error("500 passed")
	}
}
