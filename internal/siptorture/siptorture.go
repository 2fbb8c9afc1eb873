// Package siptorture makes malformed SIP: random datagrams, torture
// messages with random edits, and requests whose Via is noise. The SIP
// server's torture test and voipgen soak's background of malformed SIP
// draw from it, so that a seed names the same datagrams in both.
package siptorture

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
)

// NoiseChars are what the noise after a Via is made of: SIP's delimiters
// and a few of its words' letters.
const NoiseChars = " \t\r\n;,:=/<>\"@SIPUDPabc0123456789.z9hG4bK"

// Garbage returns the i-th datagram of a seeded sequence, by i mod 3:
// random bytes (1 to 1,400), a message of base with a few random edits
// (Mangle), or an INVITE whose Via is up to 300 noise characters.
// base must not be empty.
func Garbage(rng *rand.Rand, base [][]byte, i int) []byte {
	switch i % 3 {
	case 0:
		b := make([]byte, 1+rng.IntN(1400))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		return b
	case 1:
		return Mangle(rng, base[rng.IntN(len(base))])
	default:
		noise := make([]byte, rng.IntN(300))
		for j := range noise {
			noise[j] = NoiseChars[rng.IntN(len(NoiseChars))]
		}
		return append([]byte("INVITE sip:x@y SIP/2.0\r\nVia: "), noise...)
	}
}

// Mangle returns a copy of m with a few random edits of the kinds that
// break parsers: bytes changed, cut, doubled or inserted, line ends
// broken, white space added.
func Mangle(rng *rand.Rand, m []byte) []byte {
	b := bytes.Clone(m)
	for range 1 + rng.IntN(4) {
		if len(b) == 0 {
			break
		}
		i := rng.IntN(len(b))
		switch rng.IntN(7) {
		case 0:
			b[i] = byte(rng.Uint32())
		case 1:
			b = b[:i]
		case 2:
			j := min(len(b), i+1+rng.IntN(40))
			b = slices.Delete(b, i, j)
		case 3:
			j := min(len(b), i+1+rng.IntN(40))
			b = slices.Insert(b, i, b[i:j]...)
		case 4:
			b = slices.Insert(b, i, []byte{" \t;,:=<>\"\r\n"[rng.IntN(11)]}...)
		case 5:
			b = bytes.Replace(b, []byte("\r\n"), []byte("\n"), 1+rng.IntN(3))
		case 6:
			b = slices.Insert(b, i, ' ', ' ')
		}
	}
	return b
}

// Load reads the torture messages under dir (control/sip/testdata/torture:
// one file per message, *.dat in its subdirectories), sorted by path.
func Load(dir string) ([][]byte, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*", "*.dat"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no torture messages (*/*.dat) under %s", dir)
	}
	slices.Sort(files)
	msgs := make([][]byte, len(files))
	for i, f := range files {
		if msgs[i], err = os.ReadFile(f); err != nil {
			return nil, err
		}
	}
	return msgs, nil
}
