//go:build race

package srtpflow

// raceEnabled: the race detector runs. It makes sync.Pool drop items at
// random, and pion's SRTCP keystream comes from one (xorBufferPool), so
// an RTCP packet's allocation count means nothing then.
const raceEnabled = true
