package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relayd/relayd/voipgen/gen"
	"github.com/relayd/relayd/voipgen/payload"

	"github.com/relayd/relayd/control/admin"
)

const demoHelp = `usage: voipgen demo [flags]

Builds a network-namespace lab (caller, relay, callee), starts relayd with its
XDP data plane in the relay namespace, installs two static flows per stream
through the admin API and sends RTP both ways at once: stream i runs between
caller port 4000+2i and callee port 5000+2i through relay ports 30000+4i
(caller to callee, only from the caller's address and port) and 30002+4i
(callee to caller). voipgen's senders and receivers run in-process with their
sockets in the caller and callee namespaces.

It then prints the load, the relay's per-flow statistics, the receivers' view
of each direction and relayd's global XDP counters, and ends with a PASS or
FAIL line. It exits non-zero when a packet was lost, was not relayed by XDP,
or the relay failed. The lab is torn down on exit, also on SIGINT, SIGTERM and
SIGHUP. Needs root; traffic stays inside the lab (198.18.0.0/15, 2001:2::/48).

--json prints the report as one JSON object instead:
  {"config", "load", "flows" (every flow with stream and direction),
   "flow_summary", "directions" (receivers), "relay" (counters),
   "pass", "problems", "verdict"}

flags:
`

// DemoConfig configures a demo run.
type DemoConfig struct {
	streams  int
	duration time.Duration
	codec    payload.Codec
	ptime    time.Duration
	xdpMode  string // native | generic
	relayd   string // prebuilt relayd binary; "" builds one with labrelay.Build
	ipv6     bool
	JSON     bool
	AllFlows bool

	Progress io.Writer // step-by-step progress; never nil after parseDemo
	grace    time.Duration
}

// Port plan of the demo (see demoHelp). maxDemoStreams keeps the relay
// ports inside relayd's media range 30000-39999.
const (
	demoCallerPort = 4000
	demoCalleePort = 5000
	demoRelayPort  = 30000
	maxDemoStreams = 2500
)

func ParseDemo(args []string, out io.Writer) (DemoConfig, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(out, demoHelp); fs.PrintDefaults() }
	streams := fs.Int("streams", 100, "number of streams (calls); each is relayed both ways")
	duration := fs.Duration("duration", 10*time.Second, "how long to send")
	codecName := fs.String("codec", "pcmu", "pcmu | pcma | g729")
	ptime := fs.Duration("ptime", 20*time.Millisecond, "packetization time")
	xdpMode := fs.String("xdp-mode", "native", "native | generic")
	relayd := fs.String("relayd", "", "relayd binary to run (default: go build ./cmd/relayd)")
	v6 := fs.Bool("ipv6", false, "relay IPv6 instead of IPv4")
	js := fs.Bool("json", false, "print the report as JSON")
	all := fs.Bool("all-flows", false, "list every flow in the text report, not just the first and worst")
	if err := fs.Parse(args); err != nil {
		return DemoConfig{}, err
	}
	if fs.NArg() > 0 {
		return DemoConfig{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg := DemoConfig{
		streams: *streams, duration: *duration, ptime: *ptime, xdpMode: *xdpMode, relayd: *relayd,
		ipv6: *v6, JSON: *js, AllFlows: *all, Progress: os.Stderr, grace: 250 * time.Millisecond,
	}
	var err error
	if cfg.codec, err = payload.Lookup(*codecName, *ptime); err != nil {
		return cfg, err
	}
	return cfg, cfg.validate()
}

func (c *DemoConfig) validate() error {
	switch {
	case c.streams < 1 || c.streams > maxDemoStreams:
		return fmt.Errorf("--streams %d: want 1 to %d", c.streams, maxDemoStreams)
	case c.duration < c.ptime:
		return fmt.Errorf("--duration %v shorter than --ptime %v", c.duration, c.ptime)
	case c.xdpMode != "native" && c.xdpMode != "generic":
		return fmt.Errorf("--xdp-mode %q: want native or generic", c.xdpMode)
	}
	return nil
}

// packetsPerStream is how many packets each stream sends in each direction.
func (c *DemoConfig) packetsPerStream() int { return int(c.duration / c.ptime) }

// demoRun runs the demo in the lab; set on Linux (demo_linux.go).
var demoRun func(ctx context.Context, cfg DemoConfig) (*DemoReport, error)

// Demo runs the Demo and returns its report, which may not pass; err is
// for runs that could not complete (no lab, no relay, interrupted).
func Demo(ctx context.Context, cfg DemoConfig) (*DemoReport, error) {
	if demoRun == nil {
		return nil, errors.New("the demo needs Linux (network namespaces and XDP)")
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	rep, err := demoRun(ctx, cfg)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil, fmt.Errorf("interrupted, lab torn down: %w", err)
	}
	return rep, err
}

// Directions of a stream, as the report names them.
const (
	demoToCallee = "caller->callee"
	demoToCaller = "callee->caller"
)

// DemoReport is everything the demo prints; --json encodes it as is.
type DemoReport struct {
	Config      demoConfigReport  `json:"config"`
	Load        demoLoad          `json:"load"`
	Flows       []demoFlow        `json:"flows"`
	FlowSummary demoFlowSummary   `json:"flow_summary"`
	Directions  []demoDirection   `json:"directions"`
	Relay       demoRelayCounters `json:"relay"`
	Pass        bool              `json:"pass"`
	Problems    []string          `json:"problems"`
	Verdict     string            `json:"verdict"`
	Elapsed     float64           `json:"elapsed_s"` // whole run: lab, relay, traffic, report
}

type demoConfigReport struct {
	Streams          int     `json:"streams"`
	Directions       int     `json:"directions"`
	Codec            string  `json:"codec"`
	PtimeMs          int64   `json:"ptime_ms"`
	DurationS        float64 `json:"duration_s"`
	PacketsPerStream int     `json:"packets_per_stream"` // per direction
	IPv6             bool    `json:"ipv6"`
	XDPMode          string  `json:"xdp_mode"`
	Lab              string  `json:"lab"` // namespace name prefix
	RelayMedia       string  `json:"relay_media"`
	Caller           string  `json:"caller"`
	Callee           string  `json:"callee"`
}

// demoLoad is the offered load: PerDirection for the streams of one
// direction (voipgen send's figures), the totals for both.
type demoLoad struct {
	PerDirection gen.SenderLoad `json:"per_direction"`
	Flows        int            `json:"flows"`
	PPS          float64        `json:"pps"` // into the relay, both directions; as many leave it
	WireBitsPS   float64        `json:"wire_bits_per_s"`
	IPBitsPS     float64        `json:"ip_bits_per_s"`
}

// demoFlow is a flow as the relay reports it, with the stream and
// direction it carries.
type demoFlow struct {
	Stream    int    `json:"stream"`
	Direction string `json:"direction"`
	admin.Flow
}

type demoFlowSummary struct {
	Flows      int     `json:"flows"`
	OnXDP      int     `json:"on_xdp"`
	Packets    uint64  `json:"packets"`
	Bytes      uint64  `json:"bytes"`
	MinPackets uint64  `json:"min_packets"`
	MaxPackets uint64  `json:"max_packets"`
	Lost       int64   `json:"lost"`
	Dropped    uint64  `json:"dropped"`
	MeanJitter float64 `json:"mean_jitter_ms"`
	MaxJitter  float64 `json:"max_jitter_ms"`
}

// demoDirection is the receivers' view of one direction.
type demoDirection struct {
	Direction    string  `json:"direction"`
	Streams      int     `json:"streams"`       // streams that arrived
	StreamsShort int     `json:"streams_short"` // streams that arrived incomplete or not at all
	Sent         uint64  `json:"sent"`
	SendErrors   uint64  `json:"send_errors"`
	Received     uint64  `json:"received"` // unique packets
	Duplicates   uint64  `json:"duplicates"`
	Reordered    uint64  `json:"reordered"`
	Lost         int64   `json:"lost"` // sent - received
	LossPct      float64 `json:"loss_pct"`
	MeanJitterMs float64 `json:"mean_jitter_ms"`
	MaxJitterMs  float64 `json:"max_jitter_ms"`
	MaxGapMs     float64 `json:"max_gap_ms"`
	SendLateP99  float64 `json:"send_late_p99_us"`
	SendLateMax  float64 `json:"send_late_max_us"`
}

// demoRelayCounters are relayd's global XDP counters (relayd_packets_total).
type demoRelayCounters struct {
	Attached  []demoXDPAttachment `json:"attached"`
	Counters  []demoRelayCounter  `json:"counters"` // every label set, zeros included
	Forwarded uint64              `json:"forwarded"`
	Punted    uint64              `json:"punted"`
	// FlowPunts are the punts of packets that matched a flow, which the
	// demo expects none of; the others (demoPrefilterPunts) happen before
	// the flow lookup.
	FlowPunts uint64 `json:"flow_punts"`
	Dropped   uint64 `json:"dropped"`
	Passed    uint64 `json:"passed"`
}

type demoXDPAttachment struct {
	Interface string `json:"interface"`
	Mode      string `json:"mode"`
}

type demoRelayCounter struct {
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// parseDemoMetrics reads relayd_packets_total, relayd_bytes_total and
// relayd_xdp_attached from a Prometheus text exposition.
func parseDemoMetrics(text string) (demoRelayCounters, error) {
	var rc demoRelayCounters
	type key struct{ verdict, reason string }
	index := make(map[key]int)
	for _, line := range strings.Split(text, "\n") {
		name, labels, value, ok := parseDemoSample(line)
		if !ok {
			continue
		}
		switch name {
		case "relayd_packets_total", "relayd_bytes_total":
			k := key{labels["verdict"], labels["reason"]}
			i, seen := index[k]
			if !seen {
				i = len(rc.Counters)
				index[k] = i
				rc.Counters = append(rc.Counters, demoRelayCounter{Verdict: k.verdict, Reason: k.reason})
			}
			n, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return rc, fmt.Errorf("metric %s: %w", line, err)
			}
			if name == "relayd_packets_total" {
				rc.Counters[i].Packets = uint64(n)
			} else {
				rc.Counters[i].Bytes = uint64(n)
			}
		case "relayd_xdp_attached":
			if value == "1" {
				rc.Attached = append(rc.Attached, demoXDPAttachment{Interface: labels["interface"], Mode: labels["mode"]})
			}
		}
	}
	if len(rc.Counters) == 0 {
		return rc, errors.New("no relayd_packets_total in /metrics")
	}
	order := map[string]int{"forward": 0, "punt": 1, "drop": 2, "pass": 3}
	sort.SliceStable(rc.Counters, func(i, j int) bool {
		a, b := rc.Counters[i], rc.Counters[j]
		oa, okA := order[a.Verdict]
		ob, okB := order[b.Verdict]
		if !okA {
			oa = len(order)
		}
		if !okB {
			ob = len(order)
		}
		return oa < ob || oa == ob && a.Reason < b.Reason
	})
	sort.Slice(rc.Attached, func(i, j int) bool { return rc.Attached[i].Interface < rc.Attached[j].Interface })
	for _, c := range rc.Counters {
		switch c.Verdict {
		case "forward":
			rc.Forwarded += c.Packets
		case "punt":
			rc.Punted += c.Packets
			if !demoPrefilterPunts[c.Reason] {
				rc.FlowPunts += c.Packets
			}
		case "drop":
			rc.Dropped += c.Packets
		case "pass":
			rc.Passed += c.Packets
		}
	}
	return rc, nil
}

// demoPrefilterPunts are the punt reasons the XDP program counts while it
// parses headers, before it looks up a flow (bpf/relay.c). Any other punt
// is of a packet that matched a flow.
var demoPrefilterPunts = map[string]bool{"vlan": true, "ip_options": true, "ipv6_ext": true, "fragment": true}

// parseDemoSample splits a Prometheus sample line `name{k="v",...} value`.
// Label values here never contain commas, quotes or braces.
func parseDemoSample(line string) (name string, labels map[string]string, value string, ok bool) {
	if line == "" || line[0] == '#' {
		return "", nil, "", false
	}
	head, value, ok := strings.Cut(line, " ")
	if !ok {
		return "", nil, "", false
	}
	labels = map[string]string{}
	name, rest, hasLabels := strings.Cut(head, "{")
	if hasLabels {
		for _, kv := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = strings.Trim(v, `"`)
		}
	}
	return name, labels, strings.TrimSpace(value), true
}

// judge checks the report for consistency and loss and sets Pass,
// Problems and Verdict. perStream is the packets each stream sent in each
// direction.
func (r *DemoReport) judge(perStream int) {
	var p []string
	want := uint64(r.Config.Streams * perStream)
	var received uint64
	for _, d := range r.Directions {
		received += d.Received
		if d.Sent != want {
			p = append(p, fmt.Sprintf("%s: sent %d packets, want %d (%d send errors)", d.Direction, d.Sent, want, d.SendErrors))
		}
		if d.Lost != 0 || d.Received != d.Sent {
			p = append(p, fmt.Sprintf("%s: received %d of %d packets (%d lost)", d.Direction, d.Received, d.Sent, d.Lost))
		}
		if d.StreamsShort != 0 {
			p = append(p, fmt.Sprintf("%s: %d of %d streams incomplete", d.Direction, d.StreamsShort, r.Config.Streams))
		}
		if d.Duplicates != 0 {
			p = append(p, fmt.Sprintf("%s: %d duplicates", d.Direction, d.Duplicates))
		}
	}
	fs := r.FlowSummary
	if fs.Flows != 2*r.Config.Streams {
		p = append(p, fmt.Sprintf("relay lists %d flows, want %d", fs.Flows, 2*r.Config.Streams))
	}
	if fs.OnXDP != fs.Flows {
		p = append(p, fmt.Sprintf("%d of %d flows not on the xdp path", fs.Flows-fs.OnXDP, fs.Flows))
	}
	if fs.MinPackets != uint64(perStream) || fs.MaxPackets != uint64(perStream) {
		p = append(p, fmt.Sprintf("relay flows carried %d to %d packets, want %d each", fs.MinPackets, fs.MaxPackets, perStream))
	}
	if fs.Lost != 0 || fs.Dropped != 0 {
		p = append(p, fmt.Sprintf("relay flows: %d lost, %d dropped", fs.Lost, fs.Dropped))
	}
	rc := r.Relay
	if rc.Forwarded != received {
		p = append(p, fmt.Sprintf("relay XDP forwarded %d packets, receivers got %d", rc.Forwarded, received))
	}
	if fs.Packets != received {
		p = append(p, fmt.Sprintf("relay flows counted %d packets, receivers got %d", fs.Packets, received))
	}
	if rc.FlowPunts != 0 || rc.Dropped != 0 {
		p = append(p, fmt.Sprintf("relay XDP punted %d packets of flows and dropped %d", rc.FlowPunts, rc.Dropped))
	}
	var lost int64
	for _, d := range r.Directions {
		lost += d.Lost
	}
	r.Problems = p
	r.Pass = len(p) == 0
	if r.Pass {
		r.Verdict = fmt.Sprintf("PASS: %d streams x 2 directions, %d packets relayed by XDP, %d lost", r.Config.Streams, rc.Forwarded, lost)
	} else {
		r.Verdict = fmt.Sprintf("FAIL: %d streams x 2 directions, %d of %d packets relayed by XDP, %d lost: %s",
			r.Config.Streams, rc.Forwarded, 2*want, lost, strings.Join(p, "; "))
	}
}

// summarizeFlows fills FlowSummary from Flows.
func (r *DemoReport) summarizeFlows() {
	s := demoFlowSummary{Flows: len(r.Flows)}
	for i, f := range r.Flows {
		if f.Path == "xdp" {
			s.OnXDP++
		}
		s.Packets += f.Packets
		s.Bytes += f.Bytes
		s.Lost += f.Lost
		s.Dropped += f.Dropped
		s.MeanJitter += f.JitterMS
		s.MaxJitter = max(s.MaxJitter, f.JitterMS)
		if i == 0 || f.Packets < s.MinPackets {
			s.MinPackets = f.Packets
		}
		s.MaxPackets = max(s.MaxPackets, f.Packets)
	}
	if s.Flows > 0 {
		s.MeanJitter /= float64(s.Flows)
	}
	r.FlowSummary = s
}

// worstFlows returns the indexes of up to n flows, worst first: most
// lost, dropped or missing packets, then highest jitter.
func (r *DemoReport) worstFlows(n int) []int {
	idx := make([]int, len(r.Flows))
	for i := range idx {
		idx[i] = i
	}
	most := r.FlowSummary.MaxPackets
	bad := func(f *demoFlow) int64 {
		b := max(f.Lost, 0) + int64(f.Dropped) + int64(most-f.Packets)
		if f.Path != "xdp" {
			b += 1 << 40
		}
		return b
	}
	sort.SliceStable(idx, func(i, j int) bool {
		a, b := &r.Flows[idx[i]], &r.Flows[idx[j]]
		if ba, bb := bad(a), bad(b); ba != bb {
			return ba > bb
		}
		return a.JitterMS > b.JitterMS
	})
	return idx[:min(n, len(idx))]
}

func (r *DemoReport) WriteText(w io.Writer, allFlows bool) {
	c := r.Config
	family := "IPv4"
	if c.IPv6 {
		family = "IPv6"
	}
	fmt.Fprintf(w, "relayd demo: %d %s/%dms streams x 2 directions for %gs, %s, relayd XDP in %s mode (lab %s)\n",
		c.Streams, strings.ToUpper(c.Codec), c.PtimeMs, c.DurationS, family, c.XDPMode, strings.TrimSuffix(c.Lab, "-"))
	fmt.Fprintf(w, "  caller %s:%d..%d  <->  relay %s:%d..%d  <->  callee %s:%d..%d\n",
		c.Caller, demoCallerPort, demoCallerPort+2*(c.Streams-1),
		c.RelayMedia, demoRelayPort, demoRelayPort+4*(c.Streams-1)+2,
		c.Callee, demoCalleePort, demoCalleePort+2*(c.Streams-1))

	l := r.Load
	pd := l.PerDirection
	fmt.Fprintf(w, "\nload: %d streams x 2 directions = %d flows of %d packets; %.0f pps into the relay and as many out (%.0f per direction)\n",
		c.Streams, l.Flows, c.PacketsPerStream, l.PPS, pd.PPS)
	fmt.Fprintf(w, "  per packet %d B RTP, %d B IP, %d B on the wire; %.1f kbit/s per stream and direction;\n"+
		"  %.2f Mbit/s on the wire into the relay and as much out (%.2f Mbit/s IP)\n",
		pd.RTPBytes, pd.IPBytes, pd.WireBytes, pd.PerStreamBP/1e3, l.WireBitsPS/1e6, l.IPBitsPS/1e6)

	fs := r.FlowSummary
	fmt.Fprintf(w, "\nrelay flows (GET /v1/flows): %d flows, %d on xdp; %d packets (%d to %d per flow), %d bytes; lost %d, dropped %d; jitter mean %.3f ms, max %.3f ms\n",
		fs.Flows, fs.OnXDP, fs.Packets, fs.MinPackets, fs.MaxPackets, fs.Bytes, fs.Lost, fs.Dropped, fs.MeanJitter, fs.MaxJitter)
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tSTREAM\tDIRECTION\tID\tMATCH\tSEND_TO\tPATH\tPACKETS\tBYTES\tLOST\tJITTER_MS\tDROPPED\t")
	row := func(f *demoFlow) {
		fmt.Fprintf(tw, "\t%d\t%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%.3f\t%d\t\n",
			f.Stream, f.Direction, f.ID, f.Match, f.SendTo, f.Path, f.Packets, f.Bytes, f.Lost, f.JitterMS, f.Dropped)
	}
	const first, worst = 3, 4 // streams, flows
	if allFlows || len(r.Flows) <= 2*first+worst {
		for i := range r.Flows {
			row(&r.Flows[i])
		}
		tw.Flush()
		demoWriteTrimmed(w, &buf)
	} else {
		shown := make(map[int]bool)
		for i := 0; i < 2*first; i++ {
			row(&r.Flows[i])
			shown[i] = true
		}
		fmt.Fprintln(tw, "\t...\t\t\t\t\t\t\t\t\t\t\t")
		fmt.Fprintln(tw, "\tworst\t\t\t\t\t\t\t\t\t\t\t")
		for _, i := range r.worstFlows(worst) {
			row(&r.Flows[i])
		}
		tw.Flush()
		demoWriteTrimmed(w, &buf)
		fmt.Fprintf(w, "  (the first %d streams, then the %d worst flows: most lost, dropped or missing packets, then highest jitter;\n"+
			"   --all-flows lists all %d flows, --json has them all)\n", first, worst, len(r.Flows))
	}

	fmt.Fprintln(w, "\nreceivers (voipgen recv in the caller and callee namespaces, RFC 3550 jitter from kernel timestamps):")
	buf.Reset()
	tw = tabwriter.NewWriter(&buf, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tDIRECTION\tSTREAMS\tSENT\tRECEIVED\tLOST\tLOSS_%\tJITTER_MEAN_MS\tJITTER_MAX_MS\tMAX_GAP_MS\t")
	for _, d := range r.Directions {
		fmt.Fprintf(tw, "\t%s\t%d\t%d\t%d\t%d\t%.3f\t%.3f\t%.3f\t%.1f\t\n", d.Direction, d.Streams, d.Sent, d.Received,
			d.Lost, d.LossPct, d.MeanJitterMs, d.MaxJitterMs, d.MaxGapMs)
	}
	tw.Flush()
	demoWriteTrimmed(w, &buf)

	rc := r.Relay
	var att []string
	for _, a := range rc.Attached {
		att = append(att, fmt.Sprintf("%s (%s)", a.Interface, a.Mode))
	}
	fmt.Fprintf(w, "\nrelay XDP counters (GET /metrics, relayd_packets_total); program attached to %s:\n", demoOrNone(strings.Join(att, ", ")))
	for _, v := range []string{"forward", "punt", "drop", "pass"} {
		var parts []string
		var total uint64
		for _, ct := range rc.Counters {
			if ct.Verdict != v {
				continue
			}
			total += ct.Packets
			if ct.Packets != 0 || v == "forward" {
				parts = append(parts, fmt.Sprintf("%s %d", ct.Reason, ct.Packets))
			}
		}
		fmt.Fprintf(w, "  %-8s %10d  %s\n", v+":", total, demoOrNone(strings.Join(parts, ", ")))
	}
	fmt.Fprintf(w, "  (punted packets of flows: %d. vlan, ip_options, ipv6_ext and fragment punts happen before the flow\n"+
		"   lookup, like pass: here the kernel's own ARP, neighbour discovery and MLD reports, never RTP)\n", rc.FlowPunts)
	fmt.Fprintf(w, "\n%s (%.1f s)\n", r.Verdict, r.Elapsed)
}

// demoWriteTrimmed copies a tabwriter's output to w without trailing blanks.
func demoWriteTrimmed(w io.Writer, buf *bytes.Buffer) {
	for line := range strings.Lines(buf.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
	buf.Reset()
}

func demoOrNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
