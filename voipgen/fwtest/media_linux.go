package fwtest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/relayd/relayd/internal/pktio"
	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/voipgen/gen"
	"github.com/relayd/relayd/voipgen/payload"
)

// Ports of the failover calls: call i's LAN end is LANAddrs[i mod n] port
// lanBasePort+2*(i/n), its WAN end the same on the WAN side.
const (
	lanBasePort = 10000
	wanBasePort = 20000
)

// side is one end of every call of a failover run: a socket per call that
// sends (a paced gen.Sender) and receives (a recorder), as a phone's
// symmetric RTP does, so the firewall sees one connection per call.
type side struct {
	name  string // the direction it receives, e.g. "wan->lan"
	conns []*net.UDPConn
	snd   *gen.Sender
	seq0  []uint16 // the first sequence number each stream sends

	mu   sync.Mutex // guards recs while recording
	recs []StreamRecord
	wg   sync.WaitGroup
}

// openSide opens calls sockets in ns, on addrs round robin from base.
func openSide(ns *lab.NS, name string, addrs []netip.Addr, base, calls int) (*side, error) {
	s := &side{name: name, recs: make([]StreamRecord, calls)}
	err := ns.Do(func() error {
		for i := range calls {
			ap := netip.AddrPortFrom(addrs[i%len(addrs)], uint16(base+2*(i/len(addrs))))
			c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ap))
			if err != nil {
				return fmt.Errorf("listen on %s: %w", ap, err)
			}
			_ = c.SetReadBuffer(1 << 20)
			s.conns = append(s.conns, c)
		}
		return nil
	})
	if err != nil {
		s.close()
		return nil, fmt.Errorf("%s: %w", ns, err)
	}
	return s, nil
}

// endpoint is call i's address on s.
func (s *side) endpoint(i int) netip.AddrPort {
	return s.conns[i].LocalAddr().(*net.UDPAddr).AddrPort()
}

// sender makes s send call i's stream to peer's endpoint i for dur.
func (s *side) sender(peer *side, c payload.Codec, ptime, dur time.Duration) error {
	snd, err := gen.NewSenderOn(gen.SenderConfig{Streams: len(s.conns), Codec: c, Ptime: ptime, Duration: dur},
		s.conns, peer.endpoint)
	if err != nil {
		return err
	}
	s.snd = snd
	for _, st := range snd.Streams() {
		s.seq0 = append(s.seq0, st.Header.SequenceNumber)
	}
	return nil
}

// open sends one datagram (not RTP) from every call to peer, so a
// stateful firewall tracks the connection from the LAN side before the
// WAN sends on it.
func (s *side) open(peer *side) error {
	for i, c := range s.conns {
		if _, err := c.WriteToUDPAddrPort([]byte("open"), peer.endpoint(i)); err != nil {
			return fmt.Errorf("open call %d: %w", i, err)
		}
	}
	return nil
}

// record starts recording what arrives on s from sender (the peer side),
// stream i's sequence numbers counted from sender.seq0[i].
func (s *side) record(from *side) {
	for i, c := range s.conns {
		s.recs[i] = StreamRecord{ID: i, Direction: s.name,
			Name: fmt.Sprintf("%s %s", s.name, s.endpoint(i))}
		var seq0 uint16
		var sent bool
		if from != nil && from.seq0 != nil {
			seq0, sent = from.seq0[i], true
		}
		s.wg.Go(func() { s.read(c, i, seq0, sent) })
	}
}

// read records the RTP arriving on c until c is closed.
func (s *side) read(c *net.UDPConn, i int, seq0 uint16, known bool) {
	if raw, err := c.SyscallConn(); err == nil {
		_ = pktio.EnableTimestamps(raw)
	}
	pc := ipv4.NewPacketConn(c)
	msgs := make([]ipv4.Message, 32)
	for k := range msgs {
		msgs[k].Buffers = [][]byte{make([]byte, 1500)}
		msgs[k].OOB = make([]byte, max(pktio.TimestampOOBSize, 1))
	}
	var arr []Arrival
	var last uint32
	for {
		n, err := pc.ReadBatch(msgs, 0)
		if err != nil {
			break
		}
		now := time.Now().UnixNano()
		for k := range n {
			m := &msgs[k]
			b := m.Buffers[0][:m.N]
			if len(b) < 12 || b[0]>>6 != 2 {
				continue // the LAN's opener, or not RTP
			}
			seq := binary.BigEndian.Uint16(b[2:])
			if !known {
				seq0, known = seq, true
			}
			// Sequence numbers from the stream's first, plus one (so the
			// range starts at 1), unwrapped around the last one seen.
			off := uint32(uint16(seq-seq0)) + 1
			if len(arr) > 0 {
				d := int32(int16(uint16(off) - uint16(last)))
				off = uint32(int64(last) + int64(d))
			}
			last = max(last, off)
			at := pktio.RxTimestamp(m.OOB[:m.NN])
			if at == 0 {
				at = now
			}
			arr = append(arr, Arrival{Seq: off, At: at})
		}
	}
	s.mu.Lock()
	s.recs[i].Arrivals = arr
	s.mu.Unlock()
}

// stop closes the sockets (which ends the recorders) and waits for them.
func (s *side) stop() []StreamRecord {
	s.close()
	s.wg.Wait()
	return s.recs
}

func (s *side) close() {
	for _, c := range s.conns {
		c.Close()
	}
}

// runSenders runs the senders of sides until ctx is done (their Duration
// is the run's upper bound).
func runSenders(ctx context.Context, sides ...*side) func() error {
	var wg sync.WaitGroup
	errs := make([]error, len(sides))
	for i, s := range sides {
		if s == nil || s.snd == nil {
			continue
		}
		wg.Go(func() {
			if res := s.snd.Run(ctx); res.Packets == 0 && ctx.Err() == nil {
				errs[i] = fmt.Errorf("%s: sender sent nothing (%d errors)", s.name, res.Errors)
			}
		})
	}
	return func() error { wg.Wait(); return errors.Join(errs...) }
}
