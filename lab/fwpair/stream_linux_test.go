package fwpair

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/lab"
)

// newPairT builds a pair for a test and closes it in t.Cleanup; it skips
// (fails in CI) without root or the daemons.
func newPairT(t *testing.T, cfg Config) *Pair {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedCommand(t, "keepalived", "keepalived")
	testenv.NeedCommand(t, "nft", "nftables")
	if cfg.Conntrackd {
		testenv.NeedCommand(t, "conntrackd", "conntrackd")
	}
	if cfg.Log == nil && testing.Verbose() && os.Getenv("FWPAIR_LOG") != "" {
		cfg.Log = os.Stderr
	}
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	p, err := New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("fwpair: %v", err)
	}
	t.Logf("pair up in %v", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, e := range p.Events() {
				t.Log(e)
			}
		}
		if err := p.Close(); err != nil {
			t.Errorf("fwpair close: %v", err)
		}
		cancel()
	})
	return p
}

// stream is a paced one-way UDP stream: each payload carries a sequence
// number and the send time; the receiver records arrival times.
type stream struct {
	tx, rx *net.UDPConn
	stop   chan struct{}
	wg     sync.WaitGroup

	mu       sync.Mutex
	sent     int
	arrivals []time.Time // in order of arrival
	seqs     []uint32
	sendErrs int
}

// Stream directions beyond the forward one.
const (
	oneWay   = iota // only from -> to, no packet back
	opened          // one packet to -> from first, so the stream lives on its state
	bothWays        // to keeps sending to from too, at the same rate
)

// startStream sends from src (in from) to dst (in to) at pps packets per
// second until stop. The receiving socket is bound before the first send.
func startStream(t *testing.T, from, to *lab.NS, src, dst netip.AddrPort, pps, mode int) *stream {
	t.Helper()
	rx, err := to.ListenUDP("udp4", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := from.DialUDP("udp4", src.String(), dst.String())
	if err != nil {
		rx.Close()
		t.Fatal(err)
	}
	s := &stream{tx: tx, rx: rx, stop: make(chan struct{})}
	t.Cleanup(s.close)
	interval := time.Second / time.Duration(pps)
	switch mode {
	case opened:
		if _, err := rx.WriteToUDPAddrPort([]byte("open"), src); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	case bothWays:
		s.wg.Add(1)
		go s.send(func(b []byte) error { _, err := rx.WriteToUDPAddrPort(b, src); return err }, interval, false)
	}
	s.wg.Add(2)
	go s.receive()
	go s.send(func(b []byte) error { _, err := tx.Write(b); return err }, interval, true)
	return s
}

func (s *stream) receive() {
	defer s.wg.Done()
	buf := make([]byte, 64)
	for {
		n, err := s.rx.Read(buf)
		if err != nil {
			return // closed
		}
		now := time.Now()
		if n < 12 {
			continue
		}
		s.mu.Lock()
		s.arrivals = append(s.arrivals, now)
		s.seqs = append(s.seqs, binary.BigEndian.Uint32(buf))
		s.mu.Unlock()
	}
}

func (s *stream) send(write func([]byte) error, interval time.Duration, count bool) {
	defer s.wg.Done()
	buf := make([]byte, 172) // a G.711 20 ms RTP packet's size
	next := time.Now()
	for seq := uint32(0); ; seq++ {
		select {
		case <-s.stop:
			return
		default:
		}
		binary.BigEndian.PutUint32(buf, seq)
		binary.BigEndian.PutUint64(buf[4:], uint64(time.Now().UnixNano()))
		err := write(buf)
		if count {
			s.mu.Lock()
			s.sent++
			if err != nil {
				s.sendErrs++
			}
			s.mu.Unlock()
		}
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
	}
}

// close stops sending, then receiving after a grace period; idempotent.
func (s *stream) close() {
	select {
	case <-s.stop:
		return
	default:
	}
	close(s.stop)
	time.Sleep(50 * time.Millisecond)
	s.tx.Close()
	s.rx.Close()
	s.wg.Wait()
}

// result is what a stream saw.
type result struct {
	sent      int           // since the start
	received  int           // since since
	gap       time.Duration // the largest inter-arrival gap, or from the last arrival to the end
	gapStart  time.Time
	recovered bool // packets arrived in the last tailWindow before the end
}

const tailWindow = 200 * time.Millisecond

// analyze measures the stream from since to now, without stopping it.
func (s *stream) analyze(since time.Time) result {
	end := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := result{sent: s.sent}
	prev := time.Time{}
	for _, a := range s.arrivals {
		if a.After(end) {
			break
		}
		if a.Before(since) {
			prev = a
			continue
		}
		r.received++
		if !prev.IsZero() && a.Sub(prev) > r.gap {
			r.gap, r.gapStart = a.Sub(prev), prev
		}
		prev = a
	}
	if !prev.IsZero() {
		if d := end.Sub(prev); d > r.gap {
			r.gap, r.gapStart = d, prev
		}
		r.recovered = end.Sub(prev) < tailWindow
	}
	return r
}
