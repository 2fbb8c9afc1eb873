package sip

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/control/route"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
	"github.com/relayd/relayd/internal/sipgolog"
)

// The tests run the B2BUA on loopback between two sipgo user agents: a
// caller (UAC) and one or more callees (UAS) with scripted behaviour.

// The B2BUA's signalling runs on loopback; media addresses are of the
// benchmarking range (the data planes are fakes: nothing is sent), as the
// destination policy refuses loopback media.
var (
	relayIP  = netip.MustParseAddr("198.18.1.1") // the default media interface
	callerIP = "198.18.0.2"                      // the caller's SDP
	calleeIP = "198.18.2.2"                      // the callees' SDP
)

// freePort returns a port free for both UDP and TCP on 127.0.0.1.
func freePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		c, err := net.ListenPacket("udp4", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			c.Close()
			return port
		}
	}
	t.Fatal("no port free for both UDP and TCP")
	return 0
}

func offerSDP(port int, extra ...string) []byte {
	lines := []string{"v=0", "o=caller 1 1 IN IP4 " + callerIP, "s=-", "c=IN IP4 " + callerIP, "t=0 0",
		fmt.Sprintf("m=audio %d RTP/AVP 0 8 101", port), "a=rtpmap:0 PCMU/8000", "a=rtpmap:8 PCMA/8000",
		"a=rtpmap:101 telephone-event/8000", "a=sendrecv"}
	lines = append(lines, extra...)
	return []byte(strings.Join(lines, "\r\n") + "\r\n")
}

// callee is a scripted UAS.
type callee struct {
	addr    string
	ua      *sipgo.UserAgent
	srv     *sipgo.Server
	dialogs *sipgo.DialogServerCache

	mu       sync.Mutex
	invites  []*sip.Request
	byes     int
	byeVia   []string                                             // transports the BYEs came over
	behave   func(d *sipgo.DialogServerSession, req *sip.Request) // nil: answer at once
	reinvite func(req *sip.Request, tx sip.ServerTransaction)
	acked    chan []byte // ACK bodies, when set
}

func newCallee(t *testing.T) *callee {
	t.Helper()
	return newCalleeTLS(t, nil)
}

// newCalleeTLS is newCallee listening on TLS with conf, or on UDP when
// conf is nil.
func newCalleeTLS(t *testing.T, conf *tls.Config) *callee {
	t.Helper()
	port := freePort(t)
	ua, err := sipgo.NewUA(sipgo.WithUserAgent("callee"))
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := sipgo.NewServer(ua)
	cli, _ := sipgo.NewClient(ua, sipgo.WithClientHostname("127.0.0.1"), sipgo.WithClientPort(port))
	ce := &callee{addr: fmt.Sprintf("127.0.0.1:%d", port), ua: ua, srv: srv}
	contact := sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "callee", Host: "127.0.0.1", Port: port}}
	if conf != nil {
		contact.Address.UriParams = sip.HeaderParams{{K: "transport", V: "tls"}}
	}
	ce.dialogs = sipgo.NewDialogServerCache(cli, contact)
	srv.OnInvite(func(req *sip.Request, tx sip.ServerTransaction) {
		if to := req.To(); to != nil && to.Params.Has("tag") {
			ce.mu.Lock()
			h := ce.reinvite
			ce.mu.Unlock()
			if h != nil {
				h(req, tx)
			}
			return
		}
		ce.mu.Lock()
		ce.invites = append(ce.invites, req)
		behave := ce.behave
		ce.mu.Unlock()
		d, err := ce.dialogs.ReadInvite(req, tx)
		if err != nil {
			tx.Respond(sip.NewResponseFromRequest(req, 500, "Callee Error", nil))
			return
		}
		defer d.Close()
		if behave != nil {
			behave(d, req)
			return
		}
		answerSDP(d, req, 6000)
		select {
		case <-d.Context().Done():
		case <-time.After(30 * time.Second):
		}
	})
	srv.OnAck(func(req *sip.Request, tx sip.ServerTransaction) {
		ce.dialogs.ReadAck(req, tx)
		ce.mu.Lock()
		acked := ce.acked
		ce.mu.Unlock()
		if acked != nil {
			select {
			case acked <- req.Body():
			default:
			}
		}
	})
	srv.OnBye(func(req *sip.Request, tx sip.ServerTransaction) {
		ce.mu.Lock()
		ce.byes++
		ce.byeVia = append(ce.byeVia, req.Transport())
		ce.mu.Unlock()
		if err := ce.dialogs.ReadBye(req, tx); err != nil {
			tx.Respond(sip.NewResponseFromRequest(req, 481, "No Dialog", nil))
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	//lint:ignore SA1029 sipgo's own key type
	rctx := context.WithValue(ctx, sipgo.ListenReadyCtxKey, sipgo.ListenReadyCtxValue(ready))
	if conf != nil {
		go srv.ListenAndServeTLS(rctx, "tls", ce.addr, conf)
	} else {
		go srv.ListenAndServe(rctx, "udp", ce.addr)
	}
	<-ready
	t.Cleanup(func() { cancel(); ua.Close() })
	return ce
}

func (ce *callee) set(f func(d *sipgo.DialogServerSession, req *sip.Request)) {
	ce.mu.Lock()
	defer ce.mu.Unlock()
	ce.behave = f
}

func answerSDP(d *sipgo.DialogServerSession, req *sip.Request, port int) {
	d.Respond(180, "Ringing", nil)
	body := []byte(calleeSDP(string(offerSDP(port))))
	d.Respond(200, "OK", body, sip.NewHeader("Content-Type", "application/sdp"))
}

// calleeSDP turns a caller's SDP into a callee's: its o= name and its
// address.
func calleeSDP(sdp string) string {
	return strings.ReplaceAll(strings.ReplaceAll(sdp, "o=caller", "o=callee"), callerIP, calleeIP)
}

func (ce *callee) lastInvite() *sip.Request {
	ce.mu.Lock()
	defer ce.mu.Unlock()
	if len(ce.invites) == 0 {
		return nil
	}
	return ce.invites[len(ce.invites)-1]
}

type harness struct {
	t      *testing.T
	o      opts
	router *route.Router
	cancel context.CancelFunc // stops Serve
	done   chan error         // what Serve returned
	srv    *Server
	addr   string
	xdp    *dataplanetest.DataPlane
	us     *dataplanetest.DataPlane
	calls  *call.Table
	ended  chan call.Info
	caller *sipgo.DialogClientCache
	client *sipgo.Client
	cport  int

	tlsAddr string // the tls listener's address, with opts.tls

	mu        sync.Mutex
	reinvites []string // bodies of re-INVITEs the caller got
	callerSDP []byte   // what the caller answers them with
}

type opts struct {
	destinations []string
	routeExtra   string
	ports        [2]uint16
	mediaTimeout time.Duration
	maxDuration  time.Duration
	userspace    bool // a userspace data plane too (SRTP termination)
	rateLimit    float64
	rateBurst    int
	log          *zap.Logger // the B2BUA's; default a test logger at info
	store        Store
	ifaces       []config.MediaInterface // named media interfaces beside the default (relayIP)
	relay6       netip.Addr              // the default interface's IPv6 address; none when invalid
	noCodecs     bool                    // relayd was built without G.729: no transcoding
	auth         Auth                    // digest authentication of routes with auth_users
	tls          *tls.Config             // with a certificate: a tls listener too (harness.tlsAddr)
	tlsClient    *tls.Config             // toward TLS destinations
}

// start makes the call table and the B2BUA (as a new relayd process
// would, over the same data planes) and serves.
func (h *harness) start() {
	t := h.t
	t.Helper()
	planes := []dataplane.DataPlane{h.xdp}
	if h.us != nil {
		planes = append(planes, h.us)
	}
	var err error
	ifaces := []registry.Interface{{Addr: relayIP, Addr6: h.o.relay6, PortMin: h.o.ports[0], PortMax: h.o.ports[1]}}
	for _, in := range h.o.ifaces {
		ifaces = append(ifaces, registry.Interface{Name: in.Name, Addr: in.Addr, Advertise: in.AdvertiseAddr, PortMin: in.PortMin, PortMax: in.PortMax})
	}
	reg, err := registry.New(registry.Config{Interfaces: ifaces}, testLogger(t, zap.DebugLevel), planes...)
	if err != nil {
		t.Fatal(err)
	}
	h.calls = call.NewTable(reg, testLogger(t, zap.DebugLevel))
	h.calls.SetCodecsAvailable(!h.o.noCodecs) // whatever this build has
	listeners := []config.Listener{{Network: "udp", Addr: netip.MustParseAddrPort(h.addr)}, {Network: "tcp", Addr: netip.MustParseAddrPort(h.addr)}}
	if h.o.tls != nil {
		listeners = append(listeners, config.Listener{Network: "tls", Addr: netip.MustParseAddrPort(h.tlsAddr)})
	}
	h.srv, err = New(Config{
		Listeners:     listeners,
		Router:        h.router,
		Calls:         h.calls,
		MediaTimeout:  h.o.mediaTimeout,
		MaxDuration:   h.o.maxDuration,
		SweepInterval: 100 * time.Millisecond,
		RateLimit:     h.o.rateLimit,
		RateBurst:     h.o.rateBurst,
		OnEnd:         func(i call.Info) { h.ended <- i },
		Store:         h.o.store,
		Auth:          h.o.auth,
		TLS:           h.o.tls,
		TLSClient:     h.o.tlsClient,
	}, h.o.log)
	if err != nil {
		t.Fatal(err)
	}
	// sipgo's process-wide default logger must not outlive this test's
	// logger: the callees and callers of other tests use it too.
	sipgolog.SetTarget(nil)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.srv.Serve(ctx) }()
	waitListening(t, h.addr)
}

// stop stops Serve and shuts the B2BUA down, as SIGTERM does.
func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
	defer c()
	if err := h.srv.Shutdown(sctx); err != nil {
		h.t.Errorf("Shutdown: %v", err)
	}
	h.cancel()
	h.cancel = nil
	if err := <-h.done; err != nil {
		h.t.Errorf("Serve: %v", err)
	}
}

// waitListening waits until something listens on TCP addr.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("B2BUA not listening on %s: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newHarness(t *testing.T, o opts) *harness {
	t.Helper()
	h := &harness{t: t, xdp: dataplanetest.New(dataplane.PathXDP), ended: make(chan call.Info, 16)}
	if o.ports == [2]uint16{} {
		o.ports = [2]uint16{30000, 30099}
	}
	if o.userspace {
		h.us = dataplanetest.New(dataplane.PathUserspace)
	}
	var dests []string
	for _, d := range o.destinations {
		dests = append(dests, fmt.Sprintf("%q", "sip:"+d))
	}
	doc := "[dataplane]\nmode = \"userspace\"\n[media]\naddress = \"198.18.1.1\"\n[[route]]\nname = \"test\"\nmatch = \".\"\nattempt_timeout = \"300ms\"\ndestinations = [" +
		strings.Join(dests, ", ") + "]\n" + o.routeExtra
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	router, err := route.New(cfg.Routes, cfg.RouteServer, testLogger(t, zap.DebugLevel))
	if err != nil {
		t.Fatal(err)
	}
	o.ifaces = cfg.Media.Interfaces
	if o.log == nil {
		o.log = testLogger(t, zap.InfoLevel) // sipgo's readers log at debug after Shutdown returns
	}
	h.o, h.router = o, router
	h.addr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	if o.tls != nil {
		h.tlsAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	}
	h.start()
	t.Cleanup(h.stop)
	// The caller.
	h.cport = freePort(t)
	ua, _ := sipgo.NewUA(sipgo.WithUserAgent("caller"))
	srv, _ := sipgo.NewServer(ua)
	h.client, _ = sipgo.NewClient(ua, sipgo.WithClientHostname("127.0.0.1"), sipgo.WithClientPort(h.cport))
	h.caller = sipgo.NewDialogClientCache(h.client, sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "caller", Host: "127.0.0.1", Port: h.cport}})
	srv.OnInvite(func(req *sip.Request, tx sip.ServerTransaction) {
		// Re-INVITEs from relayd: answered with the caller's own SDP.
		h.mu.Lock()
		h.reinvites = append(h.reinvites, string(req.Body()))
		body := h.callerSDP
		h.mu.Unlock()
		res := sip.NewResponseFromRequest(req, 200, "OK", body)
		res.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
		res.AppendHeader(&sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "caller", Host: "127.0.0.1", Port: h.cport}})
		tx.Respond(res)
	})
	srv.OnAck(func(req *sip.Request, tx sip.ServerTransaction) {})
	srv.OnBye(func(req *sip.Request, tx sip.ServerTransaction) {
		if err := h.caller.ReadBye(req, tx); err != nil {
			tx.Respond(sip.NewResponseFromRequest(req, 481, "No Dialog", nil))
		}
	})
	cctx, ccancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	//lint:ignore SA1029 sipgo's own key type
	go srv.ListenAndServe(context.WithValue(cctx, sipgo.ListenReadyCtxKey, sipgo.ListenReadyCtxValue(ready)), "udp", fmt.Sprintf("127.0.0.1:%d", h.cport))
	<-ready
	t.Cleanup(func() { ccancel(); ua.Close() })
	// Wait until the B2BUA answers OPTIONS.
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := h.request(sip.OPTIONS, nil, nil)
		if err == nil && res.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B2BUA not answering OPTIONS: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return h
}

func (h *harness) uri(user string) sip.Uri {
	host, port, _ := sip.ParseAddr(h.addr)
	return sip.Uri{Scheme: "sip", User: user, Host: host, Port: port}
}

// request sends one out-of-dialog request and waits for its final response.
func (h *harness) request(method sip.RequestMethod, body []byte, edit func(*sip.Request)) (*sip.Response, error) {
	req := sip.NewRequest(method, h.uri("+15551234"))
	if body != nil {
		req.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
		req.SetBody(body)
	}
	req.AppendHeader(&sip.ContactHeader{Address: sip.Uri{Scheme: "sip", User: "caller", Host: "127.0.0.1", Port: h.cport}})
	if edit != nil {
		edit(req)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.client.Do(ctx, req)
}

// up places a call with the caller's offer at port 4000, acknowledges
// its answer and waits for the call's four flows.
func (h *harness) up(t *testing.T, ctx context.Context) *sipgo.DialogClientSession {
	t.Helper()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	waitFor(t, "flows", func() bool { return h.xdp.Len() == 4 })
	return d
}

func (h *harness) invite(ctx context.Context, body []byte) (*sipgo.DialogClientSession, error) {
	var hdrs []sip.Header
	if body != nil {
		hdrs = append(hdrs, sip.NewHeader("Content-Type", "application/sdp"))
	}
	d, err := h.caller.Invite(ctx, h.uri("+15551234"), body, hdrs...)
	if err != nil {
		return nil, err
	}
	return d, d.WaitAnswer(ctx, sipgo.AnswerOptions{})
}

func (h *harness) cdr() call.Info {
	h.t.Helper()
	select {
	case i := <-h.ended:
		return i
	case <-time.After(10 * time.Second):
		h.t.Fatal("no CDR")
	}
	return call.Info{}
}

// answered places a call that the callee answers with SDP (port 6000),
// ACKs it, waits for its four flows and returns both ends' dialogs.
func (h *harness) answered(ctx context.Context, ce *callee) (*sipgo.DialogClientSession, *sipgo.DialogServerSession) {
	h.t.Helper()
	var calleeDialog *sipgo.DialogServerSession
	got := make(chan struct{})
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		calleeDialog = d
		answerSDP(d, req, 6000)
		close(got)
		<-d.Context().Done()
	})
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		h.t.Fatal(err)
	}
	d.Ack(ctx)
	<-got
	waitFor(h.t, "flows", func() bool { return h.xdp.Len() == 4 })
	return d, calleeDialog
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCallAnsweredAndByeFromCaller(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000, "a=ice-ufrag:x", "a=candidate:1 1 UDP 1 198.18.0.2 4000 typ host"))
	if err != nil {
		t.Fatal(err)
	}
	ans := string(d.InviteResponse.Body())
	if !strings.Contains(ans, "o=relayd") || !strings.Contains(ans, "c=IN IP4 198.18.1.1") || strings.Contains(ans, "m=audio 6000") {
		t.Errorf("answer to the caller not anchored:\n%s", ans)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	inv := ce.lastInvite()
	out := string(inv.Body())
	if strings.Contains(out, "candidate") || strings.Contains(out, "ice-ufrag") || strings.Contains(out, "m=audio 4000") {
		t.Errorf("offer to the callee not rewritten:\n%s", out)
	}
	if inv.CallID().Value() == d.InviteRequest.CallID().Value() {
		t.Error("leg B reuses leg A's Call-ID")
	}
	if mf := inv.MaxForwards(); mf == nil || mf.Val() != 69 {
		t.Errorf("Max-Forwards toward the callee %v, want 69", mf)
	}
	waitFor(t, "4 flows", func() bool { return h.xdp.Len() == 4 })
	list, _ := h.calls.List()[0], 0
	info := list.Info()
	if info.State != call.StateAnswered || info.Legs[call.A].CallID == info.Legs[call.B].CallID {
		t.Errorf("call info %+v", info)
	}
	if err := d.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	cdr := h.cdr()
	if cdr.Disposition != call.Answered || cdr.Code != 200 || len(cdr.Attempts) != 1 || cdr.Attempts[0].Code != 200 ||
		cdr.Answer == nil || cdr.End == nil || cdr.Route != "test" {
		t.Errorf("CDR %+v", cdr)
	}
	waitFor(t, "callee BYE", func() bool { ce.mu.Lock(); defer ce.mu.Unlock(); return ce.byes == 1 })
	if h.xdp.Len() != 0 || h.calls.Len() != 0 {
		t.Errorf("%d flows, %d calls left", h.xdp.Len(), h.calls.Len())
	}
}

// TestMediaInterfaces: a route puts the callee's leg on a named media
// interface behind a 1:1 NAT. The callee's SDP names the interface's
// advertised address, the caller's the default one; the flows toward the
// callee leave from the interface's own address and a port of its range.
func TestMediaInterfaces(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, routeExtra: `callee_interface = "external"
[[media.interface]]
name = "external"
address = "198.18.3.1"
advertise = "198.19.0.1"
ports = "40000-40009"
`})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	if ans := string(d.InviteResponse.Body()); !strings.Contains(ans, "c=IN IP4 198.18.1.1") {
		t.Errorf("answer to the caller not on the default interface:\n%s", ans)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	out := string(ce.lastInvite().Body())
	if !strings.Contains(out, "c=IN IP4 198.19.0.1") || !regexp.MustCompile(`(?m)^m=audio 4000[0-9] `).MatchString(out) {
		t.Errorf("offer to the callee does not name the advertised address and a port of 40000-40009:\n%s", out)
	}
	waitFor(t, "4 flows", func() bool { return h.xdp.Len() == 4 })
	list, _ := h.xdp.List()
	for _, fs := range list {
		f := fs.Flow
		switch {
		case f.Match.Addr() == netip.MustParseAddr("198.18.3.1"):
			if f.Match.Port() < 40000 || f.Match.Port() > 40009 || f.SendFrom.Addr() != relayIP {
				t.Errorf("flow from the callee %+v: want a match in 40000-40009, sent from the default interface", f)
			}
		case f.Match.Addr() == relayIP:
			if f.SendFrom.Addr() != netip.MustParseAddr("198.18.3.1") || f.SendFrom.Port() < 40000 || f.SendFrom.Port() > 40009 {
				t.Errorf("flow toward the callee %+v: want sent from 198.18.3.1:40000-40009", f)
			}
		default:
			t.Errorf("flow on no interface: %+v", f)
		}
	}
	if err := d.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "flows removed", func() bool { return h.xdp.Len() == 0 })
	for _, p := range h.calls.Registry().Ports() {
		if p.Free != p.Pairs {
			t.Errorf("interface %q: %d of %d pairs free after the call", p.Interface, p.Free, p.Pairs)
		}
	}
}

func TestByeFromCallee(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, calleeDialog := h.answered(ctx, ce)
	if err := calleeDialog.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	cdr := h.cdr()
	if cdr.Disposition != call.Answered || cdr.Reason != "callee hung up" {
		t.Errorf("CDR %+v", cdr)
	}
	select {
	case <-d.Context().Done():
	case <-time.After(5 * time.Second):
		t.Error("caller got no BYE")
	}
}

func TestFailover(t *testing.T) {
	busy := newCallee(t)
	busy.set(func(d *sipgo.DialogServerSession, req *sip.Request) { d.Respond(503, "Service Unavailable", nil) })
	silent := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // nobody listens: no response at all
	ok := newCallee(t)
	h := newHarness(t, opts{destinations: []string{busy.addr, silent, ok.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	d.Bye(ctx)
	cdr := h.cdr()
	if len(cdr.Attempts) != 3 {
		t.Fatalf("attempts %+v, want 3", cdr.Attempts)
	}
	for i, want := range []struct {
		result string
		code   int
	}{{"failed", 503}, {"timeout", 0}, {"answered", 200}} {
		a := cdr.Attempts[i]
		if a.Result != want.result || a.Code != want.code {
			t.Errorf("attempt %d %+v, want %s %d", i, a, want.result, want.code)
		}
	}
	if cdr.Attempts[0].FirstResponseMS < 0 || cdr.Attempts[1].FirstResponseMS != -1 {
		t.Errorf("first response times %v %v", cdr.Attempts[0].FirstResponseMS, cdr.Attempts[1].FirstResponseMS)
	}
}

func TestNoFailoverOnBusy(t *testing.T) {
	busy := newCallee(t)
	busy.set(func(d *sipgo.DialogServerSession, req *sip.Request) { d.Respond(486, "Busy Here", nil) })
	other := newCallee(t)
	h := newHarness(t, opts{destinations: []string{busy.addr, other.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.invite(ctx, offerSDP(4000))
	var dr *sipgo.ErrDialogResponse
	if !errors.As(err, &dr) || dr.Res.StatusCode != 486 {
		t.Fatalf("invite: %v, want 486", err)
	}
	cdr := h.cdr()
	if cdr.Disposition != call.Failed || cdr.Code != 486 || len(cdr.Attempts) != 1 || other.lastInvite() != nil {
		t.Errorf("CDR %+v", cdr)
	}
}

func TestCancelBeforeAnswer(t *testing.T) {
	ce := newCallee(t)
	canceled := make(chan struct{})
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		d.Respond(180, "Ringing", nil)
		<-d.Context().Done()
		close(canceled)
	})
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithCancel(context.Background())
	d, err := h.caller.Invite(ctx, h.uri("1"), offerSDP(4000), sip.NewHeader("Content-Type", "application/sdp"))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		errc <- d.WaitAnswer(ctx, sipgo.AnswerOptions{OnResponse: func(r *sip.Response) error {
			if r.StatusCode == 180 {
				cancel()
			}
			return nil
		}})
	}()
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("callee's INVITE not canceled")
	}
	<-errc
	cdr := h.cdr()
	if cdr.Disposition != call.Canceled || cdr.Code != 487 {
		t.Errorf("CDR %+v", cdr)
	}
	waitFor(t, "flows removed", func() bool { return h.xdp.Len() == 0 })
}

func TestEarlyMedia(t *testing.T) {
	ce := newCallee(t)
	release := make(chan struct{})
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		body := []byte(calleeSDP(string(offerSDP(6000))))
		d.Respond(183, "Session Progress", body, sip.NewHeader("Content-Type", "application/sdp"))
		<-release
		d.Respond(200, "OK", body, sip.NewHeader("Content-Type", "application/sdp"))
	})
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.caller.Invite(ctx, h.uri("1"), offerSDP(4000), sip.NewHeader("Content-Type", "application/sdp"))
	if err != nil {
		t.Fatal(err)
	}
	var early string
	err = d.WaitAnswer(ctx, sipgo.AnswerOptions{OnResponse: func(r *sip.Response) error {
		if r.StatusCode == 183 {
			early = string(r.Body())
			if h.xdp.Len() != 4 {
				t.Errorf("%d flows at 183, want 4 (early media both ways)", h.xdp.Len())
			}
			close(release)
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(early, "o=relayd") {
		t.Errorf("183 SDP not anchored:\n%s", early)
	}
	d.Ack(ctx)
	d.Bye(ctx)
	h.cdr()
}

func TestPortExhaustion(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, ports: [2]uint16{30000, 30003}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	first.Ack(ctx)
	res, err := h.request(sip.INVITE, offerSDP(4100), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 503 || res.GetHeader("Retry-After") == nil {
		t.Errorf("second call: %s, want 503 with Retry-After", res.StartLine())
	}
	cdr := h.cdr()
	if cdr.Disposition != call.Rejected || cdr.Code != 503 {
		t.Errorf("CDR %+v", cdr)
	}
	// The first call is untouched.
	if h.xdp.Len() != 4 || first.LoadState() != sip.DialogStateConfirmed {
		t.Errorf("first call disturbed: %d flows, state %v", h.xdp.Len(), first.LoadState())
	}
	first.Bye(ctx)
	h.cdr()
}

func TestRejections(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, routeExtra: "codecs = [\"G729\"]\n"})
	for _, tc := range []struct {
		name   string
		method sip.RequestMethod
		body   []byte
		edit   func(*sip.Request)
		want   int
	}{
		{"options", sip.OPTIONS, nil, nil, 200},
		{"bad sdp", sip.INVITE, []byte("v=0\r\nbogus\r\n"), nil, 400},
		{"not sdp", sip.INVITE, []byte("hello"), func(r *sip.Request) { r.ReplaceHeader(sip.NewHeader("Content-Type", "text/plain")) }, 415},
		{"no common codec", sip.INVITE, offerSDP(4000), nil, 488},
		{"max-forwards", sip.INVITE, offerSDP(4000), func(r *sip.Request) { mf := sip.MaxForwardsHeader(0); r.AppendHeader(&mf) }, 483},
		{"bye without dialog", sip.BYE, nil, func(r *sip.Request) {
			to := r.To()
			to.Params.Add("tag", "nosuch")
		}, 481},
		{"unknown method", sip.REGISTER, nil, nil, 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edit := func(r *sip.Request) {
				if tc.edit != nil {
					if r.To() == nil {
						r.AppendHeader(&sip.ToHeader{Address: r.Recipient})
					}
					tc.edit(r)
				}
			}
			res, err := h.request(tc.method, tc.body, edit)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tc.want {
				t.Errorf("%s: %s, want %d", tc.name, res.StartLine(), tc.want)
			}
		})
	}
	if ce.lastInvite() != nil {
		t.Error("a refused INVITE reached the callee")
	}
}

func TestReinviteHold(t *testing.T) {
	ce := newCallee(t)
	var calleeDialog *sipgo.DialogServerSession
	got := make(chan struct{})
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		calleeDialog = d
		answerSDP(d, req, 6000)
		close(got)
		<-d.Context().Done()
	})
	reinvites := make(chan string, 1)
	ce.mu.Lock()
	ce.reinvite = func(req *sip.Request, tx sip.ServerTransaction) {
		calleeDialog.ReadRequest(req, tx)
		reinvites <- string(req.Body())
		body := []byte(strings.ReplaceAll(string(offerSDP(6100)), "a=sendrecv", "a=recvonly"))
		res := sip.NewResponseFromRequest(req, 200, "OK", body)
		res.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
		res.AppendHeader(&sip.ContactHeader{Address: sip.Uri{Scheme: "sip", Host: "127.0.0.1"}})
		tx.Respond(res)
	}
	ce.mu.Unlock()
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := h.up(t, ctx)
	<-got
	hold := sip.NewRequest(sip.INVITE, d.InviteResponse.Contact().Address)
	hold.SetBody([]byte(strings.ReplaceAll(string(offerSDP(4000)), "a=sendrecv", "a=sendonly")))
	hold.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	res, err := d.Do(ctx, hold)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || !strings.Contains(string(res.Body()), "a=recvonly") {
		t.Fatalf("re-INVITE answer %s:\n%s", res.StartLine(), res.Body())
	}
	ack := sip.NewRequest(sip.ACK, d.InviteResponse.Contact().Address)
	d.WriteRequest(ack)
	if body := <-reinvites; !strings.Contains(body, "a=sendonly") || !strings.Contains(body, "o=relayd") {
		t.Errorf("re-INVITE to the callee:\n%s", body)
	}
	// The callee moved to port 6100: the flow toward it follows, in place.
	flows, _ := h.xdp.List()
	moved := false
	for _, f := range flows {
		if f.Flow.SendTo.Port() == 6100 {
			moved = true
		}
	}
	if !moved || h.xdp.Len() != 4 {
		t.Errorf("flows after re-INVITE: %+v", flows)
	}
	d.Bye(ctx)
	h.cdr()
}

// An offerless re-INVITE from the caller gets relayd's last SDP to it in
// the 2xx; the answer in the caller's ACK moves the flows toward it.
func TestOfferlessReinvite(t *testing.T) {
	ce := newCallee(t)
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		answerSDP(d, req, 6000)
		<-d.Context().Done()
	})
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := h.up(t, ctx)
	first := string(d.InviteResponse.Body())
	res, err := d.Do(ctx, sip.NewRequest(sip.INVITE, d.InviteResponse.Contact().Address))
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || string(res.Body()) != first {
		t.Fatalf("offerless re-INVITE: %s, want 200 with the SDP of the call's answer:\n%s\nwant:\n%s", res.StartLine(), res.Body(), first)
	}
	ack := sip.NewRequest(sip.ACK, d.InviteResponse.Contact().Address)
	ack.SetBody(offerSDP(4100))
	ack.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	if err := d.WriteRequest(ack); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the flow toward the caller moved to port 4100", func() bool {
		flows, _ := h.xdp.List()
		for _, f := range flows {
			if f.Flow.SendTo.Port() == 4100 {
				return true
			}
		}
		return false
	})
	d.Bye(ctx)
	h.cdr()
}

func TestLateOffer(t *testing.T) {
	ce := newCallee(t)
	acked := make(chan []byte, 1)
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		body := []byte(calleeSDP(string(offerSDP(6000))))
		d.Respond(200, "OK", body, sip.NewHeader("Content-Type", "application/sdp"))
	})
	ce.mu.Lock()
	ce.acked = acked
	ce.mu.Unlock()
	h := newHarness(t, opts{destinations: []string{ce.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	offer := string(d.InviteResponse.Body())
	if !strings.Contains(offer, "o=relayd") {
		t.Fatalf("late offer to the caller not anchored:\n%s", offer)
	}
	ack := sip.NewRequest(sip.ACK, d.InviteResponse.Contact().Address)
	ack.SetBody(offerSDP(4000))
	ack.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	if err := d.WriteAck(ctx, ack); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-acked:
		if !strings.Contains(string(b), "o=relayd") {
			t.Errorf("ACK to the callee carries no anchored answer:\n%s", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("callee got no ACK")
	}
	waitFor(t, "flows", func() bool { return h.xdp.Len() == 4 })
	d.Bye(ctx)
	h.cdr()
}

func TestMediaTimeout(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, mediaTimeout: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	cdr := h.cdr()
	if cdr.Disposition != call.MediaTimeout {
		t.Errorf("CDR %+v", cdr)
	}
	select {
	case <-d.Context().Done():
	case <-time.After(5 * time.Second):
		t.Error("caller got no BYE")
	}
}

func TestMaxDuration(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, maxDuration: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	if cdr := h.cdr(); cdr.Disposition != call.MaxDuration {
		t.Errorf("CDR %+v", cdr)
	}
}

const callerKey = "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz"

func savpOffer(port int) []byte {
	return []byte(strings.Replace(string(offerSDP(port, callerKey)), "RTP/AVP", "RTP/SAVP", 1))
}

func TestSRTPCallerPlainCallee(t *testing.T) {
	ce := newCallee(t)
	h := newHarness(t, opts{destinations: []string{ce.addr}, userspace: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, savpOffer(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	toCallee := string(ce.lastInvite().Body())
	if strings.Contains(toCallee, "crypto") || !strings.Contains(toCallee, "RTP/AVP") {
		t.Errorf("offer to the plain callee:\n%s", toCallee)
	}
	ans := string(d.InviteResponse.Body())
	if !strings.Contains(ans, "RTP/SAVP") || !strings.Contains(ans, "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:") || strings.Contains(ans, "WVNfX19zZW1jdGwg") {
		t.Errorf("answer to the SRTP caller must carry relayd's own key:\n%s", ans)
	}
	waitFor(t, "userspace flows", func() bool { return h.us.Len() == 4 })
	if h.xdp.Len() != 0 {
		t.Errorf("%d XDP flows for an SRTP-terminated call", h.xdp.Len())
	}
	l, _ := h.us.List()
	for _, f := range l {
		if !f.Flow.HasSRTP() {
			t.Errorf("flow without SRTP transform: %+v", f.Flow)
		}
	}
	d.Bye(ctx)
	if cdr := h.cdr(); cdr.Media[call.A].SRTP != "AES_CM_128_HMAC_SHA1_80" || cdr.Media[call.B].SRTP != "" {
		t.Errorf("CDR media %+v", cdr.Media)
	}
}

func TestSRTPRequiredTowardCallee(t *testing.T) {
	ce := newCallee(t)
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		// Answer with a key for relayd's tag and suite.
		body := strings.Replace(string(offerSDP(6000, callerKey)), "RTP/AVP", "RTP/SAVP", 1)
		d.Respond(200, "OK", []byte(body), sip.NewHeader("Content-Type", "application/sdp"))
		<-d.Context().Done()
	})
	h := newHarness(t, opts{destinations: []string{ce.addr}, userspace: true, routeExtra: "srtp = \"require\"\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, offerSDP(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	toCallee := string(ce.lastInvite().Body())
	if !strings.Contains(toCallee, "RTP/SAVP") || !strings.Contains(toCallee, "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:") {
		t.Errorf("offer to the callee must require SRTP with relayd's key:\n%s", toCallee)
	}
	if ans := string(d.InviteResponse.Body()); strings.Contains(ans, "crypto") || !strings.Contains(ans, "RTP/AVP") {
		t.Errorf("answer to the plain caller:\n%s", ans)
	}
	waitFor(t, "userspace flows", func() bool { return h.us.Len() == 4 })
	d.Bye(ctx)
	h.cdr()
}

func TestSRTPPassThrough(t *testing.T) {
	ce := newCallee(t)
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		body := strings.Replace(string(offerSDP(6000, "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkw")), "RTP/AVP", "RTP/SAVP", 1)
		d.Respond(200, "OK", []byte(body), sip.NewHeader("Content-Type", "application/sdp"))
		<-d.Context().Done()
	})
	h := newHarness(t, opts{destinations: []string{ce.addr}, userspace: true, routeExtra: "srtp = \"offer\"\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, savpOffer(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	if !strings.Contains(string(ce.lastInvite().Body()), callerKey) {
		t.Errorf("caller's key not passed to the callee:\n%s", ce.lastInvite().Body())
	}
	if !strings.Contains(string(d.InviteResponse.Body()), "MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkw") {
		t.Errorf("callee's key not passed to the caller:\n%s", d.InviteResponse.Body())
	}
	waitFor(t, "XDP flows", func() bool { return h.xdp.Len() == 4 })
	if h.us.Len() != 0 {
		t.Errorf("%d userspace flows for end-to-end SRTP", h.us.Len())
	}
	d.Bye(ctx)
	h.cdr()
}

func TestSRTPKeptOnReofferFromCallee(t *testing.T) {
	ce := newCallee(t)
	var calleeDialog *sipgo.DialogServerSession
	got := make(chan struct{})
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) {
		calleeDialog = d
		answerSDP(d, req, 6000)
		close(got)
		<-d.Context().Done()
	})
	h := newHarness(t, opts{destinations: []string{ce.addr}, userspace: true})
	h.mu.Lock()
	h.callerSDP = savpOffer(4000)
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.invite(ctx, savpOffer(4000))
	if err != nil {
		t.Fatal(err)
	}
	d.Ack(ctx)
	<-got
	relayKey := string(d.InviteResponse.Body())
	relayKey = relayKey[strings.Index(relayKey, "a=crypto:"):]
	relayKey = relayKey[:strings.Index(relayKey, "\r\n")]
	// No new INVITE transaction before the first one ends with the ACK
	// (RFC 3261 14.1): wait for the callee's dialog to be confirmed.
	waitFor(t, "callee dialog confirmed", func() bool { return calleeDialog.LoadState() == sip.DialogStateConfirmed })
	// The plain callee holds: the caller still gets relayd's key.
	hold := sip.NewRequest(sip.INVITE, calleeDialog.InviteRequest.Contact().Address)
	hold.SetBody([]byte(strings.ReplaceAll(string(offerSDP(6000)), "a=sendrecv", "a=sendonly")))
	hold.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	var res *sip.Response
	for try := 0; ; try++ {
		var err error
		if res, err = calleeDialog.Do(ctx, hold.Clone()); err != nil {
			t.Fatal(err)
		}
		// 491 while relayd completes the first offer/answer: retry, as
		// RFC 3261 14.1 has the peer do.
		if res.StatusCode != sip.StatusRequestPending || try == 20 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res.StatusCode != 200 || strings.Contains(string(res.Body()), "crypto") {
		t.Fatalf("re-INVITE answer to the plain callee %s:\n%s", res.StartLine(), res.Body())
	}
	calleeDialog.WriteRequest(sip.NewRequest(sip.ACK, calleeDialog.InviteRequest.Contact().Address))
	h.mu.Lock()
	reinvites := h.reinvites
	h.mu.Unlock()
	if len(reinvites) != 1 || !strings.Contains(reinvites[0], "RTP/SAVP") || !strings.Contains(reinvites[0], relayKey) ||
		!strings.Contains(reinvites[0], "a=sendonly") {
		t.Errorf("re-INVITE to the SRTP caller must keep relayd's key %q:\n%v", relayKey, reinvites)
	}
	if h.us.Len() != 4 {
		t.Errorf("%d userspace flows after the re-offer, want 4", h.us.Len())
	}
	d.Bye(ctx)
	h.cdr()
}

// testLogger logs to t like zaptest.NewLogger at level, and drops what is
// logged once t's cleanups have run: sipgo's readers of a stopped
// server's connections can still hand a message to its handlers, which
// log, after the test has ended, and a log of an ended test is a data
// race with the testing package's own bookkeeping.
func testLogger(t testing.TB, level zapcore.Level) *zap.Logger {
	w := &endedWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
	})
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	return zap.New(zapcore.NewCore(enc, w, level), zap.ErrorOutput(w))
}

// endedWriter writes to t until ended.
type endedWriter struct {
	mu    sync.Mutex
	t     testing.TB
	ended bool
}

func (w *endedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	}
	return len(p), nil
}

func (w *endedWriter) Sync() error { return nil }
