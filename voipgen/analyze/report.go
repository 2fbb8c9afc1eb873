package analyze

import (
	"context"
	"fmt"
	"github.com/relayd/relayd/voipgen/payload"
	"io"
	"math"
	"net/netip"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/relayd/relayd/rtp"
	"github.com/relayd/relayd/rtp/emodel"
)

// EmodelOpts are the E-model inputs a receiver cannot measure.
type EmodelOpts struct {
	DelayMs float64 // one-way mouth-to-ear delay Ta; 0: G.107 default
	NoPLC   bool    // G.711 without packet loss concealment
}

// codecByPT returns the E-model codec of a static payload type, or false.
func (o EmodelOpts) codecByPT(pt uint8) (emodel.Codec, string, bool) {
	switch pt {
	case 0, 8:
		name := map[uint8]string{0: "pcmu", 8: "pcma"}[pt]
		if o.NoPLC {
			return emodel.G711NoPLC, name, true
		}
		return emodel.G711, name, true
	case 18:
		return emodel.G729A, "g729", true
	case payload.OpusPT:
		return emodel.Codec{}, "opus", false
	}
	return emodel.Codec{}, "", false
}

type StreamReport struct {
	Port        int     `json:"port"`
	Local       string  `json:"local,omitempty"` // ADDR:PORT received on, when not one address
	SSRC        uint32  `json:"ssrc"`
	PayloadType uint8   `json:"payload_type"`
	Codec       string  `json:"codec,omitempty"`
	Packets     uint64  `json:"packets"`
	Bytes       uint64  `json:"bytes"`
	Expected    uint32  `json:"expected"`
	Lost        int64   `json:"lost"`
	LossPct     float64 `json:"loss_pct"`
	Duplicates  uint64  `json:"duplicates"`
	Reordered   uint64  `json:"reordered"`
	// Resyncs: times the sequence numbering restarted (a sender restart,
	// or packets hundreds of sequence numbers out of order); expected and
	// lost count from the last one (rtp.StreamAnalyzer.Resyncs).
	Resyncs      uint64  `json:"resyncs"`
	JitterMs     float64 `json:"jitter_ms"`
	MaxGapMs     float64 `json:"max_gap_ms"`
	PtimeMs      float64 `json:"ptime_ms"` // measured: time from first to last arrival / (expected - 1)
	FirstArrival string  `json:"first_arrival"`
	LastArrival  string  `json:"last_arrival"`
	// Loss periods (glitches), oldest first, and their count (more than
	// listed when a stream had over rtp.MaxLossPeriods).
	LossPeriods []LossPeriodReport `json:"loss_periods"`
	Glitches    uint64             `json:"glitches"`
	MaxGlitchMs float64            `json:"max_glitch_ms"` // audio missing in the longest loss period
	BurstR      float64            `json:"burst_ratio"`
	// E-model (G.107): null for codecs without G.113 values (opus).
	R   *float64 `json:"r"`
	MOS *float64 `json:"mos"`

	before, after int64 // the longest loss period's surrounding arrivals
}

type LossPeriodReport struct {
	Start      string  `json:"start"`       // arrival of the last packet before it (RFC 3339)
	StartMs    float64 `json:"start_ms"`    // the same, ms since the receiver started
	DurationMs float64 `json:"duration_ms"` // audio missing: lost packets x their duration
	GapMs      float64 `json:"gap_ms"`      // time between the packets around it
	Lost       uint32  `json:"lost"`
}

// Distribution summarises one figure over streams.
type Distribution struct {
	N    int     `json:"n"`
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

func DistOf(v []float64) Distribution {
	if len(v) == 0 {
		return Distribution{}
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	q := func(p float64) float64 { return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1+boolInt(p == 0))] }
	d := Distribution{N: len(s), Min: s[0], Max: s[len(s)-1], P50: q(0.5), P90: q(0.9), P99: q(0.99)}
	for _, x := range s {
		d.Mean += x
	}
	d.Mean /= float64(len(s))
	return d
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (d Distribution) String() string {
	if d.N == 0 {
		return "-"
	}
	return fmt.Sprintf("min %.2f p50 %.2f p90 %.2f p99 %.2f max %.2f", d.Min, d.P50, d.P90, d.P99, d.Max)
}

type Totals struct {
	Streams    int     `json:"streams"`
	Packets    uint64  `json:"packets"`
	Bytes      uint64  `json:"bytes"`
	Expected   uint64  `json:"expected"`
	Lost       int64   `json:"lost"`
	LossPct    float64 `json:"loss_pct"`
	Duplicates uint64  `json:"duplicates"`
	Reordered  uint64  `json:"reordered"`
	// Resyncs: times the sequence numbering restarted (a sender restart,
	// or packets hundreds of sequence numbers out of order); expected and
	// lost count from the last one (rtp.StreamAnalyzer.Resyncs).
	Resyncs      uint64  `json:"resyncs"`
	MaxJitterMs  float64 `json:"max_jitter_ms"`
	MeanJitterMs float64 `json:"mean_jitter_ms"`
	MaxGapMs     float64 `json:"max_gap_ms"`
	RTCPPackets  uint64  `json:"rtcp_packets"`
	OtherPackets uint64  `json:"other_packets"`
	Glitches     uint64  `json:"glitches"` // loss periods over all streams

	// Distributions over streams.
	JitterDist   Distribution `json:"jitter_ms_dist"`
	MaxGapDist   Distribution `json:"max_gap_ms_dist"`
	LossPctDist  Distribution `json:"loss_pct_dist"`
	MOSDist      Distribution `json:"mos_dist"`
	RDist        Distribution `json:"r_dist"`
	GlitchMsDist Distribution `json:"max_glitch_ms_dist"` // of streams with a glitch
}

// FailoverReport is the glitch all streams saw, when they saw one: the
// longest loss period of each stream, their distribution, and the outage
// they bound together. Streams are staggered across the ptime, so the
// moment the path failed and the moment it came back are each bracketed to
// within ptime/streams.
type FailoverReport struct {
	Streams      int          `json:"streams"`              // streams with a loss period
	StreamsClean int          `json:"streams_without_loss"` // streams without
	GlitchMs     Distribution `json:"glitch_ms"`            // audio missing per stream
	GapMs        Distribution `json:"gap_ms"`               // arrival gap around it per stream
	// OutageMs is the earliest first arrival after minus the latest last
	// arrival before over the streams' longest loss periods: the time no
	// packet crossed, to within ResolutionMs at each end.
	OutageMs     float64 `json:"outage_ms"`
	ResolutionMs float64 `json:"resolution_ms"` // ptime / streams
	Start        string  `json:"start"`         // latest last arrival before (RFC 3339)
}

type Report struct {
	Listen    string          `json:"listen"`
	Direction string          `json:"direction,omitempty"`
	Elapsed   float64         `json:"elapsed_s"`
	Streams   []StreamReport  `json:"streams"`
	Totals    Totals          `json:"totals"`
	Failover  *FailoverReport `json:"failover,omitempty"`
}

func rfc3339(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// streamReportOf builds the report of one analysed stream.
func streamReportOf(a *rtp.StreamAnalyzer, pr *portReader, start time.Time, o EmodelOpts) StreamReport {
	// Unique packets counted by RFC 3550 = Received - duplicates.
	lost := max(a.Stats.Lost()+int64(a.Duplicates), 0)
	s := StreamReport{
		Port: pr.port, SSRC: a.Stats.SSRC, PayloadType: a.PayloadType,
		Packets: a.Packets, Bytes: a.Bytes, Expected: a.Stats.Expected(), Lost: lost,
		Duplicates: a.Duplicates, Reordered: a.Reordered, Resyncs: a.Resyncs,
		JitterMs: a.JitterMillis(), MaxGapMs: a.MaxGapMillis(),
		FirstArrival: rfc3339(a.FirstArrival), LastArrival: rfc3339(a.LastArrival),
		LossPeriods: []LossPeriodReport{}, Glitches: a.LossRuns, BurstR: 1,
	}
	if pr.local.IsValid() {
		s.Local = pr.local.String()
	}
	if s.Expected > 0 {
		s.LossPct = 100 * float64(lost) / float64(s.Expected)
	}
	if s.Expected > 1 {
		s.PtimeMs = float64(a.LastArrival-a.FirstArrival) / 1e6 / float64(s.Expected-1)
	}
	for i := range a.LossPeriods {
		p := &a.LossPeriods[i]
		s.LossPeriods = append(s.LossPeriods, LossPeriodReport{
			Start: rfc3339(p.Before), StartMs: float64(p.Before-start.UnixNano()) / 1e6,
			DurationMs: p.MissingMillis(), GapMs: p.GapMillis(), Lost: p.Lost,
		})
		if p.MissingMillis() > s.MaxGlitchMs || s.before == 0 {
			s.MaxGlitchMs, s.before, s.after = p.MissingMillis(), p.Before, p.After
		}
	}
	c, name, ok := o.codecByPT(a.PayloadType)
	s.Codec = name
	received := uint64(max(int64(s.Expected)-lost, 0))
	s.BurstR = emodel.BurstRatio(received, uint64(lost), a.LossRuns)
	if ok {
		r := emodel.R(emodel.Input{Codec: c, LossPercent: s.LossPct, BurstR: s.BurstR, DelayMs: o.DelayMs})
		m := emodel.MOS(r)
		s.R, s.MOS = &r, &m
	}
	return s
}

func (rc *Receiver) Report(elapsed time.Duration) Report {
	r := Report{
		Listen:    fmt.Sprintf("%s-%d", netip.AddrPortFrom(rc.cfg.Addr, uint16(rc.cfg.PortLo)), rc.cfg.PortHi),
		Direction: rc.cfg.Direction,
		Elapsed:   elapsed.Seconds(),
		Streams:   []StreamReport{},
	}
	start := rc.start
	if start.IsZero() {
		start = time.Now().Add(-elapsed)
	}
	t := &r.Totals
	for _, pr := range rc.readers {
		t.RTCPPackets += pr.rtcp
		t.OtherPackets += pr.other
		for _, a := range pr.streams {
			r.Streams = append(r.Streams, streamReportOf(a, pr, start, rc.cfg.Emodel))
		}
	}
	sort.Slice(r.Streams, func(i, j int) bool {
		a, b := r.Streams[i], r.Streams[j]
		if a.Local != b.Local && a.Port == b.Port {
			return a.Local < b.Local
		}
		return a.Port < b.Port || a.Port == b.Port && a.SSRC < b.SSRC
	})
	r.Summarize()
	return r
}

// Summarize fills the totals, the distributions and the failover report
// from r.Streams.
func (r *Report) Summarize() {
	t := &r.Totals
	var jit, gap, loss, mos, rr, glitch, gaps, ptimes []float64
	var before, after int64
	var with int
	for i := range r.Streams {
		s := &r.Streams[i]
		t.Streams++
		t.Packets += s.Packets
		t.Bytes += s.Bytes
		t.Expected += uint64(s.Expected)
		t.Lost += s.Lost
		t.Duplicates += s.Duplicates
		t.Reordered += s.Reordered
		t.Glitches += s.Glitches
		t.MaxJitterMs = max(t.MaxJitterMs, s.JitterMs)
		t.MeanJitterMs += s.JitterMs
		t.MaxGapMs = max(t.MaxGapMs, s.MaxGapMs)
		jit, gap, loss = append(jit, s.JitterMs), append(gap, s.MaxGapMs), append(loss, s.LossPct)
		if s.MOS != nil {
			mos, rr = append(mos, *s.MOS), append(rr, *s.R)
		}
		if s.PtimeMs > 0 {
			ptimes = append(ptimes, s.PtimeMs)
		}
		if s.before != 0 {
			with++
			glitch = append(glitch, s.MaxGlitchMs)
			gaps = append(gaps, float64(s.after-s.before)/1e6)
			if before == 0 || s.before > before {
				before = s.before
			}
			if after == 0 || s.after < after {
				after = s.after
			}
		}
	}
	if t.Streams > 0 {
		t.MeanJitterMs /= float64(t.Streams)
	}
	if t.Expected > 0 {
		t.LossPct = 100 * float64(t.Lost) / float64(t.Expected)
	}
	t.JitterDist, t.MaxGapDist, t.LossPctDist = DistOf(jit), DistOf(gap), DistOf(loss)
	t.MOSDist, t.RDist, t.GlitchMsDist = DistOf(mos), DistOf(rr), DistOf(glitch)
	if with > 0 {
		f := &FailoverReport{Streams: with, StreamsClean: t.Streams - with, GlitchMs: DistOf(glitch), GapMs: DistOf(gaps),
			OutageMs: float64(after-before) / 1e6, Start: rfc3339(before)}
		if p := DistOf(ptimes); p.N > 0 {
			f.ResolutionMs = p.P50 / float64(t.Streams)
		}
		r.Failover = f
	}
}

// Worst returns the indexes of up to n streams with the most loss, then
// the longest gap.
func (r *Report) Worst(n int) []int {
	idx := make([]int, len(r.Streams))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool {
		a, b := &r.Streams[idx[i]], &r.Streams[idx[j]]
		return a.Lost > b.Lost || a.Lost == b.Lost && a.MaxGapMs > b.MaxGapMs
	})
	return idx[:min(n, len(idx))]
}

func (r *Report) WriteText(w io.Writer) { r.WriteTextAll(w, false) }

func (r *Report) WriteTextAll(w io.Writer, all bool) {
	rows := make([]int, 0, len(r.Streams))
	if all || len(r.Streams) <= 40 {
		for i := range r.Streams {
			rows = append(rows, i)
		}
	} else {
		rows = r.Worst(10)
		fmt.Fprintf(w, "the 10 worst of %d streams (--all-streams lists every one):\n", len(r.Streams))
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PORT\tSSRC\tPT\tPACKETS\tEXPECTED\tLOST\tDUP\tREORD\tJITTER_MS\tMAX_GAP_MS\tGLITCHES\tMAX_GLITCH_MS\tMOS\t")
	for _, i := range rows {
		s := &r.Streams[i]
		mos := "-"
		if s.MOS != nil {
			mos = fmt.Sprintf("%.2f", *s.MOS)
		}
		fmt.Fprintf(tw, "%d\t%08x\t%d\t%d\t%d\t%d\t%d\t%d\t%.3f\t%.1f\t%d\t%.0f\t%s\t\n", s.Port, s.SSRC, s.PayloadType,
			s.Packets, s.Expected, s.Lost, s.Duplicates, s.Reordered, s.JitterMs, s.MaxGapMs, s.Glitches, s.MaxGlitchMs, mos)
	}
	tw.Flush()
	t := r.Totals
	dir := ""
	if r.Direction != "" {
		dir = r.Direction + ": "
	}
	fmt.Fprintf(w, "%stotal: %d streams, %d packets, %d expected, %d lost (%.3f%%), %d duplicates, %d reordered; jitter mean %.3f ms max %.3f ms; max gap %.1f ms; %d glitches; %d RTCP, %d other packets; %.2f s\n",
		dir, t.Streams, t.Packets, t.Expected, t.Lost, t.LossPct, t.Duplicates, t.Reordered, t.MeanJitterMs, t.MaxJitterMs, t.MaxGapMs, t.Glitches, t.RTCPPackets, t.OtherPackets, r.Elapsed)
	if t.Streams > 1 {
		fmt.Fprintf(w, "  over streams: jitter ms %v; max gap ms %v; loss %% %v; MOS %v\n", t.JitterDist, t.MaxGapDist, t.LossPctDist, t.MOSDist)
	} else if t.MOSDist.N == 1 {
		fmt.Fprintf(w, "  E-model: R %.1f, MOS %.2f\n", t.RDist.Max, t.MOSDist.Max)
	}
	if f := r.Failover; f != nil {
		fmt.Fprintf(w, "  glitch: %d of %d streams lost packets; longest loss period per stream, audio missing ms %v; arrival gap ms %v\n",
			f.Streams, f.Streams+f.StreamsClean, f.GlitchMs, f.GapMs)
		fmt.Fprintf(w, "  outage seen by all of them together: %.1f ms (resolution %.3f ms = ptime/streams), from %s\n", f.OutageMs, f.ResolutionMs, f.Start)
	}
}

// ShowProgress rewrites one line on w every 250 ms until ctx is done.
func (rc *Receiver) ShowProgress(ctx context.Context, w io.Writer) {
	tk := time.NewTicker(250 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprint(w, "\r\033[K")
			return
		case now := <-tk.C:
			fmt.Fprintf(w, "\r\033[K%5.1fs receiving: %d RTP packets, %d loss periods", now.Sub(rc.start).Seconds(), rc.received.Load(), rc.lossRuns.Load())
		}
	}
}
