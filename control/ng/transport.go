package ng

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/control/ng/bencode"
)

// maxUDPReply is the largest reply a datagram carries (IPv4's limit; a
// larger reply is dropped and counted as too_large).
const maxUDPReply = 65507

func (s *Server) bind(sp listenSpec) (listener, error) {
	switch sp.network {
	case "udp":
		conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(sp.addr))
		if err != nil {
			return nil, err
		}
		return &udpListener{s: s, conn: conn}, nil
	case "tcp", "http":
		ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(sp.addr))
		if err != nil {
			return nil, err
		}
		if sp.network == "tcp" {
			return &tcpListener{s: s, ln: ln, conns: map[net.Conn]struct{}{}}, nil
		}
		return newHTTPListener(s, ln), nil
	}
	panic("unreachable: validated")
}

// udpListener answers datagrams.
type udpListener struct {
	s    *Server
	conn *net.UDPConn
}

func (l *udpListener) addr() string { return "udp:" + l.conn.LocalAddr().String() }
func (l *udpListener) close() error { return l.conn.Close() }

func (l *udpListener) serve(ctx context.Context) {
	buf := make([]byte, 65536)
	for {
		n, from, err := l.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.s.log.Debug("ng udp read", zap.Error(err))
			continue
		}
		msg := bytes.Clone(buf[:n])
		l.s.submit(job{from: from, msg: msg, send: func(reply []byte) {
			if len(reply) > maxUDPReply {
				l.s.metrics.ignored.WithLabelValues(ignoredTooLarge).Inc()
				if ce := l.s.loglim.Check(l.s.log, zap.InfoLevel, from.Addr(), "ng reply too large for a datagram"); ce != nil {
					ce.Write(zap.Stringer("to", from), zap.Int("bytes", len(reply)))
				}
				return
			}
			if _, err := l.conn.WriteToUDPAddrPort(reply, from); err != nil && !errors.Is(err, net.ErrClosed) {
				l.s.log.Debug("ng udp write", zap.Stringer("to", from), zap.Error(err))
			}
		}})
	}
}

// tcpListener answers rtpengine's ng over TCP: a stream of
// "cookie bencode-dictionary" messages without framing; the end of each
// is where its dictionary ends.
type tcpListener struct {
	s  *Server
	ln *net.TCPListener
	wg sync.WaitGroup

	mu     sync.Mutex // guards the following
	conns  map[net.Conn]struct{}
	closed bool
}

func (l *tcpListener) addr() string { return "tcp:" + l.ln.Addr().String() }

func (l *tcpListener) close() error {
	err := l.ln.Close()
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	return err
}

func (l *tcpListener) serve(ctx context.Context) {
	defer l.wg.Wait()
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.s.log.Debug("ng tcp accept", zap.Error(err))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		from := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		if !l.s.allowed(from.Addr()) {
			l.s.metrics.ignored.WithLabelValues(ignoredNotAllowed).Inc()
			c.Close()
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		l.conns[c] = struct{}{}
		l.mu.Unlock()
		l.wg.Go(func() {
			l.serveConn(c, from)
			l.mu.Lock()
			delete(l.conns, c)
			l.mu.Unlock()
			c.Close()
		})
	}
}

// serveConn reads messages until the connection closes; a writer
// goroutine sends the replies, so that no worker waits on the socket.
func (l *tcpListener) serveConn(c *net.TCPConn, from netip.AddrPort) {
	out := make(chan []byte, 64)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case b := <-out:
				c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write(b); err != nil {
					c.Close()
					return
				}
			}
		}
	}()
	send := func(reply []byte) {
		select {
		case out <- reply:
		case <-done:
		default: // the client does not read: drop, it resends
			l.s.metrics.ignored.WithLabelValues(ignoredOverload).Inc()
		}
	}
	max := l.s.cfg.MaxMessage
	buf := make([]byte, 0, 4096)
	chunk := make([]byte, 16384)
	for {
		n, err := c.Read(chunk)
		buf = append(buf, chunk[:n]...)
		for {
			msgLen, ok := l.frame(buf)
			if msgLen < 0 {
				// Not bencode after the cookie: the stream cannot
				// be resynchronised. Answer it (the error reply)
				// and hang up.
				l.finalReply(c, from, bytes.Clone(buf))
				return
			}
			if !ok {
				break
			}
			l.s.submit(job{from: from, msg: bytes.Clone(buf[:msgLen]), send: send})
			buf = append(buf[:0], buf[msgLen:]...)
		}
		if len(buf) > max {
			l.s.metrics.ignored.WithLabelValues(ignoredMalformed).Inc()
			if ce := l.s.loglim.Check(l.s.log, zap.InfoLevel, from.Addr(), "ng tcp message too long"); ce != nil {
				ce.Write(zap.Stringer("from", from), zap.Int("bytes", len(buf)))
			}
			return
		}
		if err != nil {
			if err != io.EOF && !errors.Is(err, net.ErrClosed) {
				l.s.log.Debug("ng tcp read", zap.Stringer("from", from), zap.Error(err))
			}
			return
		}
	}
}

// finalReply answers the last message of a connection and waits (a
// bounded time) until the reply is written.
func (l *tcpListener) finalReply(c *net.TCPConn, from netip.AddrPort, msg []byte) {
	written := make(chan struct{})
	var once sync.Once
	queued := l.s.submit(job{from: from, msg: msg, send: func(reply []byte) {
		once.Do(func() {
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			c.Write(reply)
			close(written)
		})
	}})
	if !queued {
		return
	}
	t := time.NewTimer(l.s.cfg.CommandTimeout + 5*time.Second)
	defer t.Stop()
	select {
	case <-written:
	case <-t.C:
	}
}

// frame returns the length of the first whole message in buf and true;
// false when more is needed; -1 when buf cannot hold a message.
func (l *tcpListener) frame(buf []byte) (int, bool) {
	sp := bytes.IndexByte(buf, ' ')
	if sp < 0 || sp == len(buf)-1 {
		return 0, false
	}
	if sp == 0 {
		return -1, false
	}
	n, err := bencode.ValueLen(buf[sp+1:])
	if errors.Is(err, bencode.ErrShort) {
		return 0, false
	}
	if err != nil {
		return -1, false
	}
	return sp + 1 + n, true
}

// httpListener answers rtpengine's HTTP form: POST /ng with
// Content-Type application/x-rtpengine-ng and the message as body; the
// reply is the body of a 200 of the same type.
type httpListener struct {
	s   *Server
	ln  net.Listener
	srv *http.Server
}

const ngContentType = "application/x-rtpengine-ng"

func newHTTPListener(s *Server, ln net.Listener) *httpListener {
	l := &httpListener{s: s, ln: ln}
	mux := http.NewServeMux()
	mux.HandleFunc("/ng", l.handle)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if !l.allowed(r) {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		http.Error(w, "not found", http.StatusNotFound)
	})
	l.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      s.cfg.CommandTimeout + 5*time.Second,
		ErrorLog:          zap.NewStdLog(s.log),
	}
	return l
}

func (l *httpListener) addr() string { return "http:" + l.ln.Addr().String() }
func (l *httpListener) close() error { return l.srv.Close() }

func (l *httpListener) serve(ctx context.Context) {
	if err := l.srv.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		l.s.log.Info("ng http", zap.Error(err))
	}
}

func (l *httpListener) allowed(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil || !l.s.allowed(ap.Addr()) {
		l.s.metrics.ignored.WithLabelValues(ignoredNotAllowed).Inc()
		return false
	}
	return true
}

func (l *httpListener) handle(w http.ResponseWriter, r *http.Request) {
	if !l.allowed(r) {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != ngContentType {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(l.s.cfg.MaxMessage)))
	if err != nil {
		http.Error(w, "request too large", http.StatusRequestEntityTooLarge)
		return
	}
	if sp := bytes.IndexByte(body, ' '); sp <= 0 {
		// No cookie: rtpengine answers 600.
		l.s.metrics.ignored.WithLabelValues(ignoredMalformed).Inc()
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(600)
		io.WriteString(w, "error\n")
		return
	}
	from, _ := netip.ParseAddrPort(r.RemoteAddr)
	reply := make(chan []byte, 1)
	// The allow list was checked; submit checks it again, harmlessly.
	if !l.s.submit(job{from: from, msg: body, send: func(b []byte) { reply <- b }}) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	timer := time.NewTimer(l.s.cfg.CommandTimeout + time.Second)
	defer timer.Stop()
	select {
	case b := <-reply:
		w.Header().Set("Content-Type", ngContentType)
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	case <-timer.C:
		// The engine is stuck: rtpengine's answer to a message it
		// cannot process.
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(600)
		io.WriteString(w, "error\n")
	case <-r.Context().Done():
	}
}
