// SPDX-License-Identifier: GPL-3.0-or-later
/*
 * The benchmarks' XDP sink (voipgen bench --sink xdp), benchmarks only:
 * attached to the lab's end hosts' veths, it counts every IPv4 UDP datagram
 * to one of two ports by its RTP SSRC, as the bench's recvmmsg sink does
 * (bits 0-15 the stream, bits 16-23 the run), and drops it. Everything else
 * (ARP, SIP, IPv6, fragments, other ports) passes to the kernel untouched.
 *
 * Counters are per-CPU arrays the bench reads after each run. No helper
 * but map lookups: it loads on Linux 6.1 as well as on current kernels.
 */
#include <linux/bpf.h>
#include <bpf_helpers.h>
#include <bpf_endian.h>
#include "net.h"

#define ETH_P_IP 0x0800
#define IPPROTO_UDP 17

/* The two UDP destination ports counted (host byte order), set at load. */
volatile const __u16 sink_port_a = 0;
volatile const __u16 sink_port_b = 0;

#define SINK_STREAMS 65536
#define SINK_RUNS 256
/* sink_runs[SINK_TOTAL]: every datagram to a sink port, RTP or not. */
#define SINK_TOTAL SINK_RUNS

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SINK_STREAMS);
} sink_streams SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SINK_RUNS + 1);
} sink_runs SEC(".maps");

static __always_inline void count(void *map, __u32 key)
{
	__u64 *v = bpf_map_lookup_elem(map, &key);
	if (v)
		*v += 1; /* per-CPU: no other writer */
}

SEC("xdp")
int sink_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	/* No IP options (the lab's senders write none), no fragments. */
	if (ip->ihl_version != 0x45 || ip->protocol != IPPROTO_UDP || (ip->frag_off & bpf_htons(0x3fff)))
		return XDP_PASS;
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end)
		return XDP_PASS;
	__u16 port = bpf_ntohs(udp->dest);
	if (port == 0 || (port != sink_port_a && port != sink_port_b))
		return XDP_PASS;
	count(&sink_runs, SINK_TOTAL);
	__u8 *rtp = (void *)(udp + 1);
	if ((void *)(rtp + 12) > end || bpf_ntohs(udp->len) < sizeof(*udp) + 12)
		return XDP_DROP;
	count(&sink_streams, (__u32)rtp[10] << 8 | rtp[11]);
	count(&sink_runs, rtp[9]);
	return XDP_DROP;
}

char _license[] SEC("license") = "GPL";
