package watchdog

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// local returns where to reach a listener bound to addr from this host: the
// loopback address of its family for an unspecified address.
func local(addr netip.AddrPort) netip.AddrPort {
	if a := addr.Addr(); a.IsUnspecified() {
		if a.Is4() {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), addr.Port())
		}
		return netip.AddrPortFrom(netip.IPv6Loopback(), addr.Port())
	}
	return addr
}

func token() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// SIPOptions returns a probe that sends an OPTIONS to the SIP listener on
// network ("udp", "tcp" or "tls") and addr and wants a 200 with the same
// Call-ID.
func SIPOptions(network string, addr netip.AddrPort) func(ctx context.Context) error {
	to := local(addr)
	return func(ctx context.Context) error {
		var d net.Dialer
		dial := network
		if network == "tls" {
			dial = "tcp"
		}
		conn, err := d.DialContext(ctx, dial, to.String())
		if err != nil {
			return err
		}
		defer conn.Close()
		if dl, ok := ctx.Deadline(); ok {
			conn.SetDeadline(dl)
		}
		if network == "tls" {
			// relayd probing its own listener: whether it answers is the
			// question, not whose certificate it shows.
			tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true})
			if err := tc.HandshakeContext(ctx); err != nil {
				return fmt.Errorf("OPTIONS to %s:%s: %w", network, to, err)
			}
			conn = tc
		}
		callID := token() + "@relayd-watchdog"
		transport := strings.ToUpper(network)
		msg := "OPTIONS sip:relayd@" + to.String() + " SIP/2.0\r\n" +
			"Via: SIP/2.0/" + transport + " " + conn.LocalAddr().String() + ";branch=z9hG4bK" + token() + ";rport\r\n" +
			"Max-Forwards: 70\r\n" +
			"From: <sip:watchdog@" + conn.LocalAddr().String() + ">;tag=" + token() + "\r\n" +
			"To: <sip:relayd@" + to.String() + ">\r\n" +
			"Call-ID: " + callID + "\r\n" +
			"CSeq: 1 OPTIONS\r\n" +
			"Content-Length: 0\r\n\r\n"
		if _, err := io.WriteString(conn, msg); err != nil {
			return err
		}
		// Over UDP each read is one datagram; over TCP read the head of one
		// message. Provisional responses are skipped.
		r := bufio.NewReader(conn)
		for {
			status, headers, err := readHead(r, network == "udp")
			if err != nil {
				return fmt.Errorf("OPTIONS to %s:%s: %w", network, to, err)
			}
			if !strings.Contains(headers, callID) {
				continue // a late answer to an earlier probe
			}
			code := strings.Fields(status)
			if len(code) < 2 || code[0] != "SIP/2.0" {
				return fmt.Errorf("OPTIONS to %s:%s: bad status line %q", network, to, status)
			}
			if code[1][0] == '1' {
				continue
			}
			if code[1] != "200" {
				return fmt.Errorf("OPTIONS to %s:%s: %s", network, to, status)
			}
			return nil
		}
	}
}

// readHead reads the status line and headers of one SIP message.
func readHead(r *bufio.Reader, datagram bool) (status, headers string, err error) {
	if datagram {
		// The whole datagram is in the reader's buffer after the first read.
		buf := make([]byte, 65536)
		n, err := r.Read(buf)
		if err != nil {
			return "", "", err
		}
		head, _, _ := strings.Cut(string(buf[:n]), "\r\n\r\n")
		status, headers, _ = strings.Cut(head, "\r\n")
		return status, headers, nil
	}
	var b strings.Builder
	status, err = r.ReadString('\n')
	if err != nil {
		return "", "", err
	}
	clen := 0
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", "", err
		}
		if line == "\r\n" || line == "\n" {
			break
		}
		if k, v, ok := strings.Cut(line, ":"); ok && (strings.EqualFold(strings.TrimSpace(k), "Content-Length") || strings.TrimSpace(k) == "l") {
			fmt.Sscanf(strings.TrimSpace(v), "%d", &clen)
		}
		b.WriteString(line)
	}
	if clen > 0 {
		if _, err := io.CopyN(io.Discard, r, int64(clen)); err != nil {
			return "", "", err
		}
	}
	return strings.TrimSpace(status), b.String(), nil
}

// HTTPGet returns a probe that GETs url through dial and wants a 200.
// dial lets the admin API be reached on a unix socket.
func HTTPGet(url string, dial func(ctx context.Context) (net.Conn, error)) func(ctx context.Context) error {
	client := &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DisableKeepAlives: true,
	}}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// Admin returns a probe of GET /healthz on the admin API at listen: a
// host:port or unix:/path as in the config.
func Admin(listen string) func(ctx context.Context) error {
	network, address := "unix", strings.TrimPrefix(listen, "unix:")
	if !strings.HasPrefix(listen, "unix:") {
		network = "tcp"
		if ap, err := netip.ParseAddrPort(listen); err == nil {
			address = local(ap).String()
		}
	}
	var d net.Dialer
	return HTTPGet("http://relayd/healthz", func(ctx context.Context) (net.Conn, error) {
		return d.DialContext(ctx, network, address)
	})
}
