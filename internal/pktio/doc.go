// Package pktio holds the packet code the relay's userspace workers
// (slowpath) and the traffic generator (voipgen) share: the Internet
// checksum, struct mmsghdr for sendmmsg and recvmmsg, and the kernel's
// receive timestamps.
//
// Everything here is safe for concurrent use and allocates nothing.
package pktio
