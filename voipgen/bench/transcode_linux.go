package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/control/ng/bencode"
	"github.com/relayd/relayd/control/sdp"
	"github.com/relayd/relayd/lab/rtpengine"
	"github.com/relayd/relayd/lab/rtpengine/ngclient"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// bcg729Clock times bcg729 in-process for the transcode comparison, in
// the same run as the relays and interleaved with their runs: on one
// thread pinned to a CPU, by that thread's CPU time
// (CLOCK_THREAD_CPUTIME_ID: time on CPU, not time waiting for one). Two
// timings: "hot", one encoder and one decoder running frames back to
// back (the yardstick: what bcg729's cost alone allows), and
// "contexts", as many encoders and decoders as the sweep's largest step
// has calls (one of each per call, as a relay holds them), one frame of
// each in turn, so that the contexts do not stay in the caches. Its zero
// value is not usable: use newBcg729Clock. Not safe for concurrent use.
type bcg729Clock struct {
	m          *transcodeMaterial
	encs       []*g729.Encoder
	decs       []*g729.Decoder
	pos        []int // each context's next frame in m's loop
	cpu        int
	enc, dec   []float64 // hot: ns per frame, one entry per timing
	nenc, ndec []float64 // contexts: the same
}

// newBcg729Clock makes the contexts for calls calls.
func newBcg729Clock(m *transcodeMaterial, calls int) (*bcg729Clock, error) {
	c := &bcg729Clock{m: m, cpu: runtime.NumCPU() - 1}
	loop := len(m.pcm) / g729.FrameSamples
	for i := range max(calls, 1) {
		e, err := g729.NewEncoder(false)
		if err != nil {
			c.close()
			return nil, err
		}
		c.encs = append(c.encs, e)
		d, err := g729.NewDecoder()
		if err != nil {
			c.close()
			return nil, err
		}
		c.decs = append(c.decs, d)
		// Each call from its own point of the loop, as the sender's
		// streams are.
		c.pos = append(c.pos, 7*i%loop)
	}
	return c, nil
}

func (c *bcg729Clock) close() {
	for _, e := range c.encs {
		e.Close()
	}
	for _, d := range c.decs {
		d.Close()
	}
	c.encs, c.decs = nil, nil
}

// contexts is the number of encoders (and decoders) of the contexts
// timing.
func (c *bcg729Clock) contexts() int { return len(c.encs) }

// measure runs reps hot timings and reps contexts timings of frames
// frames each, alternating, on a thread pinned to the clock's CPU.
func (c *bcg729Clock) measure(frames, reps int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err == nil {
		var set unix.CPUSet
		set.Set(c.cpu)
		if unix.SchedSetaffinity(0, &set) == nil {
			defer unix.SchedSetaffinity(0, &was)
		}
	}
	for range reps {
		e, d, err := c.time(frames, 1)
		if err != nil {
			return err
		}
		c.enc, c.dec = append(c.enc, e), append(c.dec, d)
		if e, d, err = c.time(frames, len(c.encs)); err != nil {
			return err
		}
		c.nenc, c.ndec = append(c.nenc, e), append(c.ndec, d)
	}
	return nil
}

// time encodes frames frames of the material, then decodes frames frames
// of its G.729, over the first n contexts in turn, and returns the CPU
// time per encoded and per decoded frame.
func (c *bcg729Clock) time(frames, n int) (enc, dec float64, err error) {
	m := c.m
	loop := len(m.pcm) / g729.FrameSamples
	var bits [g729.FrameBytes]byte
	var pcm [g729.FrameSamples]int16
	now := func() int64 {
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		return ts.Nano()
	}
	pos := slices.Clone(c.pos[:n])
	t0 := now()
	for i := range frames {
		k := i % n
		f := pos[k] * g729.FrameSamples
		if _, _, err = c.encs[k].Encode(bits[:0], m.pcm[f:f+g729.FrameSamples]); err != nil {
			return 0, 0, err
		}
		pos[k] = (pos[k] + 1) % loop
	}
	t1 := now()
	copy(pos, c.pos[:n])
	for i := range frames {
		k := i % n
		f := pos[k] * g729.FrameBytes
		if _, err = c.decs[k].Decode(pcm[:0], m.g729[f:f+g729.FrameBytes]); err != nil {
			return 0, 0, err
		}
		pos[k] = (pos[k] + 1) % loop
	}
	t2 := now()
	copy(c.pos[:n], pos)
	return float64(t1-t0) / float64(frames), float64(t2-t1) / float64(frames), nil
}

// ngCall is a transcode call set up on a relay over ng.
type ngCall struct {
	callID, fromTag string
	// toCallee is where the caller sends (the relay's port in the
	// rewritten answer), toCaller where the callee sends (the rewritten
	// offer's); the relay sends each leg's packets from that leg's port.
	toCallee, toCaller netip.AddrPort
}

// transcodeOfferSDP is the caller's offer: PCMU 20 ms and telephone-event.
func transcodeOfferSDP(caller netip.AddrPort, id int) string {
	return fmt.Sprintf("v=0\r\no=- %d 1 IN IP4 %s\r\ns=-\r\nc=IN IP4 %s\r\nt=0 0\r\n"+
		"m=audio %d RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-16\r\n"+
		"a=ptime:20\r\na=sendrecv\r\n", id, caller.Addr(), caller.Addr(), caller.Port())
}

// transcodeAnswerSDP is the callee's answer: G.729 20 ms only, Annex B off.
func transcodeAnswerSDP(callee netip.AddrPort, id int) string {
	return fmt.Sprintf("v=0\r\no=- %d 1 IN IP4 %s\r\ns=-\r\nc=IN IP4 %s\r\nt=0 0\r\n"+
		"m=audio %d RTP/AVP 18\r\na=rtpmap:18 G729/8000\r\na=fmtp:18 annexb=no\r\na=ptime:20\r\na=sendrecv\r\n",
		id, callee.Addr(), callee.Addr(), callee.Port())
}

// transcodeFlags are the offer's and the answer's codec operations, in
// rtpengine's dictionary form (relayd's ng takes the same): offer G.729 to
// the callee, transcoding, and hide PCMU from it so that the callee's leg
// is G.729 whatever it would accept.
func transcodeFlags() []bencode.Entry {
	return []bencode.Entry{{Key: "codec", Value: bencode.Dict(
		bencode.Entry{Key: "mask", Value: bencode.Strings("PCMU")},
		bencode.Entry{Key: "transcode", Value: bencode.Strings("G729")},
	)}}
}

// setupTranscodeCall sets call id up on the relay behind c: the offer
// from caller, the answer from callee. The rewritten offer must carry
// the relay's address and G.729 without PCMU, the rewritten answer PCMU
// first and no G.729: else the relay would not transcode.
func setupTranscodeCall(ctx context.Context, c *ngclient.Client, id int, caller, callee netip.AddrPort, relay netip.Addr) (*ngCall, error) {
	call := &ngCall{callID: fmt.Sprintf("bench-xc-%d-%d", os.Getpid(), id), fromTag: fmt.Sprintf("caller-%d", id)}
	base := ngclient.Request{CallID: call.callID, FromTag: call.fromTag, Replace: []string{"origin", "session-connection"}, ICE: "remove"}
	offer := base
	offer.SDP, offer.Extra = transcodeOfferSDP(caller, id), transcodeFlags()
	o, err := c.Offer(ctx, offer)
	if err != nil {
		return nil, fmt.Errorf("call %s: %w", call.callID, err)
	}
	if call.toCaller, err = checkTranscodeSDP(o.SDP, relay, g729PT, pcmuPT); err != nil {
		return call, fmt.Errorf("call %s: offer to the callee: %w", call.callID, err)
	}
	answer := base
	answer.ToTag, answer.SDP = fmt.Sprintf("callee-%d", id), transcodeAnswerSDP(callee, id)
	a, err := c.Answer(ctx, answer)
	if err != nil {
		return call, fmt.Errorf("call %s: %w", call.callID, err)
	}
	if call.toCallee, err = checkTranscodeSDP(a.SDP, relay, pcmuPT, g729PT); err != nil {
		return call, fmt.Errorf("call %s: answer to the caller: %w", call.callID, err)
	}
	return call, nil
}

// checkTranscodeSDP returns the RTP address of a rewritten SDP's one
// audio stream after checking that it is the relay's, that its first
// audio codec (not telephone-event or comfort noise) is payload type first
// and that it does not carry not.
func checkTranscodeSDP(body string, relay netip.Addr, first, not uint8) (netip.AddrPort, error) {
	d, err := sdp.Parse([]byte(body))
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(d.Streams) != 1 {
		return netip.AddrPort{}, fmt.Errorf("%d streams, want 1: %q", len(d.Streams), body)
	}
	st := &d.Streams[0]
	ap := st.RTP()
	if ap.Addr() != relay {
		return ap, fmt.Errorf("media address %s, want the relay's %s: %q", ap, relay, body)
	}
	// The first audio codec (telephone-event may come before it).
	var audio []uint8
	for _, c := range st.Codecs {
		if !strings.EqualFold(c.Name, "telephone-event") && !strings.EqualFold(c.Name, "CN") {
			audio = append(audio, c.PT)
		}
	}
	if len(audio) == 0 || audio[0] != first {
		return ap, fmt.Errorf("first audio codec not payload type %d: %q", first, body)
	}
	for _, c := range st.Codecs {
		if c.PT == not {
			return ap, fmt.Errorf("payload type %d offered, the relay would not transcode: %q", not, body)
		}
	}
	return ap, nil
}

// transcodeSweep runs the transcode sweep (cfg.transcodeCalls) through
// the relay behind c, whose media address is relay: at each step the
// calls missing are set up over ng, the sender's streams get their
// formats (the calls' forward streams PCMU, their reverse streams G.729)
// and the relay path's runs are transcode runs (fwdPath.xc). The calls
// are deleted at the end.
func (b *fwdBench) transcodeSweep(ctx context.Context, cfg Config, rep *Report, m fwdMode, c *ngclient.Client, relay netip.Addr) error {
	mat := b.xcMat
	if mat == nil {
		return errors.New("no G.729 material")
	}
	if c := b.xcClock; c != nil {
		b.afterRun = func() error {
			if err := c.measure(bcg729Frames, bcg729RunReps); err != nil {
				return fmt.Errorf("time bcg729: %w", err)
			}
			return nil
		}
		defer func() { b.afterRun = nil }()
	}
	var calls []*ngCall
	defer func() {
		b.snd.resetStreams()
		if len(calls) == 0 {
			return
		}
		start := time.Now()
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var failed atomic.Int64
		parallel(len(calls), 8, func(i int) {
			if _, err := c.Delete(dctx, ngclient.Request{CallID: calls[i].callID, FromTag: calls[i].fromTag}); err != nil {
				failed.Add(1)
			}
		})
		fmt.Fprintf(cfg.Progress, "  %s: %d calls deleted in %v (%d failed)\n", m.Name, len(calls), time.Since(start).Round(time.Millisecond), failed.Load())
	}()
	return b.benchSweep(ctx, cfg, cfg.transcodeCalls, rep, m, benchMediaNGTranscode, func(f int) (fwdPath, fwdPath, error) {
		n := f / 2
		start, have := time.Now(), len(calls)
		more := make([]*ngCall, n-have)
		errs := make([]error, len(more))
		parallel(len(more), 8, func(i int) {
			k := have + i
			more[i], errs[i] = setupTranscodeCall(ctx, c, k, netip.AddrPortFrom(b.l.CallerAddr4, uint16(fwdSenderPort)),
				netip.AddrPortFrom(addrAt(farPrefix, k), uint16(fwdSinkPort)), relay)
		})
		for _, call := range more {
			if call != nil {
				calls = append(calls, call)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return fwdPath{}, fwdPath{}, err
		}
		fmt.Fprintf(cfg.Progress, "  %s: %d transcoding ng calls set up in %v, %d in all\n", m.Name, len(more), time.Since(start).Round(time.Millisecond), n)
		// Call i: stream i the caller's PCMU, stream n+i the callee's
		// G.729, each from its own point of the loop.
		for i := range n {
			b.snd.setLoop(i, pcmuPT, fwdRTPLen-12, mat.pcmu, 7*i)
			b.snd.setLoop(n+i, g729PT, g729RTPLen-12, mat.g729, 7*i)
		}
		direct, rp, order := b.callPaths(n, nil, func(i int) netip.AddrPort { return calls[i].toCallee },
			func(j int) netip.AddrPort { return calls[j].toCaller })
		ports := make([]int32, 1<<16)
		for i := range ports {
			ports[i] = -1
		}
		for i, c := range order {
			// To the callee from the relay's callee-side port (stream i),
			// to the caller from its caller-side port (stream n+i).
			for _, x := range []struct {
				port   uint16
				stream int
			}{{calls[c].toCaller.Port(), i}, {calls[c].toCallee.Port(), n + i}} {
				if ports[x.port] >= 0 {
					return fwdPath{}, fwdPath{}, fmt.Errorf("relay port %d in two calls", x.port)
				}
				ports[x.port] = int32(x.stream)
			}
		}
		rp.xc = &fwdTranscode{ports: ports}
		return direct, rp, nil
	})
}

// ngListen is relayd's ng listener in the relay namespace, for the
// transcode mode.
const ngListen = "127.0.0.1:2223"

// benchRelaydTranscode runs the transcode sweep through relayd: userspace
// workers (one per CPU), its ng listener, calls over ng.
func (b *fwdBench) benchRelaydTranscode(ctx context.Context, cfg Config, rep *Report) (err error) {
	m := cfg.relaydMode(transcodeRelayd)
	b.relayPorts = benchSIPRelayPorts
	b.relayTop = fmt.Sprintf("[ng]\nlisten = [\"udp:%s\"]\n", ngListen)
	defer func() { b.relayTop, b.relayPorts = "", "" }()
	if err := b.startRelay(m); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.stopRelay()) }()
	conn, err := b.l.Relay.DialUDP("udp4", "", ngListen)
	if err != nil {
		return err
	}
	c, err := ngclient.New(conn, ngclient.Config{})
	if err != nil {
		conn.Close()
		return err
	}
	defer c.Close()
	return b.transcodeSweep(ctx, cfg, rep, m, c, b.l.RelayMedia4)
}

// benchRtpengineTranscode runs the transcode sweep through rtpengine.
func (b *fwdBench) benchRtpengineTranscode(ctx context.Context, cfg Config, rep *Report) (err error) {
	e, err := rtpengine.Start(b.l, rtpengine.Options{PortMin: 20000, PortMax: 59999, ExtraArgs: b.rtpengineSched()})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	softirqd := b.softirqd
	b.softirqd = append(slices.Clone(softirqd), e.Pid())
	defer func() { b.softirqd = softirqd }()
	return b.transcodeSweep(ctx, cfg, rep, benchMode(transcodeRtpengine), e.Client(), e.Relay4)
}
