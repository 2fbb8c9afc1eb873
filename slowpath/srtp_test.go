package slowpath

import (
	"bytes"
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/dataplane"
	"github.com/relayd/relayd/sdes"
	"github.com/relayd/relayd/slowpath/srtpflow"
)

func srtpParams(t testing.TB, suite sdes.Suite, seed byte) *dataplane.SRTP {
	t.Helper()
	key := bytes.Repeat([]byte{seed}, suite.KeyLen())
	salt := bytes.Repeat([]byte{seed + 1}, suite.SaltLen())
	return &dataplane.SRTP{Suite: suite.String(), Key: key, Salt: salt}
}

func srtpCfg(t testing.TB, p *dataplane.SRTP) srtpflow.Config {
	t.Helper()
	c, err := srtpConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newSRTPFlow(t testing.TB, dec, enc *dataplane.SRTP) *flowState {
	t.Helper()
	fl := dataplane.Flow{
		Match: netip.MustParseAddrPort("198.18.1.1:30000"), SendFrom: netip.MustParseAddrPort("198.18.1.1:30002"),
		SendTo: netip.MustParseAddrPort("198.18.2.2:5000"), ClockRate: 8000, Decrypt: dec, Encrypt: enc,
	}
	d, e, err := newTransforms(&fl)
	if err != nil {
		t.Fatal(err)
	}
	return &flowState{flow: fl, dec: d, enc: e}
}

var srtpSuites = []sdes.Suite{sdes.AES_CM_128_HMAC_SHA1_80, sdes.AES_CM_128_HMAC_SHA1_32, sdes.AES_256_CM_HMAC_SHA1_80, sdes.AEAD_AES_128_GCM, sdes.AEAD_AES_256_GCM}

// TestProcessSRTP: SRTP in, RTP out and RTP in, SRTP out, byte-exact, for
// every suite; forged, truncated and replayed packets are dropped and
// counted and do not touch the statistics.
func TestProcessSRTP(t *testing.T) {
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	for _, suite := range srtpSuites {
		t.Run(suite.String(), func(t *testing.T) {
			p := srtpParams(t, suite, 7)
			// Caller side: encrypts what it sends.
			callerEnc, err := srtpflow.NewEncrypter(srtpCfg(t, p))
			if err != nil {
				t.Fatal(err)
			}
			decFlow := newSRTPFlow(t, p, nil)
			out := make([]byte, maxPacket)
			var sent [][]byte
			for seq := uint16(1); seq <= 5; seq++ {
				plain := rtpPayload(9, seq, uint32(seq)*160)
				srtp, err := callerEnc.EncryptRTP(make([]byte, 0, 256), plain)
				if err != nil {
					t.Fatal(err)
				}
				sent = append(sent, srtp)
				n, _, v := decFlow.process(out, srtp, src, int64(seq)*20e6)
				if v != vSend {
					t.Fatalf("seq %d: verdict %s", seq, verdictNames[v])
				}
				if got := out[28:n]; !bytes.Equal(got, plain) {
					t.Fatalf("seq %d: decrypted payload differs", seq)
				}
			}
			// Forged: one bit of the payload flipped.
			forged := bytes.Clone(sent[4])
			forged[20] ^= 1
			forged[2], forged[3] = 0, 6 // a fresh sequence number
			if _, _, v := decFlow.process(out, forged, src, 1e9); v != vDropCrypto {
				t.Errorf("forged packet: verdict %s, want srtp_auth", verdictNames[v])
			}
			if _, _, v := decFlow.process(out, sent[2], src, 1e9); v != vDropReplay {
				t.Errorf("replayed packet: verdict %s, want srtp_replay", verdictNames[v])
			}
			if _, _, v := decFlow.process(out, sent[4][:14], src, 1e9); v != vDropCrypto {
				t.Errorf("truncated packet: verdict %s, want srtp_auth", verdictNames[v])
			}
			st := decFlow.stats()
			if st.Packets != 5 || st.Dropped != 3 || st.Received != 5 || st.ExtHighestSeq != 5 {
				t.Errorf("stats %+v, want 5 packets, 3 dropped, highest seq 5", st)
			}

			// The other direction: plain in, SRTP out, which the caller
			// decrypts.
			encFlow := newSRTPFlow(t, nil, p)
			callerDec, err := srtpflow.NewDecrypter(srtpCfg(t, p))
			if err != nil {
				t.Fatal(err)
			}
			for seq := uint16(1); seq <= 3; seq++ {
				plain := rtpPayload(11, seq, uint32(seq)*160)
				n, _, v := encFlow.process(out, plain, src, int64(seq)*20e6)
				if v != vSend {
					t.Fatalf("verdict %s", verdictNames[v])
				}
				checkLen := n - 28
				if checkLen <= len(plain) {
					t.Fatalf("encrypted packet not longer than plain (%d <= %d)", checkLen, len(plain))
				}
				got, err := callerDec.DecryptRTP(make([]byte, 0, 256), out[28:n])
				if err != nil || !bytes.Equal(got, plain) {
					t.Fatalf("caller cannot decrypt what the relay sent: %v", err)
				}
			}
		})
	}
}

// TestProcessSRTPRekey: decrypt with one key, encrypt with another.
func TestProcessSRTPRekey(t *testing.T) {
	in, outKey := srtpParams(t, sdes.AES_CM_128_HMAC_SHA1_80, 1), srtpParams(t, sdes.AEAD_AES_128_GCM, 50)
	f := newSRTPFlow(t, in, outKey)
	enc, _ := srtpflow.NewEncrypter(srtpCfg(t, in))
	dec, _ := srtpflow.NewDecrypter(srtpCfg(t, outKey))
	plain := rtpPayload(3, 1, 160)
	srtp, _ := enc.EncryptRTP(make([]byte, 0, 256), plain)
	out := make([]byte, maxPacket)
	n, _, v := f.process(out, srtp, netip.MustParseAddrPort("198.18.0.2:4000"), 1)
	if v != vSend {
		t.Fatal(verdictNames[v])
	}
	got, err := dec.DecryptRTP(make([]byte, 0, 256), out[28:n])
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("re-keyed packet: %v", err)
	}
}

func TestProcessSRTPAllocs(t *testing.T) {
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	for _, suite := range []sdes.Suite{sdes.AES_CM_128_HMAC_SHA1_80, sdes.AEAD_AES_128_GCM} {
		p := srtpParams(t, suite, 3)
		enc, _ := srtpflow.NewEncrypter(srtpCfg(t, p))
		dec := newSRTPFlow(t, p, nil)
		encFlow := newSRTPFlow(t, nil, p)
		out := make([]byte, maxPacket)
		plain := rtpPayload(1, 0, 0)
		pkt := make([]byte, 0, 256)
		seq := uint16(0)
		allocs := testing.AllocsPerRun(500, func() {
			seq++
			plain[2], plain[3] = byte(seq>>8), byte(seq)
			srtp, _ := enc.EncryptRTP(pkt, plain)
			if _, _, v := dec.process(out, srtp, src, int64(seq)); v != vSend {
				t.Fatal(verdictNames[v])
			}
			if _, _, v := encFlow.process(out, plain, src, int64(seq)); v != vSend {
				t.Fatal(verdictNames[v])
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per packet, want 0", suite, allocs)
		}
	}
}

// cpuPerOp locks the benchmark to its thread and returns a function that
// reports the thread's CPU time per op as cpu-ns/op: ns/op without the time
// the thread waited for a CPU, most of the spread between runs on a shared
// machine. The decrypt benchmark's fresh contexts (timer stopped) are
// counted in it: one per 65,536 packets.
func cpuPerOp(b *testing.B) func() {
	runtime.LockOSThread()
	start := threadCPU()
	return func() {
		b.ReportMetric(float64(threadCPU()-start)/float64(b.N), "cpu-ns/op")
		runtime.UnlockOSThread()
	}
}

func threadCPU() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

// BenchmarkProcessSRTP compares the worker's per-packet cost for a plain
// flow and SRTP flows (decrypt: SRTP->RTP; encrypt: RTP->SRTP), 172-byte
// packets, in one run:
//
//	go test -run '^$' -bench ProcessSRTP ./slowpath/
//
// cpu-ns/op is the figure to compare on a busy machine (docs/bench.md).
func BenchmarkProcessSRTP(b *testing.B) {
	src := netip.MustParseAddrPort("198.18.0.2:4000")
	run := func(b *testing.B, f *flowState, pkt func(seq uint16) []byte) {
		out := make([]byte, maxPacket)
		b.ReportAllocs()
		b.SetBytes(172)
		defer cpuPerOp(b)()
		for i := range b.N {
			if _, _, v := f.process(out, pkt(uint16(i)), src, int64(i)); v != vSend {
				b.Fatal(verdictNames[v])
			}
		}
	}
	plain := rtpPayload(1, 0, 0)
	setSeq := func(seq uint16) []byte { plain[2], plain[3] = byte(seq>>8), byte(seq); return plain }
	b.Run("plain", func(b *testing.B) { run(b, newSRTPFlow(b, nil, nil), setSeq) })
	for _, suite := range []sdes.Suite{sdes.AES_CM_128_HMAC_SHA1_80, sdes.AEAD_AES_128_GCM} {
		p := srtpParams(b, suite, 5)
		b.Run(fmt.Sprintf("encrypt_%s", suite), func(b *testing.B) { run(b, newSRTPFlow(b, nil, p), setSeq) })
		// Decrypt: pre-encrypt a window of packets so the timed loop only
		// decrypts (sequence numbers advance; the window repeats after 64k).
		enc, _ := srtpflow.NewEncrypter(srtpCfg(b, p))
		pkts := make([][]byte, 1<<16)
		for i := range pkts {
			var err error
			if pkts[i], err = enc.EncryptRTP(make([]byte, 0, 256), setSeq(uint16(i))); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("decrypt_%s", suite), func(b *testing.B) {
			out := make([]byte, maxPacket)
			b.ReportAllocs()
			b.SetBytes(172)
			f := newSRTPFlow(b, p, nil)
			defer cpuPerOp(b)()
			for i := range b.N {
				if i > 0 && i%len(pkts) == 0 {
					// The window of packets repeats: a fresh context, or
					// they would be replays.
					b.StopTimer()
					f = newSRTPFlow(b, p, nil)
					b.StartTimer()
				}
				if _, _, v := f.process(out, pkts[i%len(pkts)], src, int64(i)); v != vSend {
					b.Fatal(verdictNames[v])
				}
			}
		})
	}
}
