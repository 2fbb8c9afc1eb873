// Package ngclient is a client of the rtpengine ng control protocol: each
// request is a cookie, a space and a bencode dictionary in one UDP
// datagram, and the reply repeats the cookie. A request that gets no reply
// in time is sent again with the same cookie, which the server uses to
// answer a retransmission from its cache instead of acting twice.
//
// It talks to rtpengine (the anchor in the lab comparison) and to relayd's
// own ng front-end.
package ngclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/relayd/relayd/control/ng/bencode"
)

// Defaults of a Config.
const (
	DefaultTimeout = time.Second
	DefaultRetries = 2
)

// maxDatagram is the largest UDP payload.
const maxDatagram = 65535

// ErrTimeout is wrapped by the error of a request that got no reply after
// all its attempts.
var ErrTimeout = errors.New("no reply")

// Config configures a Client. The zero value is valid.
type Config struct {
	// Timeout is how long each attempt waits for the reply before the
	// request is sent again; 0 means DefaultTimeout.
	Timeout time.Duration
	// Retries is how many times a request is sent again, with the same
	// cookie, after the first attempt timed out; 0 means DefaultRetries
	// and a negative value none.
	Retries int
}

func (c *Config) validate() error {
	if c.Timeout < 0 {
		return fmt.Errorf("timeout %v: negative", c.Timeout)
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	switch {
	case c.Retries == 0:
		c.Retries = DefaultRetries
	case c.Retries < 0:
		c.Retries = 0
	}
	return nil
}

// ReplyError is the error of a request that the server answered with
// result "error" (or another failure result such as "load limit").
type ReplyError struct {
	Command string // the request's command
	Result  string // the reply's result
	Reason  string // its error-reason, if any
}

func (e *ReplyError) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("ng %s: %s", e.Command, e.Result)
	}
	return fmt.Sprintf("ng %s: %s: %s", e.Command, e.Result, e.Reason)
}

// Stats counts datagrams a Client received that answered no waiting
// request.
type Stats struct {
	Late      uint64 // a reply whose request was already answered or abandoned (a retransmission's)
	Malformed uint64 // no cookie, or a reply that is not bencode
}

// Client sends ng requests over one UDP socket. It is safe for concurrent
// use: requests in flight are told apart by their cookies. Close it to
// release the socket.
type Client struct {
	conn   net.Conn
	cfg    Config
	prefix string // random, so two clients never share cookies
	seq    atomic.Uint64
	wg     sync.WaitGroup // the reader

	late, malformed atomic.Uint64

	mu      sync.Mutex // guards the following
	pending map[string]chan []byte
	closed  bool
	readErr error // the reader's last error other than close, such as ECONNREFUSED
}

// Dial returns a Client of the ng server at addr (host:port, UDP).
func Dial(ctx context.Context, addr string, cfg Config) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return nil, fmt.Errorf("ng dial %s: %w", addr, err)
	}
	c, err := New(conn, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// New returns a Client that sends requests on conn, a connected datagram
// socket (such as one made by net.DialUDP, or lab.NS.DialUDP to reach a
// server in another network namespace). The Client owns conn: Close
// closes it.
func New(conn net.Conn, cfg Config) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("ng client config: %w", err)
	}
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return nil, err
	}
	c := &Client{
		conn:    conn,
		cfg:     cfg,
		prefix:  hex.EncodeToString(r[:]) + "_",
		pending: make(map[string]chan []byte),
	}
	c.wg.Add(1)
	go c.readLoop()
	return c, nil
}

// Close closes the socket and ends the requests in flight with an error
// wrapping net.ErrClosed. It is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	for cookie, ch := range c.pending {
		close(ch)
		delete(c.pending, cookie)
	}
	c.mu.Unlock()
	err := c.conn.Close()
	c.wg.Wait()
	return err
}

// Stats returns the counts of unmatched datagrams so far.
func (c *Client) Stats() Stats {
	return Stats{Late: c.late.Load(), Malformed: c.malformed.Load()}
}

// readLoop hands each reply to the request with its cookie until the
// socket is closed.
func (c *Client) readLoop() {
	defer c.wg.Done()
	buf := make([]byte, maxDatagram)
	for {
		n, err := c.conn.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A connected UDP socket reports ICMP errors (the server
			// is not listening) on the next read; the requests retry
			// and mention it if they time out.
			c.mu.Lock()
			c.readErr = err
			closed := c.closed
			c.mu.Unlock()
			if closed {
				return
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				time.Sleep(10 * time.Millisecond) // not a busy loop on a lasting error
			}
			continue
		}
		msg := buf[:n]
		sp := -1
		for i, b := range msg {
			if b == ' ' {
				sp = i
				break
			}
		}
		if sp <= 0 {
			c.malformed.Add(1)
			continue
		}
		c.mu.Lock()
		ch, ok := c.pending[string(msg[:sp])]
		if ok {
			delete(c.pending, string(msg[:sp]))
		}
		c.mu.Unlock()
		if !ok {
			c.late.Add(1)
			continue
		}
		body := make([]byte, n-sp-1)
		copy(body, msg[sp+1:])
		ch <- body // buffered, and only one sender: the entry is gone
	}
}

// Do sends cmd, a dictionary with at least "command", and returns the
// reply dictionary. It waits up to the configured timeout for each of the
// attempts, and never past ctx. A reply with result "error" or "load
// limit" is returned with a *ReplyError.
func (c *Client) Do(ctx context.Context, cmd bencode.Value) (bencode.Value, error) {
	command := cmd.GetString("command")
	if cmd.Kind() != bencode.KindDict || command == "" {
		return bencode.Value{}, fmt.Errorf("ng request %v: not a dictionary with a command", cmd)
	}
	cookie := c.prefix + strconv.FormatUint(c.seq.Add(1), 10)
	msg := make([]byte, 0, len(cookie)+1+256)
	msg = append(append(msg, cookie...), ' ')
	msg, err := bencode.Append(msg, cmd)
	if err != nil {
		return bencode.Value{}, fmt.Errorf("ng %s: %w", command, err)
	}
	if len(msg) > maxDatagram {
		return bencode.Value{}, fmt.Errorf("ng %s: request of %d bytes does not fit a datagram", command, len(msg))
	}
	ch := make(chan []byte, 1)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return bencode.Value{}, fmt.Errorf("ng %s: %w", command, net.ErrClosed)
	}
	c.pending[cookie] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, cookie)
		c.mu.Unlock()
	}()

	timer := time.NewTimer(c.cfg.Timeout)
	defer timer.Stop()
	attempts := 1 + c.cfg.Retries
	for attempt := 1; attempt <= attempts; attempt++ {
		if _, err := c.conn.Write(msg); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return bencode.Value{}, fmt.Errorf("ng %s: %w", command, err)
			}
			// ECONNREFUSED from an earlier ICMP error, for example:
			// the next attempt may get through.
			c.mu.Lock()
			c.readErr = err
			c.mu.Unlock()
		}
		timer.Reset(c.cfg.Timeout)
		select {
		case body, ok := <-ch:
			if !ok {
				return bencode.Value{}, fmt.Errorf("ng %s: %w", command, net.ErrClosed)
			}
			return parseReply(command, body)
		case <-timer.C:
		case <-ctx.Done():
			return bencode.Value{}, fmt.Errorf("ng %s: %w", command, ctx.Err())
		}
	}
	c.mu.Lock()
	readErr := c.readErr
	c.mu.Unlock()
	if readErr != nil {
		return bencode.Value{}, fmt.Errorf("ng %s: %w after %d attempts %v apart (last socket error: %v)", command, ErrTimeout, attempts, c.cfg.Timeout, readErr)
	}
	return bencode.Value{}, fmt.Errorf("ng %s: %w after %d attempts %v apart", command, ErrTimeout, attempts, c.cfg.Timeout)
}

// parseReply decodes a reply and turns failure results into errors.
func parseReply(command string, body []byte) (bencode.Value, error) {
	v, err := bencode.Unmarshal(body)
	if err != nil {
		return bencode.Value{}, fmt.Errorf("ng %s: reply: %w", command, err)
	}
	if v.Kind() != bencode.KindDict {
		return bencode.Value{}, fmt.Errorf("ng %s: reply is a %v, not a dictionary", command, v.Kind())
	}
	switch result := v.GetString("result"); result {
	case "ok", "pong":
		return v, nil
	case "":
		return v, fmt.Errorf("ng %s: reply without a result: %v", command, v)
	default:
		// "error", "load limit" and whatever a server adds.
		return v, &ReplyError{Command: command, Result: result, Reason: v.GetString("error-reason")}
	}
}
