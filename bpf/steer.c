// SPDX-License-Identifier: GPL-3.0-or-later
/*
 * relayd socket steering (BPF_PROG_TYPE_SK_LOOKUP): every UDP packet to a
 * relay address and port that the userspace data plane carries is handed
 * to the socket of the worker that owns the flow. One socket per worker and
 * family receives the traffic of thousands of ports, so a worker batches
 * across flows with recvmmsg and learns each packet's port from
 * IP_RECVORIGDSTADDR. Packets to ports no worker owns take the normal
 * socket lookup.
 */
#include <linux/bpf.h>
#include <bpf_helpers.h>

#define IPPROTO_UDP 17
#define AF_INET 2
#define AF_INET6 10

/* Same layout as the XDP program's flow_key. */
struct steer_key {
	__u8 family;
	__u8 pad;
	__be16 port;
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct steer_key);
	__type(value, __u32); /* index into sockets */
	__uint(max_entries, 65536);
} steer SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 512); /* worker * 2 + (IPv6 ? 1 : 0) */
} sockets SEC(".maps");

SEC("sk_lookup")
int relay_steer(struct bpf_sk_lookup *ctx)
{
	if (ctx->protocol != IPPROTO_UDP)
		return SK_PASS;
	struct steer_key k = {};
	k.family = ctx->family;
	k.port = __builtin_bswap16((__u16)ctx->local_port);
	if (ctx->family == AF_INET) {
		__builtin_memcpy(k.addr, &ctx->local_ip4, 4);
	} else if (ctx->family == AF_INET6) {
		__builtin_memcpy(k.addr, ctx->local_ip6, 16);
	} else {
		return SK_PASS;
	}
	__u32 *idx = bpf_map_lookup_elem(&steer, &k);
	if (!idx)
		return SK_PASS;
	__u32 i = *idx;
	struct bpf_sock *sk = bpf_map_lookup_elem(&sockets, &i);
	if (!sk)
		return SK_PASS;
	bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	return SK_PASS;
}

char __license[] SEC("license") = "GPL";
