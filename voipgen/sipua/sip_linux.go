package sipua

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayd/relayd/internal/sipgolog"
	"github.com/relayd/relayd/voipgen/analyze"
	"github.com/relayd/relayd/voipgen/gen"
	"github.com/relayd/relayd/voipgen/payload"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
)

// Endpoint is what voipgen call and answer share: a SIP user agent
// listening on one UDP address, and the media settings of its calls.
type Endpoint struct {
	Listen   netip.AddrPort // SIP
	Media    netip.Addr     // RTP address put into SDP
	RTPPort  int            // first RTP port; call i uses rtpPort+2i
	Codec    payload.Codec
	Ptime    time.Duration
	Emodel   analyze.EmodelOpts
	JSON     bool
	Debug    bool
	Duration time.Duration // call: call duration (mean with exp); answer: how long to run

	// NS, when set, runs fn where the endpoint's sockets belong (a lab
	// namespace's Do); sockets are created only through it.
	NS func(fn func() error) error

	seen *responseTimes // arrival of the first 18x and 2xx per Call-ID

	// Signal, when set, makes the endpoint signal only (voipgen bench).
	Signal *Signal

	ua  *sipgo.UserAgent
	srv *sipgo.Server
	cli *sipgo.Client
	dua *sipgo.DialogUA
}

// Signal makes an endpoint signal only: its calls carry no media of
// its own. Their SDP names media that another part of voipgen sends and
// receives (voipgen bench's paced sender and sink), and each call's peer
// address is reported instead of being sent to.
type Signal struct {
	Media  func(i int) netip.AddrPort         // the SDP's address for call i
	Crypto func(i int) string                 // an a=crypto value for call i's offer, or "" (plain RTP)
	Peer   func(i int, remote netip.AddrPort) // call i's peer media address, from its answer or offer
	// Failed, if set, is told of a placed call i that ended before its
	// ACK (Peer is not called for it): its final status, 0 if none came,
	// and what went wrong. A caller holding its calls learns of the
	// failures as they happen, not only from the reports at the end.
	Failed func(i, status int, reason string)
}

// sdp is call i's session description for media at local.
func (e *Endpoint) sdp(local netip.AddrPort, i int) []byte {
	if e.Signal != nil && e.Signal.Crypto != nil {
		if c := e.Signal.Crypto(i); c != "" {
			return SDPBodyCrypto(local, e.Codec, e.Ptime, int64(i)+1, c)
		}
	}
	return SDPBody(local, e.Codec, e.Ptime, int64(i)+1)
}

func (e *Endpoint) flags(fs *flag.FlagSet) (listen, media, codecName *string) {
	listen = fs.String("sip", "", "local SIP ADDR:PORT (UDP) (required)")
	media = fs.String("media", "", "RTP address for SDP (default: the SIP address)")
	fs.IntVar(&e.RTPPort, "rtp-port", 20000, "first local RTP port; call i uses +2i")
	codecName = fs.String("codec", "pcmu", "pcmu | pcma | g729 | opus")
	fs.DurationVar(&e.Ptime, "ptime", 20*time.Millisecond, "packetization time")
	fs.BoolVar(&e.JSON, "json", false, "print machine-readable JSON")
	fs.BoolVar(&e.Debug, "debug", false, "log SIP to stderr")
	fs.Float64Var(&e.Emodel.DelayMs, "emodel-delay", 0, "one-way delay Ta in ms for the E-model (0: G.107 default)")
	return
}

func (e *Endpoint) parse(listen, media, codecName string) error {
	var err error
	if e.Listen, err = netip.ParseAddrPort(listen); err != nil {
		return fmt.Errorf("--sip %q: %w", listen, err)
	}
	e.Media = e.Listen.Addr()
	if media != "" {
		if e.Media, err = netip.ParseAddr(media); err != nil {
			return fmt.Errorf("--media %q: %w", media, err)
		}
	}
	if e.Codec, err = payload.LookupAny(codecName, e.Ptime); err != nil {
		return err
	}
	if e.RTPPort < 1 || e.RTPPort > 65000 {
		return fmt.Errorf("--rtp-port %d", e.RTPPort)
	}
	return nil
}

// start opens the user agent and listens. It returns once the listener is
// bound. register adds the server's handlers before it serves: sipgo's
// handler map is not safe to write while requests are read against it.
func (e *Endpoint) start(ctx context.Context, register func()) error {
	log := slog.New(slog.DiscardHandler)
	if e.Debug {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	sipgolog.SetTarget(log)
	host := e.Listen.Addr().String()
	var err error
	if e.ua, err = sipgo.NewUA(sipgo.WithUserAgent("voipgen"), sipgo.WithUserAgentHostname(host)); err != nil {
		return err
	}
	if e.srv, err = sipgo.NewServer(e.ua, sipgo.WithServerLogger(log)); err != nil {
		return err
	}
	if e.cli, err = sipgo.NewClient(e.ua, sipgo.WithClientLogger(log), sipgo.WithClientHostname(host),
		sipgo.WithClientConnectionAddr(e.Listen.String())); err != nil {
		return err
	}
	e.dua = &sipgo.DialogUA{Client: e.cli, ContactHDR: sip.ContactHeader{
		Address: sip.Uri{Scheme: "sip", User: "voipgen", Host: host, Port: int(e.Listen.Port())}}}
	// Bind first so that a busy port is an error here, not in a goroutine.
	var c net.PacketConn
	err = e.do(func() (err error) { c, err = net.ListenPacket("udp", e.Listen.String()); return err })
	if err != nil {
		return fmt.Errorf("SIP listen on %s: %w", e.Listen, err)
	}
	e.seen = &responseTimes{first: map[string]*[2]time.Time{}}
	register()
	go func() { _ = e.srv.ServeUDP(&sniffConn{PacketConn: c, rt: e.seen}) }()
	go func() { <-ctx.Done(); c.Close() }()
	// sipgo registers the listener for client transactions in its own
	// goroutine: a request sent before that would open a second socket on
	// the same address and fail. ListenPorts, not GetListenPort: sipgo
	// (v1.7.3) reads its map of listen ports under its lock only in
	// ListenPorts, and an unlocked read racing the registration is the
	// runtime's fatal "concurrent map read and map write" (a voipgen
	// call died so in the appliance test's guest).
	for i := 0; i < 200 && len(e.ua.TransportLayer().ListenPorts("udp")) == 0; i++ {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	return nil
}

func (e *Endpoint) do(fn func() error) error {
	if e.NS == nil {
		return fn()
	}
	return e.NS(fn)
}

func (e *Endpoint) close() {
	if e.ua != nil {
		e.ua.Close()
	}
}

// callMedia is the RTP of one call: one bidirectional stream from
// local to the peer's SDP address, analysed as it comes back.
type callMedia struct {
	g      *gen.Generator
	local  netip.AddrPort
	cancel context.CancelFunc
	done   chan struct{}
	res    gen.Result
	rep    *analyze.Report
}

// openMedia binds the RTP socket of a call at local (before the SDP that
// names it is sent).
func (e *Endpoint) openMedia(local netip.AddrPort, maxDur time.Duration) (*callMedia, error) {
	cfg := gen.Config{
		Src: gen.Endpoints{Lo: local.Addr(), N: 1, Port: int(local.Port())}, Dst: gen.Endpoints{Lo: local.Addr(), N: 1, Port: 9},
		Streams: 1, Codec: e.Codec, Ptime: e.Ptime, Duration: maxDur, Bidir: true, Threads: 1, Transport: "udp",
		Slot: time.Millisecond, DSCP: 46, Grace: 200 * time.Millisecond, Emodel: e.Emodel,
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var g *gen.Generator
	if err := e.do(func() (err error) { g, err = gen.New(cfg); return err }); err != nil {
		return nil, err
	}
	return &callMedia{g: g, local: local, done: make(chan struct{})}, nil
}

// startMedia sends to the peer and analyses what comes back until stop;
// nothing on nil media (signalling only).
func (m *callMedia) start(peer netip.AddrPort) {
	if m == nil {
		return
	}
	m.g.SetDst(0, peer)
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() {
		defer close(m.done)
		m.res, m.rep = m.g.RunAndReceive(ctx, nil)
		m.g.Close()
	}()
}

// stop ends the media and waits for its report; safe on media never started.
func (m *callMedia) stop() {
	if m == nil {
		return
	}
	if m.cancel == nil {
		m.g.Close()
		return
	}
	m.cancel()
	<-m.done
}

// CallReport is one call of voipgen call or answer.
type CallReport struct {
	Call     int     `json:"call"`
	CallID   string  `json:"call_id"`
	Status   int     `json:"status"` // final response code; 0: none
	Success  bool    `json:"success"`
	T180Ms   float64 `json:"t180_ms,omitempty"` // INVITE to first 180/183
	T200Ms   float64 `json:"t200_ms,omitempty"` // INVITE to 200
	Error    string  `json:"error,omitempty"`
	Local    string  `json:"local_rtp,omitempty"`
	Remote   string  `json:"remote_rtp,omitempty"`
	Duration float64 `json:"duration_s"`
	ByeFrom  string  `json:"bye_from,omitempty"` // "local" or "remote"
	// Media: sent by this side, and received from the peer.
	SentPackets uint64                `json:"sent_packets"`
	Received    *analyze.StreamReport `json:"received,omitempty"`
	// SendErrors are packets this side failed to send, by errno: the peer
	// sees their sequence numbers missing, as if the network lost them.
	SendErrors     uint64            `json:"send_errors,omitempty"`
	SendErrorKinds map[string]uint64 `json:"send_error_kinds,omitempty"`
}

// Summary aggregates calls.
type Summary struct {
	Calls     int                  `json:"calls"`
	Succeeded int                  `json:"succeeded"`
	Failed    int                  `json:"failed"`
	Statuses  map[int]int          `json:"statuses"`
	T180Ms    analyze.Distribution `json:"t180_ms"`
	T200Ms    analyze.Distribution `json:"t200_ms"`
	// Media over the calls that carried any.
	WithMedia   int                  `json:"calls_with_media_both_ways"`
	SentPackets uint64               `json:"sent_packets"`
	SendErrors  uint64               `json:"send_errors"`
	RecvPackets uint64               `json:"received_packets"`
	Lost        int64                `json:"lost"`
	JitterMs    analyze.Distribution `json:"jitter_ms"`
	MaxGapMs    analyze.Distribution `json:"max_gap_ms"`
	MOS         analyze.Distribution `json:"mos"`
}

func Summarize(calls []CallReport) Summary {
	s := Summary{Calls: len(calls), Statuses: map[int]int{}}
	var t180, t200, jit, gap, mos []float64
	for _, c := range calls {
		s.Statuses[c.Status]++
		if c.Success {
			s.Succeeded++
		} else {
			s.Failed++
		}
		if c.T180Ms > 0 {
			t180 = append(t180, c.T180Ms)
		}
		if c.T200Ms > 0 {
			t200 = append(t200, c.T200Ms)
		}
		s.SentPackets += c.SentPackets
		s.SendErrors += c.SendErrors
		if r := c.Received; r != nil {
			s.RecvPackets += r.Packets
			s.Lost += r.Lost
			jit, gap = append(jit, r.JitterMs), append(gap, r.MaxGapMs)
			if r.MOS != nil {
				mos = append(mos, *r.MOS)
			}
			if c.SentPackets > 0 && r.Packets > 0 {
				s.WithMedia++
			}
		}
	}
	s.T180Ms, s.T200Ms, s.JitterMs, s.MaxGapMs, s.MOS = analyze.DistOf(t180), analyze.DistOf(t200), analyze.DistOf(jit), analyze.DistOf(gap), analyze.DistOf(mos)
	return s
}

func (s Summary) WriteText(w io.Writer, what string) {
	codes := make([]int, 0, len(s.Statuses))
	for c := range s.Statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var st []string
	for _, c := range codes {
		st = append(st, fmt.Sprintf("%d x%d", c, s.Statuses[c]))
	}
	fmt.Fprintf(w, "%s: %d calls, %d succeeded, %d failed; final responses: %s\n", what, s.Calls, s.Succeeded, s.Failed, strings.Join(st, ", "))
	if s.T200Ms.N > 0 || s.T180Ms.N > 0 {
		fmt.Fprintf(w, "  setup ms: to 180 %v; to 200 %v\n", s.T180Ms, s.T200Ms)
	}
	fmt.Fprintf(w, "  media: %d calls with media both ways; sent %d packets (%d send errors), received %d, lost %d; jitter ms %v; max gap ms %v; MOS %v\n",
		s.WithMedia, s.SentPackets, s.SendErrors, s.RecvPackets, s.Lost, s.JitterMs, s.MaxGapMs, s.MOS)
}

func mediaReport(c *CallReport, m *callMedia) {
	if m == nil {
		return
	}
	c.SentPackets = m.res.Packets
	c.SendErrors, c.SendErrorKinds = m.res.Errors, m.res.ErrorKinds
	if m.rep != nil {
		for i := range m.rep.Streams {
			s := m.rep.Streams[i]
			if s.Port == int(m.local.Port()) && (c.Received == nil || s.Packets > c.Received.Packets) {
				c.Received = &s
			}
		}
	}
}

const CallUsage = `usage: voipgen call --sip ADDR:PORT --target sip:USER@HOST[:PORT] [flags]

Places --calls calls at --rate calls per second (at most --concurrent at
once) through a SIP proxy or B2BUA, each with one bidirectional G.711,
G.729 or Opus stream from voipgen's sender (RTP from --rtp-port+2i), held
for --call-duration (fixed or exponential) and hung up with BYE. SIGUSR1
hangs up every call now, each with its BYE as if its duration had passed,
and places no more. Reports call success, setup time to the first 180/183
and to the 200, and the media each call received back.

flags:
`

type CallConfig struct {
	Endpoint
	Target     sip.Uri
	Calls      int
	Concurrent int
	Rate       float64
	Exp        bool
	Timeout    time.Duration
	// Hangup, when closed, ends every call at once with its BYE (as if
	// its duration had passed: ByeFrom "local"); calls not placed yet are
	// not placed. voipgen call closes it on SIGUSR1, so that a test can
	// hold calls until it has done what they must span.
	Hangup <-chan struct{}
}

func ParseCall(args []string, out io.Writer) (CallConfig, error) {
	var c CallConfig
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, CallUsage); fs.PrintDefaults() }
	listen, media, codecName := c.flags(fs)
	target := fs.String("target", "", "request URI, e.g. sip:uas@198.18.2.2:5060 (required)")
	fs.IntVar(&c.Calls, "calls", 1, "calls to place")
	fs.IntVar(&c.Concurrent, "concurrent", 0, "most calls at once (0: --calls)")
	fs.Float64Var(&c.Rate, "rate", 10, "calls per second")
	fs.DurationVar(&c.Duration, "call-duration", 5*time.Second, "call duration after the answer")
	dist := fs.String("call-duration-dist", "fixed", "fixed | exp")
	fs.DurationVar(&c.Timeout, "answer-timeout", 32*time.Second, "give up (CANCEL) a call not answered within this")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if err := c.parse(*listen, *media, *codecName); err != nil {
		return c, err
	}
	if err := sip.ParseUri(*target, &c.Target); err != nil || *target == "" {
		return c, fmt.Errorf("--target %q: want sip:USER@HOST[:PORT]", *target)
	}
	c.Exp = *dist == "exp"
	if *dist != "fixed" && *dist != "exp" {
		return c, fmt.Errorf("--call-duration-dist %q", *dist)
	}
	if c.Concurrent == 0 {
		c.Concurrent = c.Calls
	}
	switch {
	case c.Calls < 1 || c.Concurrent < 1:
		return c, errors.New("--calls and --concurrent must be positive")
	case c.Rate <= 0:
		return c, errors.New("--rate must be positive")
	case c.RTPPort+2*c.Concurrent > 65535:
		return c, errors.New("--rtp-port + 2 x --concurrent exceeds 65535")
	}
	return c, nil
}

// callSlots hands out RTP port slots to concurrent calls.
type callSlots struct {
	mu   sync.Mutex
	free []int
}

func (s *callSlots) get() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	return i
}

func (s *callSlots) put(i int) {
	s.mu.Lock()
	s.free = append(s.free, i)
	s.mu.Unlock()
}

// PlaceCalls runs voipgen call and returns a report per call.
func PlaceCalls(ctx context.Context, cfg CallConfig) ([]CallReport, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The socket outlives ctx until every call returned: a call ended by
	// ctx still sends its BYE and reads the answer.
	tctx, tcancel := context.WithCancel(context.Background())
	defer tcancel()
	// In-dialog requests from the far end: BYE ends the call.
	var mu sync.Mutex
	byes := map[string]chan struct{}{}
	err := cfg.start(tctx, func() {
		cfg.srv.OnBye(func(req *sip.Request, tx sip.ServerTransaction) {
			mu.Lock()
			ch := byes[req.CallID().Value()]
			delete(byes, req.CallID().Value())
			mu.Unlock()
			code := 200
			if ch == nil {
				code = 481
			} else {
				close(ch)
			}
			_ = tx.Respond(sip.NewResponseFromRequest(req, code, map[int]string{200: "OK", 481: "Call/Transaction Does Not Exist"}[code], nil))
		})
	})
	if err != nil {
		return nil, err
	}
	defer cfg.close()
	slots := &callSlots{}
	for i := cfg.Concurrent - 1; i >= 0; i-- {
		slots.free = append(slots.free, i)
	}
	sem := make(chan struct{}, cfg.Concurrent)
	reports := make([]CallReport, cfg.Calls)
	placed := cfg.Calls // the calls placed: fewer when ctx or a hang-up ended the placing
	var wg sync.WaitGroup
	start := time.Now()
	rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), 7))
	for i := range cfg.Calls {
		if d := time.Until(start.Add(time.Duration(float64(i) / cfg.Rate * float64(time.Second)))); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			case <-cfg.Hangup:
			}
		}
		if ctx.Err() != nil || closed(cfg.Hangup) {
			placed = i
			break
		}
		sem <- struct{}{}
		dur := cfg.Duration
		if cfg.Exp {
			dur = time.Duration(rng.ExpFloat64() * float64(dur))
		}
		bye := make(chan struct{})
		wg.Go(func() {
			defer func() { <-sem }()
			slot := slots.get()
			defer slots.put(slot)
			reports[i] = cfg.oneCall(ctx, i, slot, dur, bye, func(callID string) {
				mu.Lock()
				byes[callID] = bye
				mu.Unlock()
			})
		})
	}
	wg.Wait()
	return reports[:placed], nil
}

// closed reports whether ch is closed; a nil ch never is.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// oneCall places call i with RTP port slot and holds it for dur.
func (cfg *CallConfig) oneCall(ctx context.Context, i, slot int, dur time.Duration, bye chan struct{}, register func(string)) (r CallReport) {
	r = CallReport{Call: i}
	acked := false
	if cfg.Signal != nil && cfg.Signal.Failed != nil {
		defer func() {
			if !acked {
				cfg.Signal.Failed(i, r.Status, r.Error)
			}
		}()
	}
	local := netip.AddrPortFrom(cfg.Media, uint16(cfg.RTPPort+2*slot))
	var m *callMedia // nil when signalling only
	if cfg.Signal != nil {
		local = cfg.Signal.Media(i)
	} else {
		var err error
		if m, err = cfg.openMedia(local, dur+cfg.Timeout+time.Minute); err != nil {
			r.Error = err.Error()
			return r
		}
		defer m.stop()
	}
	r.Local = local.String()
	req := sip.NewRequest(sip.INVITE, cfg.Target)
	req.SetBody(cfg.sdp(local, i))
	req.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
	from := &sip.FromHeader{Address: sip.Uri{Scheme: "sip", User: "voipgen" + strconv.Itoa(i), Host: cfg.Listen.Addr().String(), Port: int(cfg.Listen.Port())},
		Params: sip.NewParams()}
	from.Params.Add("tag", sip.GenerateTagN(16))
	req.AppendHeader(from)
	t0 := time.Now()
	// Past the answer timeout a call that had a provisional response is
	// CANCELled; one without is abandoned at once (a CANCEL needs a
	// provisional response, and sipgo would otherwise wait for Timer B).
	var provisional atomic.Bool
	actx, acancel := context.WithCancelCause(ctx)
	defer acancel(nil)
	timer := time.AfterFunc(cfg.Timeout, func() {
		if provisional.Load() {
			acancel(context.DeadlineExceeded)
		} else {
			acancel(sipgo.WaitAnswerForceCancelErr)
		}
	})
	defer timer.Stop()
	sess, err := cfg.dua.WriteInvite(actx, req)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer sess.Close()
	r.CallID = req.CallID().Value()
	register(r.CallID)
	err = sess.WaitAnswer(actx, sipgo.AnswerOptions{OnResponse: func(res *sip.Response) error {
		if res.StatusCode > 100 && res.StatusCode < 200 {
			provisional.Store(true)
		}
		if (res.StatusCode == 180 || res.StatusCode == 183) && r.T180Ms == 0 {
			r.T180Ms = float64(time.Since(t0)) / 1e6
		}
		if res.StatusCode >= 200 {
			r.Status = res.StatusCode
		}
		return nil
	}})
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.T200Ms = float64(time.Since(t0)) / 1e6
	if t180, t200 := cfg.seen.get(r.CallID); !t200.IsZero() {
		r.T200Ms = float64(t200.Sub(t0)) / 1e6
		if !t180.IsZero() {
			r.T180Ms = float64(t180.Sub(t0)) / 1e6
		}
	}
	sd, err := ParseSDP(sess.InviteResponse.Body())
	if err != nil {
		r.Error = "answer: " + err.Error()
		_ = sess.Ack(ctx)
		_ = sess.Bye(ctx)
		return r
	}
	r.Remote = sd.Addr.String()
	if err := sess.Ack(ctx); err != nil {
		r.Error = "ACK: " + err.Error()
		return r
	}
	acked = true
	if cfg.Signal != nil {
		cfg.Signal.Peer(i, sd.Addr)
	}
	m.start(sd.Addr)
	t1 := time.Now()
	select {
	case <-time.After(dur):
		r.ByeFrom = "local"
	case <-bye:
		r.ByeFrom = "remote"
	case <-ctx.Done():
		r.ByeFrom = "local"
	case <-cfg.Hangup:
		r.ByeFrom = "local"
	}
	r.Duration = time.Since(t1).Seconds()
	m.stop()
	mediaReport(&r, m)
	if r.ByeFrom == "local" {
		bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := sess.Bye(bctx)
		bcancel()
		if err != nil {
			r.Error = "BYE: " + err.Error()
			return r
		}
	}
	r.Success = r.Status >= 200 && r.Status < 300
	return r
}

const AnswerUsage = `usage: voipgen answer --sip ADDR:PORT [flags]

Answers incoming calls for --duration (or until SIGINT) with one of these
personalities: answer (180, then 200 with SDP after --ring, then RTP both
ways from voipgen's sender until BYE), ring (180 and never answer; a CANCEL
gets 487), reject:CODE (e.g. reject:404, 480, 503 or 603), silent (no
response at all). Then reports every call and the media it received.

flags:
`

type AnswerConfig struct {
	Endpoint
	Personality string
	Code        int
	Ring        time.Duration
	MaxCalls    int
	MaxCallDur  time.Duration
}

func ParseAnswer(args []string, out io.Writer) (AnswerConfig, error) {
	var c AnswerConfig
	fs := flag.NewFlagSet("answer", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, AnswerUsage); fs.PrintDefaults() }
	listen, media, codecName := c.flags(fs)
	p := fs.String("personality", "answer", "answer | ring | reject:CODE | silent")
	fs.DurationVar(&c.Ring, "ring", 0, "ring this long (180) before answering")
	fs.DurationVar(&c.Duration, "duration", time.Minute, "how long to answer calls")
	fs.IntVar(&c.MaxCalls, "max-calls", 0, "stop after this many calls ended (0: no limit)")
	fs.DurationVar(&c.MaxCallDur, "max-call-duration", time.Hour, "hang up (BYE) calls still up after this")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if err := c.parse(*listen, *media, *codecName); err != nil {
		return c, err
	}
	c.Personality = *p
	switch {
	case *p == "answer" || *p == "ring" || *p == "silent":
	case strings.HasPrefix(*p, "reject:"):
		code, err := strconv.Atoi(strings.TrimPrefix(*p, "reject:"))
		if err != nil || code < 300 || code > 699 {
			return c, fmt.Errorf("--personality %q: want reject:CODE with a code 300-699", *p)
		}
		c.Personality, c.Code = "reject", code
	default:
		return c, fmt.Errorf("--personality %q: want answer, ring, reject:CODE or silent", *p)
	}
	return c, nil
}

// AnswerCalls answers calls until ctx is done, the duration passed or
// maxCalls calls ended; ready, if set, is closed once SIP listens.
func AnswerCalls(ctx context.Context, cfg AnswerConfig, ready chan<- struct{}) ([]CallReport, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	// As in PlaceCalls: the calls ctx ends still send their BYEs.
	tctx, tcancel := context.WithCancel(context.Background())
	defer tcancel()
	var mu sync.Mutex
	var reports []CallReport
	var ended atomic.Int64
	slots := &callSlots{}
	const maxSlots = 10000
	for i := maxSlots - 1; i >= 0; i-- {
		if cfg.RTPPort+2*i <= 65534 {
			slots.free = append(slots.free, i)
		}
	}
	type active struct {
		sess *sipgo.DialogServerSession
		bye  chan struct{}
	}
	calls := map[string]*active{}
	var wg sync.WaitGroup
	var n atomic.Int64
	finish := func(r CallReport) {
		mu.Lock()
		reports = append(reports, r)
		mu.Unlock()
		if ended.Add(1) == int64(cfg.MaxCalls) {
			cancel()
		}
	}
	register := func() {
		cfg.srv.OnInvite(func(req *sip.Request, tx sip.ServerTransaction) {
			i := int(n.Add(1)) - 1
			r := CallReport{Call: i, CallID: req.CallID().Value()}
			switch cfg.Personality {
			case "silent":
				finish(r)
				return
			case "reject":
				_ = tx.Respond(sip.NewResponseFromRequest(req, cfg.Code, reasonPhrase(cfg.Code), nil))
				r.Status = cfg.Code
				finish(r)
				return
			}
			sess, err := cfg.dua.ReadInvite(req, tx)
			if err != nil {
				r.Error = err.Error()
				finish(r)
				return
			}
			t0 := time.Now()
			_ = sess.Respond(180, "Ringing", nil)
			r.T180Ms = float64(time.Since(t0)) / 1e6
			if cfg.Personality == "ring" {
				// Never answer: wait for the CANCEL (487) or the end.
				select {
				case <-sess.Context().Done():
				case <-ctx.Done():
					_ = sess.Respond(480, "Temporarily Unavailable", nil)
				}
				r.Status = 487
				finish(r)
				sess.Close()
				return
			}
			offer, err := ParseSDP(req.Body())
			if err != nil {
				_ = sess.Respond(488, "Not Acceptable Here", nil)
				r.Status, r.Error = 488, err.Error()
				finish(r)
				return
			}
			slot := slots.get()
			local := netip.AddrPortFrom(cfg.Media, uint16(cfg.RTPPort+2*slot))
			var m *callMedia // nil when signalling only
			if cfg.Signal != nil {
				local = cfg.Signal.Media(i)
				cfg.Signal.Peer(i, offer.Addr)
			} else if m, err = cfg.openMedia(local, cfg.MaxCallDur+time.Minute); err != nil {
				slots.put(slot)
				_ = sess.Respond(500, "Server Internal Error", nil)
				r.Status, r.Error = 500, err.Error()
				finish(r)
				return
			}
			r.Local, r.Remote = local.String(), offer.Addr.String()
			if cfg.Ring > 0 {
				select {
				case <-time.After(cfg.Ring):
				case <-sess.Context().Done():
				}
			}
			a := &active{sess: sess, bye: make(chan struct{})}
			mu.Lock()
			calls[r.CallID] = a
			mu.Unlock()
			if err := sess.RespondSDP(cfg.sdp(local, i)); err != nil {
				m.stop()
				slots.put(slot)
				r.Error = err.Error()
				finish(r)
				return
			}
			r.Status, r.T200Ms = 200, float64(time.Since(t0))/1e6
			// The media and the call's end run on after the handler returns.
			wg.Go(func() {
				defer slots.put(slot)
				m.start(offer.Addr)
				t1 := time.Now()
				select {
				case <-a.bye:
					r.ByeFrom = "remote"
				case <-time.After(cfg.MaxCallDur):
					r.ByeFrom = "local"
				case <-ctx.Done():
					r.ByeFrom = "local"
				}
				r.Duration = time.Since(t1).Seconds()
				m.stop()
				mediaReport(&r, m)
				if r.ByeFrom == "local" {
					bctx, bcancel := context.WithTimeout(context.Background(), 2*time.Second)
					_ = sess.Bye(bctx)
					bcancel()
				}
				sess.Close()
				r.Success = true
				finish(r)
			})
		})
		cfg.srv.OnAck(func(req *sip.Request, tx sip.ServerTransaction) {
			mu.Lock()
			a := calls[req.CallID().Value()]
			mu.Unlock()
			if a != nil {
				_ = a.sess.ReadAck(req, tx)
			}
		})
		cfg.srv.OnBye(func(req *sip.Request, tx sip.ServerTransaction) {
			mu.Lock()
			a := calls[req.CallID().Value()]
			delete(calls, req.CallID().Value())
			mu.Unlock()
			if a == nil {
				_ = tx.Respond(sip.NewResponseFromRequest(req, 481, "Call/Transaction Does Not Exist", nil))
				return
			}
			_ = a.sess.ReadBye(req, tx)
			close(a.bye)
		})
	}
	if err := cfg.start(tctx, register); err != nil {
		return nil, err
	}
	defer cfg.close()
	if ready != nil {
		close(ready)
	}
	<-ctx.Done()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(reports, func(i, j int) bool { return reports[i].Call < reports[j].Call })
	return reports, nil
}

// reasonPhrase returns the RFC 3261 reason phrase of the codes voipgen
// answer sends.
func reasonPhrase(code int) string {
	if p, ok := map[int]string{404: "Not Found", 480: "Temporarily Unavailable", 486: "Busy Here",
		487: "Request Terminated", 488: "Not Acceptable Here", 500: "Server Internal Error",
		503: "Service Unavailable", 603: "Decline"}[code]; ok {
		return p
	}
	return "Rejected"
}

// responseTimes records when the first 180/183 and the first 2xx of each
// call arrived, as read from the socket. sipgo handles each datagram in
// its own goroutine: a 180 and a 200 arriving back to back can reach the
// transaction in the wrong order, which then drops the 180, so setup times
// are taken here rather than from the transaction's responses.
type responseTimes struct {
	mu    sync.Mutex
	first map[string]*[2]time.Time // Call-ID: [18x, 2xx]
}

func (rt *responseTimes) get(callID string) (t180, t200 time.Time) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if v := rt.first[callID]; v != nil {
		delete(rt.first, callID)
		return v[0], v[1]
	}
	return
}

// sniffConn is the SIP socket, noting response arrivals in rt.
type sniffConn struct {
	net.PacketConn
	rt *responseTimes
}

func (c *sniffConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := c.PacketConn.ReadFrom(b)
	if err == nil {
		c.rt.note(b[:n], time.Now())
	}
	return n, a, err
}

var (
	sipStatus18x = []byte("SIP/2.0 18")
	sipStatus2xx = []byte("SIP/2.0 2")
)

func (rt *responseTimes) note(msg []byte, now time.Time) {
	k := -1
	switch {
	case bytes.HasPrefix(msg, sipStatus18x) && len(msg) > 10 && (msg[10] == '0' || msg[10] == '3'):
		k = 0
	case bytes.HasPrefix(msg, sipStatus2xx):
		k = 1
	default:
		return
	}
	id := sipCallID(msg)
	if id == "" {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	v := rt.first[id]
	if v == nil {
		if len(rt.first) > 100000 {
			return // calls nobody asks about: do not grow without bound
		}
		v = new([2]time.Time)
		rt.first[id] = v
	}
	if v[k].IsZero() {
		v[k] = now
	}
}

// sipCallID returns the Call-ID header value (or its compact form i:).
func sipCallID(msg []byte) string {
	for len(msg) > 0 {
		i := bytes.IndexByte(msg, '\n')
		if i < 0 {
			return ""
		}
		msg = msg[i+1:]
		line := msg
		if j := bytes.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			return "" // end of headers
		}
		name, val, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		name = bytes.TrimSpace(name)
		if bytes.EqualFold(name, []byte("Call-ID")) || bytes.EqualFold(name, []byte("i")) {
			return string(bytes.TrimSpace(val))
		}
	}
	return ""
}
