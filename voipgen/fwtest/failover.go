package fwtest

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// Arrival is one packet a receiver recorded.
type Arrival struct {
	Seq uint32 `json:"seq"` // extended RTP sequence number (rollovers counted)
	At  int64  `json:"at"`  // kernel receive time, unix ns
}

// StreamRecord is everything one receiver recorded of one stream.
type StreamRecord struct {
	ID        int    `json:"id"`
	Name      string `json:"name"`      // e.g. "wan->lan 198.18.20.10:4000"
	Direction string `json:"direction"` // e.g. "wan->lan"
	// Arrivals in receive order (Analyze sorts a copy by At if they are
	// not).
	Arrivals []Arrival `json:"-"`
	// SentFirst and SentLast are the sequence range the sender sent; both
	// 0 means unknown, and the received range stands in for it.
	SentFirst uint32 `json:"sent_first,omitempty"`
	SentLast  uint32 `json:"sent_last,omitempty"`
}

// Ms is a duration in milliseconds. +Inf (a glitch that never ended) reads
// "never" in JSON, NaN (not measured) null.
type Ms float64

// Never is the glitch of a stream that never recovered.
var Never = Ms(math.Inf(1))

// MsOf converts a duration.
func MsOf(d time.Duration) Ms { return Ms(float64(d) / float64(time.Millisecond)) }

// MarshalJSON writes a number, "never" or null.
func (m Ms) MarshalJSON() ([]byte, error) {
	switch f := float64(m); {
	case math.IsInf(f, 1):
		return []byte(`"never"`), nil
	case math.IsNaN(f) || math.IsInf(f, -1):
		return []byte("null"), nil
	default:
		return json.Marshal(math.Round(f*1000) / 1000)
	}
}

// UnmarshalJSON reads what MarshalJSON writes.
func (m *Ms) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"never"`:
		*m = Never
		return nil
	case "null":
		*m = Ms(math.NaN())
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("ms: %w", err)
	}
	*m = Ms(f)
	return nil
}

// String is "12.3 ms", "never" or "-".
func (m Ms) String() string {
	switch f := float64(m); {
	case math.IsInf(f, 1):
		return "never"
	case math.IsNaN(f):
		return "-"
	default:
		return fmt.Sprintf("%.1f ms", f)
	}
}

// StreamStatus is how a stream came through the failure.
type StreamStatus string

// The statuses of a stream.
const (
	// Recovered: it was flowing before the failure and kept arriving
	// until the end (its glitch may be nothing).
	Recovered StreamStatus = "recovered"
	// NeverRecovered: it was flowing before the failure and stopped
	// arriving for good before the end.
	NeverRecovered StreamStatus = "never-recovered"
	// SilentBefore: it had no packet in the QuietPtimes ptimes before the
	// failure, so the failure cannot be measured on it.
	SilentBefore StreamStatus = "silent-before"
)

// QuietPtimes is how many ptimes without packets make a stream silent: a
// stream silent that long before the failure is SilentBefore, and one whose
// last packet is older than that at the end never recovered.
const QuietPtimes = 5

// StreamFailover is the analysis of one stream.
type StreamFailover struct {
	ID        int          `json:"id"`
	Name      string       `json:"name"`
	Direction string       `json:"direction,omitempty"`
	Status    StreamStatus `json:"status"`
	Received  uint64       `json:"received"` // arrivals, duplicates included
	// Expected is the sequence range sent (or, unknown, received); Lost
	// those of it never received, over the whole stream.
	Expected   uint64 `json:"expected"`
	Lost       uint64 `json:"lost"`
	Duplicated uint64 `json:"duplicated"` // extra copies of a sequence number
	// Reordered counts arrivals below the highest sequence number received
	// before them (duplicates not counted).
	Reordered uint64 `json:"reordered"`
	// The glitch: the longest interval without arrivals that spans or
	// follows the failure, between the arrivals at GapStart and GapEnd
	// (GapEnd 0 when none came after). GlitchMs is that gap less one ptime,
	// the media missing (the middle of what the gap brackets); Never when
	// the stream did not recover. MissingSeq is the packets missing by
	// sequence number across the gap.
	GapStart   int64  `json:"gap_start"`
	GapEnd     int64  `json:"gap_end,omitempty"`
	GapMs      Ms     `json:"gap_ms"`
	GlitchMs   Ms     `json:"glitch_ms"`
	MissingSeq uint32 `json:"missing_seq"`
}

// Distribution summarises a figure over streams (or repetitions). The zero
// value is the distribution of nothing (N 0).
type Distribution struct {
	N    int `json:"n"`
	Min  Ms  `json:"min"`
	P50  Ms  `json:"p50"`
	P90  Ms  `json:"p90"`
	P99  Ms  `json:"p99"`
	Max  Ms  `json:"max"`
	Mean Ms  `json:"mean"`
}

// DistributionOf summarises v; its percentiles are nearest-rank.
func DistributionOf(v []float64) Distribution {
	if len(v) == 0 {
		return Distribution{}
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	q := func(p float64) Ms { return Ms(s[max(0, int(math.Ceil(p*float64(len(s))))-1)]) }
	d := Distribution{N: len(s), Min: Ms(s[0]), Max: Ms(s[len(s)-1]), P50: q(0.5), P90: q(0.9), P99: q(0.99)}
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	d.Mean = Ms(sum / float64(len(s)))
	return d
}

// String is "min .. p50 .. p90 .. p99 .. max .. (n N)" or "-".
func (d Distribution) String() string {
	if d.N == 0 {
		return "-"
	}
	return fmt.Sprintf("min %.1f p50 %.1f p90 %.1f p99 %.1f max %.1f ms (n %d)",
		float64(d.Min), float64(d.P50), float64(d.P90), float64(d.P99), float64(d.Max), d.N)
}

// Timeline counts received packets per Bucket from Start: All of every
// stream, Worst of the stream with the longest glitch (WorstID, -1 when
// there is none).
type Timeline struct {
	Start    int64 `json:"start"`     // unix ns of the first bucket
	BucketNs int64 `json:"bucket_ns"` // 1 ms
	All      []int `json:"all"`
	Worst    []int `json:"worst"`
	WorstID  int   `json:"worst_id"`
}

// Failover is the analysis of one failure over all streams. The zero value
// is the analysis of no streams.
type Failover struct {
	FailAt  int64 `json:"fail_at"` // the failure instant, unix ns
	End     int64 `json:"end"`     // the end of the recording, unix ns
	PtimeMs Ms    `json:"ptime_ms"`

	Streams        []StreamFailover `json:"streams"`
	Recovered      int              `json:"recovered"`
	NeverRecovered int              `json:"never_recovered"`
	SilentBefore   int              `json:"silent_before"`

	// The failover as all streams together saw it: the latest arrival
	// before the streams' glitches and the earliest after (0 when no
	// stream recovered). Streams are staggered across the ptime, so each
	// instant is known to within ResolutionMs (ptime / streams). GapMs is
	// FirstAfter - LastBefore, OutageMs that less one resolution (the
	// middle of what the gap brackets); OutageMs is Never when no stream
	// came back.
	LastBefore   int64 `json:"last_before"`
	FirstAfter   int64 `json:"first_after,omitempty"`
	GapMs        Ms    `json:"gap_ms"`
	OutageMs     Ms    `json:"outage_ms"`
	ResolutionMs Ms    `json:"resolution_ms"`

	// Glitch is the distribution of GlitchMs over the recovered streams.
	Glitch     Distribution `json:"glitch"`
	Lost       uint64       `json:"lost"`
	Duplicated uint64       `json:"duplicated"`
	Reordered  uint64       `json:"reordered"`

	Timeline Timeline `json:"timeline"`
}

// Timeline bounds around the failure.
const (
	TimelineBefore = 500 * time.Millisecond // before the failure
	TimelineAfter  = time.Second            // after the end of the outage
	TimelineBucket = time.Millisecond
	// TimelineMax caps the timeline after the failure when the outage
	// never ended (or ran longer than that).
	TimelineMax = time.Minute
)

// Analyze measures the failure at failAt on what the receivers recorded
// until end (unix ns both); ptime is the streams' packet interval. It does
// not modify streams.
func Analyze(streams []StreamRecord, failAt int64, ptime time.Duration, end int64) Failover {
	f := Failover{FailAt: failAt, End: end, PtimeMs: MsOf(ptime), OutageMs: Never, GapMs: Never}
	quiet := int64(QuietPtimes) * int64(ptime)
	sorted := make([][]Arrival, len(streams))
	var glitches []float64
	worst, worstGap := -1, int64(-1)
	for i, st := range streams {
		a := st.Arrivals
		if !slices.IsSortedFunc(a, func(x, y Arrival) int { return cmpInt64(x.At, y.At) }) {
			a = slices.Clone(a)
			slices.SortStableFunc(a, func(x, y Arrival) int { return cmpInt64(x.At, y.At) })
		}
		sorted[i] = a
		s := analyzeStream(st, a, failAt, ptime, end, quiet)
		f.Streams = append(f.Streams, s)
		f.Lost += s.Lost
		f.Duplicated += s.Duplicated
		f.Reordered += s.Reordered
		switch s.Status {
		case SilentBefore:
			f.SilentBefore++
			continue
		case NeverRecovered:
			f.NeverRecovered++
		case Recovered:
			f.Recovered++
			glitches = append(glitches, float64(s.GlitchMs))
			if gap := s.GapEnd - s.GapStart; gap > worstGap {
				worst, worstGap = i, gap
			}
			if f.FirstAfter == 0 || s.GapEnd < f.FirstAfter {
				f.FirstAfter = s.GapEnd
			}
		}
	}
	// The latest arrival before the outage: a stream that never recovered
	// counts only if it stopped before the first stream came back.
	for _, s := range f.Streams {
		if s.Status == Recovered || (s.Status == NeverRecovered && (f.FirstAfter == 0 || s.GapStart < f.FirstAfter)) {
			f.LastBefore = max(f.LastBefore, s.GapStart)
		}
	}
	f.Glitch = DistributionOf(glitches)
	if active := f.Recovered + f.NeverRecovered; active > 0 {
		res := ptime / time.Duration(active)
		f.ResolutionMs = MsOf(res)
		if f.FirstAfter != 0 {
			gap := time.Duration(f.FirstAfter - f.LastBefore)
			f.GapMs = MsOf(gap)
			f.OutageMs = MsOf(max(0, gap-res))
		}
	}
	if worst < 0 {
		// No stream recovered: the worst is the first that never did.
		for i, s := range f.Streams {
			if s.Status == NeverRecovered {
				worst = i
				break
			}
		}
	}

	// The timeline: from before the failure to a second after the
	// outage (to the end when it never ended), at most TimelineMax after
	// the failure.
	from := failAt - int64(TimelineBefore)
	to := min(end, failAt+int64(TimelineMax))
	if f.FirstAfter != 0 {
		to = min(to, max(f.FirstAfter, failAt)+int64(TimelineAfter))
	}
	f.Timeline = Timeline{Start: from, BucketNs: int64(TimelineBucket), WorstID: -1}
	if to > from {
		n := int((to - from + int64(TimelineBucket) - 1) / int64(TimelineBucket))
		f.Timeline.All = make([]int, n)
		f.Timeline.Worst = make([]int, n)
		for i, a := range sorted {
			for _, x := range a {
				if x.At < from || x.At >= from+int64(n)*int64(TimelineBucket) {
					continue
				}
				b := (x.At - from) / int64(TimelineBucket)
				f.Timeline.All[b]++
				if i == worst {
					f.Timeline.Worst[b]++
				}
			}
		}
	}
	if worst >= 0 {
		f.Timeline.WorstID = streams[worst].ID
	}
	return f
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// analyzeStream measures one stream whose arrivals a are sorted by time.
func analyzeStream(st StreamRecord, a []Arrival, failAt int64, ptime time.Duration, end, quiet int64) StreamFailover {
	s := StreamFailover{ID: st.ID, Name: st.Name, Direction: st.Direction, Received: uint64(len(a)),
		GapMs: Ms(math.NaN()), GlitchMs: Ms(math.NaN())}

	// Sequence accounting over the whole stream.
	seen := make(map[uint32]struct{}, len(a))
	var highest, lowest uint32
	for i, x := range a {
		if _, dup := seen[x.Seq]; dup {
			s.Duplicated++
			continue
		}
		seen[x.Seq] = struct{}{}
		if i > 0 && x.Seq < highest {
			s.Reordered++
		}
		if len(seen) == 1 {
			highest, lowest = x.Seq, x.Seq
		}
		highest, lowest = max(highest, x.Seq), min(lowest, x.Seq)
	}
	first, last := lowest, highest
	if st.SentFirst != 0 || st.SentLast != 0 {
		first, last = st.SentFirst, st.SentLast
	}
	if len(seen) > 0 || st.SentFirst != 0 || st.SentLast != 0 {
		if last >= first {
			s.Expected = uint64(last-first) + 1
			inRange := uint64(0)
			for q := range seen {
				if q >= first && q <= last {
					inRange++
				}
			}
			s.Lost = s.Expected - inRange
		}
	}

	// The last arrival at or before the failure starts the search for the
	// glitch; without one recent enough there is nothing to measure.
	k := sort.Search(len(a), func(i int) bool { return a[i].At > failAt }) - 1
	if k < 0 || a[k].At < failAt-quiet {
		s.Status = SilentBefore
		return s
	}
	// The longest gap from there on.
	gi := k
	for i := k + 1; i+1 < len(a); i++ {
		if a[i+1].At-a[i].At > a[gi+1].At-a[gi].At {
			gi = i
		}
	}
	lastAt := a[len(a)-1].At
	if gi+1 >= len(a) || lastAt < end-quiet {
		// Nothing after the failure, or it stopped again for good: the
		// glitch runs from its last packet to the end.
		s.Status = NeverRecovered
		s.GlitchMs, s.GapMs = Never, Never
		s.GapStart = lastAt
		return s
	}
	s.Status = Recovered
	s.GapStart, s.GapEnd = a[gi].At, a[gi+1].At
	gap := time.Duration(s.GapEnd - s.GapStart)
	s.GapMs = MsOf(gap)
	s.GlitchMs = MsOf(max(0, gap-ptime))
	if b, e := a[gi].Seq, a[gi+1].Seq; e > b {
		s.MissingSeq = e - b - 1
	}
	return s
}
