package audio

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
)

// Packet is one RTP packet of a capture, as RTPFromPcap reads it. Payload
// excludes the header, CSRCs, extension and padding.
type Packet struct {
	SSRC      uint32
	Seq       uint16
	Timestamp uint32
	PT        uint8
	Marker    bool
	Payload   []byte
}

// tsharkFields are the fields RTPFromPcap has tshark print, in the order
// parsePacket reads them.
var tsharkFields = []string{"rtp.ssrc", "rtp.seq", "rtp.timestamp", "rtp.p_type", "rtp.marker", "rtp.payload"}

// RTPFromPcap returns the RTP packets of a capture in capture order, read
// by tshark: every UDP datagram that looks like RTP (Wireshark's RTP
// heuristic, -o rtp.heuristic_rtp:TRUE, so no port needs declaring) and
// matches filter, a display filter (-Y) such as "udp.dstport == 4000" or
// "rtp.ssrc == 0x1234"; an empty filter takes all. The RTP event dissector
// is disabled so that telephone-event packets keep their payload as bytes
// (rtp.payload). RTP quoted inside an ICMP error (a port unreachable) is
// left out.
func RTPFromPcap(ctx context.Context, pcapPath, filter string) ([]Packet, error) {
	bin, err := exec.LookPath("tshark")
	if err != nil {
		return nil, fmt.Errorf("tshark (Debian package tshark): %w", err)
	}
	display := "rtp && !icmp && !icmpv6"
	if filter != "" {
		display += " && (" + filter + ")"
	}
	args := []string{"-n", "-r", pcapPath, "-o", "rtp.heuristic_rtp:TRUE", "--disable-protocol", "rtpevent",
		"-Y", display, "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"}
	for _, f := range tsharkFields {
		args = append(args, "-e", f)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("tshark -r %s: %w: %s", pcapPath, err, strings.TrimSpace(stderr.String()))
	}
	var pkts []Packet
	for n, line := range strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n") {
		if line == "" {
			continue
		}
		p, err := parsePacket(line)
		if err != nil {
			return nil, fmt.Errorf("tshark -r %s: line %d %q: %w", pcapPath, n+1, line, err)
		}
		pkts = append(pkts, p)
	}
	return pkts, nil
}

// parsePacket reads one line of tshark's fields.
func parsePacket(line string) (Packet, error) {
	f := strings.Split(line, "\t")
	if len(f) != len(tsharkFields) {
		return Packet{}, fmt.Errorf("%d fields, want %d", len(f), len(tsharkFields))
	}
	var p Packet
	ssrc, err := strconv.ParseUint(f[0], 0, 32) // 0x-prefixed hex
	if err != nil {
		return p, fmt.Errorf("rtp.ssrc: %w", err)
	}
	seq, err := strconv.ParseUint(f[1], 10, 16)
	if err != nil {
		return p, fmt.Errorf("rtp.seq: %w", err)
	}
	ts, err := strconv.ParseUint(f[2], 10, 32)
	if err != nil {
		return p, fmt.Errorf("rtp.timestamp: %w", err)
	}
	pt, err := strconv.ParseUint(f[3], 10, 7)
	if err != nil {
		return p, fmt.Errorf("rtp.p_type: %w", err)
	}
	switch strings.ToLower(f[4]) {
	case "1", "true":
		p.Marker = true
	case "0", "false":
	default:
		return p, fmt.Errorf("rtp.marker %q", f[4])
	}
	// Bytes come as hex, with or without colons (tshark versions differ).
	p.Payload, err = hex.DecodeString(strings.ReplaceAll(f[5], ":", ""))
	if err != nil {
		return p, fmt.Errorf("rtp.payload: %w", err)
	}
	p.SSRC, p.Seq, p.Timestamp, p.PT = uint32(ssrc), uint16(seq), uint32(ts), uint8(pt)
	return p, nil
}

// Payloads returns the payloads of the packets of payload type pt, in
// sequence number order (the order they were sent, whatever the capture's:
// numbers are unwrapped from the first packet's, so a stream may wrap
// past 65535), a sequence number seen again (a duplicate) counted once.
// pkts are of one stream (one SSRC: filter first); a payload aliases its
// Packet's.
func Payloads(pkts []Packet, pt uint8) [][]byte {
	type ext struct {
		seq     int64
		payload []byte
	}
	var all []ext
	var last int64
	first := true
	for _, p := range pkts {
		if p.PT != pt {
			continue
		}
		var s int64
		if first {
			s, first = int64(p.Seq), false
		} else {
			// The extended number nearest the last one.
			d := int64(int16(p.Seq - uint16(last)))
			s = last + d
		}
		last = s
		all = append(all, ext{s, p.Payload})
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].seq < all[j].seq })
	var out [][]byte
	for i, e := range all {
		if i > 0 && e.seq == all[i-1].seq {
			continue
		}
		out = append(out, e.payload)
	}
	return out
}
