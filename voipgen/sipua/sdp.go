package sipua

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/relayd/relayd/voipgen/payload"
)

// voipgen's SDP (RFC 4566) is the minimum a call with one audio stream
// needs: it offers or answers one codec and reads back c= and m=audio.

// SDPBody returns an SDP offer or answer for one audio stream at media.
func SDPBody(media netip.AddrPort, c payload.Codec, ptime time.Duration, sessID int64) []byte {
	ip := "IP4"
	if !media.Addr().Is4() {
		ip = "IP6"
	}
	enc := map[string]string{"pcmu": "PCMU/8000", "pcma": "PCMA/8000", "g729": "G729/8000", "opus": "opus/48000/2"}[c.Name]
	var b strings.Builder
	fmt.Fprintf(&b, "v=0\r\no=voipgen %d %d IN %s %s\r\ns=voipgen\r\nc=IN %s %s\r\nt=0 0\r\n",
		sessID, sessID, ip, media.Addr(), ip, media.Addr())
	fmt.Fprintf(&b, "m=audio %d RTP/AVP %d\r\na=rtpmap:%d %s\r\n", media.Port(), c.PayloadType, c.PayloadType, enc)
	if c.Name == "g729" {
		fmt.Fprintf(&b, "a=fmtp:18 annexb=no\r\n")
	}
	fmt.Fprintf(&b, "a=ptime:%d\r\na=sendrecv\r\n", ptime/time.Millisecond)
	return []byte(b.String())
}

// SDPBodyCrypto is sdpBody for SRTP with SDES (RFC 4568): RTP/SAVP and
// one a=crypto line, crypto being its value ("1 AES_CM_128_HMAC_SHA1_80
// inline:...").
func SDPBodyCrypto(media netip.AddrPort, c payload.Codec, ptime time.Duration, sessID int64, crypto string) []byte {
	b := string(SDPBody(media, c, ptime, sessID))
	b = strings.Replace(b, " RTP/AVP ", " RTP/SAVP ", 1)
	return []byte(b + "a=crypto:" + crypto + "\r\n")
}

var errNoAudio = errors.New("sdp: no audio stream")

// SDPMedia is what voipgen reads from a peer's SDP.
type SDPMedia struct {
	Addr netip.AddrPort // where to send RTP
	PTs  []int          // payload types offered, in order
}

// ParseSDP reads the connection address and the first audio stream.
func ParseSDP(body []byte) (SDPMedia, error) {
	var m SDPMedia
	var sessAddr, mediaAddr netip.Addr
	inAudio, seenAudio := false, false
	port := 0
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if len(line) < 2 || line[1] != '=' {
			continue
		}
		v := line[2:]
		switch line[0] {
		case 'm':
			inAudio = false
			f := strings.Fields(v)
			if seenAudio || len(f) < 4 || f[0] != "audio" {
				continue
			}
			p, err := strconv.Atoi(strings.SplitN(f[1], "/", 2)[0])
			if err != nil || p < 0 || p > 65535 {
				return m, fmt.Errorf("sdp: bad port in m=%s", v)
			}
			port, inAudio, seenAudio = p, true, true
			for _, s := range f[3:] {
				if pt, err := strconv.Atoi(s); err == nil {
					m.PTs = append(m.PTs, pt)
				}
			}
		case 'c':
			f := strings.Fields(v)
			if len(f) < 3 {
				return m, fmt.Errorf("sdp: bad c=%s", v)
			}
			a, err := netip.ParseAddr(strings.SplitN(f[2], "/", 2)[0])
			if err != nil {
				return m, fmt.Errorf("sdp: c=%s: %w", v, err)
			}
			if inAudio {
				mediaAddr = a
			} else if !seenAudio {
				sessAddr = a
			}
		}
	}
	if !seenAudio {
		return m, errNoAudio
	}
	a := mediaAddr
	if !a.IsValid() {
		a = sessAddr
	}
	if !a.IsValid() {
		return m, errors.New("sdp: no connection address")
	}
	m.Addr = netip.AddrPortFrom(a.Unmap(), uint16(port))
	return m, nil
}
