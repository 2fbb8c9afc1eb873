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
 * xdp_redirect_err. The programs read the classic tracepoints' records
 * (there is no vmlinux BTF to read raw tracepoint arguments with); the
 * loader checks the layouts below against tracefs's format files.
 *
 * The same programs count the refusals of the redirect probe: one frame
 * that redirect_probe sends into a device through its own DEVMAP
 * (probe_ports), with BPF_PROG_TEST_RUN in live-frame mode, to find out
 * whether the device takes redirected frames again.
 */
#include <linux/bpf.h>
#include <bpf_helpers.h>

#define MAX_IFINDEX 4096 /* as tx_ports in relay.c */

/* struct trace_event_raw_xdp_redirect_template */
struct redirect_err_record {
	__u64 common; /* common_type, common_flags, common_preempt_count, common_pid */
	int prog_id;
	__u32 act;
	int ifindex;
	int err;
	int to_ifindex;
	__u32 map_id;
	int map_index;
};

/* struct trace_event_raw_xdp_devmap_xmit */
struct devmap_xmit_record {
	__u64 common;
	int from_ifindex;
	__u32 act;
	int to_ifindex;
	int drops;
	int sent;
	int err;
};

struct redirmon_config {
	__u32 relay_map_id; /* tx_ports */
	__u32 probe_map_id; /* probe_ports */
};

enum dev_flags {
	DEV_F_RELAY = 1 << 0, /* the relay program is attached to the device */
	DEV_F_ARMED = 1 << 1, /* the next refusal toward the device is reported */
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

/* Refusals of the relay program's frames, by egress ifindex. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct egress_errors);
	__uint(max_entries, MAX_IFINDEX);
} redirect_errors SEC(".maps");

/* Refusals of the probe's frames, by ifindex. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, MAX_IFINDEX);
} probe_errors SEC(".maps");

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

static __always_inline void probe_refused(__u32 ifindex, __u64 frames)
{
	if (ifindex >= MAX_IFINDEX)
		return;
	__u64 *n = bpf_map_lookup_elem(&probe_errors, &ifindex);
	if (n)
		*n += frames;
}

/* xdp_redirect_err (6.18) and xdp_redirect_map_err (6.1): one frame the
 * devmap would not enqueue. Tracepoints are global: the map id tells the
 * relay's frames and the probe's from other programs' (another network
 * namespace's relayd). */
SEC("tracepoint/xdp/xdp_redirect_err")
int redirect_err(struct redirect_err_record *r)
{
	__u32 k = 0;
	struct redirmon_config *c = bpf_map_lookup_elem(&config, &k);
	if (!c)
		return 0;
	if (r->map_id == c->relay_map_id && c->relay_map_id != 0)
		relay_refused(r->map_index, r->err, 1);
	else if (r->map_id == c->probe_map_id && c->probe_map_id != 0)
		probe_refused(r->map_index, 1);
	return 0;
}

/* xdp_devmap_xmit: a bulk the driver took only part of (or none). It
 * fires for every bulk a devmap flushes: return at once when nothing was
 * dropped. The record names no map: a frame redirected from a device the
 * relay program runs on is the relay's, any other (the probe's come from
 * the loopback device) counts for the probe. */
SEC("tracepoint/xdp/xdp_devmap_xmit")
int devmap_xmit(struct devmap_xmit_record *r)
{
	if (r->drops <= 0)
		return 0;
	__u32 from = r->from_ifindex;
	__u32 *flags = bpf_map_lookup_elem(&devices, &from);
	if (flags && (*flags & DEV_F_RELAY))
		relay_refused(r->to_ifindex, r->err, r->drops);
	else
		probe_refused(r->to_ifindex, r->drops);
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
	__u32 ifindex;
	__builtin_memcpy(&ifindex, data + 14, 4);
	return bpf_redirect_map(&probe_ports, ifindex, XDP_ABORTED);
}

char __license[] SEC("license") = "GPL";
