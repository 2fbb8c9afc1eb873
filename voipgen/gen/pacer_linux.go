package gen

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// pacer waits for absolute CLOCK_MONOTONIC deadlines: a long wait on a
// timerfd read through Go's network poller, a short one in
// clock_nanosleep.
//
// A goroutine sleeping in a system call keeps its P, and the runtime's
// monitor takes the P back once the call has lasted 10 ms; having done
// something, the monitor starts polling again every 20 us. A sender with
// a few streams, sleeping most of each 20 ms ptime in clock_nanosleep,
// made the monitor wake some 2,500 times a second: two thirds of an idle
// `voipgen call`'s CPU (perf). Parked on a timerfd the goroutine holds no
// P, the monitor backs off (a caller of 2 calls: 15% of a CPU before, 3%
// after), and the kernel's high-resolution timer still ends the wait
// (some 20 us later than clock_nanosleep, for the hand-over to the locked
// thread). A wait shorter than longWait ends before the monitor would
// take the P, so it stays a clock_nanosleep: that is a loaded sender's
// case, where the extra hand-over would cost.
//
// A nil *pacer always sleeps in clock_nanosleep.
type pacer struct {
	f   *os.File // the timerfd, in the poller
	fd  int      // the same, for timerfd_settime (f.Fd would make it blocking)
	buf [8]byte
}

const longWait = 5 * time.Millisecond

func newPacer() (*pacer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("timerfd_create", err)
	}
	return &pacer{f: os.NewFile(uintptr(fd), "timerfd"), fd: fd}, nil
}

// until returns at CLOCK_MONOTONIC t (ns) or later.
func (p *pacer) until(t int64) {
	if p == nil || t-MonoNow() < int64(longWait) || p.wait(t) != nil {
		SleepUntil(t)
	}
}

// wait parks on the timerfd until t.
func (p *pacer) wait(t int64) error {
	its := unix.ItimerSpec{Value: unix.NsecToTimespec(t)}
	if err := unix.TimerfdSettime(p.fd, unix.TFD_TIMER_ABSTIME, &its, nil); err != nil {
		return os.NewSyscallError("timerfd_settime", err)
	}
	_, err := p.f.Read(p.buf[:])
	return err
}

func (p *pacer) close() error { return p.f.Close() }
