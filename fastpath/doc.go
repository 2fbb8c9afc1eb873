// Package fastpath loads relayd's XDP program (bpf/relay.c), attaches it to
// the configured interfaces, pins program, maps and links under
// /sys/fs/bpf/relayd/<layout version>/ so forwarding survives a daemon
// restart, and implements dataplane.DataPlane on the BPF flow map.
package fastpath
