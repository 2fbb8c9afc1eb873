// SPDX-License-Identifier: GPL-3.0-or-later
/*
 * relayd XDP fast path: relays plain RTP/RTCP between call legs.
 *
 * A flow is keyed by the relay address and port a packet arrives on. For a
 * forwarded packet the program validates Ethernet/IP/UDP, checks the expected
 * source, looks up the route (bpf_fib_lookup, or the flow's cached result of
 * it) before touching the packet, updates the flow's counters and RFC 3550
 * statistics, rewrites addresses and ports, fixes checksums incrementally,
 * decrements TTL / hop limit and sends the frame with XDP_TX or a DEVMAP
 * redirect. Everything it cannot or should not forward is passed to the
 * kernel untouched, with a counted reason.
 */
#include <linux/bpf.h>
#include <bpf_helpers.h>
#include <bpf_endian.h>
#include "net.h"
#include "xsk.h"

#define ETH_ALEN 6
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8
#define IPPROTO_UDP 17
#define AF_INET 2
#define AF_INET6 10

/* Layout version of the maps below; the pin path carries it. Bump it (and
 * fastpath.LayoutVersion) on any change to a map's key or value. */
#define RELAY_LAYOUT_VERSION 1

enum flow_action {
	FLOW_FORWARD = 0,
	FLOW_USERSPACE = 1,
	FLOW_DROP = 2,
	FLOW_REFLECT = 3,
	FLOW_ACTION_MAX,
};

enum flow_flags {
	FLOW_F_EXPECT_ADDR = 1 << 0, /* only accept packets from expect_addr */
	FLOW_F_EXPECT_PORT = 1 << 1, /* ... and from expect_port */
	FLOW_F_LATCH = 1 << 2,       /* latching in userspace (action is FLOW_USERSPACE until locked) */
	/* The flow's destination is itself a flow's match (its own or
	 * another's): relayd sets it whenever that holds, before the match
	 * it loops to is installed, and clears it after that is removed. */
	FLOW_F_LOOP = 1 << 3,
};

/* Global counters: every packet the program sees is counted once, under
 * exactly one of these. The prefix is the verdict. */
enum relay_counter {
	COUNTER_FORWARD_TX,           /* forwarded out of the ingress device */
	COUNTER_FORWARD_REDIRECT,     /* forwarded through the DEVMAP */
	COUNTER_FORWARD_REFLECT,      /* reflected back to its sender */
	COUNTER_PASS_NOT_IP,          /* neither IPv4 nor IPv6 */
	COUNTER_PASS_NOT_UDP,         /* IP but not UDP */
	COUNTER_PASS_MALFORMED,       /* truncated or inconsistent headers */
	COUNTER_PASS_NO_FLOW,         /* UDP to no relay flow */
	COUNTER_PUNT_USERSPACE,       /* the flow is handled in userspace */
	COUNTER_PUNT_VLAN,            /* VLAN-tagged frame */
	COUNTER_PUNT_IP_OPTIONS,      /* IPv4 header with options */
	COUNTER_PUNT_IPV6_EXT,        /* IPv6 extension header before UDP */
	COUNTER_PUNT_FRAGMENT,        /* IP fragment */
	COUNTER_PUNT_NOT_RTP,         /* first byte not RTP/RTCP (STUN, DTLS: RFC 7983) */
	COUNTER_PUNT_TTL,             /* TTL / hop limit would expire */
	COUNTER_PUNT_OVER_MTU,        /* larger than the egress MTU */
	COUNTER_PUNT_FIB_NO_NEIGH,    /* next hop not resolved yet */
	COUNTER_PUNT_FIB_FWD_DISABLED,/* forwarding is off on the ingress device */
	COUNTER_PUNT_FIB_OTHER,       /* no route, blackhole, local, ... */
	COUNTER_PUNT_NO_EGRESS,       /* egress device has no XDP redirect entry */
	COUNTER_PUNT_FAMILY,          /* egress family differs from ingress */
	COUNTER_DROP_WRONG_SOURCE,    /* not from the flow's expected source */
	COUNTER_DROP_FLOW,            /* the flow's action is drop */
	COUNTER_DROP_LOOP,            /* the rewritten destination is itself a flow's match */
	COUNTER_DROP_RATE,            /* over the flow's packet-rate cap */
	COUNTER_PUNT_USERSPACE_AFXDP, /* the flow is handled in userspace: into its worker's AF_XDP socket */
	COUNTER_MAX,
};

/* Slots of the counters map: more than there are counters, so that a
 * counter added later fits the map a running relayd pinned (the loader
 * moves the values of an older, smaller map over). */
#define COUNTER_SLOTS 64
_Static_assert(COUNTER_MAX <= COUNTER_SLOTS, "more counters than slots");

struct counter {
	__u64 packets;
	__u64 bytes; /* frame bytes (Ethernet header included) */
};

struct flow_key {
	__u8 family; /* AF_INET or AF_INET6 */
	__u8 pad;
	__be16 port;   /* relay port */
	__u8 addr[16]; /* relay address; IPv4 in the first 4 bytes, rest zero */
};

struct flow_value {
	__u64 id;        /* the control plane's flow id */
	__u32 stats_idx; /* index into flow_stats */
	__u32 clock_rate; /* RTP clock rate in Hz; 0: no RTP statistics */
	__u8 action;     /* enum flow_action */
	__u8 flags;      /* enum flow_flags */
	__u8 family;     /* egress family */
	__u8 owner;      /* the control plane's: who installed the flow (the program ignores it) */
	__be16 src_port;
	__be16 dst_port;
	__u8 src_addr[16];
	__u8 dst_addr[16];
	__u8 expect_addr[16];
	__be16 expect_port;
	/* Packet-rate cap, a token bucket (see police()). rate_mult is the
	 * refill in tokens of 2^-16 packet per ns, times 2^24 (pps * 2^40 /
	 * 1e9, rounded); 0: no cap. rate_burst is the bucket's depth in
	 * packets. They sit in what was padding, so the map layout is
	 * unchanged: flows a previous version installed read as uncapped. */
	__u16 rate_burst;
	__u32 rate_mult;
	__u64 ticks_mult; /* clock_rate * 2^32 / 1e9: ns to RTP timestamp units */
};

/* Per-flow statistics, one array slot per flow, written by one CPU at a
 * time: without the spin lock for a flow with one source, under it
 * otherwise (see account). relayd reads and resets slots under the lock.
 * The RTP fields follow RFC 3550 appendix A.1, A.3 and A.8 exactly as
 * rtp.ReceiverStats does in Go (no probation). */
struct flow_stats {
	struct bpf_spin_lock lock;
	__u32 ssrc;
	__u64 packets;
	__u64 bytes;        /* IP bytes */
	__u64 dropped;
	__u64 last_seen_ns; /* bpf_ktime_get_ns of the last packet */
	__u64 rtp_base_ns;  /* arrival of the first RTP packet: origin of arrival times */
	__u64 received;
	__u32 base_seq;
	__u32 cycles;
	__u32 bad_seq;
	__u32 jitter16;     /* jitter in timestamp units, times 16 */
	__u32 last_transit;
	__u32 ssrc_changes;
	__u16 max_seq;
	__u8 initialized;
	__u8 have_transit;
	/* Tokens of the rate cap's bucket in 2^-16 packets, as of
	 * last_seen_ns (what was padding). */
	__u32 rate_tokens;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct flow_key);
	__type(value, struct flow_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct flow_stats);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct counter);
	__uint(max_entries, COUNTER_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} counters SEC(".maps");

/* Egress devices, indexed by ifindex (an array: the egress check before the
 * redirect is a direct index, not a hash lookup). Devices with an ifindex
 * of MAX_IFINDEX or more cannot be an egress. */
#define MAX_IFINDEX 4096
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__type(key, __u32);
	__type(value, struct bpf_devmap_val);
	__uint(max_entries, MAX_IFINDEX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tx_ports SEC(".maps");

/* The route cache: the result of a flow's last successful bpf_fib_lookup,
 * with what it was looked up for. The kernel's routing state is the same
 * as long as route_gen is, which relayd moves on at every change the
 * result may depend on (routes, rules, neighbours, links, addresses,
 * forwarding; see fastpath/routewatch_linux.go), and once a second for
 * whatever the kernel does not announce: an entry of another generation is
 * stale. relayd also renews a lease, route_until: when it stops renewing
 * it (relayd stopped or died, and nothing watches any more), the cache
 * turns itself off. A packet whose own inputs (ingress device, TOS or flow
 * label, length) or whose flow's addresses and ports differ from the
 * entry's is looked up too, so a reused statistics slot or an updated flow
 * never finds another's result.
 *
 * Each CPU has a partition of route_slots entries, indexed by the flow's
 * statistics slot: an entry is only ever written and read on its CPU, by
 * one program run at a time, so it needs no lock and cannot be read half
 * written. Two flows whose slots share an entry take turns in it. The map
 * is the program's own (not pinned): a new program starts with an empty
 * cache. */
struct route_entry {
	__u32 gen;         /* route_gen when filled; 0: empty */
	__u16 in_ifindex;  /* looked up for packets from this device */
	__u16 out_ifindex; /* result: egress device */
	__u32 tos;         /* IPv4 TOS or IPv6 flowinfo, as looked up */
	__be16 sport;
	__be16 dport;
	__u8 src[16];
	__u8 dst[16];
	__u8 dmac[ETH_ALEN]; /* result: next hop's MAC */
	__u8 smac[ETH_ALEN]; /* result: egress device's MAC */
	__u16 ok_len;      /* the longest IP packet a lookup passed (MTU) */
	__u8 family;
	__u8 pad;
};
_Static_assert(sizeof(struct route_entry) == 64, "a route entry is one cache line");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct route_entry);
	__uint(max_entries, 1); /* the loader's: CPUs times route_slots */
} routes SEC(".maps");

/* The statistics slot of the flows on relay port P: P - slot_port_base.
 * With a flow's state spread over its port's entry (or the flow map's
 * bucket and element), its statistics slot and its route cache entry, a
 * packet of one of many flows finds each of them out of the CPU's caches;
 * the flow's value names its slot, so the slot's cache misses would wait
 * for the value's. relayd gives a flow its port's slot when that is free
 * (fastpath/slots.go), so the program starts loading the slot and the
 * route cache entry from the packet's port alone, beside the port entry
 * (see warm_slot). It never trusts that: it uses the slot the flow's
 * value names, and a flow in another slot (a second flow on the port, a
 * flow adopted from a previous relayd) costs a wasted load. Set by the
 * loader: the lowest relay port. */
volatile const __u32 slot_port_base = 0;

/* Flows by relay port: a copy of the flow map's entry of one flow on each
 * port (the last installed there), read before the flow map. A hash lookup
 * is two cache misses, one waiting for the other (the bucket, then the
 * element); a flow of many is out of the CPU's caches at its next packet,
 * so the lookup was most of the program's time at thousands of flows. An
 * entry here is one array index from the packet's port: its two cache
 * lines are loaded at once, beside the statistics slot's (see
 * slot_port_base). The flow map stays what relayd installs into and adopts
 * from, and what the program falls back to: for a port with no entry, an
 * entry of another address on the port, one being written, and every
 * packet when relayd does not fill the table.
 *
 * relayd writes an entry through its memory mapping, in place, as a
 * sequence lock: seq is odd while the entry changes and moves on at each
 * change, so a packet that read the same even seq before and after its
 * copy of key and value read them whole. The program only reads it (it
 * cannot be BPF_F_RDONLY_PROG: the kernel then refuses relayd a writable
 * mapping). On x86 loads are not reordered with older loads,
 * nor stores with older stores, which this needs with no barrier
 * instruction: relayd fills the table on amd64 only. Not pinned: relayd
 * fills it for the flows it adopts, before the program is attached. */
struct port_flow {
	__u32 seq;
	struct flow_key key;
	struct flow_value value;
	__u8 pad[16];
};
_Static_assert(sizeof(struct port_flow) == 128, "a port entry is two cache lines");
_Static_assert(__builtin_offsetof(struct port_flow, value) == 24, "port entry layout");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct port_flow);
	__uint(max_entries, 65536);
} port_flows SEC(".maps");

/* AF_XDP receive for the flows the userspace workers carry
 * (dataplane.userspace_io = "afxdp" in mode xdp). A packet of a flow they
 * hold (SRTP, transcoding: not in the flow map), or of a flow whose action
 * is FLOW_USERSPACE (latching), is redirected into the XDP socket of the
 * worker that owns the flow, as bpf/xsk.c does in mode userspace, instead
 * of climbing the kernel's IP and UDP receive path to the worker's UDP
 * socket. The three maps are the userspace data plane's, given to the
 * loader: the worker of each flow by its match (the sk_lookup program's
 * map), the workers' sockets, and the index of each device among the
 * devices they have sockets on. The worker's socket for a packet is at
 * (worker * xsk_devices + device) * XSK_QUEUES + rx queue. Without them
 * (xsk_devices 0, the default) the branch is dead and such packets pass to
 * the kernel as before; so do packets of a flow the workers do not steer,
 * from a device or queue without sockets, or for a slot without a socket
 * (bpf_redirect_map's fallback). The program's own maps are placeholders:
 * none is pinned, a new program gets the running relayd's. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct flow_key); /* steer.c's steer_key */
	__type(value, __u32);         /* worker index */
	__uint(max_entries, 1);
} xsk_steer SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);   /* ifindex */
	__type(value, __u32); /* the device's index among xsk_devices */
	__uint(max_entries, 1);
} xsk_devs SEC(".maps");

/* Devices the workers have AF_XDP sockets on; 0: none. Set by the loader. */
volatile const __u32 xsk_devices = 0;

/* Entries per CPU, a power of two; 0: no route cache. Set by the loader. */
volatile const __u32 route_slots = 0;
/* The routing state's generation, moved on by relayd; 0: the cache is off
 * (nothing watches the kernel's routing state). */
volatile __u32 route_gen = 0;
/* The cache is on until this bpf_ktime_get_ns (CLOCK_MONOTONIC) time. */
volatile __u64 route_until = 0;

/* Path MTU exceptions learnt from ICMP lower a route's MTU without a
 * netlink event, but not below net.ipv4.route.min_pmtu (552 bytes by
 * default) over IPv4, nor below the minimum MTU of 1280 over IPv6: a
 * cached result serves packets up to these lengths, longer ones are looked
 * up every time. (Below a lowered min_pmtu, the refresh bounds how long a
 * cached result outlives an exception.) */
#define ROUTE_CACHE_MAX_LEN4 552
#define ROUTE_CACHE_MAX_LEN6 1280

/* Force the enums and structs into BTF so bpf2go can export them. */
const enum relay_counter relay_counter_unused __attribute__((unused));
const enum flow_action flow_action_unused __attribute__((unused));
const enum flow_flags flow_flags_unused __attribute__((unused));

#define RTP_SEQ_MOD (1 << 16)
#define MAX_DROPOUT 3000
#define MAX_MISORDER 100
/* Rebase arrival times after 12 hours: d * ticks_mult stays within 64 bits
 * for clock rates up to 96 kHz. */
#define ARRIVAL_REBASE_NS (12ULL * 3600 * 1000000000ULL)

static __always_inline int count(enum relay_counter c, __u64 bytes, int verdict)
{
	__u32 k = c;
	struct counter *ct = bpf_map_lookup_elem(&counters, &k);
	if (ct) {
		ct->packets++;
		ct->bytes += bytes;
	}
	return verdict;
}

/* One's complement add of 32-bit words. */
static __always_inline __u32 csum_add(__u32 sum, __u32 add)
{
	sum += add;
	return sum + (sum < add);
}

static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* Replaces the 32-bit word at *p with v, folding the change into *sum
 * (RFC 1624: HC' = ~(~HC + ~m + m')). */
static __always_inline void swap32(__u32 *sum, void *p, __u32 v)
{
	__u32 old;
	__builtin_memcpy(&old, p, 4);
	*sum = csum_add(*sum, ~old);
	*sum = csum_add(*sum, v);
	__builtin_memcpy(p, &v, 4);
}

static __always_inline void init_seq(struct flow_stats *st, __u16 seq)
{
	st->base_seq = seq;
	st->max_seq = seq;
	st->bad_seq = RTP_SEQ_MOD + 1;
	st->cycles = 0;
	st->received = 1;
}

/* RFC 3550 A.1 (without probation) and A.8. Called by the slot's only
 * writer, maybe with st->lock held: no helper calls in here. */
static __always_inline void rtp_update(struct flow_stats *st, __u64 ticks_mult, __u32 ssrc,
				       __u16 seq, __u32 ts, __u64 now)
{
	if (!st->initialized || st->ssrc != ssrc) {
		if (st->initialized)
			st->ssrc_changes++;
		else
			st->rtp_base_ns = now;
		st->initialized = 1;
		st->ssrc = ssrc;
		init_seq(st, seq);
		st->jitter16 = 0;
		st->have_transit = 0;
	} else {
		__u16 udelta = seq - st->max_seq;
		if (udelta < MAX_DROPOUT) {
			if (seq < st->max_seq)
				st->cycles += RTP_SEQ_MOD;
			st->max_seq = seq;
			st->received++;
		} else if (udelta <= RTP_SEQ_MOD - MAX_MISORDER) {
			if ((__u32)seq == st->bad_seq) {
				init_seq(st, seq);
			} else {
				st->bad_seq = ((__u32)seq + 1) & (RTP_SEQ_MOD - 1);
				return;
			}
		} else {
			st->received++;
		}
	}

	/* Arrival in timestamp units since the first RTP packet: d times
	 * clock_rate / 1e9 as a multiplication by the flow's precomputed
	 * reciprocal (ticks_mult = clock_rate * 2^32 / 1e9, rounded), no
	 * division. Jitter takes differences of arrivals 20 ms apart, where the
	 * reciprocal's rounding (under 1/30,000 relative) is far below a tick.
	 * The product fits 64 bits for d under 2^64 / ticks_mult (about 13 hours
	 * at 90 kHz, 6 days at 8 kHz); beyond that the origin moves forward. */
	__u64 d = now - st->rtp_base_ns;
	if (d >= ARRIVAL_REBASE_NS) {
		st->rtp_base_ns = now;
		st->have_transit = 0; /* a new origin: the next transit starts over */
		d = 0;
	}
	__u32 arrival = (__u32)((d * ticks_mult) >> 32);
	__u32 transit = arrival - ts;
	if (st->have_transit) {
		__s32 diff = (__s32)(transit - st->last_transit);
		if (diff < 0)
			diff = -diff;
		st->jitter16 += (__u32)diff - ((st->jitter16 + 8) >> 4);
	}
	st->last_transit = transit;
	st->have_transit = 1;
}

struct pkt {
	struct xdp_md *ctx;
	void *end;
	struct ethhdr *eth;
	struct udphdr *udp;
	__u64 frame_len;
	__u32 ip_len; /* IP header + payload */
	__u8 *payload;
	__u32 payload_len;
	int v6;
};

#define RATE_ONE (1U << 16) /* one packet in bucket tokens */
/* A bucket left alone this long is full whatever its rate (for a cap of
 * at least rate_burst / 4.29 s); below it, elapsed * rate_mult fits 64
 * bits for rate_mult < 2^32. */
#define RATE_FULL_NS (1ULL << 32)

/* police takes one packet's token from the flow's bucket, or reports that
 * there is none (1: drop). The bucket is refilled lazily from the time of
 * the flow's last accepted packet (last_seen_ns), which a refused packet
 * leaves alone: no second timestamp, and no state written for a drop.
 * Called by its slot's only writer (see account). */
static __always_inline int police(struct flow_stats *st, const struct flow_value *fv, __u64 now)
{
	__u64 full = (__u64)fv->rate_burst << 16;
	__u64 elapsed = now - st->last_seen_ns;
	__u64 avail = full;
	/* Another CPU may have accepted a packet stamped after now. */
	if ((__s64)elapsed < 0)
		elapsed = 0;
	if (elapsed < RATE_FULL_NS) {
		avail = st->rate_tokens + ((elapsed * fv->rate_mult) >> 24);
		if (avail > full)
			avail = full;
	}
	if (avail < RATE_ONE)
		return 1;
	st->rate_tokens = avail - RATE_ONE;
	return 0;
}

/* update counts an accepted packet in st, or one the rate cap refuses
 * (returns 1), with at most one writer at a time (see account). */
static __always_inline int update(struct pkt *p, struct flow_stats *st, const struct flow_value *fv,
				  int rtp, __u32 ssrc, __u16 seq, __u32 ts, __u64 now)
{
	if (fv->rate_mult && police(st, fv, now)) {
		__sync_fetch_and_add(&st->dropped, 1); /* refused sources add to it too */
		return 1;
	}
	st->packets++;
	st->bytes += p->ip_len;
	st->last_seen_ns = now;
	if (rtp)
		rtp_update(st, fv->ticks_mult, ssrc, seq, ts, now);
	return 0;
}

/* Accounts a packet to its flow. Returns 1 when the flow's rate cap
 * refuses the packet (counted as dropped), 0 otherwise. now is the
 * packet's arrival (unused for a dropped packet).
 *
 * A slot has one writer at a time. A flow that takes packets from one
 * source address and port only (FLOW_F_EXPECT_ADDR and _PORT: every
 * call's flow once its source is known) gets them on one receive queue,
 * the one the NIC's RSS hash of the 5-tuple names, and so on one CPU at a
 * time: its slot is written without the spin lock, which costs more than
 * the rest of the accounting (its helper calls, an interrupt save and
 * restore, a locked instruction). A flow open to several sources can get
 * packets on several CPUs at once, and takes the lock. Refused sources
 * only add to the drop counter, with an atomic add. */
static __always_inline int account(struct pkt *p, struct flow_value *fv, int dropped, __u64 now)
{
	__u32 idx = fv->stats_idx;
	struct flow_stats *st = bpf_map_lookup_elem(&stats, &idx);
	if (!st)
		return 0;
	if (dropped) {
		__sync_fetch_and_add(&st->dropped, 1);
		return 0;
	}

	/* RTP header fields, read before taking the lock. RTCP (RFC 5761:
	 * second byte 192..223) and short packets carry no RTP statistics. */
	int rtp = 0;
	__u32 ssrc = 0, ts = 0;
	__u16 seq = 0;
	if (fv->clock_rate && p->payload_len >= 12) {
		__u8 *b = p->payload;
		if ((void *)(b + 12) <= p->end && (b[1] < 192 || b[1] > 223)) {
			rtp = 1;
			seq = ((__u16)b[2] << 8) | b[3];
			ts = ((__u32)b[4] << 24) | ((__u32)b[5] << 16) | ((__u32)b[6] << 8) | b[7];
			ssrc = ((__u32)b[8] << 24) | ((__u32)b[9] << 16) | ((__u32)b[10] << 8) | b[11];
		}
	}

	const __u8 one_source = FLOW_F_EXPECT_ADDR | FLOW_F_EXPECT_PORT;
	if ((fv->flags & one_source) == one_source)
		return update(p, st, fv, rtp, ssrc, seq, ts, now);
	bpf_spin_lock(&st->lock);
	int policed = update(p, st, fv, rtp, ssrc, seq, ts, now);
	bpf_spin_unlock(&st->lock);
	return policed;
}

static __always_inline int addr_eq(const __u8 *a, const __u8 *b, int n)
{
	int eq = 1;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		if (i < n && a[i] != b[i])
			eq = 0;
	}
	return eq;
}

/* route_entry_of returns this CPU's route cache entry for the flow in
 * statistics slot idx, NULL without a cache. */
static __always_inline struct route_entry *route_entry_of(__u32 idx)
{
	if (!route_slots)
		return NULL;
	__u32 k = bpf_get_smp_processor_id() * route_slots + (idx & (route_slots - 1));
	return bpf_map_lookup_elem(&routes, &k);
}

static __always_inline int addr16_eq(const __u8 *a, const __u8 *b)
{
	const __u64 *x = (const void *)a, *y = (const void *)b;
	return x[0] == y[0] && x[1] == y[1];
}

/* route_cached answers the lookup fib describes (its input: family,
 * ingress device, TOS or flowinfo, ports, length; src and dst, which fib
 * holds too) from r, when r holds the result of the same lookup in
 * generation gen for a packet at least as long: it sets fib's egress
 * device and MACs as bpf_fib_lookup would and returns 1. */
static __always_inline int route_cached(const struct route_entry *r, struct bpf_fib_lookup *fib,
					const __u8 *src, const __u8 *dst, __u32 gen)
{
	if (!r || r->gen != gen || r->family != fib->family ||
	    r->in_ifindex != fib->ifindex || r->tos != fib->flowinfo || r->sport != fib->sport ||
	    r->dport != fib->dport || fib->tot_len > r->ok_len || !addr16_eq(r->dst, dst) ||
	    !addr16_eq(r->src, src))
		return 0;
	fib->ifindex = r->out_ifindex;
	__builtin_memcpy(fib->dmac, r->dmac, ETH_ALEN);
	__builtin_memcpy(fib->smac, r->smac, ETH_ALEN);
	return 1;
}

/* route_lookup resolves where the packet goes, into fib: from the flow's
 * route cache entry r when it answers, else with bpf_fib_lookup, whose
 * successful result it then caches. It returns a BPF_FIB_LKUP_RET_ code.
 * now is the packet's arrival. */
static __always_inline long route_lookup(struct pkt *p, struct route_entry *r, struct bpf_fib_lookup *fib,
					 const __u8 *src, const __u8 *dst, __u64 now)
{
	/* Read before the lookup: a change that the generation announces
	 * after this read makes what the lookup finds stale, whichever state
	 * it saw. */
	__u32 gen = route_gen;
	if (!gen || now >= route_until)
		r = NULL;
	if (route_cached(r, fib, src, dst, gen))
		return BPF_FIB_LKUP_RET_SUCCESS;

	/* The lookup overwrites some of its input (ifindex, ipv4_dst). */
	__u32 in_ifindex = fib->ifindex, tos = fib->flowinfo;
	__be16 sport = fib->sport, dport = fib->dport;
	__u16 len = fib->tot_len;
	__u8 family = fib->family;
	long rc = bpf_fib_lookup(p->ctx, fib, sizeof(*fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS || !r ||
	    len > (p->v6 ? ROUTE_CACHE_MAX_LEN6 : ROUTE_CACHE_MAX_LEN4) ||
	    in_ifindex > 0xffff || fib->ifindex > 0xffff)
		return rc;
	/* Whatever the entry held (another generation's lookup, another
	 * flow's sharing the entry, or this one's for a shorter packet), it
	 * holds this lookup now. */
	r->gen = gen;
	r->family = family;
	r->in_ifindex = in_ifindex;
	r->out_ifindex = fib->ifindex;
	r->tos = tos;
	r->sport = sport;
	r->dport = dport;
	r->ok_len = len;
	__builtin_memcpy(r->src, src, 16);
	__builtin_memcpy(r->dst, dst, 16);
	__builtin_memcpy(r->dmac, fib->dmac, ETH_ALEN);
	__builtin_memcpy(r->smac, fib->smac, ETH_ALEN);
	return rc;
}

/* touch loads the byte at p and discards it: the load's cache miss is
 * under way while the instructions that follow run. */
#define touch(p) asm volatile("" ::"r"(*(const volatile __u8 *)(p)))

/* warm_slot starts the loads of the cache lines of statistics slot idx
 * and of this CPU's route cache entry for it. The 88-byte slots are 88
 * bytes apart, so a slot spans two cache lines or, one in four, three:
 * bytes 4, 32 and 84 are on each of them (the lock word itself may not be
 * read). */
static __always_inline void warm_slot(__u32 idx)
{
	struct flow_stats *st = bpf_map_lookup_elem(&stats, &idx);
	struct route_entry *r = route_entry_of(idx);
	if (st) {
		touch(&st->ssrc);
		touch(&st->last_seen_ns);
		touch(&st->rate_tokens);
	}
	if (r)
		touch(r);
}

#define barrier() asm volatile("" ::: "memory")

/* port_flow_read copies the flow of key from its port's entry pf into fv
 * and returns 1, or returns 0 when the entry holds no flow, another flow,
 * or one that was being written (see port_flows). */
static __always_inline int port_flow_read(const struct port_flow *pf, const struct flow_key *key,
					  struct flow_value *fv)
{
	__u32 seq = *(const volatile __u32 *)&pf->seq;
	if (seq & 1)
		return 0;
	barrier();
	/* Both keys' addresses are 4-byte aligned (key: on the stack, at 4). */
	const __u32 *a = (const void *)pf->key.addr, *b = (const void *)key->addr;
	if (pf->key.family != key->family || pf->key.port != key->port ||
	    a[0] != b[0] || a[1] != b[1] || a[2] != b[2] || a[3] != b[3])
		return 0;
	__builtin_memcpy(fv, &pf->value, sizeof(*fv));
	barrier();
	return *(const volatile __u32 *)&pf->seq == seq;
}

/* to_xsk redirects the packet into the AF_XDP socket of the worker that
 * owns its flow (see xsk_steer); XDP_PASS when it cannot. The packet's
 * pointers are stale after it. */
static __always_inline int to_xsk(struct pkt *p, struct flow_key *key)
{
	__u32 *worker = bpf_map_lookup_elem(&xsk_steer, key);
	if (!worker)
		return XDP_PASS;
	__u32 ifindex = p->ctx->ingress_ifindex;
	__u32 *dev = bpf_map_lookup_elem(&xsk_devs, &ifindex);
	if (!dev)
		return XDP_PASS;
	return xsk_redirect(p->ctx, &xsks, *worker, *dev, xsk_devices);
}

static __always_inline int handle_flow(struct pkt *p, struct flow_key *key, const __u8 *saddr,
				       __be16 sport)
{
	/* The port's entry and its statistics slot first: their cache misses
	 * are under way together (see port_flows and slot_port_base). */
	__u32 port = bpf_ntohs(key->port);
	struct port_flow *pf = bpf_map_lookup_elem(&port_flows, &port);
	if (pf) {
		touch(&pf->seq);
		touch(&pf->value.expect_addr);
	}
	warm_slot(port - slot_port_base);

	/* The flow, copied: from its port's entry, else from the flow map. */
	struct flow_value fvs;
	struct flow_value *fv = &fvs;
	if (!pf || !port_flow_read(pf, key, fv)) {
		struct flow_value *m = bpf_map_lookup_elem(&flows, key);
		if (!m) {
			/* The flows the workers hold have no entry here. */
			if (xsk_devices && to_xsk(p, key) == XDP_REDIRECT)
				return count(COUNTER_PUNT_USERSPACE_AFXDP, p->frame_len, XDP_REDIRECT);
			return count(COUNTER_PASS_NO_FLOW, p->frame_len, XDP_PASS);
		}
		__builtin_memcpy(fv, m, sizeof(*fv));
	}

	int alen = p->v6 ? 16 : 4;

	/* Drops take no time: a dropped packet only counts. */
	if (fv->action == FLOW_DROP) {
		account(p, fv, 1, 0);
		return count(COUNTER_DROP_FLOW, p->frame_len, XDP_DROP);
	}
	if (((fv->flags & FLOW_F_EXPECT_ADDR) && !addr_eq(saddr, fv->expect_addr, alen)) ||
	    ((fv->flags & FLOW_F_EXPECT_PORT) && sport != fv->expect_port)) {
		account(p, fv, 1, 0);
		return count(COUNTER_DROP_WRONG_SOURCE, p->frame_len, XDP_DROP);
	}
	if (fv->action == FLOW_USERSPACE) {
		if (xsk_devices && to_xsk(p, key) == XDP_REDIRECT)
			return count(COUNTER_PUNT_USERSPACE_AFXDP, p->frame_len, XDP_REDIRECT);
		return count(COUNTER_PUNT_USERSPACE, p->frame_len, XDP_PASS);
	}
	if (fv->action != FLOW_FORWARD && fv->action != FLOW_REFLECT)
		return count(COUNTER_PUNT_USERSPACE, p->frame_len, XDP_PASS);

	/* RFC 7983: RTP and RTCP start with 128..191; STUN, DTLS, ZRTP and
	 * anything else go to userspace. */
	if (p->payload_len < 1 || (void *)(p->payload + 1) > p->end ||
	    p->payload[0] < 128 || p->payload[0] > 191)
		return count(COUNTER_PUNT_NOT_RTP, p->frame_len, XDP_PASS);

	/* Where the packet goes. */
	__u8 src[16] __attribute__((aligned(8))) = {};
	__u8 dst[16] __attribute__((aligned(8))) = {};
	__be16 nsport, ndport;
	int loop;
	if (fv->action == FLOW_REFLECT) {
		__builtin_memcpy(src, key->addr, 16);
		if (p->v6)
			__builtin_memcpy(dst, saddr, 16);
		else
			__builtin_memcpy(dst, saddr, 4);
		nsport = key->port;
		ndport = sport;
		/* Loop guard: a destination that is itself a flow's match
		 * (this flow's, or another's) would bring the packet straight
		 * back to a relay flow, and one packet would circle at the
		 * full speed of the data plane. A reflected packet's
		 * destination is its sender, so the test is a lookup with it
		 * as a flow key. */
		struct flow_key lk = {};
		lk.family = key->family;
		lk.port = ndport;
		__builtin_memcpy(lk.addr, dst, 16);
		loop = bpf_map_lookup_elem(&flows, &lk) != NULL;
	} else {
		if (fv->family != key->family)
			return count(COUNTER_PUNT_FAMILY, p->frame_len, XDP_PASS);
		__builtin_memcpy(src, fv->src_addr, 16);
		__builtin_memcpy(dst, fv->dst_addr, 16);
		nsport = fv->src_port;
		ndport = fv->dst_port;
		/* A forwarded flow's destination is fixed: relayd tells a
		 * loop with the flag (the control plane never installs such
		 * a flow; this holds if it did). */
		loop = fv->flags & FLOW_F_LOOP;
	}
	if (loop) {
		account(p, fv, 1, 0);
		return count(COUNTER_DROP_LOOP, p->frame_len, XDP_DROP);
	}

	struct bpf_fib_lookup fib = {};
	fib.ifindex = p->ctx->ingress_ifindex;
	fib.l4_protocol = IPPROTO_UDP;
	fib.sport = nsport;
	fib.dport = ndport;
	if (p->v6) {
		struct ipv6hdr *ip6 = (void *)(p->eth + 1);
		if ((void *)(ip6 + 1) > p->end)
			return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
		if (ip6->hop_limit <= 1)
			return count(COUNTER_PUNT_TTL, p->frame_len, XDP_PASS);
		fib.family = AF_INET6;
		fib.flowinfo = ip6->vtc_flow & bpf_htonl(0x0FFFFFFF);
		fib.tot_len = p->ip_len;
		__builtin_memcpy(fib.ipv6_src, src, 16);
		__builtin_memcpy(fib.ipv6_dst, dst, 16);
	} else {
		struct iphdr *ip = (void *)(p->eth + 1);
		if ((void *)(ip + 1) > p->end)
			return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
		if (ip->ttl <= 1)
			return count(COUNTER_PUNT_TTL, p->frame_len, XDP_PASS);
		fib.family = AF_INET;
		fib.tos = ip->tos;
		fib.tot_len = p->ip_len;
		__builtin_memcpy(&fib.ipv4_src, src, 4);
		__builtin_memcpy(&fib.ipv4_dst, dst, 4);
	}

	/* Only a packet that is to be forwarded needs the time: the route
	 * cache's lease, its arrival for the jitter, its refill of the cap's
	 * bucket, its last_seen_ns. */
	__u64 now = bpf_ktime_get_ns();
	long rc = route_lookup(p, route_entry_of(fv->stats_idx), &fib, src, dst, now);
	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		break;
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		return count(COUNTER_PUNT_FIB_NO_NEIGH, p->frame_len, XDP_PASS);
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		return count(COUNTER_PUNT_OVER_MTU, p->frame_len, XDP_PASS);
	case BPF_FIB_LKUP_RET_FWD_DISABLED:
		return count(COUNTER_PUNT_FIB_FWD_DISABLED, p->frame_len, XDP_PASS);
	default:
		return count(COUNTER_PUNT_FIB_OTHER, p->frame_len, XDP_PASS);
	}

	/* The redirect is set up now, while the packet may still be punted
	 * untouched: the DEVMAP's own lookup is the egress check (XDP_PASS
	 * when the device has no entry). The program may still drop the
	 * packet; the kernel redirects only on XDP_REDIRECT. */
	int tx = fib.ifindex == p->ctx->ingress_ifindex;
	if (!tx && bpf_redirect_map(&tx_ports, fib.ifindex, XDP_PASS) != XDP_REDIRECT)
		return count(COUNTER_PUNT_NO_EGRESS, p->frame_len, XDP_PASS);

	/* From here on the packet is ours. The cap is applied here, after
	 * the punt decisions, because what is punted is the userspace
	 * shadow's to count (and to police); a flood of packets that would be
	 * forwarded still costs only this far, never the rewrite or the
	 * transmit. */
	if (account(p, fv, 0, now))
		return count(COUNTER_DROP_RATE, p->frame_len, XDP_DROP);

	struct udphdr *udp = p->udp;
	if ((void *)(udp + 1) > p->end)
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
	__u32 usum = (__u16)~udp->check;
	int zero_csum = udp->check == 0;
	__u32 ports = (__u32)nsport | ((__u32)ndport << 16);
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
	ports = ((__u32)nsport << 16) | ndport;
#endif

	if (p->v6) {
		struct ipv6hdr *ip6 = (void *)(p->eth + 1);
		if ((void *)(ip6 + 1) > p->end)
			return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
#pragma unroll
		for (int i = 0; i < 16; i += 4) {
			__u32 w;
			__builtin_memcpy(&w, src + i, 4);
			swap32(&usum, ip6->saddr + i, w);
			__builtin_memcpy(&w, dst + i, 4);
			swap32(&usum, ip6->daddr + i, w);
		}
		swap32(&usum, udp, ports);
		ip6->hop_limit--;
	} else {
		struct iphdr *ip = (void *)(p->eth + 1);
		if ((void *)(ip + 1) > p->end)
			return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
		__u32 w;
		__u32 isum = (__u16)~ip->check;
		/* TTL shares a 16-bit word with the protocol. */
		__u16 old_ttl_word, new_ttl_word;
		__builtin_memcpy(&old_ttl_word, &ip->ttl, 2);
		ip->ttl--;
		__builtin_memcpy(&new_ttl_word, &ip->ttl, 2);
		isum = csum_add(isum, (__u16)~old_ttl_word);
		isum = csum_add(isum, new_ttl_word);

		__builtin_memcpy(&w, src, 4);
		__u32 old_s = ip->saddr;
		swap32(&isum, &ip->saddr, w);
		usum = csum_add(usum, ~old_s);
		usum = csum_add(usum, w);
		__builtin_memcpy(&w, dst, 4);
		__u32 old_d = ip->daddr;
		swap32(&isum, &ip->daddr, w);
		usum = csum_add(usum, ~old_d);
		usum = csum_add(usum, w);
		ip->check = ~csum_fold(isum);

		swap32(&usum, udp, ports);
	}
	if (p->v6 || !zero_csum) {
		__u16 c = ~csum_fold(usum);
		udp->check = c ? c : 0xffff;
	} else {
		udp->check = 0; /* IPv4: no checksum stays no checksum */
	}

	__builtin_memcpy(p->eth->h_dest, fib.dmac, ETH_ALEN);
	__builtin_memcpy(p->eth->h_source, fib.smac, ETH_ALEN);

	if (fv->action == FLOW_REFLECT && tx)
		return count(COUNTER_FORWARD_REFLECT, p->frame_len, XDP_TX);
	if (tx)
		return count(COUNTER_FORWARD_TX, p->frame_len, XDP_TX);
	if (fv->action == FLOW_REFLECT)
		return count(COUNTER_FORWARD_REFLECT, p->frame_len, XDP_REDIRECT);
	return count(COUNTER_FORWARD_REDIRECT, p->frame_len, XDP_REDIRECT);
}

/* bounded_ntohs byte-swaps a 16-bit length and bounds the result where the
 * verifier can see it. Debian 12's 6.1 verifier loses the bounds of a byte
 * swap, then refuses pointer arithmetic with the result ("math between pkt
 * pointer and register with unbounded min value"); newer kernels track
 * them. The mask is in asm so that clang, which knows the swap fits in 16
 * bits, cannot drop it. */
static __always_inline __u32 bounded_ntohs(__be16 v)
{
	__u64 r = bpf_ntohs(v);
	asm volatile("%0 &= 0xffff" : "+r"(r));
	return r;
}

static __always_inline int handle_ipv4(struct pkt *p)
{
	struct iphdr *ip = (void *)(p->eth + 1);
	if ((void *)(ip + 1) > p->end)
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
	if ((ip->ihl_version & 0xf0) != 0x40)
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
	if (ip->protocol != IPPROTO_UDP)
		return count(COUNTER_PASS_NOT_UDP, p->frame_len, XDP_PASS);
	__u8 ihl = ip->ihl_version & 0x0f;
	if (ihl < 5)
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
	if (ihl > 5)
		return count(COUNTER_PUNT_IP_OPTIONS, p->frame_len, XDP_PASS);
	if (ip->frag_off & bpf_htons(0x3fff))
		return count(COUNTER_PUNT_FRAGMENT, p->frame_len, XDP_PASS);

	__u32 tot_len = bounded_ntohs(ip->tot_len);
	if (tot_len < sizeof(*ip) + sizeof(struct udphdr) ||
	    (void *)ip + tot_len > p->end)
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);

	/* Verify the header checksum: the incremental update below would
	 * otherwise turn a corrupt header into a valid-looking one. */
	__u32 sum = 0;
	__u16 *w = (void *)ip;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += w[i];
	if (csum_fold(sum) != 0xffff)
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);

	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > p->end)
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
	__u32 udp_len = bpf_ntohs(udp->len);
	if (udp_len != tot_len - sizeof(*ip))
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);

	p->udp = udp;
	p->ip_len = tot_len;
	p->payload = (void *)(udp + 1);
	p->payload_len = udp_len - sizeof(*udp);

	struct flow_key key __attribute__((aligned(8))) = {};
	key.family = AF_INET;
	key.port = udp->dest;
	__builtin_memcpy(key.addr, &ip->daddr, 4);
	__u8 saddr[16] = {};
	__builtin_memcpy(saddr, &ip->saddr, 4);
	return handle_flow(p, &key, saddr, udp->source);
}

static __always_inline int handle_ipv6(struct pkt *p)
{
	struct ipv6hdr *ip6 = (void *)(p->eth + 1);
	if ((void *)(ip6 + 1) > p->end)
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
	if ((ip6->vtc_flow & bpf_htonl(0xf0000000)) != bpf_htonl(0x60000000))
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
	if (ip6->nexthdr != IPPROTO_UDP) {
		/* Walk a few extension headers only to tell UDP that may be ours
		 * (punted: the kernel parses the chain) from the kernel's own
		 * traffic such as MLD reports behind a hop-by-hop header. */
		__u8 next = ip6->nexthdr;
		__u8 *h = (void *)(ip6 + 1);
		int frag = 0;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			if (next != 0 && next != 43 && next != 44 && next != 60)
				break;
			if ((void *)(h + 8) > p->end)
				return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
			frag |= next == 44;
			next = h[0];
			h += next == 44 ? 8 : ((__u32)h[1] + 1) * 8;
		}
		if (next != IPPROTO_UDP)
			return count(COUNTER_PASS_NOT_UDP, p->frame_len, XDP_PASS);
		if (frag)
			return count(COUNTER_PUNT_FRAGMENT, p->frame_len, XDP_PASS);
		return count(COUNTER_PUNT_IPV6_EXT, p->frame_len, XDP_PASS);
	}

	__u32 plen = bounded_ntohs(ip6->payload_len);
	struct udphdr *udp = (void *)(ip6 + 1);
	if ((void *)(udp + 1) > p->end || plen < sizeof(*udp) ||
	    (void *)udp + plen > p->end)
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);
	/* The UDP checksum is mandatory over IPv6 (RFC 8200 8.1). */
	if (bpf_ntohs(udp->len) != plen || udp->check == 0)
		return count(COUNTER_PASS_MALFORMED, p->frame_len, XDP_PASS);

	p->udp = udp;
	p->ip_len = plen + sizeof(*ip6);
	p->payload = (void *)(udp + 1);
	p->payload_len = plen - sizeof(*udp);

	struct flow_key key __attribute__((aligned(8))) = {};
	key.family = AF_INET6;
	key.port = udp->dest;
	__builtin_memcpy(key.addr, ip6->daddr, 16);
	__u8 saddr[16];
	__builtin_memcpy(saddr, ip6->saddr, 16);
	return handle_flow(p, &key, saddr, udp->source);
}

SEC("xdp")
int relay_xdp(struct xdp_md *ctx)
{
	struct pkt p = {};
	void *data = (void *)(long)ctx->data;
	p.ctx = ctx;
	p.end = (void *)(long)ctx->data_end;
	p.frame_len = p.end - data;
	p.eth = data;
	if ((void *)(p.eth + 1) > p.end)
		return count(COUNTER_PASS_MALFORMED, p.frame_len, XDP_PASS);

	switch (p.eth->h_proto) {
	case bpf_htons(ETH_P_IP):
		return handle_ipv4(&p);
	case bpf_htons(ETH_P_IPV6):
		p.v6 = 1;
		return handle_ipv6(&p);
	case bpf_htons(ETH_P_8021Q):
	case bpf_htons(ETH_P_8021AD):
		return count(COUNTER_PUNT_VLAN, p.frame_len, XDP_PASS);
	default:
		return count(COUNTER_PASS_NOT_IP, p.frame_len, XDP_PASS);
	}
}

char __license[] SEC("license") = "GPL";
