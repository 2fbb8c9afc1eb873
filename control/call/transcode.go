package call

import (
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/dataplane"
)

// codecPlan is what relayd decided about the codecs of one stream of an
// offer, for the answer.
type codecPlan struct {
	// offered are the offerer's codecs relayd may use on the offerer's
	// leg (the offer less stripped codecs; masked ones and those a
	// route's codecs left out stay), those the filter kept first.
	offered []sdp.Codec
	// ptime and maxptime are the offerer's a=ptime and a=maxptime.
	ptime, maxptime int
	// added are the codecs relayd added toward the answerer, which only
	// transcoding provides.
	added []sdp.Codec
}

// transcodable returns the canonical name of a codec a transcoding flow
// can carry (PCMU, PCMA, G729 at 8 kHz).
func transcodable(c sdp.Codec) (string, bool) {
	name, ok := dataplane.TranscodeCodec(c.Name)
	return name, ok && (c.ClockRate == 8000 || c.ClockRate == 0)
}

func isEvent(c sdp.Codec) bool {
	return strings.EqualFold(c.Name, "telephone-event") && c.ClockRate == 8000
}

func isCN(c sdp.Codec) bool { return strings.EqualFold(c.Name, "CN") && c.ClockRate == 8000 }

// staticPT are the RFC 3551 payload types of the codecs relayd adds.
var staticPT = map[string]uint8{"PCMU": 0, "PCMA": 8, "G729": 18}

// freePT returns the codec's static payload type if no codec in used has
// it, else the first free dynamic one; false with none free.
func freePT(name string, used []sdp.Codec) (uint8, bool) {
	taken := func(pt uint8) bool {
		return slices.ContainsFunc(used, func(c sdp.Codec) bool { return c.PT == pt })
	}
	if pt, ok := staticPT[name]; ok && !taken(pt) {
		return pt, true
	}
	for pt := uint8(96); pt <= 127; pt++ {
		if !taken(pt) {
			return pt, true
		}
	}
	return 0, false
}

// annexB reports whether G.729 fmtp parameters allow Annex B: annexb=yes
// or absent (RFC 4749 section 5.1.1, RFC 3555).
func annexB(fmtp string) bool {
	for _, p := range strings.Split(fmtp, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(strings.TrimSpace(k), "annexb") {
			return !strings.EqualFold(strings.TrimSpace(v), "no")
		}
	}
	return true
}

// packetTime returns the packet time a leg's a=ptime and a=maxptime ask
// for (20 ms without a=ptime), as a transcoding flow packs frames: 10 to
// 40 ms in steps of 10, within maxptime.
func packetTime(ptime, maxptime int) uint8 {
	p := ptime
	if p <= 0 {
		p = 20
	}
	if maxptime > 0 && p > maxptime {
		p = maxptime
	}
	p = min(max(p/10*10, 10), 40)
	return uint8(p)
}

// codecSide describes the codec c of one leg's SDP (whose codecs are
// all) for a transcoding flow; vad is Annex B on that leg.
func codecSide(c sdp.Codec, all []sdp.Codec, ptime, maxptime int, vad bool) dataplane.Codec {
	name, _ := transcodable(c)
	dc := dataplane.Codec{Name: name, PT: c.PT, Ptime: packetTime(ptime, maxptime), VAD: name == "G729" && vad}
	for _, o := range all {
		switch {
		case isEvent(o) && dc.Event == 0 && o.PT != c.PT:
			dc.Event = o.PT
		case isCN(o) && dc.CN == 0 && o.PT != c.PT:
			dc.CN = o.PT
		}
	}
	return dc
}

// mainCodec returns the first codec of a stream that is neither
// telephone-event nor comfort noise.
func mainCodec(st *sdp.Stream) (sdp.Codec, bool) {
	for _, c := range st.Codecs {
		if !strings.EqualFold(c.Name, "telephone-event") && !strings.EqualFold(c.Name, "CN") {
			return c, true
		}
	}
	return sdp.Codec{}, false
}

// transcodeAnswer decides the codecs of one answered stream: nil when
// the answerer picked a codec of the offerer (plain relay), else the
// codec of each leg (by Side, from being the answerer's). answer is what
// the SDP toward the offerer carries instead of the answerer's codecs
// (nil: the answerer's as they are), with that a=ptime.
func transcodeAnswer(st *sdp.Stream, cp codecPlan, from Side) (tc *[2]dataplane.Codec, answer []sdp.Codec, ptime int, err error) {
	if len(cp.added) == 0 {
		return nil, nil, 0, nil
	}
	added := func(c sdp.Codec) (sdp.Codec, bool) {
		for _, a := range cp.added {
			if strings.EqualFold(a.Name, c.Name) && a.ClockRate == c.ClockRate {
				return a, true
			}
		}
		return sdp.Codec{}, false
	}
	main, ok := mainCodec(st)
	sent, isAdded := added(main)
	if !ok || !isAdded || isEvent(sent) {
		// Plain relay: the offerer never offered what relayd added.
		keep := slices.DeleteFunc(slices.Clone(st.Codecs), func(c sdp.Codec) bool {
			_, ok := added(c)
			return ok
		})
		if len(keep) == len(st.Codecs) || len(keep) == 0 {
			return nil, nil, 0, nil
		}
		return nil, keep, st.Ptime, nil
	}
	var best sdp.Codec
	found := false
	for _, c := range cp.offered {
		if _, ok := transcodable(c); ok {
			best, found = c, true
			break
		}
	}
	if !found {
		return nil, nil, 0, sdp.NotAcceptable("the offer has no codec to transcode %s from", main.Name)
	}
	var sides [2]dataplane.Codec
	sides[from] = codecSide(main, st.Codecs, st.Ptime, st.MaxPtime, annexB(main.Fmtp) && annexB(sent.Fmtp))
	sides[from.Other()] = codecSide(best, cp.offered, cp.ptime, cp.maxptime, annexB(best.Fmtp))
	if sides[A].Event == 0 || sides[B].Event == 0 {
		sides[A].Event, sides[B].Event = 0, 0
	}
	answer = []sdp.Codec{best}
	for _, c := range cp.offered {
		if o := sides[from.Other()]; c.PT != best.PT && (c.PT == o.Event && o.Event != 0 || c.PT == o.CN && o.CN != 0) {
			answer = append(answer, c)
		}
	}
	return &sides, answer, cp.ptime, nil
}

// newSSRC returns a random non-zero SSRC.
func newSSRC() uint32 {
	for {
		if s := rand.Uint32(); s != 0 {
			return s
		}
	}
}
