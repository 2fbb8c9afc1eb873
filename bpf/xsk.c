// SPDX-License-Identifier: GPL-3.0-or-later
/*
 * relayd AF_XDP receive (dataplane.userspace_io = "afxdp"): in dataplane
 * mode userspace, every UDP packet to a relay address and port the
 * userspace workers carry is redirected from the driver into the XDP socket
 * of the worker that owns the flow, skipping the kernel's IP and UDP
 * receive path, the socket steering and recvmmsg. The worker is looked up
 * in the same map the sk_lookup program (steer.c) uses; relayd loads this
 * program with that map, so one update steers both ways. An XDP socket is
 * bound to one device queue: the worker's socket for this packet is at
 * (worker * devices + dev_index) * XSK_QUEUES + rx queue in the XSKMAP,
 * where relayd loads the program once per device with its dev_index.
 *
 * Everything else takes the kernel's path, which is today's socket path:
 * packets to other addresses or ports, IPv4 with options or fragmented,
 * IPv6 with extension headers, VLAN-tagged frames, and packets for a slot
 * without a socket (bpf_redirect_map's XDP_PASS fallback). The program
 * does not verify checksums: the worker does, before it relays.
 *
 * In front of the packet (XDP metadata, copied into the socket's frame)
 * the program writes its receive time, bpf_ktime_get_ns (CLOCK_MONOTONIC),
 * for the worker's per-packet delay and its RFC 3550 arrival times.
 */
#include <linux/bpf.h>
#include <bpf_helpers.h>
#include "net.h"
#include "xsk.h"

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define IPPROTO_UDP 17
#define AF_INET 2
#define AF_INET6 10

/* Same layout as steer.c's steer_key (and the XDP program's flow_key). */
struct steer_key {
	__u8 family;
	__u8 pad;
	__be16 port;
	__u8 addr[16];
};

/* Replaced at load by the sk_lookup program's map (Steering.steer). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct steer_key);
	__type(value, __u32); /* worker index */
	__uint(max_entries, 65536);
} steer SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 256 * XSK_QUEUES); /* set at load: workers * devices * XSK_QUEUES */
} xsks SEC(".maps");

/* Set at load: this attachment's device among the pool's devices. */
volatile const __u32 dev_index = 0;
volatile const __u32 devices = 1;

#define bswap16(x) __builtin_bswap16(x)

SEC("xdp")
int relay_xsk(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	struct steer_key k = {};
	struct udphdr *udp;
	if (eth->h_proto == bswap16(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end)
			return XDP_PASS;
		/* Version 4, no options, not a fragment (MF or an offset). */
		if (ip->ihl_version != 0x45 || ip->protocol != IPPROTO_UDP || (ip->frag_off & bswap16(0x3fff)))
			return XDP_PASS;
		udp = (void *)(ip + 1);
		k.family = AF_INET;
		__builtin_memcpy(k.addr, &ip->daddr, 4);
	} else if (eth->h_proto == bswap16(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end)
			return XDP_PASS;
		if ((ip6->vtc_flow & 0xf0) != 0x60 || ip6->nexthdr != IPPROTO_UDP)
			return XDP_PASS;
		udp = (void *)(ip6 + 1);
		k.family = AF_INET6;
		__builtin_memcpy(k.addr, ip6->daddr, 16);
	} else {
		return XDP_PASS;
	}
	if ((void *)(udp + 1) > end)
		return XDP_PASS;
	k.port = udp->dest;
	__u32 *worker = bpf_map_lookup_elem(&steer, &k);
	if (!worker)
		return XDP_PASS;
	return xsk_redirect(ctx, &xsks, *worker, dev_index, devices);
}

char __license[] SEC("license") = "GPL";
