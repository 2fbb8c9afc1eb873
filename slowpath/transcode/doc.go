// Package transcode is the per-stream transcoding engine of relayd's
// userspace workers: one Stream converts one direction of one media
// stream (a dataplane.Flow with Transcode set) between G.711 (PCMU, PCMA)
// and G.729 (Annex A, with Annex B when VAD is set), and between packet
// times. The codecs are rtp/g711 and slowpath/codec/g729 (bcg729); this
// package only moves frames between them.
//
// # Pipeline
//
// Push parses a packet, puts it through the reorder buffer and, once it is
// in sequence, decodes it into 10 ms frames of 80 samples of PCM. Each
// frame is encoded in the output codec at once and added to the packet
// being built; a packet is queued when it holds Out.Ptime of frames (or
// earlier, see DTX). Pull hands queued packets out, writing the RTP
// header then: the output sequence number is assigned as a packet leaves,
// so it goes up by exactly one per packet sent. Everything is
// preallocated in New; Push and Pull do not allocate. G.729 to G.729
// (unless Annex B must be removed) copies the frames, bit-exact, and only
// repacketizes.
//
// # Timestamp mapping
//
// The output timeline is the input's shifted: out = in + offset (mod
// 2^32), 8 kHz both sides. The first packet maps to a random initial
// timestamp. The output keeps pos, the timestamp of the next frame; a
// frame that would land behind pos (a timestamp going back, comfort noise
// that ran ahead of the input, a new SSRC, a confirmed sequence jump)
// rebases the offset so that it lands on pos: the output never overlaps
// and never goes back, and after a source change it continues where it
// was. Timestamps off the 10 ms grid are pulled onto it the same way.
// Frames ahead of pos are a gap: lost input is concealed if the loss is
// at most MaxConceal frames (120 ms), silence is filled with comfort
// noise where the output wants it (up to MaxConceal frames), and
// otherwise the output timestamps jump, as in DTX, with the sequence
// numbers contiguous and the marker set on the first packet after the
// jump. The marker is also set on the first packet of the stream and on
// the packet of a frame whose input packet had it (that frame starts a
// new packet). Telephone-events (RFC 4733) map with the same offset, keep
// their marker, take the output's sequence numbers and Out.Event as
// payload type; with Out.Event 0 they are dropped and counted.
//
// # Reorder hold and added delay
//
// An in-order packet is played at once: no delay while nothing is lost.
// After a gap in sequence numbers, later packets are held (up to
// ReorderWindow ahead) until the missing packet arrives, HoldLimit (60 ms)
// has passed since the first was held, or a fourth packet would be held
// (HoldPackets, 3); then the missing frames are concealed and the held
// packets played. A packet arriving after its slot was concealed is
// dropped (LateDropped); duplicates are recognised from a 64-packet
// history and dropped. The largest delay the engine adds is therefore
// min(60 ms, 3 input ptimes): 30 ms at 10 ms input, 60 ms at 20, 30 or 40
// ms, and only for the packets after a loss; Stats.MaxHold records the
// longest seen. Why these: real reordering across a path is a few
// milliseconds, one or two packets; holding longer only delays the
// concealment the far end would do anyway, and the far end's jitter
// buffer already absorbs the hold as jitter. 60 ms keeps a relayed call
// (plus the two legs' jitter buffers) inside the 150 ms one-way budget of
// G.114, and three packets at 20 ms is the same 60 ms.
//
// # Loss concealment
//
// A loss is seen when the packet after it arrives, so what is synthesised
// for it leaves then, behind its time: a few frames late are still of
// use to the far end's jitter buffer, a long loss's are not (they would
// be dropped there, or stretch an adaptive buffer), and making them
// would cost an encode a frame at the moment every stream resumes after
// an outage. A loss longer than MaxConceal frames is therefore a jump,
// nothing synthesised.
//
// G.729 input: bcg729's erasure concealment (Decoder.Conceal). G.729 to
// G.729 copied through: nothing is synthesised (re-encoding a concealment
// would do worse than the far decoder's own); the output timestamps skip
// the lost frames. G.711 input: the last pitch period repeated, G.711
// Appendix I in spirit (written here from its description): the period
// is the lag of 5 to 15 ms that best matches the last 10 ms (normalised
// autocorrelation); the last period, its end cross-faded into the sample
// before it so the repetition has no step, is repeated at full gain for
// 10 ms, then fades by 20% per 10 ms to silence at 60 ms; the first 4 ms
// of the packet that ends the loss is cross-faded from the continued
// concealment. Unlike Appendix I it does not delay the output (it keeps
// no look-behind to rewrite) and repeats one period only: the engine adds
// no latency on the path without loss, and past 20 ms the fading
// dominates what extra periods would improve. Against silence in place
// of the lost packets it raises the segmental SNR of the test's
// speech-like signal (TestQuality).
//
// # DTX and comfort noise
//
// G.729 Annex B input: a SID frame (2 bytes) is decoded (bcg729 starts its
// comfort noise) and the input is in silence until a speech frame. Toward
// G.711 with a CN payload type (Out.CN), an RFC 3389 packet carries the
// level of the decoded noise (in -dBov, 0 dBov the power of a full-scale
// square wave) at the start of silence and again whenever the SID frame
// changes, and no audio is sent during DTX. Without Out.CN, and toward
// G.729, the silence is filled with the decoder's comfort noise in real
// time: a packet every Out.Ptime, driven by Deadline, so the far end
// sees no gap in timestamps. Each noise frame is synthesised NoiseGrace
// (20 ms) after its input would have arrived, so that an input packet on
// time, within that jitter, takes its own slot; when one comes later
// anyway the mapping rebases by the overlap. G.711 input with RFC 3389
// packets (In.CN): silence at the packet's level, white noise, forwarded
// as CN (payload type mapped) toward a G.711 leg with Out.CN and fed as
// PCM otherwise; toward G.729 it goes to the encoder, which with Out.VAD
// turns it into SID frames or nothing (a SID frame ends its packet,
// suppressed frames are not sent and the next packet carries a
// timestamp jump and the marker). CN is never sent to a G.729 leg.
//
// # RTCP
//
// Across a transcoder the two legs' reports describe different streams,
// so relayd reports for itself: Report writes a sender report of what the
// Stream sent, with a reception report block from the reverse flow's
// receive statistics, and an SDES CNAME.
package transcode
