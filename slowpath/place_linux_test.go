package slowpath

import (
	"net/netip"
	"slices"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/slowpath/codec/g729"
)

// TestPackFlows: with PackFlows, calls fill the first worker up to it
// before the next gets any, a flow's reverse joins it wherever that is,
// a transcoded flow weighs TranscodeLoad (and a flow updated into or out
// of transcoding is weighed again where it is), an RTCP port's nothing, a
// worker whose flows go
// takes new ones first again, and past the limit on every worker the least
// loaded takes a call. Without it, calls spread to the least loaded.
func TestPackFlows(t *testing.T) {
	if !g729.Available {
		testenv.Skip(t, "built without bcg729")
	}
	enterTestNS(t, "198.18.1.1/32")
	relay := netip.MustParseAddr("198.18.1.1")
	flow := func(port uint16, transcode bool) dataplane.Flow {
		fl := dataplane.Flow{Match: netip.AddrPortFrom(relay, port), SendFrom: netip.AddrPortFrom(relay, port+1000),
			SendTo: netip.MustParseAddrPort("198.18.2.2:5000"), ClockRate: 8000}
		if transcode {
			fl.Transcode = &dataplane.Transcode{
				In:  dataplane.Codec{Name: "PCMU", PT: 0, Ptime: 20},
				Out: dataplane.Codec{Name: "G729", PT: 18, Ptime: 20},
			}
		}
		return fl
	}
	type step struct {
		name    string
		do      func(p *Pool) error
		workers []int // each flow's worker, by port: 30000 + 2*index
		load    []int
	}
	// call installs a call's two flows, on ports port and port+2, each
	// the other's reverse; rtcpCall two flows of RTCP ports.
	pair := func(port uint16, transcode, rtcp bool) func(p *Pool) error {
		return func(p *Pool) error {
			a, b := flow(port, transcode), flow(port+2, false)
			a.Reverse, b.Reverse = b.Match, a.Match
			if rtcp {
				a.ClockRate, b.ClockRate = 0, 0
			}
			if err := p.Install(a); err != nil {
				return err
			}
			return p.Install(b)
		}
	}
	call := func(port uint16, transcode bool) func(p *Pool) error { return pair(port, transcode, false) }
	rtcpCall := func(port uint16) func(p *Pool) error { return pair(port, false, true) }
	hangUp := func(port uint16) func(p *Pool) error {
		return func(p *Pool) error {
			for _, m := range []uint16{port, port + 2} {
				if _, err := p.Remove(netip.AddrPortFrom(relay, m)); err != nil {
					return err
				}
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name  string
		pack  int
		steps []step
	}{
		{"packed", 4, []step{
			{"first call", call(30000, false), []int{0, 0}, []int{2, 0, 0}},
			{"second call, the first worker full", call(30004, false), []int{0, 0, 0, 0}, []int{4, 0, 0}},
			{"third call to the next", call(30008, false), []int{0, 0, 0, 0, 1, 1}, []int{4, 2, 0}},
			// 10 + 1 fits nowhere within 4: the least loaded.
			{"transcoded call", call(30012, true), []int{0, 0, 0, 0, 1, 1, 2, 2}, []int{4, 2, 11}},
			{"no longer transcoded", func(p *Pool) error {
				fl := flow(30012, false)
				fl.Reverse = netip.AddrPortFrom(relay, 30014)
				return p.Update(fl)
			}, []int{0, 0, 0, 0, 1, 1, 2, 2}, []int{4, 2, 2}},
			{"first call ends", hangUp(30000), []int{-1, -1, 0, 0, 1, 1, 2, 2}, []int{2, 2, 2}},
			{"the first worker takes the next", call(30016, false), []int{-1, -1, 0, 0, 1, 1, 2, 2, 0, 0}, []int{4, 2, 2}},
			{"the next with room", call(30020, false), []int{-1, -1, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1}, []int{4, 4, 2}},
			{"the last with room", call(30024, false), []int{-1, -1, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2}, []int{4, 4, 4}},
			{"past the limit everywhere: the least loaded", func(p *Pool) error {
				if err := call(30028, false)(p); err != nil {
					return err
				}
				return call(30032, false)(p)
			}, []int{-1, -1, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1}, []int{6, 6, 4}},
			{"RTCP ports: the first within the limit, no load", rtcpCall(30036), []int{-1, -1, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2}, []int{6, 6, 4}},
		}},
		{"spread", 0, []step{
			{"first call", call(30000, false), []int{0, 0}, []int{2, 0, 0}},
			{"second call", call(30004, false), []int{0, 0, 1, 1}, []int{2, 2, 0}},
			{"transcoded call", call(30008, true), []int{0, 0, 1, 1, 2, 2}, []int{2, 2, 11}},
			{"fourth call", call(30012, false), []int{0, 0, 1, 1, 2, 2, 0, 0}, []int{4, 2, 11}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(Config{Workers: 3, PackFlows: tc.pack}, zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			for _, s := range tc.steps {
				if err := s.do(p); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				p.mu.Lock()
				workers := make([]int, len(s.workers))
				for i := range workers {
					workers[i] = -1
					if at, ok := p.owner[netip.AddrPortFrom(relay, uint16(30000+2*i))]; ok {
						workers[i] = at.worker
					}
				}
				load := slices.Clone(p.load)
				p.mu.Unlock()
				if !slices.Equal(workers, s.workers) || !slices.Equal(load, s.load) {
					t.Fatalf("%s: flows on workers %v, loads %v; want %v, %v", s.name, workers, load, s.workers, s.load)
				}
				want := make([]int, 3)
				for _, wi := range s.workers {
					if wi >= 0 {
						want[wi]++
					}
				}
				if got := p.WorkerStats().Flows; !slices.Equal(got, want) {
					t.Fatalf("%s: WorkerStats().Flows = %v, want %v", s.name, got, want)
				}
			}
		})
	}
}
