package bench

import (
	"fmt"
	"io"
	"slices"

	"github.com/relayd/relayd/rtp/g711"
	"github.com/relayd/relayd/slowpath/codec/g729"
	"github.com/relayd/relayd/voipgen/payload"
)

// The transcode mode: each call's caller leg is G.711 µ-law 20 ms, its
// callee leg G.729 20 ms (Annex B off). Per call and second the relay
// decodes 50 PCMU packets and encodes them into 100 G.729 frames, and
// decodes 100 G.729 frames into 50 PCMU packets.
const (
	transcodeRelayd    = "transcode"           // relayd, userspace workers, calls over ng
	transcodeRtpengine = "rtpengine-transcode" // rtpengine, calls over ng
	// G.729 frames encoded (and as many decoded) per call and second: a
	// stream each way of 50 packets of 20 ms, two 10 ms frames each.
	g729FramesPerCallSecond = 100
	g729PT                  = 18
	g729RTPLen              = 12 + 2*g729.FrameBytes // 20 ms: two frames
	pcmuPT                  = 0
	defaultTranscodeCalls   = "25,50,100,150,200"
	// bcg729Frames is the frames encoded and decoded per timing of bcg729.
	bcg729Frames = 1000
	// bcg729EdgeReps is the timings of each kind before the relays and
	// after them, bcg729RunReps those after each run of a transcode sweep
	// (interleaved with the relays' runs, so that the yardstick sees the
	// machine as the relays did).
	bcg729EdgeReps = 10
	bcg729RunReps  = 2
)

// transcodeMaterial is what the transcode mode's streams carry, made once
// from payload.Speech: the signal µ-law encoded (the caller's packets) and
// the µ-law signal decoded again and encoded with bcg729 (the callee's
// packets: real G.729 frames, of what a relay decoding the caller's PCMU
// would encode).
type transcodeMaterial struct {
	pcmu []byte  // payload.SpeechSamples bytes: 50 payloads of 160
	g729 []byte  // 100 payloads of 20 bytes (two frames each)
	pcm  []int16 // the µ-law signal decoded: bcg729's input when timing it
}

func newTranscodeMaterial() (*transcodeMaterial, error) {
	if !g729.Available {
		return nil, g729.ErrUnavailable
	}
	sp := payload.Speech()
	m := &transcodeMaterial{pcmu: g711.AppendUlaw(nil, sp), pcm: make([]int16, len(sp))}
	for i, b := range m.pcmu {
		m.pcm[i] = g711.DecodeUlaw(b)
	}
	enc, err := g729.NewEncoder(false)
	if err != nil {
		return nil, err
	}
	defer enc.Close()
	m.g729 = make([]byte, 0, len(sp)/g729.FrameSamples*g729.FrameBytes)
	if m.g729, _, err = enc.Encode(m.g729, m.pcm); err != nil {
		return nil, fmt.Errorf("encode the G.729 loop: %w", err)
	}
	if len(m.g729) != len(sp)/g729.FrameSamples*g729.FrameBytes {
		return nil, fmt.Errorf("encode the G.729 loop: %d bytes, want %d", len(m.g729), len(sp)/g729.FrameSamples*g729.FrameBytes)
	}
	return m, nil
}

// benchBcg729 is bcg729's own cost on this machine, measured in-process
// in the same run as the relays: encode and decode of the transcode
// mode's signal, on one thread pinned to a CPU, by its CPU time, before
// the relays, after each run of a transcode sweep and after the relays.
type benchBcg729 struct {
	// Hot: one encoder and one decoder, frames back to back. Per 10 ms
	// frame, medians over the timings (each bcg729Frames frames).
	EncodeNsPerFrame float64 `json:"encode_ns_per_frame"`
	DecodeNsPerFrame float64 `json:"decode_ns_per_frame"`
	// Spread: the lowest and highest timing of encode + decode per frame.
	MinNsPerFramePair float64 `json:"min_ns_per_frame_pair"`
	MaxNsPerFramePair float64 `json:"max_ns_per_frame_pair"`
	Timings           int     `json:"timings"`
	// NsPerCallSecond is what a call costs bcg729 per second: 100 frames
	// encoded and 100 decoded (a 50 pps stream of 20 ms each way).
	NsPerCallSecond float64 `json:"ns_per_call_second"`
	// PhysicalCallsPerCore is 1 s over NsPerCallSecond: the most calls a
	// core could transcode if the relay cost nothing but bcg729. The goal
	// of calls per core is set on it.
	PhysicalCallsPerCore float64 `json:"physical_calls_per_core"`

	// Contexts: as many encoders and decoders as the sweep's largest
	// step has calls, one frame of each in turn (a relay's codec state
	// spread over its calls), the same frames and timings as hot.
	Contexts                 int     `json:"contexts"`
	ContextsEncodeNsPerFrame float64 `json:"contexts_encode_ns_per_frame"`
	ContextsDecodeNsPerFrame float64 `json:"contexts_decode_ns_per_frame"`
	ContextsMinNsPerPair     float64 `json:"contexts_min_ns_per_frame_pair"`
	ContextsMaxNsPerPair     float64 `json:"contexts_max_ns_per_frame_pair"`
	ContextsNsPerCallSecond  float64 `json:"contexts_ns_per_call_second"`
	ContextsCallsPerCore     float64 `json:"contexts_calls_per_core"`
	// ContextsOverHot is ContextsNsPerCallSecond over NsPerCallSecond.
	ContextsOverHot float64 `json:"contexts_over_hot"`
	// CPU is the CPU the timing thread was pinned to.
	CPU int `json:"cpu"`
}

// bcg729Timings are the per-frame timings of both kinds.
type bcg729Timings struct {
	enc, dec, nenc, ndec []float64
	contexts, cpu        int
}

// bcg729Cost folds timings into the figures.
func bcg729Cost(t bcg729Timings) benchBcg729 {
	b := benchBcg729{Timings: len(t.enc), Contexts: t.contexts, CPU: t.cpu}
	fold := func(enc, dec []float64) (e, d, lo, hi float64) {
		pairs := make([]float64, len(enc))
		for i := range enc {
			pairs[i] = enc[i] + dec[i]
		}
		if len(pairs) > 0 {
			lo, hi = slices.Min(pairs), slices.Max(pairs)
		}
		return median(enc), median(dec), lo, hi
	}
	b.EncodeNsPerFrame, b.DecodeNsPerFrame, b.MinNsPerFramePair, b.MaxNsPerFramePair = fold(t.enc, t.dec)
	b.NsPerCallSecond = g729FramesPerCallSecond * (b.EncodeNsPerFrame + b.DecodeNsPerFrame)
	if b.NsPerCallSecond > 0 {
		b.PhysicalCallsPerCore = 1e9 / b.NsPerCallSecond
	}
	b.ContextsEncodeNsPerFrame, b.ContextsDecodeNsPerFrame, b.ContextsMinNsPerPair, b.ContextsMaxNsPerPair = fold(t.nenc, t.ndec)
	b.ContextsNsPerCallSecond = g729FramesPerCallSecond * (b.ContextsEncodeNsPerFrame + b.ContextsDecodeNsPerFrame)
	if b.ContextsNsPerCallSecond > 0 {
		b.ContextsCallsPerCore = 1e9 / b.ContextsNsPerCallSecond
		if b.NsPerCallSecond > 0 {
			b.ContextsOverHot = b.ContextsNsPerCallSecond / b.NsPerCallSecond
		}
	}
	return b
}

// Goals of the transcode comparison.
const (
	goalOverheadRatio    = 0.5  // relayd's overhead / rtpengine's, at most
	goalOfPhysicalLimit  = 0.75 // relayd's calls per core / bcg729's limit, at least
	goalCallsPerGHz      = 100  // relayd's transcoded calls per GHz, more than
	asteriskCallsPerGHz  = 40   // Asterisk 1.4, for reference
	transcodeOverheadWhy = "relay CPU per call (tasks) minus bcg729's own encode + decode per call, both from this run"
)

// benchTranscodeRelay is one relay's transcode figures, from its summary
// (tasks method) and bcg729's cost of the same run.
type benchTranscodeRelay struct {
	Relay string `json:"relay"`
	Steps int    `json:"comparable_steps"`
	// CPUNsPerCallSecond is the relay's CPU per transcoded call and second:
	// its ns per packet (tasks) times 100 packets.
	CPUNsPerCallSecond     float64 `json:"cpu_ns_per_call_second_tasks"`
	IdleCPUNsPerCallSecond float64 `json:"cpu_ns_per_call_second_idle"`
	// OverheadNsPerCallSecond is CPUNsPerCallSecond minus bcg729's
	// NsPerCallSecond: what the relay spends besides the codec.
	OverheadNsPerCallSecond float64 `json:"overhead_ns_per_call_second"`
	// CallsPerCore: 1 s over CPUNsPerCallSecond.
	CallsPerCore float64 `json:"calls_per_core"`
	// OfPhysicalLimit: CallsPerCore over bcg729's PhysicalCallsPerCore
	// (the goal's); OfContextsLimit over its ContextsCallsPerCore.
	OfPhysicalLimit float64 `json:"of_physical_limit"`
	OfContextsLimit float64 `json:"of_contexts_limit"`
	CallsPerGHz     float64 `json:"calls_per_ghz"`
	MaxZeroLoss     int     `json:"max_zero_loss_calls"`

	// Under load: the same figures at the relay's most loaded comparable
	// zero-loss step (its highest call count). Calls per core is a
	// capacity, what a busy core carries: at a light step a worker
	// sleeps between packets and pays each wake-up (tens of µs of CPU on
	// a VM, about a G.729 frame's encode), which a busy worker does not.
	// The goals on calls per core and per GHz are checked on these; the
	// figures above, over every comparable step, are the cost per call.
	LoadCalls              int     `json:"load_calls"`
	LoadRelayCPU           float64 `json:"load_relay_cpu_share"`
	LoadCPUNsPerCallSecond float64 `json:"load_cpu_ns_per_call_second_tasks"`
	LoadCallsPerCore       float64 `json:"load_calls_per_core"`
	LoadOfPhysicalLimit    float64 `json:"load_of_physical_limit"`
	LoadCallsPerGHz        float64 `json:"load_calls_per_ghz"`
	// BehindSteps are the call counts carried without loss whose workers
	// were behind (benchRow.WorkerBehind).
	BehindSteps []int `json:"steps_workers_behind,omitempty"`
}

// loadStep returns relay's most loaded comparable zero-loss row: the
// highest call count whose load the sender offered in full and the relay
// kept up with (relayd's workers not behind: a step they carry only by
// queueing is past their capacity).
func loadStep(rows []benchRow, relay string) (benchRow, bool) {
	var best benchRow
	ok := false
	for _, r := range rows {
		if r.Relay != relay || !r.lossless() || !r.Comparable || r.SenderLimited || r.WorkerBehind || r.TaskNsPerPkt <= 0 {
			continue
		}
		if !ok || r.Calls > best.Calls {
			best, ok = r, true
		}
	}
	return best, ok
}

// benchTranscodeReport is the transcode comparison, all from one run.
type benchTranscodeReport struct {
	Bcg729 benchBcg729            `json:"bcg729"`
	Relays []benchTranscodeRelay  `json:"relays"`
	Goals  map[string]float64     `json:"goals"`
	Checks []benchTranscodeResult `json:"checks,omitempty"`
	// OverheadRatio is relayd's overhead over rtpengine's (0: not both).
	OverheadRatio float64 `json:"overhead_ratio_relayd_rtpengine,omitempty"`
	// OverheadSteps are the call counts both relays carried without
	// loss, over which OverheadRatio is taken (medians of each relay's
	// CPU per packet over them).
	OverheadSteps []int  `json:"overhead_ratio_steps,omitempty"`
	Definition    string `json:"overhead_definition"`
}

// benchTranscodeResult is one goal against its figure.
type benchTranscodeResult struct {
	What  string  `json:"what"`
	Value float64 `json:"value"`
	Goal  string  `json:"goal"`
	Met   bool    `json:"met"`
}

// summarizeTranscode fills rep.Transcode from the summaries of the
// transcoding relays and bcg729's cost; nil when neither ran.
func summarizeTranscode(rep *Report, ghz float64) {
	if rep.Transcode == nil {
		return
	}
	t := rep.Transcode
	t.Relays, t.Checks, t.OverheadRatio, t.OverheadSteps = nil, nil, 0, nil
	t.Definition = transcodeOverheadWhy
	t.Goals = map[string]float64{"overhead_ratio_max": goalOverheadRatio, "of_physical_limit_min": goalOfPhysicalLimit,
		"calls_per_ghz_min": goalCallsPerGHz, "asterisk_1_4_calls_per_ghz": asteriskCallsPerGHz}
	byRelay := map[string]benchTranscodeRelay{}
	for _, s := range rep.Summaries {
		if s.Relay != transcodeRelayd && s.Relay != transcodeRtpengine {
			continue
		}
		r := benchTranscodeRelay{Relay: s.Relay, Steps: s.Steps, MaxZeroLoss: s.MaxZeroLossCalls,
			CPUNsPerCallSecond: s.TaskNsPerPkt * benchPPSPerCall, IdleCPUNsPerCallSecond: s.IdleNsPerPkt * benchPPSPerCall}
		if r.CPUNsPerCallSecond > 0 {
			r.OverheadNsPerCallSecond = r.CPUNsPerCallSecond - t.Bcg729.NsPerCallSecond
			r.CallsPerCore = 1e9 / r.CPUNsPerCallSecond
			if t.Bcg729.PhysicalCallsPerCore > 0 {
				r.OfPhysicalLimit = r.CallsPerCore / t.Bcg729.PhysicalCallsPerCore
			}
			if t.Bcg729.ContextsCallsPerCore > 0 {
				r.OfContextsLimit = r.CallsPerCore / t.Bcg729.ContextsCallsPerCore
			}
			if ghz > 0 {
				r.CallsPerGHz = r.CallsPerCore / ghz
			}
		}
		for _, row := range rep.Rows {
			if row.Relay == s.Relay && row.lossless() && row.WorkerBehind {
				r.BehindSteps = append(r.BehindSteps, row.Calls)
			}
		}
		if l, ok := loadStep(rep.Rows, s.Relay); ok {
			r.LoadCalls, r.LoadRelayCPU = l.Calls, l.RelayCPU
			r.LoadCPUNsPerCallSecond = l.TaskNsPerPkt * benchPPSPerCall
			r.LoadCallsPerCore = 1e9 / r.LoadCPUNsPerCallSecond
			if t.Bcg729.PhysicalCallsPerCore > 0 {
				r.LoadOfPhysicalLimit = r.LoadCallsPerCore / t.Bcg729.PhysicalCallsPerCore
			}
			if ghz > 0 {
				r.LoadCallsPerGHz = r.LoadCallsPerCore / ghz
			}
		}
		t.Relays = append(t.Relays, r)
		byRelay[s.Relay] = r
	}
	a, okA := byRelay[transcodeRelayd]
	_, okB := byRelay[transcodeRtpengine]
	if okA && okB {
		// Over the steps both relays carried without loss: each relay's
		// cost per packet falls as its load rises, so medians over
		// different steps would favour the one that carried more.
		var ta, tb []float64
		for _, pr := range commonSteps(rep.Rows, transcodeRelayd, transcodeRtpengine) {
			ta, tb = append(ta, pr[0].TaskNsPerPkt), append(tb, pr[1].TaskNsPerPkt)
			t.OverheadSteps = append(t.OverheadSteps, pr[0].Calls)
		}
		oa := median(ta)*benchPPSPerCall - t.Bcg729.NsPerCallSecond
		ob := median(tb)*benchPPSPerCall - t.Bcg729.NsPerCallSecond
		if len(ta) > 0 && ob > 0 {
			t.OverheadRatio = oa / ob
			t.Checks = append(t.Checks, benchTranscodeResult{What: "relayd overhead / rtpengine overhead", Value: t.OverheadRatio,
				Goal: fmt.Sprintf("<= %.2f", goalOverheadRatio), Met: t.OverheadRatio <= goalOverheadRatio})
		}
	}
	if okA && a.LoadCallsPerCore > 0 {
		t.Checks = append(t.Checks,
			benchTranscodeResult{What: fmt.Sprintf("relayd calls per core at %d calls / bcg729's limit", a.LoadCalls), Value: a.LoadOfPhysicalLimit,
				Goal: fmt.Sprintf(">= %.2f", goalOfPhysicalLimit), Met: a.LoadOfPhysicalLimit >= goalOfPhysicalLimit},
			benchTranscodeResult{What: fmt.Sprintf("relayd transcoded calls per GHz at %d calls", a.LoadCalls), Value: a.LoadCallsPerGHz,
				Goal: fmt.Sprintf("> %d (Asterisk 1.4: about %d)", goalCallsPerGHz, asteriskCallsPerGHz), Met: a.LoadCallsPerGHz > goalCallsPerGHz})
	}
}

// writeTranscodeText prints the transcode comparison.
func writeTranscodeText(w io.Writer, t *benchTranscodeReport) {
	if t == nil {
		return
	}
	b := t.Bcg729
	fmt.Fprintf(w, "\nTranscoding G.711 µ-law 20 ms <-> G.729 20 ms (a call: 100 G.729 frames encoded and 100 decoded per second), same run:\n")
	fmt.Fprintf(w, "  bcg729 in-process, hot (one encoder, one decoder): encode %.0f ns/frame, decode %.0f ns/frame (medians of %d timings of %d frames, CPU time on CPU %d, before, between and after the relays' runs; encode+decode %.0f-%.0f ns)\n",
		b.EncodeNsPerFrame, b.DecodeNsPerFrame, b.Timings, bcg729Frames, b.CPU, b.MinNsPerFramePair, b.MaxNsPerFramePair)
	fmt.Fprintf(w, "  bcg729 per call: %.0f µs of CPU per second; physical limit %.0f calls per core (the goal's yardstick)\n", b.NsPerCallSecond/1e3, b.PhysicalCallsPerCore)
	if b.Contexts > 0 {
		fmt.Fprintf(w, "  bcg729 over %d encoders and %d decoders in turn: encode %.0f ns/frame, decode %.0f ns/frame (encode+decode %.0f-%.0f ns): %.0f µs per call-second, %.2fx hot, %.0f calls per core\n",
			b.Contexts, b.Contexts, b.ContextsEncodeNsPerFrame, b.ContextsDecodeNsPerFrame, b.ContextsMinNsPerPair, b.ContextsMaxNsPerPair,
			b.ContextsNsPerCallSecond/1e3, b.ContextsOverHot, b.ContextsCallsPerCore)
	}
	for _, r := range t.Relays {
		if r.CPUNsPerCallSecond <= 0 {
			fmt.Fprintf(w, "  %-20s no comparable zero-loss step\n", r.Relay)
			continue
		}
		fmt.Fprintf(w, "  %-20s median over %d steps: %.0f µs/call/s (tasks), overhead %.0f µs/call/s, %.0f calls per core (%.2fx the limit, %.2fx the contexts limit), %.0f calls/GHz; max zero-loss %d calls\n",
			r.Relay, r.Steps, r.CPUNsPerCallSecond/1e3, r.OverheadNsPerCallSecond/1e3, r.CallsPerCore, r.OfPhysicalLimit, r.OfContextsLimit, r.CallsPerGHz, r.MaxZeroLoss)
		if r.LoadCalls > 0 {
			fmt.Fprintf(w, "  %-20s under load, at %d calls (relay %.2f CPUs, the highest step carried without loss or workers behind): %.0f µs/call/s, %.0f calls per core (%.2fx the limit), %.0f calls/GHz\n",
				"", r.LoadCalls, r.LoadRelayCPU, r.LoadCPUNsPerCallSecond/1e3, r.LoadCallsPerCore, r.LoadOfPhysicalLimit, r.LoadCallsPerGHz)
		}
		if len(r.BehindSteps) > 0 {
			fmt.Fprintf(w, "  %-20s no loss but the workers behind (median packet delayed over %d ms) at %v calls: not counted as carried\n", "", behindDelayUS/1000, r.BehindSteps)
		}
	}
	if len(t.OverheadSteps) > 0 {
		fmt.Fprintf(w, "  overheads compared over the steps both relays carried without loss: %v calls\n", t.OverheadSteps)
	}
	for _, c := range t.Checks {
		met := "met"
		if !c.Met {
			met = "NOT met"
		}
		fmt.Fprintf(w, "  %-48s %.2f (goal %s): %s\n", c.What, c.Value, c.Goal, met)
	}
}
