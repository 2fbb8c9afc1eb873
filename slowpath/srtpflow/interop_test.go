package srtpflow

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/sdes"
)

// The interoperability test drives libsrtp2 through a small C program
// (testdata/libsrtp_helper.c) built with gcc, so that cgo stays out of the
// package. It needs gcc and Debian's libsrtp2-dev; it skips, with the reason,
// only when <srtp2/srtp.h> is missing.

var helper struct {
	once sync.Once
	path string
	skip string
	err  error
}

func libsrtpHelper(t *testing.T) string {
	t.Helper()
	helper.once.Do(func() {
		gcc, err := exec.LookPath("gcc")
		if err != nil {
			helper.err = fmt.Errorf("gcc not found (needed to build the libsrtp2 helper): %w", err)
			return
		}
		probe := exec.Command(gcc, "-E", "-x", "c", "-")
		probe.Stdin = strings.NewReader("#include <srtp2/srtp.h>\n")
		if out, err := probe.CombinedOutput(); err != nil {
			if bytes.Contains(out, []byte("srtp2/srtp.h")) {
				helper.skip = "libsrtp2 header <srtp2/srtp.h> not found; install libsrtp2-dev"
				return
			}
			helper.err = fmt.Errorf("probe for <srtp2/srtp.h>: %w: %s", err, out)
			return
		}
		dir, err := osMkdirTemp()
		if err != nil {
			helper.err = err
			return
		}
		helper.path = dir + "/libsrtp_helper"
		build := exec.Command(gcc, "-O2", "-Wall", "-o", helper.path, "testdata/libsrtp_helper.c", "-lsrtp2")
		if out, err := build.CombinedOutput(); err != nil {
			helper.err = fmt.Errorf("build libsrtp helper: %w: %s", err, out)
		}
	})
	if helper.skip != "" {
		lab.SkipOrFail(t, helper.skip)
	}
	if helper.err != nil {
		t.Fatal(helper.err)
	}
	return helper.path
}

// libsrtp is one running helper: a libsrtp2 session protecting or
// unprotecting the packets it is given, in order.
type libsrtp struct {
	t      *testing.T
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *bytes.Buffer
}

func startLibsrtp(t *testing.T, mode string, c *sdes.Crypto, mki []byte) *libsrtp {
	t.Helper()
	mkiArg := "-"
	if len(mki) > 0 {
		mkiArg = hex.EncodeToString(mki)
	}
	keySalt := hex.EncodeToString(append(bytes.Clone(c.Key), c.Salt...))
	cmd := exec.Command(libsrtpHelper(t), mode, c.Suite.String(), keySalt, mkiArg)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	l := &libsrtp{t: t, in: in, out: bufio.NewReader(out), stderr: &bytes.Buffer{}}
	cmd.Stderr = l.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		_ = cmd.Wait()
	})
	return l
}

// do sends one packet ("rtp" or "rtcp") and returns libsrtp's result, or
// an error naming libsrtp's status.
func (l *libsrtp) do(kind string, pkt []byte) ([]byte, error) {
	l.t.Helper()
	if _, err := fmt.Fprintf(l.in, "%s %x\n", kind, pkt); err != nil {
		l.fatal(err)
	}
	line, err := l.out.ReadString('\n')
	if err != nil {
		l.fatal(err)
	}
	line = strings.TrimSpace(line)
	if rest, ok := strings.CutPrefix(line, "ERR "); ok {
		return nil, fmt.Errorf("libsrtp status %s", rest)
	}
	b, err := hex.DecodeString(line)
	if err != nil {
		l.t.Fatalf("helper output %q: %v", line, err)
	}
	return b, nil
}

func (l *libsrtp) fatal(err error) {
	l.t.Helper()
	if strings.Contains(l.stderr.String(), "srtp_create") {
		l.t.Skipf("this libsrtp2 build does not support the suite: %s", strings.TrimSpace(l.stderr.String()))
	}
	l.t.Fatalf("libsrtp helper: %v; stderr: %s", err, l.stderr)
}

// interopPackets returns RTP packets of several shapes: G.711 and G.729
// sizes, CSRCs, a header extension, a marker bit; sequence numbers cross a
// rollover.
func interopPackets() [][]byte {
	var pkts [][]byte
	for i := range 24 {
		seq := uint16(65520 + i) // wraps after 16 packets
		p := rtpPacket(seq, 0xcafe0001)
		switch i % 4 {
		case 1: // G.729
			p = p[:32]
		case 2: // two CSRCs and a one-byte-header extension
			h := []byte{0x92, 0x80 | 8, 0, 0, 0, 0, 0, 0, 0xca, 0xfe, 0, 1,
				0, 0, 0, 1, 0, 0, 0, 2,
				0xbe, 0xde, 0, 1, 0x10, 0xaa, 0, 0}
			binary.BigEndian.PutUint16(h[2:], seq)
			p = append(h, p[12:100]...)
		case 3:
			p[1] |= 0x80
		}
		pkts = append(pkts, p)
	}
	return pkts
}

func TestLibsrtpInterop(t *testing.T) {
	libsrtpHelper(t)
	for _, s := range sdes.Suites {
		for _, mki := range [][]byte{nil, {0xde, 0xad, 0xbe, 0xef}} {
			t.Run(fmt.Sprintf("%s/mki=%x", s, mki), func(t *testing.T) {
				c, err := sdes.Generate(1, s)
				if err != nil {
					t.Fatal(err)
				}
				cfg := Config{Suite: s, Key: c.Key, Salt: c.Salt, MKI: mki}
				t.Run("libsrtp-to-srtpflow", func(t *testing.T) { fromLibsrtp(t, c, cfg) })
				t.Run("srtpflow-to-libsrtp", func(t *testing.T) { toLibsrtp(t, c, cfg) })
			})
		}
	}
}

func fromLibsrtp(t *testing.T, c *sdes.Crypto, cfg Config) {
	l := startLibsrtp(t, "protect", c, cfg.MKI)
	d, err := NewDecrypter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 0, 512)
	var last []byte
	for i, plain := range interopPackets() {
		enc, err := l.do("rtp", plain)
		if err != nil {
			t.Fatalf("packet %d: protect: %v", i, err)
		}
		if i == 5 {
			// Forged: one bit flipped in the payload, then in the tag.
			tagEnd := len(enc) // AES-CM: ...|MKI|tag; GCM: ...|tag|MKI
			if cfg.Suite.AEAD() {
				tagEnd -= len(cfg.MKI)
			}
			for _, off := range []int{len(enc) / 2, tagEnd - 1} {
				f := bytes.Clone(enc)
				f[off] ^= 0x04
				if _, err := d.DecryptRTP(out, f); err != ErrAuth {
					t.Errorf("packet %d with byte %d flipped: %v, want ErrAuth", i, off, err)
				}
			}
		}
		got, err := d.DecryptRTP(out, enc)
		if err != nil {
			t.Fatalf("packet %d (seq %d): %v", i, binary.BigEndian.Uint16(plain[2:]), err)
		}
		if !bytes.Equal(got, plain) {
			t.Fatalf("packet %d: got  %x\nwant %x", i, got, plain)
		}
		last = enc
	}
	if _, err := d.DecryptRTP(out, last); err != ErrReplay {
		t.Errorf("replayed SRTP packet: %v, want ErrReplay", err)
	}

	var lastRTCP []byte
	for i := range 5 {
		plain := rtcpPacket(0xcafe0001)
		plain[20] = byte(i)
		enc, err := l.do("rtcp", plain)
		if err != nil {
			t.Fatalf("rtcp %d: protect: %v", i, err)
		}
		if i == 2 {
			f := bytes.Clone(enc)
			f[12] ^= 0x80
			if _, err := d.DecryptRTCP(out, f); err != ErrAuth {
				t.Errorf("forged SRTCP: %v, want ErrAuth", err)
			}
		}
		got, err := d.DecryptRTCP(out, enc)
		if err != nil {
			t.Fatalf("rtcp %d: %v", i, err)
		}
		if !bytes.Equal(got, plain) {
			t.Fatalf("rtcp %d: got  %x\nwant %x", i, got, plain)
		}
		lastRTCP = enc
	}
	if _, err := d.DecryptRTCP(out, lastRTCP); err != ErrReplay {
		t.Errorf("replayed SRTCP packet: %v, want ErrReplay", err)
	}
}

func toLibsrtp(t *testing.T, c *sdes.Crypto, cfg Config) {
	l := startLibsrtp(t, "unprotect", c, cfg.MKI)
	e, err := NewEncrypter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 512)
	for i, plain := range interopPackets() {
		enc, err := e.EncryptRTP(buf, plain)
		if err != nil {
			t.Fatal(err)
		}
		got, err := l.do("rtp", enc)
		if err != nil {
			t.Fatalf("packet %d: libsrtp unprotect: %v", i, err)
		}
		if !bytes.Equal(got, plain) {
			t.Fatalf("packet %d: got  %x\nwant %x", i, got, plain)
		}
	}
	// libsrtp 2.5 cannot unprotect SRTCP carrying an MKI under the _32
	// suites, not even its own packets: it locates the MKI with the SRTP
	// (4-byte) tag length instead of SRTCP's 10 bytes and answers
	// srtp_err_status_bad_mki. There, check instead that srtpflow's SRTCP
	// equals libsrtp's own protect output byte for byte (AES-CM is
	// deterministic for the same key, SSRC and SRTCP index).
	var lp *libsrtp
	if len(cfg.MKI) > 0 && cfg.Suite.RTPTagLen() == 4 {
		t.Logf("%s with MKI: libsrtp 2.5 cannot unprotect such SRTCP; comparing with libsrtp's protect output", cfg.Suite)
		lp = startLibsrtp(t, "protect", c, cfg.MKI)
	}
	for i := range 5 {
		plain := rtcpPacket(0xcafe0001)
		plain[20] = byte(i)
		enc, err := e.EncryptRTCP(buf, plain)
		if err != nil {
			t.Fatal(err)
		}
		if lp != nil {
			want, err := lp.do("rtcp", plain)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc, want) {
				t.Fatalf("rtcp %d: srtpflow %x\nlibsrtp  %x", i, enc, want)
			}
			continue
		}
		got, err := l.do("rtcp", enc)
		if err != nil {
			t.Fatalf("rtcp %d: libsrtp unprotect: %v", i, err)
		}
		if !bytes.Equal(got, plain) {
			t.Fatalf("rtcp %d: got  %x\nwant %x", i, got, plain)
		}
	}
}

func osMkdirTemp() (string, error) { return os.MkdirTemp("", "srtpflow-libsrtp") }
