package call

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
	"github.com/relayd/relayd/sdes"
)

// TestFlowCounts: call flows are counted by the path that carries them,
// follow a move to userspace (SRTP) and go when the call ends.
func TestFlowCounts(t *testing.T) {
	xdp, us := dataplanetest.New(dataplane.PathXDP), dataplanetest.New(dataplane.PathUserspace)
	tb := newTable(t, xdp, us)
	want := func(x, u int) {
		t.Helper()
		if d := cmp.Diff(map[dataplane.Path]int{dataplane.PathXDP: x, dataplane.PathUserspace: u}, tb.FlowCounts()); d != "" {
			t.Errorf("FlowCounts (-want +got):\n%s", d)
		}
	}
	want(0, 0)
	c := tb.New(netip.AddrPort{}, "", "")
	c.Media.Ensure(0, relay4, relay4)
	c.Media.Edit(0, func(st *Stream) {
		st.Ends[A].RTP = netip.AddrPortFrom(callerIP, 4000)
		st.Ends[A].RTCP = netip.AddrPortFrom(callerIP, 4001)
		st.Ends[B].RTP = netip.AddrPortFrom(calleeIP, 6000)
		st.Ends[B].RTCP = netip.AddrPortFrom(calleeIP, 6001)
	})
	if err := c.Media.Sync(); err != nil {
		t.Fatal(err)
	}
	want(4, 0)
	key, _ := sdes.Generate(1, sdes.AES_CM_128_HMAC_SHA1_80)
	c.Media.Edit(0, func(st *Stream) { st.Ends[A].Recv, st.Ends[A].Send = key, key })
	if err := c.Media.Sync(); err != nil {
		t.Fatal(err)
	}
	want(0, 4)
	c.End(Answered, 200, "")
	want(0, 0)
}
