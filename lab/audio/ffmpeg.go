package audio

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// G.729 frame sizes (RFC 3551 4.5.6).
const (
	G729FrameBytes   = 10 // a speech frame: 10 ms
	G729SIDBytes     = 2  // an Annex B silence insertion descriptor
	G729FrameSamples = 80
)

// ErrSID is returned for G.729 input with an Annex B SID frame where
// ffmpeg must decode it. ffmpeg (5.1, Debian 12) has no Annex B: its raw
// demuxer (-f g729) cuts the input into 10-byte frames, so a 2-byte frame
// shifts every later one (and a stream that does not end on a frame is
// "corrupt input packet"); its G.729 decoder, given a 2-byte packet
// through the ITU bitstream demuxer (-f bit), rejects it ("Packet size 2
// is unknown") and outputs nothing for it. It has no frame erasure either.
var ErrSID = errors.New("g729: SID frame: ffmpeg's decoder has no Annex B")

// DecodeG729FFmpeg decodes G.729 speech frames, concatenated 10-byte
// frames as in RTP payloads without SID frames, with ffmpeg (its g729
// demuxer and decoder, not bcg729: an independent implementation), into
// 80 samples per frame. Input that is not whole 10-byte frames is ErrSID
// wrapped, without running ffmpeg; SpeechFrames makes such input from RTP
// payloads that have SID frames.
//
// It runs
//
//	ffmpeg -f g729 -i pipe:0 -f s16le -ar 8000 -ac 1 pipe:1
//
// and fails when ffmpeg reports any error (-xerror), such as a frame it
// cannot decode.
func DecodeG729FFmpeg(ctx context.Context, frames []byte) ([]int16, error) {
	if len(frames)%G729FrameBytes != 0 {
		return nil, fmt.Errorf("ffmpeg: %d bytes are not whole 10-byte frames: %w", len(frames), ErrSID)
	}
	return ffmpegDecode(ctx, "g729", frames)
}

// DecodeG711FFmpeg decodes G.711 (a payload or several concatenated, one
// byte a sample), µ-law or with alaw A-law, with ffmpeg: -f mulaw or -f
// alaw into s16le.
func DecodeG711FFmpeg(ctx context.Context, payload []byte, alaw bool) ([]int16, error) {
	format := "mulaw"
	if alaw {
		format = "alaw"
	}
	return ffmpegDecode(ctx, format, payload)
}

// ffmpegDecode has ffmpeg decode in, raw in the given input format, to 8
// kHz mono s16le.
func ffmpegDecode(ctx context.Context, format string, in []byte) ([]int16, error) {
	bin, err := exec.LookPath("ffmpeg")
	if err != nil {
		return nil, fmt.Errorf("ffmpeg (Debian package ffmpeg): %w", err)
	}
	args := []string{"-hide_banner", "-nostdin", "-loglevel", "error", "-xerror",
		"-f", format}
	if format != "g729" {
		// The raw PCM demuxers need the rate and channels; g729's are fixed.
		args = append(args, "-ar", "8000", "-ac", "1")
	}
	args = append(args, "-i", "pipe:0", "-f", "s16le", "-ar", "8000", "-ac", "1", "pipe:1")
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("ffmpeg -f %s: %w: %s", format, err, strings.TrimSpace(stderr.String()))
	}
	if msg := strings.TrimSpace(stderr.String()); msg != "" {
		return nil, fmt.Errorf("ffmpeg -f %s: %s", format, msg)
	}
	out := stdout.Bytes()
	pcm := make([]int16, len(out)/2)
	for i := range pcm {
		pcm[i] = int16(binary.LittleEndian.Uint16(out[2*i:]))
	}
	return pcm, nil
}

// SIDMode says what SpeechFrames does with an Annex B SID frame.
type SIDMode int

const (
	// SIDReject makes a SID frame an error (ErrSID): for a stream
	// negotiated with annexb=no, which must have none.
	SIDReject SIDMode = iota
	// SIDDrop leaves SID frames out: the decoded audio after one comes 10
	// ms earlier than it was sent, for each SID before it.
	SIDDrop
	// SIDRepeat puts the last speech frame before it (or, before any, a
	// frame of zero bytes) in a SID frame's place, which keeps the timing:
	// the decoded audio of that 10 ms is not the comfort noise the sender
	// meant and should be left out of a comparison (the returned indexes
	// say where it is).
	SIDRepeat
)

// SpeechFrames concatenates the G.729 frames of RTP payloads (each zero
// or more 10-byte speech frames, then at most one 2-byte SID frame) for
// DecodeG729FFmpeg, treating SID frames as mode says. sids are the frame
// indexes, in the result, of the frames that stand in for SID frames
// (SIDRepeat) or where they were left out (SIDDrop). A payload of any
// other length is an error.
func SpeechFrames(payloads [][]byte, mode SIDMode) (frames []byte, sids []int, err error) {
	var last [G729FrameBytes]byte
	for n, p := range payloads {
		speech := len(p) / G729FrameBytes
		switch len(p) % G729FrameBytes {
		case 0:
		case G729SIDBytes:
		default:
			return nil, nil, fmt.Errorf("g729 payload %d: %d bytes are not 10-byte frames and a SID frame", n, len(p))
		}
		frames = append(frames, p[:speech*G729FrameBytes]...)
		if speech > 0 {
			copy(last[:], p[(speech-1)*G729FrameBytes:])
		}
		if len(p)%G729FrameBytes == 0 {
			continue
		}
		switch mode {
		case SIDReject:
			return nil, nil, fmt.Errorf("g729 payload %d: %w", n, ErrSID)
		case SIDDrop:
			sids = append(sids, len(frames)/G729FrameBytes)
		case SIDRepeat:
			sids = append(sids, len(frames)/G729FrameBytes)
			frames = append(frames, last[:]...)
		default:
			return nil, nil, fmt.Errorf("g729: SID mode %d", mode)
		}
	}
	return frames, sids, nil
}
