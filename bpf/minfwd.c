// SPDX-License-Identifier: GPL-3.0-or-later
/*
 * A minimal XDP IPv4 forwarder, for benchmarks only: the yardstick relayd's
 * own program is measured against in the same run (a reference relay of
 * docs/architecture.md: fib lookup, rewrite, DEVMAP redirect). It
 * forwards IPv4 by route like the kernel: no flows, no statistics, no
 * address rewrite beyond MACs and TTL.
 */
#include <linux/bpf.h>
#include <bpf_helpers.h>
#include <bpf_endian.h>
#include "net.h"

#define ETH_P_IP 0x0800
#define AF_INET 2

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__type(key, __u32);
	__type(value, struct bpf_devmap_val);
	__uint(max_entries, 64);
} min_ports SEC(".maps");

SEC("xdp")
int min_fwd(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->ttl <= 1)
		return XDP_PASS;
	struct bpf_fib_lookup fib = {};
	fib.family = AF_INET;
	fib.tos = ip->tos;
	fib.l4_protocol = ip->protocol;
	fib.tot_len = bpf_ntohs(ip->tot_len);
	fib.ipv4_src = ip->saddr;
	fib.ipv4_dst = ip->daddr;
	fib.ifindex = ctx->ingress_ifindex;
	if (bpf_fib_lookup(ctx, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_SUCCESS)
		return XDP_PASS;
	/* TTL decrement with the usual incremental checksum (RFC 1624). */
	__u32 check = ip->check;
	check += bpf_htons(0x0100);
	ip->check = (__u16)(check + (check >= 0xFFFF));
	ip->ttl--;
	__builtin_memcpy(eth->h_dest, fib.dmac, 6);
	__builtin_memcpy(eth->h_source, fib.smac, 6);
	return bpf_redirect_map(&min_ports, fib.ifindex, 0);
}

char __license[] SEC("license") = "GPL";
