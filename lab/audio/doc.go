// Package audio checks transcoded audio from outside relayd: test signals
// (Tone, Speech), their quality after a codec (Align, SNR, SegSNR), an
// independent decoder (ffmpeg: DecodeG729FFmpeg, DecodeG711FFmpeg), RTP
// out of captures (tshark: RTPFromPcap, Payloads) and captures to play
// (WritePcap, for SIPp's play_pcap_audio and for tshark).
//
// Audio is 8 kHz, mono, 16-bit linear PCM ([]int16), the rate of G.711 and
// G.729.
//
// The package's functions are safe for concurrent use; those that run a
// tool (ffmpeg, tshark) take a context that bounds the tool's run and
// return an error that names the tool when it is missing (Debian packages
// ffmpeg and tshark, installed by `make deps`).
package audio

// SampleRate is the sampling rate of every signal of the package, in Hz.
const SampleRate = 8000
