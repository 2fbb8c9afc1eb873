// Package pktio holds the packet code the relay's userspace workers
// (slowpath) and the traffic generators (voipgen) share: the Internet
// checksum, struct mmsghdr for sendmmsg and recvmmsg, the kernel's receive
// timestamps, and an AF_XDP socket for transmitting whole frames (XSK).
//
// Nothing here allocates per packet. Everything is safe for concurrent use
// except an XSK, which belongs to one thread at a time.
package pktio
