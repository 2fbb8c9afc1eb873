//go:build !linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/relayd/relayd/voipgen/gen"
)

var stderrFd = 2

func isTerminal(fd int) bool { return false }

// runSend falls back to the single-model sender where the generator of
// gen_linux.go (raw sockets, sendmmsg, clock_nanosleep) is not available.
func runSend(ctx context.Context, args []string, out io.Writer) error {
	return runSendBasic(ctx, args, out)
}

func runCall(ctx context.Context, args []string, out io.Writer) error {
	return errors.New("voipgen call runs on Linux only")
}

func runAnswer(ctx context.Context, args []string, out io.Writer) error {
	return errors.New("voipgen answer runs on Linux only")
}

func runPacebench(ctx context.Context, args []string, out io.Writer) error {
	return errors.New("voipgen pacebench runs on Linux only")
}

// runSendBasic is voipgen send on systems without the generator of
// gen_linux.go: one stream model, x/net batches.
func runSendBasic(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := gen.ParseSender(args, out)
	if err != nil {
		return err
	}
	s, err := gen.NewSender(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	l := cfg.Load()
	if !cfg.JSON {
		last := netip.AddrPortFrom(cfg.Dst.Addr(), cfg.Dst.Port()+uint16(2*(cfg.Streams-1)))
		fmt.Fprintf(out, "sending %d %s/%v streams to %s..%s for %v (%d slots per ptime, %s)\n",
			cfg.Streams, cfg.Codec.Name, cfg.Ptime, cfg.Dst, last, cfg.Duration, s.Slots(), sockMode(cfg))
		fmt.Fprintf(out, "load: %.0f pps; packet RTP %d B, IP %d B, frame %d B, wire %d B; %.3f Mbit/s on the wire (%.1f kbit/s per stream), %.3f Mbit/s IP\n",
			l.PPS, l.RTPBytes, l.IPBytes, l.FrameBytes, l.WireBytes, l.WireBitsPS/1e6, l.PerStreamBP/1e3, l.IPBitsPS/1e6)
	}
	res := s.Run(ctx)
	if cfg.JSON {
		return json.NewEncoder(out).Encode(map[string]any{
			"config": map[string]any{"dst": cfg.Dst.String(), "streams": cfg.Streams, "codec": cfg.Codec.Name,
				"ptime_ms": cfg.Ptime.Milliseconds(), "duration_s": cfg.Duration.Seconds(), "shared_socket": cfg.SharedSocket},
			"load": l, "result": res})
	}
	fmt.Fprintf(out, "sent %d packets (%d bytes, %d errors) in %.3f s: %.0f pps; lateness against schedule p50 %.0f us, p99 %.0f us, max %.0f us\n",
		res.Packets, res.Bytes, res.Errors, res.Elapsed, res.PPS, res.LateP50us, res.LateP99us, res.LateMaxus)
	return nil
}

func sockMode(cfg gen.SenderConfig) string {
	if cfg.SharedSocket {
		return "one shared socket"
	}
	return "one socket per stream"
}
