package ng

import (
	"context"
	"net/netip"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/registry"
	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/dataplane/dataplanetest"
)

func newTestEngine(t *testing.T) *CallEngine {
	t.Helper()
	log := zaptest.NewLogger(t)
	in := registry.Interface{Addr: netip.MustParseAddr("198.18.1.1"), PortMin: 30000, PortMax: 30099}
	reg, err := registry.New(registry.Config{Interfaces: []registry.Interface{in}}, log, dataplanetest.New(dataplane.PathXDP), dataplanetest.New(dataplane.PathUserspace))
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(EngineConfig{Calls: call.NewTable(reg, log)}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func audioSDP(addr string, port int, proto string) string {
	return "v=0\r\no=- 1 1 IN IP4 " + addr + "\r\ns=-\r\nc=IN IP4 " + addr + "\r\nt=0 0\r\nm=audio " +
		strconv.Itoa(port) + " " + proto + " 0\r\na=rtpmap:0 PCMU/8000\r\n"
}

// TestQueryViaBranchAndProtocol: as rtpengine, the via-branch of the
// offer and the answer belongs to the answerer's tag (the branch), and
// each tag's media names its transport protocol.
func TestQueryViaBranchAndProtocol(t *testing.T) {
	e := newTestEngine(t)
	ctx := context.Background()
	if _, err := e.Offer(ctx, &Request{CallID: "c1", FromTag: "ft", ViaBranch: "vb1", SDP: audioSDP("198.18.0.2", 4000, "RTP/AVP"), TransportProtocol: "RTP/SAVP"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Answer(ctx, &Request{CallID: "c1", FromTag: "ft", ToTag: "tt", ViaBranch: "vb1", SDP: audioSDP("198.18.2.2", 5000, "RTP/SAVP") +
		"a=crypto:5 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz\r\n"}); err != nil {
		t.Fatal(err)
	}
	nc := e.lookup("c1")
	if nc == nil {
		t.Fatal("no call c1")
	}
	nc.mu.Lock()
	cs := e.callStats(nc)
	nc.mu.Unlock()
	type tagView struct{ Tag, Via, Proto string }
	var got []tagView
	for _, ts := range cs.Tags {
		v := tagView{Tag: ts.Tag, Via: ts.ViaBranch}
		if len(ts.Medias) > 0 {
			v.Proto = ts.Medias[0].Protocol
		}
		got = append(got, v)
	}
	want := []tagView{{"ft", "", "RTP/AVP"}, {"tt", "vb1", "RTP/SAVP"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("tags (-want +got):\n%s", d)
	}
}
