package sip

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/internal/siptorture"
)

// tortureCase is one line of testdata/torture/expect.txt.
type tortureCase struct {
	file    string // under testdata/torture
	section string // of RFC 4475, or "-"
	outcome string // accepted, rejected, dropped
	status  int    // final status; 0 when dropped
	data    []byte
}

func loadTorture(t *testing.T) []tortureCase {
	t.Helper()
	f, err := os.Open("testdata/torture/expect.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cases []tortureCase
	listed := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 4 {
			t.Fatalf("expect.txt: %q", line)
		}
		c := tortureCase{file: fields[0], section: fields[1], outcome: fields[2]}
		switch c.outcome {
		case "accepted", "rejected":
			if c.status, err = strconv.Atoi(fields[3]); err != nil {
				t.Fatalf("expect.txt: %q: %v", line, err)
			}
		case "dropped":
			if fields[3] != "-" {
				t.Fatalf("expect.txt: %q: a dropped message has no status", line)
			}
		default:
			t.Fatalf("expect.txt: %q: outcome %q", line, c.outcome)
		}
		if c.data, err = os.ReadFile(filepath.Join("testdata/torture", c.file)); err != nil {
			t.Fatal(err)
		}
		listed[c.file] = true
		cases = append(cases, c)
	}
	files, _ := filepath.Glob("testdata/torture/*/*.dat")
	for _, f := range files {
		if rel, _ := filepath.Rel("testdata/torture", f); !listed[filepath.ToSlash(rel)] {
			t.Errorf("%s is not in expect.txt", rel)
		}
	}
	sections := 0
	for _, c := range cases {
		if c.section != "-" {
			sections++
		}
	}
	if sections != 49 {
		t.Errorf("%d RFC 4475 messages in expect.txt, want its 49", sections)
	}
	return cases
}

// tortureIP is the loopback address the test sends message i from, so
// that each message's answers (and their retransmissions) are its own.
func tortureIP(base byte, i int) net.IP { return net.IPv4(127, base, byte(i/250), byte(i%250+1)) }

var (
	viaLine   = regexp.MustCompile(`(?im)^(?:via|v)[ \t]*:[ \t]*(.*)$`)
	viaPort   = regexp.MustCompile(`(?i)^SIP\s*/\s*[\d.]+\s*/\s*\S+\s+[^\s:;,]+\s*(?::\s*(\d+))?`)
	callIDRe  = regexp.MustCompile(`(?im)^(?:call-id|i)[ \t]*:[ \t]*(\S+)`)
	statusRe  = regexp.MustCompile(`^SIP/2\.0 (\d{3}) `)
	headerRes sync.Map // of *regexp.Regexp by header name
)

// answerPort is where RFC 3261 18.2.2 sends the answer to msg, sent from
// srcPort: the top Via's port (default 5060), or the source port with
// rport (RFC 3581).
func answerPort(msg []byte, srcPort int) int {
	m := viaLine.FindSubmatch(msg)
	if m == nil {
		return 0
	}
	top, _, _ := bytes.Cut(m[1], []byte{','})
	if regexp.MustCompile(`(?i);\s*rport\s*(;|$)`).Match(bytes.TrimSpace(top)) {
		return srcPort
	}
	if p := viaPort.FindSubmatch(top); p != nil && len(p[1]) > 0 {
		n, _ := strconv.Atoi(string(p[1]))
		return n
	}
	return 5060
}

func hdr(res []byte, name string) string {
	v, ok := headerRes.Load(name)
	if !ok {
		v, _ = headerRes.LoadOrStore(name, regexp.MustCompile(`(?im)^`+regexp.QuoteMeta(name)+`[ \t]*:[ \t]*(.*?)\r$`))
	}
	if m := v.(*regexp.Regexp).FindSubmatch(res); m != nil {
		return string(m[1])
	}
	return ""
}

// answer is one datagram the test got, and on which port.
type answer struct {
	port int
	data []byte
}

// exchange sends msg from ip to the B2BUA and returns what comes back
// to ip's ports 5060 and 5050 and to the sending port, until a final
// answer has come (and a little more, for duplicates) or wait passed.
func exchange(t *testing.T, h *harness, ip net.IP, msg []byte, wait time.Duration) ([]answer, int) {
	t.Helper()
	sender, err := net.ListenUDP("udp4", &net.UDPAddr{IP: ip})
	if err != nil {
		t.Fatal(err)
	}
	conns := []*net.UDPConn{sender}
	for _, port := range []int{5060, 5050} {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: ip, Port: port})
		if err != nil {
			t.Fatalf("listen on %s:%d: %v", ip, port, err)
		}
		conns = append(conns, c)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	raddr, _ := net.ResolveUDPAddr("udp4", h.addr)
	if _, err := sender.WriteToUDP(msg, raddr); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []answer
	final := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(wait))
		wg.Go(func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := c.ReadFromUDP(buf)
				if err != nil {
					return
				}
				a := answer{port: c.LocalAddr().(*net.UDPAddr).Port, data: bytes.Clone(buf[:n])}
				mu.Lock()
				got = append(got, a)
				mu.Unlock()
				if m := statusRe.FindSubmatch(a.data); m != nil && m[1][0] != '1' {
					once.Do(func() { close(final) })
				}
			}
		})
	}
	select {
	case <-final:
		time.Sleep(100 * time.Millisecond)
		for _, c := range conns {
			c.SetReadDeadline(time.Now())
		}
	case <-time.After(wait):
	}
	wg.Wait()
	return got, sender.LocalAddr().(*net.UDPAddr).Port
}

// ackFor acknowledges a final answer to an INVITE (RFC 3261 17.1.1.3),
// so that relayd stops resending it.
func ackFor(invite, res []byte) []byte {
	start, _, _ := bytes.Cut(invite, []byte("\r\n"))
	parts := strings.Fields(string(start))
	num, _, _ := strings.Cut(hdr(res, "CSeq"), " ")
	return fmt.Appendf(nil, "ACK %s SIP/2.0\r\nVia: %s\r\nFrom: %s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %s ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
		parts[1], hdr(res, "Via"), hdr(res, "From"), hdr(res, "To"), hdr(res, "Call-ID"), num)
}

// tortureHarness is a B2BUA whose callee declines every call, so that
// relayd never contacts the hosts the torture messages name. The CDRs
// of those calls are read off; answered reports those of answered calls.
func tortureHarness(t *testing.T, log *zap.Logger) (h *harness, ce *callee, answered chan call.Info) {
	ce = newCallee(t)
	ce.set(func(d *sipgo.DialogServerSession, req *sip.Request) { d.Respond(603, "Decline", nil) })
	h = newHarness(t, opts{destinations: []string{ce.addr}, log: log})
	answered = make(chan call.Info, 1)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		for {
			select {
			case info := <-h.ended:
				if info.Code == 200 {
					answered <- info
				}
			case <-stop:
				return
			}
		}
	}()
	return h, ce, answered
}

// TestTortureMessages sends each RFC 4475 message (and a few of relayd's
// own) alone over UDP and checks the answer expect.txt gives: its
// status, that it comes to the port RFC 3261 18.2.2 says, with the
// request's Call-ID, and nothing for the dropped ones.
func TestTortureMessages(t *testing.T) {
	cases := loadTorture(t)
	// A datagram too large for sipgo's read buffer (32 KiB): cut, so 513.
	big := fmt.Appendf(nil, "INVITE sip:user@example.com SIP/2.0\r\nVia: SIP/2.0/UDP big.example.com;branch=z9hG4bK-big\r\n"+
		"Max-Forwards: 70\r\nFrom: <sip:caller@example.net>;tag=big1\r\nTo: <sip:user@example.com>\r\nCall-ID: big.relayd\r\n"+
		"CSeq: 1 INVITE\r\nContact: <sip:caller@big.example.com>\r\nContent-Type: application/sdp\r\nContent-Length: 40000\r\n\r\n%s",
		bytes.Repeat([]byte("a=x\r\n"), 8000))
	cases = append(cases, tortureCase{file: "(generated) 40 kB INVITE", outcome: "rejected", status: 513, data: big})

	// Several messages share a transaction key (top Via and CSeq method,
	// RFC 3261 17.2.3): sent to one B2BUA, a later one is a
	// retransmission of the earlier and gets its answer. Each round of
	// messages with distinct keys has a B2BUA of its own.
	var rounds []map[string]bool
	round := make([]int, len(cases))
	for i, c := range cases {
		k := txKey(c.data)
		r := 0
		for r < len(rounds) && rounds[r][k] {
			r++
		}
		if r == len(rounds) {
			rounds = append(rounds, map[string]bool{})
		}
		rounds[r][k] = true
		round[i] = r
	}
	for r := range rounds {
		t.Run(fmt.Sprintf("udp%d", r), func(t *testing.T) {
			h, _, _ := tortureHarness(t, nil)
			t.Cleanup(h.stop) // before the next round starts
			for i, c := range cases {
				if round[i] != r {
					continue
				}
				t.Run(c.file, func(t *testing.T) {
					t.Parallel()
					wait := 5 * time.Second
					if c.outcome == "dropped" {
						wait = time.Second
					}
					got, srcPort := exchange(t, h, tortureIP(77, i), c.data, wait)
					if c.outcome == "dropped" {
						for _, a := range got {
							t.Errorf("dropped message answered on port %d: %q", a.port, firstLine(a.data))
						}
						return
					}
					wantPort := answerPort(c.data, srcPort)
					finals := 0
					for _, a := range got {
						m := statusRe.FindSubmatch(a.data)
						if m == nil {
							t.Errorf("not a SIP/2.0 response: %q", firstLine(a.data))
							continue
						}
						code, _ := strconv.Atoi(string(m[1]))
						if a.port != wantPort {
							t.Errorf("%d answered on port %d, want %d (RFC 3261 18.2.2)", code, a.port, wantPort)
						}
						if cid := callIDRe.FindSubmatch(c.data); cid != nil && hdr(a.data, "Call-ID") != string(cid[1]) {
							t.Errorf("%d has Call-ID %q, want the request's %q", code, hdr(a.data, "Call-ID"), cid[1])
						}
						if code < 200 {
							if !bytes.HasPrefix(c.data, []byte("INVITE ")) {
								t.Errorf("provisional %d to a non-INVITE", code)
							}
							continue
						}
						finals++
						if code != c.status {
							t.Errorf("answered %q, want %d (%s)", firstLine(a.data), c.status, c.outcome)
						}
						if !strings.Contains(hdr(a.data, "To"), "tag=") && hdr(a.data, "To") != "" {
							t.Errorf("%d without a To tag: %q", code, hdr(a.data, "To"))
						}
						if finals == 1 {
							checkTortureExtras(t, c.file, a.data, srcPort)
						}
						if bytes.HasPrefix(c.data, []byte("INVITE ")) && code >= 300 && finals == 1 {
							ack := ackFor(c.data, a.data)
							if conn, err := net.DialUDP("udp4", &net.UDPAddr{IP: tortureIP(77, i)}, mustUDPAddr(h.addr)); err == nil {
								conn.Write(ack)
								conn.Close()
							}
						}
					}
					if finals == 0 {
						t.Errorf("no final answer, want %d (%s)", c.status, c.outcome)
					}
				})
			}
		})
	}

	// Over TCP sipgo parses what it can and closes the connection on the
	// rest; requests that parse are refused as over UDP.
	t.Run("tcp", func(t *testing.T) {
		h, _, _ := tortureHarness(t, nil)
		for _, c := range cases {
			switch c.file {
			case "invalid/badvers.dat", "invalid/mismatch01.dat", "invalid/bext01.dat", "invalid/unkscm.dat",
				"invalid/multi01.dat", "invalid/sdp01.dat", "valid/lwsdisp.dat", "valid/intmeth.dat":
			default:
				continue
			}
			t.Run(c.file, func(t *testing.T) {
				conn, err := net.Dial("tcp", h.addr)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				conn.Write(c.data)
				conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				r := bufio.NewReader(conn)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						t.Fatalf("no answer over TCP, want %d: %v", c.status, err)
					}
					if m := statusRe.FindStringSubmatch(line); m != nil && m[1][0] != '1' {
						if m[1] != strconv.Itoa(c.status) {
							t.Errorf("answered %q over TCP, want %d", strings.TrimSpace(line), c.status)
						}
						return
					}
				}
			})
		}
	})
}

// txKey is what sipgo matches a request's transaction by, roughly: the
// top Via entry and the CSeq method.
func txKey(msg []byte) string {
	unfolded := regexp.MustCompile(`\r\n[ \t]+`).ReplaceAll(msg, []byte(" "))
	v := viaLine.FindSubmatch(unfolded)
	if v == nil {
		return ""
	}
	top, _, _ := bytes.Cut(v[1], []byte{','})
	top = bytes.ToLower(regexp.MustCompile(`\s+`).ReplaceAll(top, nil))
	m := regexp.MustCompile(`(?im)^cseq[ \t]*:[ \t]*\d+[ \t]+(\S+)`).FindSubmatch(unfolded)
	if m == nil {
		return string(top)
	}
	return string(top) + "|" + string(m[1])
}

func mustUDPAddr(s string) *net.UDPAddr {
	a, err := net.ResolveUDPAddr("udp4", s)
	if err != nil {
		panic(err)
	}
	return a
}

func firstLine(b []byte) string {
	l, _, _ := bytes.Cut(b, []byte("\r\n"))
	return string(l)
}

// checkTortureExtras checks what some answers must carry beside their
// status.
func checkTortureExtras(t *testing.T, file string, res []byte, srcPort int) {
	t.Helper()
	want := map[string]map[string]string{
		"invalid/bext01.dat": {"Unsupported": "nothingSupportsThis, nothingSupportsThisEither"},
		"invalid/sdp01.dat":  {"Accept": "application/sdp"},
		"invalid/invut.dat":  {"Accept": "application/sdp"},
		"valid/intmeth.dat":  {"Allow": allowed},
		"valid/escnull.dat":  {"Allow": allowed},
	}[file]
	for name, v := range want {
		if got := hdr(res, name); got != v {
			t.Errorf("%s: %q, want %q", name, got, v)
		}
	}
	switch file {
	case "relayd/rport.dat":
		via := hdr(res, "Via")
		if !strings.Contains(via, ";rport="+strconv.Itoa(srcPort)) || !strings.Contains(via, ";received=127.77.") {
			t.Errorf("Via %q: want rport and received filled in (RFC 3581)", via)
		}
	case "valid/wsinv.dat":
		// The LWS removed before sipgo read it: the tags are whole.
		if from := hdr(res, "From"); !strings.HasSuffix(from, ";tag=98asjd8") {
			t.Errorf("From %q: the From tag got lost", from)
		}
		if to := hdr(res, "To"); !strings.HasSuffix(to, ";tag=1918181833n") {
			t.Errorf("To %q: the To tag got lost", to)
		}
	}
}

var tortureSeed = flag.Uint64("torture.seed", 0, "seed of TestTortureGarbage's generator (default: RELAYD_TORTURE_SEED, else random)")

// TestTortureGarbage throws seeded random datagrams at the B2BUA over
// UDP: random bytes, mangled torture messages and requests whose Via is
// noise. For each it checks that the answers (seen as the listener sends
// them, whatever port they go to) are SIP responses and that only
// datagrams that read as requests with a Via got any; then that nothing
// panicked and a call still completes. The seed is printed; set it with
// -torture.seed or RELAYD_TORTURE_SEED to replay a failure. The same
// datagrams then go over TCP, where sipgo closes connections on framing
// errors, checked for crashes only.
func TestTortureGarbage(t *testing.T) {
	seed := *tortureSeed
	if s := os.Getenv("RELAYD_TORTURE_SEED"); s != "" && seed == 0 {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("RELAYD_TORTURE_SEED: %v", err)
		}
	}
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (replay: go test ./control/sip -run TestTortureGarbage -torture.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))

	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(zapcore.NewTee(core, testLogger(t, zap.InfoLevel).Core()))
	h, ce, answeredCDR := tortureHarness(t, log)
	var base [][]byte
	for _, c := range loadTorture(t) {
		base = append(base, c.data)
	}

	const n = 600
	msgs := make([][]byte, n)
	for i := range msgs {
		msgs[i] = siptorture.Garbage(rng, base, i)
	}

	var mu sync.Mutex
	answers := make(map[string][][]byte) // by destination IP
	sent := func(to net.Addr, b []byte) {
		if u, ok := to.(*net.UDPAddr); ok && u.IP.To4() != nil && u.IP.To4()[1] == 78 {
			mu.Lock()
			answers[u.IP.String()] = append(answers[u.IP.String()], bytes.Clone(b))
			mu.Unlock()
		}
	}
	h.srv.vet.sent.Store(&sent)
	raddr := mustUDPAddr(h.addr)
	for i, m := range msgs {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: tortureIP(78, i)}, raddr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(m)
		c.Close()
		if i%50 == 49 {
			time.Sleep(20 * time.Millisecond) // let 2 cores keep up
		}
	}
	time.Sleep(2 * time.Second)

	answered := 0
	mu.Lock()
	for i, m := range msgs {
		got := answers[tortureIP(78, i).String()]
		if len(got) == 0 {
			continue
		}
		answered++
		if !readsAsRequest(m) {
			t.Errorf("datagram %d answered %q though it is no request with a Via: %q", i, firstLine(got[0]), m)
		}
		for _, a := range got {
			if statusRe.Find(a) == nil || !bytes.HasSuffix(a, []byte("\r\n\r\n")) || viaLine.Find(a) == nil {
				t.Errorf("datagram %d got a malformed answer %q", i, a)
			}
		}
	}
	mu.Unlock()
	h.srv.vet.sent.Store(nil)
	t.Logf("%d of %d datagrams answered", answered, n)
	if answered < n/10 {
		t.Errorf("only %d of %d datagrams answered: the mangled requests should mostly be", answered, n)
	}

	// TCP: the same datagrams, each on its own connection.
	var conns []net.Conn
	for _, m := range msgs[:200] {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(m)
		conns = append(conns, c)
	}
	time.Sleep(500 * time.Millisecond)
	for _, c := range conns {
		c.Close()
	}

	if n := logs.FilterMessage("SIP handler panic").Len(); n > 0 {
		t.Errorf("%d handler panics", n)
	}
	select {
	case err := <-h.done:
		t.Fatalf("Serve returned during the torture: %v", err)
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, _ := h.answered(ctx, ce) // answered, ACKed, its media up
	if err := d.Bye(ctx); err != nil {
		t.Fatalf("BYE of the call after the torture: %v", err)
	}
	select {
	case <-answeredCDR:
	case <-time.After(10 * time.Second):
		t.Fatal("no CDR of the call after the torture")
	}
}

// readsAsRequest is the test's own reading of what may get an answer: a
// first line "token SP ...", and a Via header line.
func readsAsRequest(m []byte) bool {
	first, _, _ := bytes.Cut(m, []byte("\n"))
	sp := bytes.IndexByte(first, ' ')
	if sp <= 0 {
		return false
	}
	for _, c := range first[:sp] {
		if !isToken(c) {
			return false
		}
	}
	if bytes.HasPrefix(bytes.ToUpper(first), []byte("SIP/")) {
		return false
	}
	return viaLine.Match(m)
}
