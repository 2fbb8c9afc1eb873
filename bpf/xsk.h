/* SPDX-License-Identifier: GPL-3.0-or-later */
/*
 * The redirect into a userspace worker's AF_XDP socket, shared by the
 * AF_XDP receive program (xsk.c, mode userspace) and the relay program
 * (relay.c, mode xdp). The worker's socket for a packet is at
 * (worker * devices + device) * XSK_QUEUES + rx queue in the XSKMAP.
 */
#ifndef RELAYD_XSK_H
#define RELAYD_XSK_H

#include <linux/bpf.h>
#include <bpf_helpers.h>

/* Device queues a worker can have a socket on; slowpath's xskQueues. */
#define XSK_QUEUES 64

/* Set at load: 0 where the kernel refuses bpf_xdp_adjust_meta in XDP
 * programs (some hardened kernels do); the packets then go to the worker
 * without their receive time, and the worker takes the time it reads
 * them. */
volatile const __u32 xsk_meta = 1;

/* xsk_redirect redirects the packet into slot (worker, device, rx queue)
 * of the XSKMAP xsks, with its receive time, bpf_ktime_get_ns
 * (CLOCK_MONOTONIC), in front of it (XDP metadata, copied into the
 * socket's frame) for the worker's per-packet delay and its RFC 3550
 * arrival times (unless xsk_meta is 0). XDP_PASS when it cannot: a queue
 * past XSK_QUEUES, a driver without room for metadata, or no socket in
 * the slot (bpf_redirect_map's fallback). The packet's pointers are stale
 * after it. */
static __always_inline int xsk_redirect(struct xdp_md *ctx, void *xsks, __u32 worker, __u32 device, __u32 devices)
{
	__u32 q = ctx->rx_queue_index;
	if (q >= XSK_QUEUES)
		return XDP_PASS;
	__u32 slot = (worker * devices + device) * XSK_QUEUES + q;
	if (xsk_meta) {
		if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(__u64)))
			return XDP_PASS;
		__u64 *meta = (void *)(long)ctx->data_meta;
		if ((void *)(meta + 1) > (void *)(long)ctx->data)
			return XDP_PASS;
		*meta = bpf_ktime_get_ns();
	}
	return bpf_redirect_map(xsks, slot, XDP_PASS);
}

#endif
