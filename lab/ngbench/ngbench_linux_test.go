// Package ngbench measures the ng control protocol of relayd against
// Debian's rtpengine in the same run: both in the lab's relay namespace,
// the same client, the same offer, answer and delete of one call per
// iteration.
//
//	go test -run '^$' -bench NG -count 3 ./lab/ngbench/
package ngbench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/lab/labrelay"
	"github.com/relayd/relayd/lab/rtpengine"
	"github.com/relayd/relayd/lab/rtpengine/ngclient"
)

const relaydNG = "127.0.0.1:2224"

type server struct {
	name   string
	client *ngclient.Client
}

// servers starts rtpengine and relayd in a new lab and returns an ng
// client of each, made in the relay namespace.
func servers(tb testing.TB) []server {
	tb.Helper()
	l := lab.NewT(tb)
	e := rtpengine.StartT(tb, l, rtpengine.Options{PortMin: 30000, PortMax: 39999, Threads: 1})
	r, err := labrelay.New(l, labrelay.Options{Dir: tb.TempDir(), Ports: "40000-49999", Mode: os.Getenv("NGBENCH_MODE"),
		ExtraMedia: fmt.Sprintf("\n[ng]\nlisten = [\"udp:%s\"]\n", relaydNG)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	if err := r.Start(); err != nil {
		tb.Fatal(err)
	}
	conn, err := l.Relay.DialUDP("udp4", "", relaydNG)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := ngclient.New(conn, ngclient.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return []server{{"relayd", c}, {"rtpengine", e.Client()}}
}

const offerSDP = "v=0\r\no=- 1 1 IN IP4 198.18.0.2\r\ns=-\r\nc=IN IP4 198.18.0.2\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0 8 101\r\na=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
const answerSDP = "v=0\r\no=- 2 2 IN IP4 198.18.2.2\r\ns=-\r\nc=IN IP4 198.18.2.2\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0 101\r\na=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"

// call does one call's offer, answer and delete and returns how long
// each took.
func call(ctx context.Context, c *ngclient.Client, id string) ([3]time.Duration, error) {
	var d [3]time.Duration
	req := ngclient.Request{CallID: id, FromTag: "caller", ViaBranch: "z9hG4bK-" + id, SDP: offerSDP,
		Replace: []string{"origin", "session-connection"}, ICE: "remove"}
	t0 := time.Now()
	if _, err := c.Offer(ctx, req); err != nil {
		return d, fmt.Errorf("offer: %w", err)
	}
	t1 := time.Now()
	req.ToTag, req.SDP = "callee", answerSDP
	if _, err := c.Answer(ctx, req); err != nil {
		return d, fmt.Errorf("answer: %w", err)
	}
	t2 := time.Now()
	req.SDP = ""
	if _, err := c.Delete(ctx, req); err != nil {
		return d, fmt.Errorf("delete: %w", err)
	}
	t3 := time.Now()
	return [3]time.Duration{t1.Sub(t0), t2.Sub(t1), t3.Sub(t2)}, nil
}

// BenchmarkNG: one iteration is one call's offer, answer and delete, sent
// one after the other; reported are the median latency of each command
// and commands per second.
func BenchmarkNG(b *testing.B) {
	ctx := context.Background()
	for _, s := range servers(b) {
		b.Run(s.name, func(b *testing.B) {
			lat := make([][]time.Duration, 3)
			start := time.Now()
			for i := range b.N {
				d, err := call(ctx, s.client, fmt.Sprintf("bench-%s-%d-%d", s.name, b.N, i))
				if err != nil {
					b.Fatal(err)
				}
				for k := range d {
					lat[k] = append(lat[k], d[k])
				}
			}
			elapsed := time.Since(start)
			for k, name := range []string{"offer", "answer", "delete"} {
				b.ReportMetric(float64(median(lat[k]).Nanoseconds())/1e3, name+"-us")
			}
			b.ReportMetric(float64(3*b.N)/elapsed.Seconds(), "cmds/s")
		})
	}
}

// TestNG: both servers take the benchmark's calls (a check that the
// benchmark measures working commands).
func TestNG(t *testing.T) {
	for _, s := range servers(t) {
		if _, err := call(context.Background(), s.client, "check-"+s.name); err != nil {
			t.Errorf("%s: %v", s.name, err)
		}
		ids, err := s.client.List(context.Background(), 0)
		if err != nil || len(ids) != 0 {
			t.Errorf("%s: calls after delete %v %v", s.name, ids, err)
		}
	}
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
