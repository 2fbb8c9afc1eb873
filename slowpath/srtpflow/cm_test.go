package srtpflow

import (
	"bytes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/pion/transport/v5/replaydetector"

	"github.com/relayd/relayd/sdes"
)

// TestDifferential runs the AES-CM suites' own RTP path and pion's side by
// side on random streams and requires the same SRTP bytes, the same
// accepted plaintext and the same verdicts.
func TestDifferential(t *testing.T) {
	accepted, sent := 0, 0
	for seed := uint64(1); seed <= 24; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			a, s := differential(t, seed, 300)
			accepted, sent = accepted+a, sent+s
		})
	}
	// Most packets are genuine and new: a low count would mean the streams
	// exercise little but the reject paths.
	if accepted < sent/2 {
		t.Fatalf("%d of %d packets accepted", accepted, sent)
	}
	t.Logf("%d of %d sent packets accepted", accepted, sent)
}

// FuzzDifferential is TestDifferential from a fuzzed seed.
func FuzzDifferential(f *testing.F) {
	f.Add(uint64(0))
	f.Add(uint64(1) << 40)
	f.Fuzz(func(t *testing.T, seed uint64) { differential(t, seed, 100) })
}

// differential drives n packets of a random stream through both paths. The
// stream: a random suite, master key, salt and MKI (or none), SSRC and
// starting ROC; sequence numbers that mostly advance by one and sometimes
// jump ahead, go back, or wrap; payloads of 0 to 1400 bytes; CSRCs and a
// header extension now and then. The receiving side sees the packets
// slightly reordered, some twice (replays), some with one bit flipped.
// It returns how many packets the receivers accepted and how many were sent.
func differential(t *testing.T, seed uint64, n int) (accepted, sent int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	suites := []sdes.Suite{sdes.AES_CM_128_HMAC_SHA1_80, sdes.AES_CM_128_HMAC_SHA1_32,
		sdes.AES_256_CM_HMAC_SHA1_80, sdes.AES_256_CM_HMAC_SHA1_32}
	s := suites[rng.IntN(len(suites))]
	cfg := Config{Suite: s, Key: randBytes(rng, s.KeyLen()), Salt: randBytes(rng, s.SaltLen())}
	if rng.IntN(3) == 0 {
		cfg.MKI = randBytes(rng, 1+rng.IntN(4))
	}
	ssrc := rng.Uint32()
	if rng.IntN(2) == 0 {
		cfg.SSRC, cfg.ROC = ssrc, rng.Uint32N(1<<20)
		if rng.IntN(4) == 0 {
			cfg.ROC = 1<<32 - 1 - rng.Uint32N(2)
		}
	}
	pcfg := cfg
	pcfg.pionRTP = true
	mk := func(c Config) (*Encrypter, *Decrypter) {
		e, err := NewEncrypter(c)
		if err != nil {
			t.Fatal(err)
		}
		d, err := NewDecrypter(c)
		if err != nil {
			t.Fatal(err)
		}
		return e, d
	}
	fe, fd := mk(cfg)
	pe, pd := mk(pcfg)
	if !fe.t.ownRTP || pe.t.ownRTP {
		t.Fatal("paths not as configured")
	}

	// Sender: both encrypters see the same packets in the same order.
	seq := uint16(rng.Uint32())
	var out [][]byte
	for range n {
		switch r := rng.IntN(40); {
		case r == 0:
			seq += uint16(1 + rng.IntN(30000)) // a jump, sometimes past a wrap
		case r == 1:
			seq -= uint16(1 + rng.IntN(4)) // the sender goes back: replays
		default:
			seq++
		}
		pkt := randRTP(rng, seq, ssrc)
		if rng.IntN(30) == 0 {
			pkt = randRTP(rng, seq, ssrc^1) // a second SSRC in the flow
		}
		a, errF := fe.EncryptRTP(make([]byte, 0, len(pkt)+32), pkt)
		b, errP := pe.EncryptRTP(make([]byte, 0, len(pkt)+32), pkt)
		if errF != errP || !bytes.Equal(a, b) {
			t.Fatalf("encrypt seq %d len %d: own %v %x\npion %v %x", seq, len(pkt), errF, a, errP, b)
		}
		if errF == nil {
			out = append(out, a)
		}
	}

	// Receiver: reordered, replayed and tampered copies.
	var recv [][]byte
	for i := 0; i < len(out); i++ {
		p := out[i]
		if i+1 < len(out) && rng.IntN(10) == 0 {
			recv = append(recv, out[i+1])
			i++
		}
		switch r := rng.IntN(12); {
		case r == 0:
			f := bytes.Clone(p)
			bit := rng.IntN(8 * len(f))
			f[bit/8] ^= 1 << (bit % 8)
			recv = append(recv, f)
		case r == 1:
			f := bytes.Clone(p)
			f[len(f)-1-rng.IntN(s.RTPTagLen())] ^= 0x80 // the tag
			recv = append(recv, f)
		case r == 2 && len(recv) > 0:
			recv = append(recv, recv[rng.IntN(len(recv))]) // a replay
		}
		recv = append(recv, p)
	}
	for i, p := range recv {
		a, errF := fd.DecryptRTP(make([]byte, 0, len(p)), p)
		b, errP := pd.DecryptRTP(make([]byte, 0, len(p)), p)
		if (errF == nil) != (errP == nil) || !bytes.Equal(a, b) || !sameReject(errF, errP) {
			t.Fatalf("decrypt packet %d (seq %d): own %v, pion %v", i, binary.BigEndian.Uint16(p[2:]), errF, errP)
		}
		if errF == nil {
			accepted++
		}
	}
	return accepted, len(out)
}

// sameReject: both paths give the same sentinel, except where pion refuses
// a header that rtpHeaderLength accepts (its own parse of the extension),
// before it looks at the tag.
func sameReject(own, pion error) bool {
	if own == pion {
		return true
	}
	return errors.Is(pion, ErrMalformed) && own != nil
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// randRTP returns an RTP packet with 0..3 CSRCs, sometimes a one-byte
// header extension, and a payload of 0..1400 bytes.
func randRTP(rng *rand.Rand, seq uint16, ssrc uint32) []byte {
	cc := 0
	if rng.IntN(5) == 0 {
		cc = 1 + rng.IntN(3)
	}
	p := []byte{0x80 | byte(cc), byte(rng.IntN(128)), byte(seq >> 8), byte(seq)}
	p = binary.BigEndian.AppendUint32(p, rng.Uint32())
	p = binary.BigEndian.AppendUint32(p, ssrc)
	for range cc {
		p = binary.BigEndian.AppendUint32(p, rng.Uint32())
	}
	if rng.IntN(5) == 0 {
		p[0] |= 0x10
		// One element (ID 1, 4 bytes of data) then a padding byte
		// short of a word: profile 0xBEDE, length 2 words.
		p = append(p, 0xbe, 0xde, 0, 2, 0x13, 1, 2, 3, 4, 0, 0, 0)
	}
	size := rng.IntN(1401)
	if rng.IntN(4) == 0 {
		size = rng.IntN(20)
	}
	return append(p, randBytes(rng, size)...)
}

// TestCMRejectsAllocateNothing: on the AES-CM path, replays and forged
// packets under made-up SSRCs allocate nothing and leave no state behind.
func TestCMRejectsAllocateNothing(t *testing.T) {
	e, d := newPair(t, sdes.AES_CM_128_HMAC_SHA1_80, nil)
	enc, err := e.EncryptRTP(make([]byte, 0, 256), rtpPacket(1, 42))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 0, 256)
	if _, err := d.DecryptRTP(out, enc); err != nil {
		t.Fatal(err)
	}
	forged := bytes.Clone(enc)
	ssrc := uint32(1000)
	if n := testing.AllocsPerRun(200, func() {
		if _, err := d.DecryptRTP(out, enc); err != ErrReplay {
			t.Fatalf("replay: %v", err)
		}
		ssrc++
		binary.BigEndian.PutUint32(forged[8:], ssrc)
		if _, err := d.DecryptRTP(out, forged); err != ErrAuth {
			t.Fatalf("forged SSRC %d: %v", ssrc, err)
		}
	}); n != 0 {
		t.Errorf("%v allocs per rejected pair", n)
	}
	if got := len(d.t.cm.states); got != 1 {
		t.Errorf("%d SSRC states after forgeries, want 1", got)
	}
}

// TestReplayWindow holds the AES-CM path's replay window to pion's
// sliding-window detector, which SRTCP and the GCM suites use, over random
// walks of packet indices, forward in steps on both sides of the window's
// two words (64) and of its size (128), and back into and past the window:
// the same verdict for every index; then at the largest index, 2^48-1.
func TestReplayWindow(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 14))
		var w replayWindow
		ref := replaydetector.New(ReplayWindow, maxIndex).(replaydetector.CheckAccepter)
		idx := uint64(rng.IntN(300))
		steps := []int{1, 2, 63, 64, 65, 127, 128, 129, 200}
		rejected := 0
		step := func(i int) {
			tok := ref.CheckSeq(idx)
			if got := w.check(idx); got != tok.Passed() {
				t.Fatalf("seed %d step %d: index %d: check %v, pion %v", seed, i, idx, got, tok.Passed())
			}
			if tok.Passed() {
				w.accept(idx)
				ref.Accept(tok)
			} else {
				rejected++
			}
		}
		for i := range 2000 {
			if rng.IntN(2) == 0 {
				idx += uint64(steps[rng.IntN(len(steps))])
			} else {
				idx -= min(idx, uint64(rng.IntN(140)))
			}
			step(i)
		}
		if rejected < 500 {
			t.Fatalf("seed %d: %d of 2000 indices rejected: the walk tests little", seed, rejected)
		}
		// At and past the largest index.
		for i, d := range []uint64{2, 1, 0, 1, 0} {
			idx = maxIndex - d
			step(2000 + i)
		}
		idx = maxIndex + 1
		step(2005)
	}
}

// BenchmarkKeystream: the AES-CM keystream of a 160-byte payload three
// ways, to show what the standard library's pipelined CTR would save if a
// stream could take a new IV without allocating (docs/bench-history.md, "SRTP per
// packet in the worker"):
//
//   - blocks: cmRTP.xorKeystream, one cipher.Block Encrypt per 16 bytes,
//     what the AES-CM path does;
//   - NewCTR: a cipher.NewCTR stream per packet, 8 blocks per call but
//     one 512-byte allocation per IV;
//   - reused: one stream's XORKeyStream run on, the pipelined cost without
//     the allocation (not SRTP: the counter never takes the next packet's
//     IV), the floor a re-seedable stream would reach.
func BenchmarkKeystream(b *testing.B) {
	c := &cmRTP{}
	if err := c.init(Config{Suite: sdes.AES_CM_128_HMAC_SHA1_80, Key: make([]byte, 16), Salt: make([]byte, 14)}); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 160)
	var iv [16]byte
	run := func(b *testing.B, f func(i int)) {
		b.ReportAllocs()
		b.SetBytes(int64(len(buf)))
		defer cpuPerOp(b)()
		i := 0
		for b.Loop() {
			f(i)
			i++
		}
	}
	b.Run("blocks", func(b *testing.B) {
		run(b, func(i int) { c.xorKeystream(buf, buf, 42, 0, uint16(i)) })
	})
	b.Run("NewCTR", func(b *testing.B) {
		run(b, func(i int) {
			binary.BigEndian.PutUint16(iv[12:], uint16(i))
			cipher.NewCTR(c.block, iv[:]).XORKeyStream(buf, buf)
		})
	})
	b.Run("reused", func(b *testing.B) {
		s := cipher.NewCTR(c.block, iv[:])
		run(b, func(int) { s.XORKeyStream(buf, buf) })
	})
}
