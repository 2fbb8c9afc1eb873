// Package cmmsg runs a minimal C recvmmsg/sendmmsg UDP relay (cmmsg.c) in
// a lab namespace, the yardstick relayd's userspace workers are
// benchmarked against in the same run (voipgen fwdbench), as lab/minfwd is
// for relayd's XDP program. The packets reach it the way they reach
// relayd's workers: relayd's own sk_lookup program (slowpath.Steering)
// hands every flow's relay address and port to its one socket. The C
// source is embedded and compiled with the system's C compiler on first
// use, cached under the user's cache directory. Benchmarks and tests only;
// nothing in relayd uses it.
package cmmsg

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/lab"
	"github.com/relayd/relayd/slowpath"
)

//go:embed csrc/cmmsg.c
var source []byte

// cflags are the compiler flags the relay is built with.
var cflags = []string{"-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"}

var (
	buildMu  sync.Mutex
	buildBin string
)

// Build compiles the relay with $CC (default cc) the first time it is
// needed for this source, compiler and flags, and returns the binary's
// path. Binaries are cached under os.UserCacheDir()/relayd-cmmsg (the
// temporary directory without one), named by a hash of all three.
func Build() (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildBin != "" {
		if _, err := os.Stat(buildBin); err == nil {
			return buildBin, nil
		}
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	ver, err := exec.Command(cc, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("no C compiler %q (Debian package gcc): %w", cc, err)
	}
	h := sha256.New()
	for _, b := range [][]byte{source, ver, []byte(strings.Join(cflags, " "))} {
		h.Write(b)
		h.Write([]byte{0})
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "relayd-cmmsg")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "cmmsg-"+hex.EncodeToString(h.Sum(nil)[:8]))
	if _, err := os.Stat(bin); err != nil {
		// Built under a name of its own and renamed: processes building
		// at once never run a half-written binary.
		tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
		args := append(append([]string{}, cflags...), "-o", tmp, "-x", "c", "-")
		cmd := exec.Command(cc, args...)
		cmd.Stdin = bytes.NewReader(source)
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("build cmmsg.c with %s: %w\n%s", cc, err, out)
		}
		if err := os.Rename(tmp, bin); err != nil {
			os.Remove(tmp)
			return "", err
		}
	}
	buildBin = bin
	return bin, nil
}

// Flow is one relayed direction: a datagram to Match from Source is sent
// from From to To. A zero Source takes any source, a Source port of 0 any
// port. IPv4 only.
type Flow struct {
	Match, Source, From, To netip.AddrPort
}

func (f Flow) line() (string, error) {
	src := "-"
	if f.Source.IsValid() {
		src = f.Source.String()
	}
	for _, ap := range []netip.AddrPort{f.Match, f.From, f.To, f.Source} {
		if ap.IsValid() && !ap.Addr().Is4() {
			return "", fmt.Errorf("flow %s: %s is not IPv4", f.Match, ap)
		}
	}
	if !f.Match.IsValid() || !f.From.IsValid() || !f.To.IsValid() {
		return "", fmt.Errorf("flow %+v: Match, From and To must be set", f)
	}
	return fmt.Sprintf("%s %s %s %s\n", f.Match, src, f.From, f.To), nil
}

// Counters are the relay's packet counts since it started.
type Counters struct {
	Received    uint64 // datagrams read
	Forwarded   uint64 // taken by sendmmsg
	NoFlow      uint64 // to no flow's Match
	WrongSource uint64 // from another source than their flow's
	Truncated   uint64 // larger than its 2,048-byte buffers
	SendFailed  uint64 // refused by sendmmsg
	Batches     uint64 // recvmmsg calls that returned datagrams
}

// Dropped is what the relay received and did not forward.
func (c Counters) Dropped() uint64 {
	return c.NoFlow + c.WrongSource + c.Truncated + c.SendFailed
}

// statsWords is the number of uint64 counters in cmmsg.c's struct stats.
const statsWords = 7

// Relay is a running cmmsg process and the steering into its socket.
type Relay struct {
	cmd    *exec.Cmd
	steer  *slowpath.Steering
	stats  []byte // the counters' page, shared with the process
	stderr *tailBuffer
	exited chan struct{}
}

// rcvBuf is the receive buffer of the relay's socket: a relayd worker's.
const rcvBuf = 8 << 20

// Start builds the relay if needed and runs it in ns with flows, pinned
// to cpu (none if cpu < 0). Its socket is a UDP socket bound to an
// ephemeral port with IP_RECVORIGDSTADDR, created here in ns; the steering
// program attached to ns hands it every packet to a flow's Match.
func Start(ns *lab.NS, cpu int, flows []Flow) (_ *Relay, err error) {
	if len(flows) == 0 {
		return nil, errors.New("cmmsg: no flows")
	}
	var text strings.Builder
	for _, f := range flows {
		l, err := f.line()
		if err != nil {
			return nil, err
		}
		text.WriteString(l)
	}
	bin, err := Build()
	if err != nil {
		return nil, err
	}
	r := &Relay{stderr: &tailBuffer{max: 4096}, exited: make(chan struct{})}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	rx, err := socket(ns)
	if err != nil {
		return nil, err
	}
	defer rx.Close()
	statsFD, err := unix.MemfdCreate("cmmsg-stats", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("counters: %w", err)
	}
	statsFile := os.NewFile(uintptr(statsFD), "cmmsg-stats")
	defer statsFile.Close()
	if err := unix.Ftruncate(statsFD, 4096); err != nil {
		return nil, fmt.Errorf("counters: %w", err)
	}
	if r.stats, err = unix.Mmap(statsFD, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("counters: %w", err)
	}
	if r.steer, err = slowpath.NewSteering(ns.Path(), len(flows)); err != nil {
		return nil, err
	}
	if err := r.steer.SetSocket(0, int(rx.Fd())); err != nil {
		return nil, err
	}
	for _, f := range flows {
		if err := r.steer.Steer(f.Match, 0); err != nil {
			return nil, err
		}
	}
	// ExtraFiles are the child's fds 3, 4, ...
	args := []string{"-r", "3", "-s", "4"}
	if cpu >= 0 {
		args = append(args, "-c", strconv.Itoa(cpu))
	}
	r.cmd = ns.Command(bin, args...)
	r.cmd.ExtraFiles = []*os.File{rx, statsFile}
	r.cmd.Stdin = strings.NewReader(text.String())
	r.cmd.Stderr = r.stderr
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := r.cmd.Start(); err != nil {
		r.cmd = nil
		return nil, fmt.Errorf("start cmmsg: %w", err)
	}
	go func() {
		r.cmd.Wait()
		close(r.exited)
	}()
	if err := r.waitReady(out, len(flows)); err != nil {
		return nil, err
	}
	return r, nil
}

// socket creates the relay's receiving socket in ns.
func socket(ns *lab.NS) (*os.File, error) {
	fd := -1
	err := ns.Do(func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf); err != nil {
			return fmt.Errorf("SO_RCVBUFFORCE: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_RECVORIGDSTADDR, 1); err != nil {
			return fmt.Errorf("IP_RECVORIGDSTADDR: %w", err)
		}
		return unix.Bind(fd, &unix.SockaddrInet4{})
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("cmmsg socket: %w", err)
	}
	return os.NewFile(uintptr(fd), "cmmsg-rx"), nil
}

// waitReady waits for the relay's "ready N" line.
func (r *Relay) waitReady(out io.Reader, flows int) error {
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- s
	}()
	want := fmt.Sprintf("ready %d\n", flows)
	select {
	case s := <-line:
		if s == want {
			return nil
		}
		// Most likely it failed and exited: wait a little for its stderr.
		select {
		case <-r.exited:
		case <-time.After(time.Second):
		}
		return fmt.Errorf("cmmsg: said %q, want %q: %s", s, want, r.stderr)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("cmmsg: not ready after 10 s: %s", r.stderr)
	}
}

// Pid is the relay process's id (ip netns exec execs it: no process in
// between).
func (r *Relay) Pid() int { return r.cmd.Process.Pid }

// Counters returns the relay's counters as of its last batch.
func (r *Relay) Counters() Counters {
	var w [statsWords]uint64
	for i := range w {
		w[i] = atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.stats[8*i])))
	}
	return Counters{Received: w[0], Forwarded: w[1], NoFlow: w[2], WrongSource: w[3], Truncated: w[4], SendFailed: w[5], Batches: w[6]}
}

// Close stops the relay (SIGTERM, then SIGKILL after 2 s) and removes the
// steering. An error reports a relay that had exited by itself.
func (r *Relay) Close() error {
	var errs []error
	if r.cmd != nil {
		select {
		case <-r.exited:
			errs = append(errs, fmt.Errorf("cmmsg exited: %v: %s", r.cmd.ProcessState, r.stderr))
		default:
			r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.exited:
			case <-time.After(2 * time.Second):
				r.cmd.Process.Kill()
				<-r.exited
			}
		}
		r.cmd = nil
	}
	errs = append(errs, r.steer.Close())
	r.steer = nil
	if r.stats != nil {
		errs = append(errs, unix.Munmap(r.stats))
		r.stats = nil
	}
	return errors.Join(errs...)
}

// tailBuffer keeps the last max bytes written to it: the relay's stderr.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = b.buf[len(b.buf)-b.max:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(string(b.buf))
}
