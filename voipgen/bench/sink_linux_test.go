package bench

import (
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/relayd/relayd/lab/measure"
)

// TestSinkPause: a paused sink's thread does not wake (the SIP phase's
// calls have the CPUs to themselves), and what arrived meanwhile is
// counted once it resumes.
func TestSinkPause(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	k := &fwdSink{fd: fd, fd2: -1}
	k.tid = k.start(fd)
	defer k.close()
	// wakeups is the sink thread's count of times it ran (schedstat's
	// third field) over d.
	wakeups := func(d time.Duration) uint64 {
		t.Helper()
		path := "/proc/self/task/" + strconv.Itoa(k.tid) + "/schedstat"
		read := func() uint64 {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			_, _, n, err := measure.ParseSchedstat(b)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		n0 := read()
		time.Sleep(d)
		return read() - n0
	}
	if n := wakeups(300 * time.Millisecond); n < 50 {
		t.Fatalf("running sink: %d wakeups in 300 ms, want about 300 (1 ms ticks)", n)
	}
	k.pause()
	time.Sleep(5 * time.Millisecond) // the tick in progress ends
	if n := wakeups(300 * time.Millisecond); n > 3 {
		t.Errorf("paused sink: %d wakeups in 300 ms, want none", n)
	}
	tx, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tx)
	if err := unix.Sendto(tx, make([]byte, 20), 0, sa); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if n := k.total.Load(); n != 0 {
		t.Errorf("paused sink counted %d packets", n)
	}
	k.resume()
	deadline := time.Now().Add(2 * time.Second)
	for k.total.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := k.total.Load(); n != 1 {
		t.Errorf("resumed sink counted %d packets, want the 1 sent while paused", n)
	}
}
