// Package slowpath is relayd's userspace data plane: a pool of workers, one
// per CPU, each on its own OS thread pinned to its CPU. It relays every flow
// in dataplane.mode "userspace", the flows XDP hands over (SRTP, later
// transcoding), and the packets XDP punts.
//
// Structure. A relay with 10,000 calls has 20,000+ ports. One socket per
// port would cost an epoll wake-up and a system call per packet, and one
// goroutine per socket cannot be pinned. Instead a BPF sk_lookup program
// (bpf/steer.c) hands every packet addressed to a relay port that the pool
// carries to the socket of the worker that owns the flow: each worker has a
// single dual-stack UDP socket, reads up to 64 packets of any flows with one
// recvmmsg, learns each packet's relay address and port from
// IP_ORIGDSTADDR / IPV6_ORIGDSTADDR and its arrival time from
// SO_TIMESTAMPNS, and sends with one sendmmsg per family on raw sockets
// (IPPROTO_RAW, IPV6_HDRINCL), writing IP and UDP headers itself, so one
// system call sends packets of many flows from many source ports.
//
// Ownership. A flow belongs to one worker for its whole life (the one with
// the fewest flows when it is installed). Its counters, RFC 3550 state and
// SRTP contexts are that worker's alone: no locks or channel hops per
// packet. The control plane queues requests (install, update, remove,
// statistics) to the worker and wakes it through an eventfd; the worker
// answers between batches.
package slowpath
