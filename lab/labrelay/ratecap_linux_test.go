package labrelay

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/lab"
)

// TestRelayRateCap floods one call's flow at 1,000 packets per second (20
// times a 20 ms stream's rate) for 1.5 s while another call's flow carries
// a 10 ms stream, through a real relayd, on XDP and in the userspace
// workers. The flooded flow's cap is 200 packets/s with 200 of burst, the
// other's 400 (what rate_limit_factor 4 gives those ptimes): the callee of
// the flood receives the burst and the cap over the flood's time (bounds
// below), the excess is dropped and counted in the flow and in
// relayd_packets_total, and the other call loses nothing.
func TestRelayRateCap(t *testing.T) {
	l := lab.NewT(t)
	r := startRelayIn(t, l, Options{RateCaps: true})
	for i, mode := range []string{"xdp", "userspace"} {
		t.Run(mode, func(t *testing.T) {
			base := uint16(30400 + 16*i)
			flooded := capFlow(t, l, r, base, mode, 200)
			other := capFlow(t, l, r, base+4, mode, 400)
			reason := map[string]string{"xdp": "rate", "userspace": "userspace_rate"}[mode]
			metric := fmt.Sprintf(`relayd_packets_total{reason=%q,verdict="drop"}`, reason)
			before, err := r.Metric(metric)
			if err != nil {
				t.Fatal(err)
			}

			nFlood, nOther := 1500/rateDivisor, 150/rateDivisor
			var wg sync.WaitGroup
			var floodErr, otherErr error
			var floodTime time.Duration
			var gotFlood, gotOther int
			var recvFloodErr, recvOtherErr error
			wg.Add(4)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				floodErr = flooded.caller.send(nFlood, 1000, 1, 0)
				floodTime = time.Since(t0)
			}()
			go func() { defer wg.Done(); otherErr = other.caller.send(nOther, 100, 2, 0) }()
			go func() {
				defer wg.Done()
				gotFlood, recvFloodErr = flooded.callee.recv(nFlood, 1, 0, 300*time.Millisecond)
			}()
			go func() {
				defer wg.Done()
				gotOther, recvOtherErr = other.callee.recv(nOther, 2, 0, 300*time.Millisecond)
			}()
			wg.Wait()
			for _, err := range []error{floodErr, otherErr, recvFloodErr, recvOtherErr} {
				if err != nil {
					t.Fatal(err)
				}
			}

			// The burst, then the cap over the flood's time (its senders
			// pace in 1 ms steps), to within 20 ms of the refill and the
			// scheduling of two busy cores; never more than was sent.
			secs := floodTime.Seconds()
			lo := min(float64(nFlood), 200+200*(secs-0.02)) - 2
			hi := min(float64(nFlood), 200+200*(secs+0.02)) + 2
			t.Logf("flood: %d sent in %v, %d received (bounds %.0f to %.0f); other: %d of %d", nFlood, floodTime.Round(time.Millisecond),
				gotFlood, lo, hi, gotOther, nOther)
			if g := float64(gotFlood); g < lo || g > hi {
				t.Errorf("flood: %d of %d received, want %.0f to %.0f", gotFlood, nFlood, lo, hi)
			}
			if gotOther != nOther {
				t.Errorf("other call: %d of %d received", gotOther, nOther)
			}
			f := flowByID(t, r, flooded.id)
			if f.Packets != uint64(gotFlood) || f.Dropped != uint64(nFlood-gotFlood) || f.Path != mode || f.RateCapPPS != 200 {
				t.Errorf("flooded flow: %+v, want %d packets and %d dropped on %s, cap 200", f, gotFlood, nFlood-gotFlood, mode)
			}
			if o := flowByID(t, r, other.id); o.Packets != uint64(nOther) || o.Dropped != 0 || o.Lost > 0 {
				t.Errorf("other flow: %+v, want %d packets, none dropped or lost", o, nOther)
			}
			after, err := r.Metric(metric)
			if err != nil {
				t.Fatal(err)
			}
			if d := after - before; d != float64(nFlood-gotFlood) {
				t.Errorf("%s moved by %v, want %d", metric, d, nFlood-gotFlood)
			}
		})
	}
}

// capLeg is one direction of a call: caller to callee through a flow with
// a rate cap.
type capLeg struct {
	caller, callee *leg
	id             uint64
}

func capFlow(t *testing.T, l *lab.Lab, r *Relay, port uint16, mode string, pps uint32) capLeg {
	t.Helper()
	a, b := netip.AddrPortFrom(l.RelayMedia4, port), netip.AddrPortFrom(l.RelayMedia4, port+2)
	callerEP, calleeEP := netip.AddrPortFrom(l.CallerAddr4, 4000+port%1000), netip.AddrPortFrom(l.CalleeAddr4, 5000+port%1000)
	f, err := r.AddFlow(admin.FlowRequest{Match: a.String(), ExpectSource: callerEP.String(), SendFrom: b.String(),
		SendTo: calleeEP.String(), Mode: mode, RateCapPPS: &pps})
	if err != nil {
		t.Fatal(err)
	}
	if f.RateCapPPS != pps {
		t.Fatalf("flow added with cap %d, want %d", f.RateCapPPS, pps)
	}
	return capLeg{caller: openLeg(t, l.Caller, callerEP, a), callee: openLeg(t, l.Callee, calleeEP, b), id: f.ID}
}
