// SPDX-License-Identifier: GPL-3.0-or-later
/*
 * relayd redirect monitor: sees the frames the kernel refuses to send after
 * the relay program redirected them through its DEVMAP (tx_ports), counts
 * them per egress device and tells relayd at once through a ring buffer, so
 * that it punts the flows toward that device to userspace.
 *
 * Where a refusal shows up depends on the kernel. From 6.3 the devmap
 * checks a device's XDP features when it enqueues the frame and the
 * xdp_redirect_err tracepoint fires (err -EOPNOTSUPP for a veth whose peer
 * has neither an XDP program nor GRO). Before, the enqueue succeeds, the
 * driver refuses the bulk at flush time and xdp_devmap_xmit reports it
 * (drops > 0; err -ENXIO for the same veth on 6.1). 6.1 names the map
 * variant of the first xdp_redirect_map_err; 6.18 has only
 * xdp_redirect_err.
 *
 * The programs are raw tracepoints: they read the tracepoints' arguments,
 * not the records tracefs formats (a classic tracepoint needs
 * perf_event_open, which Debian's kernels allow only with CAP_SYS_ADMIN).
 * There is no vmlinux BTF to read a struct net_device with, so
 * xdp_devmap_xmit's devices are known by address: the redirect probe
 * teaches the program each device's. The probe is one frame that
 * redirect_probe sends into a device through its own DEVMAP (probe_ports),
 * run by relayd with BPF_PROG_TEST_RUN in live-frame mode, which redirects
 * and flushes on the CPU it runs on with bottom halves off: a flag per CPU
 * tells the probe's events from the relay's.
 */
#include <linux/bpf.h>
#include <bpf_helpers.h>

#define MAX_IFINDEX 4096 /* as tx_ports in relay.c */

/* Arguments of xdp_redirect_err and xdp_redirect_map_err: (dev, xdp,
 * tgt, err, map_type, map_id, index); of xdp_devmap_xmit: (from_dev,
 * to_dev, sent, drops, err). The kernel refuses to attach a program that
 * reads more arguments than a tracepoint has. */
#define REDIRECT_ERR_ERR 3
#define REDIRECT_ERR_MAP_ID 5
#define REDIRECT_ERR_INDEX 6
#define DEVMAP_XMIT_TO_DEV 1
#define DEVMAP_XMIT_SENT 2
#define DEVMAP_XMIT_DROPS 3
#define DEVMAP_XMIT_ERR 4

struct redirmon_config {
	__u32 relay_map_id; /* tx_ports */
	__u32 probe_map_id; /* probe_ports */
};

enum dev_flags {
	DEV_F_ARMED = 1 << 0, /* the next refusal toward the device is reported */
};

struct egress_errors {
	__u64 frames;  /* frames refused */
	__s32 err;     /* the last refusal's error (negative errno) */
	__u32 pad;
};

struct redirect_event {
	__u32 ifindex;
	__s32 err;
};

/* What the tracepoints saw of the last probe; relayd zeroes it before
 * each. */
struct probe_result {
	__u32 ifindex;
	__s32 err;
	__s32 sent;
	__s32 drops;
	__u32 flushes;          /* xdp_devmap_xmit events */
	__u32 enqueue_refusals; /* xdp_redirect_err events */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct redirmon_config);
	__uint(max_entries, 1);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32); /* enum dev_flags */
	__uint(max_entries, MAX_IFINDEX);
} devices SEC(".maps");

/* The ifindex of each device by the address of its struct net_device, as
 * the probe found it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, __u32);
	__uint(max_entries, MAX_IFINDEX);
} dev_addrs SEC(".maps");

/* Refusals of the relay program's frames, by egress ifindex. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct egress_errors);
	__uint(max_entries, MAX_IFINDEX);
} redirect_errors SEC(".maps");

/* The ifindex a probe frame is on its way to on this CPU; 0: none. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} probing SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct probe_result);
	__uint(max_entries, 1);
} probe_results SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__type(key, __u32);
	__type(value, struct bpf_devmap_val);
	__uint(max_entries, MAX_IFINDEX);
} probe_ports SEC(".maps");

/* Force the structs into BTF so bpf2go can export them. */
const struct redirect_event redirect_event_unused __attribute__((unused));
const enum dev_flags dev_flags_unused __attribute__((unused));

static __always_inline void relay_refused(__u32 ifindex, int err, __u64 frames)
{
	if (ifindex >= MAX_IFINDEX)
		return;
	struct egress_errors *e = bpf_map_lookup_elem(&redirect_errors, &ifindex);
	if (e) {
		e->frames += frames;
		e->err = err;
	}
	/* Drops without an error are a driver's transmit ring full: the
	 * device takes redirected frames, only not that many at once, and
	 * userspace would not drain the ring faster. They are counted, and
	 * reported only with an error (the driver refused the bulk). */
	if (err == 0)
		return;
	/* One event per arming: relayd re-arms the device when it puts it
	 * back into tx_ports. Two CPUs may both see the flag and report
	 * twice; relayd takes the second as a no-op. */
	__u32 *flags = bpf_map_lookup_elem(&devices, &ifindex);
	if (!flags || !(*flags & DEV_F_ARMED))
		return;
	*flags &= ~DEV_F_ARMED;
	struct redirect_event ev = {.ifindex = ifindex, .err = err};
	bpf_ringbuf_output(&events, &ev, sizeof(ev), 0);
}

/* xdp_redirect_err (6.18) and xdp_redirect_map_err (6.1): one frame the
 * devmap would not enqueue. Tracepoints are global: the map id tells the
 * relay's frames and the probe's from other programs' (another network
 * namespace's relayd). */
SEC("raw_tracepoint/xdp_redirect_err")
int redirect_err(struct bpf_raw_tracepoint_args *ctx)
{
	int err = (int)ctx->args[REDIRECT_ERR_ERR];
	__u32 map_id = (__u32)ctx->args[REDIRECT_ERR_MAP_ID];
	__u32 index = (__u32)ctx->args[REDIRECT_ERR_INDEX];
	__u32 k = 0;
	struct redirmon_config *c = bpf_map_lookup_elem(&config, &k);
	if (!c || map_id == 0)
		return 0;
	if (map_id == c->relay_map_id) {
		relay_refused(index, err, 1);
	} else if (map_id == c->probe_map_id) {
		__u32 *p = bpf_map_lookup_elem(&probing, &k);
		if (p)
			*p = 0;
		struct probe_result *r = bpf_map_lookup_elem(&probe_results, &k);
		if (r) {
			r->ifindex = index;
			r->err = err;
			r->enqueue_refusals++;
		}
	}
	return 0;
}

/* xdp_devmap_xmit: a bulk flushed to a device, and what the driver did not
 * take of it. It fires for every bulk a devmap flushes: the common case, a
 * relay bulk taken whole, returns at the second test. */
SEC("raw_tracepoint/xdp_devmap_xmit")
int devmap_xmit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 to = ctx->args[DEVMAP_XMIT_TO_DEV];
	int sent = (int)ctx->args[DEVMAP_XMIT_SENT];
	int drops = (int)ctx->args[DEVMAP_XMIT_DROPS];
	int err = (int)ctx->args[DEVMAP_XMIT_ERR];
	__u32 k = 0;
	__u32 *p = bpf_map_lookup_elem(&probing, &k);
	if (!p)
		return 0;
	if (*p) {
		/* The probe's bulk: its only frame, to the device the probe
		 * named. */
		__u32 ifindex = *p;
		*p = 0;
		bpf_map_update_elem(&dev_addrs, &to, &ifindex, BPF_ANY);
		struct probe_result *r = bpf_map_lookup_elem(&probe_results, &k);
		if (r) {
			r->ifindex = ifindex;
			r->err = err;
			r->sent += sent;
			r->drops += drops;
			r->flushes++;
		}
		return 0;
	}
	if (drops <= 0)
		return 0;
	__u32 *ifindex = bpf_map_lookup_elem(&dev_addrs, &to);
	if (ifindex)
		relay_refused(*ifindex, err, drops);
	return 0;
}

/* The probe frame carries the ifindex to send it into right after its
 * Ethernet header. */
SEC("xdp")
int redirect_probe(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (data + 14 + 4 > end)
		return XDP_ABORTED;
	__u32 ifindex, k = 0;
	__builtin_memcpy(&ifindex, data + 14, 4);
	if (ifindex == 0 || !bpf_map_lookup_elem(&probe_ports, &ifindex))
		return XDP_ABORTED;
	__u32 *p = bpf_map_lookup_elem(&probing, &k);
	if (!p)
		return XDP_ABORTED;
	*p = ifindex;
	return bpf_redirect_map(&probe_ports, ifindex, XDP_ABORTED);
}

char __license[] SEC("license") = "GPL";
