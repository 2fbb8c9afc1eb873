// SPDX-License-Identifier: GPL-3.0-or-later
/*
 * cmmsg: a minimal IPv4 UDP relay in C, the yardstick of relayd's
 * userspace workers in voipgen fwdbench (as bpf/minfwd.c is for relayd's
 * XDP program). It does what one worker does for a plain flow and no
 * more: one UDP socket, handed over by its parent, to which the parent
 * steers the relay ports with relayd's sk_lookup program (bpf/steer.c);
 * blocking recvmmsg of up to 64 datagrams (MSG_WAITFORONE); each
 * datagram's relay address and port from IP_ORIGDSTADDR; the flow looked
 * up by it in an open-addressing hash table; the source checked; IPv4 and
 * UDP headers written in front of the payload (UDP checksum computed, IP
 * id and checksum left to the kernel, as the worker does); one sendmmsg
 * per batch on an IPPROTO_RAW socket. No RTP parsing, statistics beyond
 * packet and byte counts, latching, rate caps or SRTP: those are
 * relayd's job, and what the comparison puts a price on.
 *
 * usage: cmmsg -r FD [-s FD] [-c CPU] < flows
 *
 *   -r FD   the bound UDP socket to receive on (IP_RECVORIGDSTADDR set)
 *   -s FD   a file of at least 4096 bytes to publish counters in (struct
 *           stats below, native-endian uint64s, updated once per batch)
 *   -c CPU  pin to this CPU
 *
 * Flows come on stdin, one per line, IPv4 addr:port each:
 *   MATCH SOURCE FROM TO
 * a datagram to MATCH from SOURCE ("-": any source; port 0: any port) is
 * sent from FROM to TO. When the flows are loaded it prints "ready N" on
 * stdout. It runs until killed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define BATCH 64
#define BUFSZ 2048
#define IPHDR 20
#define UDPHDR 8
#define HDRS (IPHDR + UDPHDR)
#define TTL 64
#define MAXFLOWS (1 << 20)

/* The counters published to the parent. */
struct stats {
	uint64_t received;     /* datagrams read */
	uint64_t forwarded;    /* handed to the kernel by sendmmsg */
	uint64_t no_flow;      /* to no flow's MATCH (or no IP_ORIGDSTADDR) */
	uint64_t wrong_source; /* from another source than the flow's */
	uint64_t truncated;    /* larger than the buffer */
	uint64_t send_failed;  /* refused by sendmmsg */
	uint64_t batches;      /* recvmmsg calls that returned datagrams */
};

/* Addresses and ports in network byte order. */
struct flow {
	uint32_t match_addr, src_addr, from_addr, to_addr;
	uint16_t match_port, src_port, from_port, to_port;
	int any_source;
	uint64_t packets, bytes;
};

static struct flow *flows;
static uint32_t nflows;
static uint32_t *slots; /* flow index + 1; 0: empty */
static uint32_t slot_mask;

static uint32_t hash(uint32_t addr, uint16_t port)
{
	uint64_t k = ((uint64_t)addr << 16 | port) * 0x9e3779b97f4a7c15ull;
	return (uint32_t)(k >> 32);
}

static struct flow *lookup(uint32_t addr, uint16_t port)
{
	for (uint32_t i = hash(addr, port) & slot_mask;; i = (i + 1) & slot_mask) {
		uint32_t s = slots[i];
		if (s == 0)
			return NULL;
		struct flow *f = &flows[s - 1];
		if (f->match_addr == addr && f->match_port == port)
			return f;
	}
}

/* insert returns 0, or -1 if MATCH is already a flow's. */
static int insert(uint32_t idx)
{
	struct flow *f = &flows[idx];
	uint32_t i = hash(f->match_addr, f->match_port) & slot_mask;
	for (; slots[i] != 0; i = (i + 1) & slot_mask) {
		struct flow *o = &flows[slots[i] - 1];
		if (o->match_addr == f->match_addr && o->match_port == f->match_port)
			return -1;
	}
	slots[i] = idx + 1;
	return 0;
}

/* parse_ap parses "a.b.c.d:port" into network-order addr and port. */
static int parse_ap(const char *s, uint32_t *addr, uint16_t *port)
{
	char host[INET_ADDRSTRLEN];
	const char *colon = strrchr(s, ':');
	if (colon == NULL || colon == s || (size_t)(colon - s) >= sizeof(host))
		return -1;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	struct in_addr a;
	if (inet_pton(AF_INET, host, &a) != 1)
		return -1;
	char *end;
	errno = 0;
	unsigned long p = strtoul(colon + 1, &end, 10);
	if (errno != 0 || *end != '\0' || end == colon + 1 || p > 65535)
		return -1;
	*addr = a.s_addr;
	*port = htons((uint16_t)p);
	return 0;
}

static int load_flows(FILE *in)
{
	size_t cap = 1024, lineno = 0;
	char line[512];
	flows = malloc(cap * sizeof(*flows));
	if (flows == NULL)
		return -1;
	while (fgets(line, sizeof(line), in) != NULL) {
		lineno++;
		char m[64], s[64], fr[64], to[64], extra[2];
		int n = sscanf(line, "%63s %63s %63s %63s %1s", m, s, fr, to, extra);
		if (n <= 0)
			continue; /* blank line */
		if (n != 4) {
			fprintf(stderr, "cmmsg: flows line %zu: want MATCH SOURCE FROM TO\n", lineno);
			return -1;
		}
		if (nflows == MAXFLOWS) {
			fprintf(stderr, "cmmsg: more than %d flows\n", MAXFLOWS);
			return -1;
		}
		if (nflows == cap) {
			cap *= 2;
			struct flow *nf = realloc(flows, cap * sizeof(*flows));
			if (nf == NULL)
				return -1;
			flows = nf;
		}
		struct flow *f = &flows[nflows];
		memset(f, 0, sizeof(*f));
		f->any_source = strcmp(s, "-") == 0;
		if (parse_ap(m, &f->match_addr, &f->match_port) < 0 ||
		    (!f->any_source && parse_ap(s, &f->src_addr, &f->src_port) < 0) ||
		    parse_ap(fr, &f->from_addr, &f->from_port) < 0 ||
		    parse_ap(to, &f->to_addr, &f->to_port) < 0) {
			fprintf(stderr, "cmmsg: flows line %zu: bad address (want a.b.c.d:port)\n", lineno);
			return -1;
		}
		nflows++;
	}
	if (ferror(in)) {
		perror("cmmsg: read flows");
		return -1;
	}
	uint32_t size = 16;
	while (size < 2 * nflows)
		size *= 2;
	slots = calloc(size, sizeof(*slots));
	if (slots == NULL)
		return -1;
	slot_mask = size - 1;
	for (uint32_t i = 0; i < nflows; i++) {
		if (insert(i) < 0) {
			fprintf(stderr, "cmmsg: flow %u: its MATCH is another flow's\n", i + 1);
			return -1;
		}
	}
	return 0;
}

/* sum adds the 16-bit words of b (len even or last) to a one's
 * complement sum; the result is in the machine's byte order, as the words
 * are, which a one's complement sum does not mind. */
static uint64_t sum(uint64_t acc, const uint8_t *b, size_t len)
{
	for (; len >= 4; b += 4, len -= 4) {
		uint32_t w;
		memcpy(&w, b, 4);
		acc += w;
	}
	if (len >= 2) {
		uint16_t w;
		memcpy(&w, b, 2);
		acc += w;
		b += 2;
		len -= 2;
	}
	if (len == 1) {
		uint16_t w = 0;
		memcpy(&w, b, 1);
		acc += w;
	}
	return acc;
}

static uint16_t fold(uint64_t acc)
{
	while (acc >> 16)
		acc = (acc & 0xffff) + (acc >> 16);
	return (uint16_t)acc;
}

/* write_headers fills the IPv4 and UDP headers in front of the len-byte
 * payload at pkt + HDRS, for f's FROM -> TO, like relayd's writeHeaders. */
static void write_headers(uint8_t *pkt, size_t len, const struct flow *f)
{
	uint16_t total = htons((uint16_t)(HDRS + len));
	uint16_t ulen = htons((uint16_t)(UDPHDR + len));
	pkt[0] = 0x45;
	pkt[1] = 0;
	memcpy(pkt + 2, &total, 2);
	memset(pkt + 4, 0, 4); /* id (the kernel fills it in), no DF */
	pkt[8] = TTL;
	pkt[9] = IPPROTO_UDP;
	memset(pkt + 10, 0, 2); /* checksum: the kernel's */
	memcpy(pkt + 12, &f->from_addr, 4);
	memcpy(pkt + 16, &f->to_addr, 4);
	uint8_t *udp = pkt + IPHDR;
	memcpy(udp, &f->from_port, 2);
	memcpy(udp + 2, &f->to_port, 2);
	memcpy(udp + 4, &ulen, 2);
	memset(udp + 6, 0, 2);
	uint64_t acc = sum(0, pkt + 12, 8); /* pseudo header: addresses */
	acc += htons(IPPROTO_UDP);
	acc += ulen;
	acc = sum(acc, udp, UDPHDR + len);
	uint16_t c = (uint16_t)~fold(acc);
	if (c == 0)
		c = 0xffff; /* RFC 768: 0 is no checksum */
	memcpy(udp + 6, &c, 2);
}

/* orig_dst finds IP_ORIGDSTADDR in h's control messages. */
static const struct sockaddr_in *orig_dst(struct msghdr *h)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c != NULL; c = CMSG_NXTHDR(h, c)) {
		if (c->cmsg_level == SOL_IP && c->cmsg_type == IP_ORIGDSTADDR &&
		    c->cmsg_len >= CMSG_LEN(sizeof(struct sockaddr_in)))
			return (const struct sockaddr_in *)CMSG_DATA(c);
	}
	return NULL;
}

static uint8_t bufs[BATCH][BUFSZ];
static struct mmsghdr rx[BATCH], tx[BATCH];
static struct iovec rxiov[BATCH], txiov[BATCH];
static struct sockaddr_in names[BATCH], dsts[BATCH];
/* Room for IP_ORIGDSTADDR and whatever else the socket was asked for. */
#define CTLSZ (CMSG_SPACE(sizeof(struct sockaddr_in)) + 64)
static _Alignas(struct cmsghdr) char ctl[BATCH][CTLSZ];

/* send_batch sends tx[0..n) and returns how many the kernel refused; a
 * refused message is skipped, not retried, as the worker does. */
static uint64_t send_batch(int fd, unsigned n, uint64_t *sent)
{
	uint64_t failed = 0;
	unsigned off = 0;
	while (off < n) {
		int r = sendmmsg(fd, tx + off, n - off, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			failed++;
			off++;
			continue;
		}
		*sent += (unsigned)r;
		off += (unsigned)r;
	}
	return failed;
}

static void publish(struct stats *out, const struct stats *s)
{
	if (out == NULL)
		return;
	__atomic_store_n(&out->received, s->received, __ATOMIC_RELAXED);
	__atomic_store_n(&out->forwarded, s->forwarded, __ATOMIC_RELAXED);
	__atomic_store_n(&out->no_flow, s->no_flow, __ATOMIC_RELAXED);
	__atomic_store_n(&out->wrong_source, s->wrong_source, __ATOMIC_RELAXED);
	__atomic_store_n(&out->truncated, s->truncated, __ATOMIC_RELAXED);
	__atomic_store_n(&out->send_failed, s->send_failed, __ATOMIC_RELAXED);
	__atomic_store_n(&out->batches, s->batches, __ATOMIC_RELAXED);
}

static int relay(int rxfd, int rawfd, struct stats *shared)
{
	struct stats st = {0};
	for (int i = 0; i < BATCH; i++) {
		/* Received into the buffer past the headers, sent from its
		 * start: the payload is never copied. */
		rxiov[i].iov_base = bufs[i] + HDRS;
		rxiov[i].iov_len = BUFSZ - HDRS;
		rx[i].msg_hdr.msg_iov = &rxiov[i];
		rx[i].msg_hdr.msg_iovlen = 1;
		rx[i].msg_hdr.msg_name = &names[i];
		txiov[i].iov_base = bufs[i];
		tx[i].msg_hdr.msg_iov = &txiov[i];
		tx[i].msg_hdr.msg_iovlen = 1;
		tx[i].msg_hdr.msg_name = &dsts[i];
		tx[i].msg_hdr.msg_namelen = sizeof(dsts[i]);
		dsts[i].sin_family = AF_INET;
	}
	for (;;) {
		for (int i = 0; i < BATCH; i++) {
			rx[i].msg_hdr.msg_namelen = sizeof(names[i]);
			rx[i].msg_hdr.msg_control = ctl[i];
			rx[i].msg_hdr.msg_controllen = CTLSZ;
			rx[i].msg_hdr.msg_flags = 0;
		}
		int n = recvmmsg(rxfd, rx, BATCH, MSG_WAITFORONE, NULL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			perror("cmmsg: recvmmsg");
			return 1;
		}
		unsigned m = 0;
		for (int i = 0; i < n; i++) {
			struct msghdr *h = &rx[i].msg_hdr;
			if (h->msg_flags & MSG_TRUNC) {
				st.truncated++;
				continue;
			}
			const struct sockaddr_in *d = orig_dst(h);
			struct flow *f = d == NULL ? NULL : lookup(d->sin_addr.s_addr, d->sin_port);
			if (f == NULL) {
				st.no_flow++;
				continue;
			}
			if (!f->any_source &&
			    (names[i].sin_addr.s_addr != f->src_addr ||
			     (f->src_port != 0 && names[i].sin_port != f->src_port))) {
				st.wrong_source++;
				continue;
			}
			size_t len = rx[i].msg_len;
			write_headers(bufs[i], len, f);
			f->packets++;
			f->bytes += len;
			/* tx[m] carries bufs[i]: m <= i, so no buffer is
			 * written that a queued message still points to. */
			txiov[m].iov_base = bufs[i];
			txiov[m].iov_len = HDRS + len;
			dsts[m].sin_addr.s_addr = f->to_addr;
			m++;
		}
		st.received += (unsigned)n;
		st.batches++;
		if (m > 0)
			st.send_failed += send_batch(rawfd, m, &st.forwarded);
		publish(shared, &st);
	}
}

static int parse_int(const char *s, int *v)
{
	char *end;
	errno = 0;
	long x = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || end == s || x < 0 || x > 1 << 20)
		return -1;
	*v = (int)x;
	return 0;
}

int main(int argc, char **argv)
{
	int rxfd = -1, statsfd = -1, cpu = -1, opt;
	while ((opt = getopt(argc, argv, "r:s:c:")) != -1) {
		int *dst = opt == 'r' ? &rxfd : opt == 's' ? &statsfd : opt == 'c' ? &cpu : NULL;
		if (dst == NULL || parse_int(optarg, dst) < 0) {
			fprintf(stderr, "usage: cmmsg -r FD [-s FD] [-c CPU] < flows\n");
			return 2;
		}
	}
	if (rxfd < 0 || optind != argc) {
		fprintf(stderr, "usage: cmmsg -r FD [-s FD] [-c CPU] < flows\n");
		return 2;
	}
	if (load_flows(stdin) < 0)
		return 1;
	struct stats *shared = NULL;
	if (statsfd >= 0) {
		shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, statsfd, 0);
		if (shared == MAP_FAILED) {
			perror("cmmsg: mmap the counters");
			return 1;
		}
	}
	if (cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set) < 0) {
			perror("cmmsg: pin to its CPU");
			return 1;
		}
	}
	int rawfd = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
	if (rawfd < 0) {
		perror("cmmsg: raw socket");
		return 1;
	}
	int sndbuf = 8 << 20;
	if (setsockopt(rawfd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof(sndbuf)) < 0) {
		perror("cmmsg: SO_SNDBUFFORCE");
		return 1;
	}
	printf("ready %u\n", nflows);
	fflush(stdout);
	return relay(rxfd, rawfd, shared);
}
