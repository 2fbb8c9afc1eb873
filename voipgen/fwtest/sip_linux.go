package fwtest

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/emiago/sipgo/sip"

	"github.com/relayd/relayd/lab/fwpair"
	"github.com/relayd/relayd/voipgen/payload"
	"github.com/relayd/relayd/voipgen/sipua"
)

const sipPort = 5060

// sipCalls is the signalling of a failover run's calls through the pair:
// voipgen's SIP user agent calls from the LAN host to an answerer on the
// WAN host, one call per stream pair, the SDP naming the run's own media
// sockets. The calls are held across the failure and the recovery and
// hung up (BYE from the LAN) just before the media stops, so each BYE
// crosses the pair on the signalling state that survived both moves.
type sipCalls struct {
	calls   int
	up      atomic.Int64
	done    chan []sipua.CallReport
	ansDone chan []sipua.CallReport
	cancel  context.CancelFunc
}

// startSIP places calls calls lasting dur and returns once every call is
// answered (or fails after a timeout).
func startSIP(ctx context.Context, p *fwpair.Pair, lan, wan *side, c payload.Codec, ptime, dur time.Duration) (*sipCalls, error) {
	n := len(lan.conns)
	s := &sipCalls{calls: n, done: make(chan []sipua.CallReport, 1), ansDone: make(chan []sipua.CallReport, 1)}
	callee := netip.AddrPortFrom(p.WANAddrs[0], sipPort)
	actx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	acfg := sipua.AnswerConfig{Endpoint: sipua.Endpoint{Listen: callee, Media: p.WANAddrs[0], RTPPort: wanBasePort, Codec: c,
		Ptime: ptime, Duration: dur + time.Minute, NS: p.WAN.Do,
		Signal: &sipua.Signal{Media: func(j int) netip.AddrPort { return wan.endpoint(j % n) }, Peer: func(int, netip.AddrPort) {}}},
		Personality: "answer", MaxCalls: n, MaxCallDur: time.Hour}
	ready := make(chan struct{})
	go func() {
		calls, _ := sipua.AnswerCalls(actx, acfg, ready)
		s.ansDone <- calls
	}()
	select {
	case <-ready:
	case <-s.ansDone:
		cancel()
		return nil, fmt.Errorf("SIP answerer on %s did not start", callee)
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	}
	ccfg := sipua.CallConfig{Endpoint: sipua.Endpoint{Listen: netip.AddrPortFrom(p.LANAddrs[0], sipPort), Media: p.LANAddrs[0],
		RTPPort: lanBasePort, Codec: c, Ptime: ptime, Duration: dur, NS: p.LAN.Do,
		Signal: &sipua.Signal{Media: lan.endpoint, Peer: func(int, netip.AddrPort) { s.up.Add(1) }}},
		Calls: n, Concurrent: n, Rate: 500, Timeout: 5 * time.Second}
	if err := sip.ParseUri(fmt.Sprintf("sip:answer@%s", callee), &ccfg.Target); err != nil {
		cancel()
		return nil, err
	}
	go func() {
		calls, err := sipua.PlaceCalls(actx, ccfg)
		if err != nil && calls == nil {
			calls = []sipua.CallReport{{Error: err.Error()}}
		}
		s.done <- calls
	}()
	deadline := time.Now().Add(10 * time.Second)
	for s.up.Load() < int64(n) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			cancel()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return s, nil
}

// wait collects the calls once they ended (at most timeout after their
// hang-up) and stops the answerer.
func (s *sipCalls) wait(timeout time.Duration) *SIPResult {
	r := &SIPResult{Calls: s.calls, Established: int(s.up.Load())}
	select {
	case calls := <-s.done:
		for _, c := range calls {
			switch {
			case c.Success:
				r.Ended++
			case c.Error != "" && len(r.Errors) < 5:
				r.Errors = append(r.Errors, c.Error)
			}
		}
	case <-time.After(timeout):
		r.Errors = append(r.Errors, "calls did not end in time")
	}
	s.cancel()
	<-s.ansDone
	return r
}
