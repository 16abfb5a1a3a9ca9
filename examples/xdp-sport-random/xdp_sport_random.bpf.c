// SPDX-License-Identifier: GPL-2.0-only
/*
 * xdp_sport_random: give each incoming UDP datagram to the host a random
 * source port, so that SO_REUSEPORT's 4-tuple hash spreads even a single
 * flow across the sockets of a reuseport group.
 *
 * Which packets: UDP to a destination port in [dport_min, dport_max] and, when
 * set, to one IPv4 (daddr4) or IPv6 (daddr6) address. Everything else, IP
 * fragments and IPv6 packets with extension headers included, passes untouched.
 * The UDP checksum is updated incrementally (RFC 1624); for IPv4 it can instead
 * be cleared (clear_csum4), which RFC 768 allows.
 *
 * Rewriting the source port means replies go to a port the sender does not
 * listen on: use it for one-way traffic (logs, metrics, telemetry).
 *
 * Every knob is a read-only global the loader sets before load (skeleton
 * rodata); the defaults match nothing, so loading it unconfigured is harmless.
 *
 * Copyright (C) 2026 moddeb authors
 */
#include "vmlinux.h"
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define IPPROTO_UDP 17
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

/* Destination ports to act on, host byte order, inclusive; 0..0 matches none. */
const volatile __u16 dport_min = 0;
const volatile __u16 dport_max = 0;
/* Destination addresses to act on, network byte order; all zero matches any. */
const volatile __be32 daddr4 = 0;
const volatile __be32 daddr6[4] = {};
/* The range new source ports are drawn from, host byte order, inclusive. */
const volatile __u16 sport_min = 32768;
const volatile __u16 sport_max = 60999;
/* IPv4 only: clear the UDP checksum instead of updating it. */
const volatile bool clear_csum4 = false;

/* RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'); byte order does not matter. */
static __always_inline __u16 csum_replace(__u16 check, __u16 from, __u16 to)
{
	__u32 sum = (__u16)~check;

	sum += (__u16)~from;
	sum += to;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

static __always_inline bool dport_wanted(__be16 dest)
{
	__u16 port = bpf_ntohs(dest);

	return dport_max != 0 && port >= dport_min && port <= dport_max;
}

static __always_inline bool daddr6_wanted(const struct in6_addr *daddr)
{
	if (!(daddr6[0] | daddr6[1] | daddr6[2] | daddr6[3]))
		return true;
	return daddr->in6_u.u6_addr32[0] == daddr6[0] && daddr->in6_u.u6_addr32[1] == daddr6[1] &&
	       daddr->in6_u.u6_addr32[2] == daddr6[2] && daddr->in6_u.u6_addr32[3] == daddr6[3];
}

/* ipv4: a zero checksum means "none" there and stays so; IPv6 always has one. */
static __always_inline int rewrite(struct udphdr *udp, bool ipv4)
{
	__u16 old = udp->source, new;
	__u32 span;

	if (sport_max < sport_min)
		return XDP_PASS;
	span = (__u32)sport_max - sport_min + 1;
	new = bpf_htons((__u16)(sport_min + bpf_get_prandom_u32() % span));
	if (ipv4 && clear_csum4) {
		udp->check = 0;
	} else if (udp->check || !ipv4) {
		__u16 check = csum_replace(udp->check, old, new);

		/* A computed zero is sent as all ones: zero would mean "no checksum". */
		udp->check = check ? check : 0xffff;
	}
	udp->source = new;
	return XDP_PASS;
}

SEC("xdp")
int sport_random(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct udphdr *udp;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		__u8 ihl;

		if ((void *)(ip + 1) > data_end)
			return XDP_PASS;
		/* The header length nibble, read as a byte: no bitfield to relocate. */
		ihl = *(__u8 *)ip & 0x0f;
		if (ihl < 5 || ip->protocol != IPPROTO_UDP)
			return XDP_PASS;
		/* Only a first fragment carries the UDP header; leave all fragments be. */
		if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return XDP_PASS;
		if (daddr4 && ip->daddr != daddr4)
			return XDP_PASS;
		udp = (void *)ip + ihl * 4;
		if ((void *)(udp + 1) > data_end || !dport_wanted(udp->dest))
			return XDP_PASS;
		return rewrite(udp, true);
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return XDP_PASS;
		if (ip6->nexthdr != IPPROTO_UDP || !daddr6_wanted(&ip6->daddr))
			return XDP_PASS;
		udp = (void *)(ip6 + 1);
		if ((void *)(udp + 1) > data_end || !dport_wanted(udp->dest))
			return XDP_PASS;
		return rewrite(udp, false);
	}
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
