// Command voipgen generates and analyses VoIP media traffic.
//
//	voipgen send --dst ADDR:PORT --streams N --codec pcmu|pcma|g729 --ptime 20ms --duration 10s
//	voipgen recv --listen ADDR:PORT-PORT --duration 12s [--json]
//	voipgen call --sip ADDR:PORT --target sip:USER@HOST:PORT --calls N --rate R
//	voipgen answer --sip ADDR:PORT --personality answer|ring|reject:CODE|silent
//	voipgen bench [--calls 250,500,...] [--with-rtpengine] [--out DIR] [--json]
//	voipgen kmodbench --vm [--calls 20] [--repeat 3]
//	voipgen fwtest [--quick] [--out DIR] [--json]
//	voipgen soak [--calls 1000] [--duration 10m] [--json] [--out FILE]
//
// Subcommands use the standard flag package, one FlagSet each: it accepts
// --flag as well as -flag, needs no dependency, and the few flags here do not
// justify a CLI framework.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: voipgen <command> [flags]

commands:
  send   send the RTP of N calls (G.711, G.729, Opus sizes; SRTP), paced per ptime
  recv   receive RTP streams on a port range and report loss, jitter, gaps
  call   place SIP calls with RTP both ways and report setup times and media
  answer answer SIP calls (or ring, reject, stay silent) with RTP both ways
  pacebench  lab benchmark: pacing of voipgen send vs SIPp rtp_stream at 1,000 and 2,000 calls (root)
  fwtest lab experiment: a redundant firewall pair (keepalived, conntrackd): zero-loss rate and failover glitch (root)
  fwdbench  lab benchmark: zero-loss rate and CPU per packet, relayd XDP vs kernel forwarding (root)
  bench  lab comparison: relayd XDP vs userspace vs SRTP (and rtpengine) over concurrent calls: CPU, loss, table and plots (root)
  kmodbench  lab comparison: relayd XDP vs rtpengine's kernel module, same calls, in Debian 6.1 under qemu with --vm (root)
  demo   relay RTP both ways through relayd's XDP in a namespace lab and report (root)
  soak   lab soak: SIP calls with media through relayd's XDP for minutes under spoofed media and malformed SIP: loss, heap, goroutines (root)

Run "voipgen <command> -h" for the flags of a command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "send":
		err = runSend(ctx, os.Args[2:], os.Stdout)
	case "recv":
		err = runRecv(ctx, os.Args[2:], os.Stdout)
	case "call":
		err = runCall(ctx, os.Args[2:], os.Stdout)
	case "answer":
		err = runAnswer(ctx, os.Args[2:], os.Stdout)
	case "pacebench":
		err = runPacebench(ctx, os.Args[2:], os.Stdout)
	case "fwtest":
		err = runFwtest(ctx, os.Args[2:], os.Stdout)
	case "fwdbench":
		err = runFwdbench(ctx, os.Args[2:], os.Stdout)
	case "bench":
		err = runBench(ctx, os.Args[2:], os.Stdout)
	case "kmodbench":
		err = runKmodbench(ctx, os.Args[2:], os.Stdout)
	case "demo":
		err = runDemo(ctx, os.Args[2:], os.Stdout)
	case "soak":
		err = runSoak(ctx, os.Args[2:], os.Stdout)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "voipgen: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	// -h is an answer, not a failure: the flag set printed the usage.
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "voipgen %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
