package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/relayd/relayd/voipgen/analyze"
	"github.com/relayd/relayd/voipgen/gen"
	"github.com/relayd/relayd/voipgen/payload"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/sipp"
	"github.com/relayd/relayd/rtp/g711"
)

const pacebenchUsage = `usage: voipgen pacebench [flags]   (root; needs sipp, Debian package sip-tester)

Compares the pacing of voipgen send with SIPp's rtp_stream as seen by a
receiver: in a lab of namespaces, for each number of calls, N G.711/20 ms
streams go from the caller through the forwarding namespace to the callee,
once sent by voipgen send and once by SIPp (uac with rtp_stream, answered
by a SIPp uas), one after the other in the same lab; voipgen's receiver
reports max inter-arrival gap and RFC 3550 jitter per stream for both.
Sender, forwarding and receiver share the machine's CPUs: on a small
machine the receiver (a socket per stream) competes with the sender.

flags:
`

type PaceConfig struct {
	calls    []int
	duration time.Duration
	rate     float64
	JSON     bool
	rt       int // SCHED_FIFO priority for both senders (voipgen threads, SIPp via chrt); 0: normal
}

func ParsePace(args []string, out io.Writer) (PaceConfig, error) {
	var c PaceConfig
	fs := flag.NewFlagSet("pacebench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, pacebenchUsage); fs.PrintDefaults() }
	calls := fs.String("calls", "1000,2000", "comma-separated numbers of calls")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "media time per call")
	fs.Float64Var(&c.rate, "rate", 500, "SIPp call rate (calls per second) while setting up")
	fs.BoolVar(&c.JSON, "json", false, "print JSON")
	fs.IntVar(&c.rt, "rt-priority", 0, "run both senders SCHED_FIFO at this priority (voipgen --rt-priority, SIPp under chrt -f)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for _, s := range strings.Split(*calls, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 10000 {
			return c, fmt.Errorf("--calls %q: want numbers 1 to 10000", *calls)
		}
		c.calls = append(c.calls, n)
	}
	if c.rt < 0 || c.rt > 99 {
		return c, errors.New("--rt-priority: want 0 to 99")
	}
	if c.duration < time.Second || c.rate <= 0 {
		return c, errors.New("--duration must be at least 1s and --rate positive")
	}
	return c, nil
}

// PaceRow is one sender at one number of calls.
type PaceRow struct {
	Sender    string               `json:"sender"`
	Calls     int                  `json:"calls"`
	Streams   int                  `json:"streams_received"`
	Packets   uint64               `json:"packets"`
	Lost      int64                `json:"lost"`
	MaxGapMs  analyze.Distribution `json:"max_gap_ms"`
	JitterMs  analyze.Distribution `json:"jitter_ms"`
	LateP99us float64              `json:"sender_late_p99_us,omitempty"`
	Note      string               `json:"note,omitempty"`
}

func Pace(ctx context.Context, cfg PaceConfig, progress io.Writer) ([]PaceRow, error) {
	l, err := lab.New(lab.Config{})
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	defer l.Close()
	dir, err := os.MkdirTemp("", "voipgen-pacebench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := writeSIPpFiles(dir); err != nil {
		return nil, err
	}
	var rows []PaceRow
	for _, n := range cfg.calls {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(progress, "pacebench: %d calls with voipgen send\n", n)
		r, err := pacebenchVoipgen(ctx, l, n, cfg.duration, cfg.rt)
		if err != nil {
			return rows, err
		}
		rows = append(rows, r)
		fmt.Fprintf(progress, "pacebench: %d calls with SIPp rtp_stream\n", n)
		r, err = pacebenchSIPp(ctx, l, dir, n, cfg)
		if err != nil {
			return rows, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// pacebenchRecv opens a receiver in the callee on eps.
func pacebenchRecv(l *lab.Lab, eps []netip.AddrPort, maxSSRCs int) (*analyze.Receiver, error) {
	var rc *analyze.Receiver
	err := l.Callee.Do(func() (err error) {
		rc, err = analyze.NewOn(analyze.Config{Addr: l.CalleeAddr4, PortLo: int(eps[0].Port()), PortHi: int(eps[len(eps)-1].Port()),
			Duration: time.Hour, ClockRate: 8000, Batch: 16, MaxSSRCsPerPort: maxSSRCs}, eps)
		return err
	})
	return rc, err
}

func rowOf(sender string, n int, rep analyze.Report) PaceRow {
	t := rep.Totals
	return PaceRow{Sender: sender, Calls: n, Streams: t.Streams, Packets: t.Packets, Lost: t.Lost,
		MaxGapMs: t.MaxGapDist, JitterMs: t.JitterDist}
}

func pacebenchVoipgen(ctx context.Context, l *lab.Lab, n int, dur time.Duration, rt int) (PaceRow, error) {
	eps := make([]netip.AddrPort, n)
	for i := range eps {
		eps[i] = netip.AddrPortFrom(l.CalleeAddr4, uint16(40000+2*i))
	}
	rc, err := pacebenchRecv(l, eps, 4)
	if err != nil {
		return PaceRow{}, err
	}
	cfg := gen.Config{
		Dst: gen.Endpoints{Lo: l.CalleeAddr4, N: 1, Port: 40000}, Src: gen.Endpoints{Lo: l.CallerAddr4, N: 1, Port: 20000},
		Streams: n, Codec: payload.Codecs["pcmu"], Ptime: 20 * time.Millisecond, Duration: dur, Threads: 1, Transport: "raw",
		Slot: time.Millisecond, DSCP: 46, RTPriority: rt,
	}
	var g *gen.Generator
	if err := l.Caller.Do(func() (err error) { g, err = gen.New(cfg); return err }); err != nil {
		rc.Close()
		return PaceRow{}, err
	}
	defer g.Close()
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan analyze.Report)
	go func() { done <- rc.Run(rctx) }()
	res := g.Run(ctx)
	time.Sleep(300 * time.Millisecond)
	cancel()
	row := rowOf("voipgen", n, <-done)
	row.LateP99us = res.LateP99us
	return row, nil
}

func pacebenchSIPp(ctx context.Context, l *lab.Lab, dir string, n int, cfg PaceConfig) (PaceRow, error) {
	rc, err := pacebenchRecv(l, []netip.AddrPort{netip.AddrPortFrom(l.CalleeAddr4, sippMediaPort)}, 4*n+16)
	if err != nil {
		return PaceRow{}, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan analyze.Report)
	go func() { done <- rc.Run(rctx) }()
	stopRecv := func() analyze.Report { cancel(); return <-done }
	limit := time.Duration(float64(n)/cfg.rate*float64(time.Second)) + cfg.duration + 60*time.Second
	sctx, scancel := context.WithTimeout(ctx, limit)
	defer scancel()
	uasOut, uacOut := new(bytes.Buffer), new(bytes.Buffer)
	// The uas names sippMediaPort in its answers, not its own -mp port.
	uas := l.Callee.CommandContext(sctx, "sipp", "-sf", filepath.Join(dir, "uas.xml"), "-i", l.CalleeAddr4.String(), "-p", "5060",
		"-mp", "6500", "-key", "sdp_port", strconv.Itoa(sippMediaPort), "-m", strconv.Itoa(n), "-nostdin", "-max_socket", strconv.Itoa(4*n+100))
	uas.Stdout, uas.Stderr = uasOut, uasOut
	if err := uas.Start(); err != nil {
		stopRecv()
		return PaceRow{}, fmt.Errorf("sipp uas: %w", err)
	}
	defer func() { _ = uas.Process.Kill(); _ = uas.Wait() }()
	time.Sleep(500 * time.Millisecond)
	// The tone loops (-1) until the hold (-d) ends.
	uacArgs := []string{"sipp", "-sf", filepath.Join(dir, "uac.xml"), l.CalleeAddr4.String() + ":5060",
		"-key", "audio", filepath.Join(dir, "tone.ulaw") + ",-1,0", "-d", strconv.FormatInt(cfg.duration.Milliseconds(), 10),
		"-i", l.CallerAddr4.String(), "-p", "5080", "-mp", "6000", "-m", strconv.Itoa(n), "-l", strconv.Itoa(n),
		"-r", strconv.Itoa(int(math.Ceil(cfg.rate))), "-nostdin", "-max_socket", strconv.Itoa(4*n + 100)}
	if cfg.rt > 0 {
		uacArgs = append([]string{"chrt", "-f", strconv.Itoa(cfg.rt)}, uacArgs...)
	}
	uac := l.Caller.CommandContext(sctx, uacArgs[0], uacArgs[1:]...)
	uac.Stdout, uac.Stderr = uacOut, uacOut
	uacErr := uac.Run()
	time.Sleep(300 * time.Millisecond)
	row := rowOf("sipp", n, stopRecv())
	if uacErr != nil {
		row.Note = fmt.Sprintf("sipp uac: %v: %s", uacErr, lastLines(uacOut.String(), 3))
	}
	return row, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// sippMediaPort is where the SIPp uas tells callers to send RTP: all calls
// share it, and voipgen's receiver tells their streams apart by SSRC.
const sippMediaPort = 7000

// writeSIPpFiles writes the scenarios (lab/sipp's uac.xml and uas.xml)
// and one second of a 1 kHz tone as raw G.711 mu-law for rtp_stream.
func writeSIPpFiles(dir string) error {
	tone := make([]byte, 8000)
	for i := range tone {
		tone[i] = g711.EncodeUlaw(int16(10000 * math.Sin(2*math.Pi*1000*float64(i)/8000)))
	}
	_, uacErr := sipp.WriteFile(dir, "uac.xml", nil)
	_, uasErr := sipp.WriteFile(dir, "uas.xml", nil)
	return errors.Join(os.WriteFile(filepath.Join(dir, "tone.ulaw"), tone, 0o644), uacErr, uasErr)
}
