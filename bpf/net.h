/* SPDX-License-Identifier: GPL-3.0-or-later */
/*
 * The wire headers relayd's XDP programs parse (relay.c, xsk.c, and the
 * benchmarks' minfwd.c and sink.c), declared here once: there is no vmlinux
 * BTF to take them from on the kernels relayd runs on, and the kernel's
 * uapi headers pull in more than -nostdinc allows.
 */
#ifndef RELAYD_BPF_NET_H
#define RELAYD_BPF_NET_H

#include <linux/bpf.h>

struct ethhdr {
	__u8 h_dest[6];
	__u8 h_source[6];
	__be16 h_proto;
} __attribute__((packed));

struct iphdr {
	__u8 ihl_version; /* ihl in the low nibble on little endian */
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__sum16 check;
	__be32 saddr;
	__be32 daddr;
};

struct ipv6hdr {
	__be32 vtc_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

struct udphdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__sum16 check;
};

#endif
