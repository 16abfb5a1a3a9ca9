// SPDX-License-Identifier: GPL-2.0-only
/*
 * rewrite: run xdp_sport_random on hand-made packets with BPF_PROG_TEST_RUN
 * (nothing is attached to any interface) and check what it did:
 *   - IPv4 and IPv6 UDP to the configured address and port get a source port
 *     from the configured range, a checksum that still verifies, and spread
 *     over that range;
 *   - an IPv4 datagram without checksum keeps none; clear_csum4 clears it;
 *   - other ports, other addresses and fragments pass byte for byte.
 *
 * Exit codes: 0 all good, 1 a check failed, 77 the kernel refused (skipped).
 * Build: cc -O2 -I<dir with xdp_sport_random.skel.h> rewrite.c -static -lbpf -lelf -lz
 *
 * Copyright (C) 2026 moddeb authors
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "xdp_sport_random.skel.h"

#define DPORT 9000
#define SPORT_MIN 40000
#define SPORT_SPAN 64
#define RUNS 4000
#define EXIT_SKIP 77

static int failures;

#define CHECK(cond, ...)                                   \
	do {                                               \
		if (!(cond)) {                             \
			printf("FAIL: " __VA_ARGS__);      \
			printf("\n");                      \
			failures++;                        \
		}                                          \
	} while (0)

static uint32_t sum16(const uint8_t *p, size_t len, uint32_t sum)
{
	for (size_t i = 0; i + 1 < len; i += 2)
		sum += (uint32_t)p[i] << 8 | p[i + 1];
	if (len & 1)
		sum += (uint32_t)p[len - 1] << 8;
	return sum;
}

static uint16_t fold(uint32_t sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

/* UDP checksum over pseudo-header + header + payload; host byte order result. */
static uint16_t udp_csum(const uint8_t *pkt, int v6, size_t udp_off, size_t udp_len)
{
	uint32_t sum = 0;

	if (v6) {
		sum = sum16(pkt + 14 + 8, 32, 0);
		sum += udp_len + 17;
	} else {
		sum = sum16(pkt + 14 + 12, 8, 0);
		sum += 17 + udp_len;
	}
	return fold(sum16(pkt + udp_off, udp_len, sum));
}

/* eth + IPv4/IPv6 + UDP + 8 bytes of payload; returns the length. */
static size_t make_packet(uint8_t *p, int v6, uint16_t dport, int with_csum, uint16_t frag)
{
	size_t ip_len = v6 ? 40 : 20, udp_off = 14 + ip_len, udp_len = 16;

	memset(p, 0, 128);
	p[12] = v6 ? 0x86 : 0x08;
	p[13] = v6 ? 0xdd : 0x00;
	if (v6) {
		p[14] = 0x60;
		p[14 + 4] = 0, p[14 + 5] = udp_len;
		p[14 + 6] = 17;
		p[14 + 7] = 64;
		p[14 + 8 + 15] = 2;  /* saddr ::2 */
		p[14 + 24 + 15] = 1; /* daddr ::1 */
	} else {
		p[14] = 0x45;
		p[14 + 3] = 20 + udp_len;
		p[14 + 6] = frag >> 8, p[14 + 7] = frag & 0xff;
		p[14 + 8] = 64;
		p[14 + 9] = 17;
		memcpy(p + 14 + 12, "\x0a\x00\x00\x02", 4); /* 10.0.0.2 */
		memcpy(p + 14 + 16, "\x0a\x00\x00\x01", 4); /* 10.0.0.1 */
	}
	p[udp_off] = 12345 >> 8, p[udp_off + 1] = 12345 & 0xff;
	p[udp_off + 2] = dport >> 8, p[udp_off + 3] = dport & 0xff;
	p[udp_off + 5] = udp_len;
	memcpy(p + udp_off + 8, "moddeb!!", 8);
	if (with_csum) {
		uint16_t c = udp_csum(p, v6, udp_off, udp_len);

		c = c ? c : 0xffff;
		p[udp_off + 6] = c >> 8, p[udp_off + 7] = c & 0xff;
	}
	return udp_off + udp_len;
}

static int run(int prog, uint8_t *in, size_t len, uint8_t *out)
{
	uint32_t out_len = 128;
	LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = in, .data_size_in = len,
		    .data_out = out, .data_size_out = out_len);

	if (bpf_prog_test_run_opts(prog, &opts))
		return -errno;
	return opts.retval;
}

static void rewritten(int prog, int v6)
{
	uint8_t in[128], out[128];
	size_t len = make_packet(in, v6, DPORT, 1, 0), udp_off = v6 ? 54 : 34;
	int seen[SPORT_SPAN] = { 0 }, distinct = 0, bad_csum = 0, out_of_range = 0;

	for (int i = 0; i < RUNS; i++) {
		int ret = run(prog, in, len, out);
		unsigned sport = out[udp_off] << 8 | out[udp_off + 1];

		if (ret != 2) {
			CHECK(0, "%s: test run returned %d, not XDP_PASS", v6 ? "IPv6" : "IPv4", ret);
			return;
		}
		if (udp_csum(out, v6, udp_off, 16) != 0)
			bad_csum++;
		if (sport < SPORT_MIN || sport >= SPORT_MIN + SPORT_SPAN)
			out_of_range++;
		else if (!seen[sport - SPORT_MIN]++)
			distinct++;
	}
	CHECK(bad_csum == 0, "%s: %d of %d rewritten checksums do not verify",
	      v6 ? "IPv6" : "IPv4", bad_csum, RUNS);
	CHECK(out_of_range == 0, "%s: %d source ports outside %d-%d", v6 ? "IPv6" : "IPv4",
	      out_of_range, SPORT_MIN, SPORT_MIN + SPORT_SPAN - 1);
	CHECK(distinct == SPORT_SPAN, "%s: only %d of %d source ports seen in %d runs",
	      v6 ? "IPv6" : "IPv4", distinct, SPORT_SPAN, RUNS);
	CHECK(memcmp(in + udp_off + 2, out + udp_off + 2, 4) == 0 &&
		      memcmp(in, out, udp_off) == 0,
	      "%s: bytes other than the source port and checksum changed", v6 ? "IPv6" : "IPv4");
	printf("%s: %d runs, %d distinct source ports of %d, checksums verify\n",
	       v6 ? "IPv6" : "IPv4", RUNS, distinct, SPORT_SPAN);
}

static void untouched(int prog, const char *what, int v6, uint16_t dport, int csum,
		      uint16_t frag, uint32_t daddr_last_octet)
{
	uint8_t in[128], out[128];
	size_t len = make_packet(in, v6, dport, csum, frag);

	if (daddr_last_octet)
		in[14 + 19] = daddr_last_octet;
	CHECK(run(prog, in, len, out) == 2 && memcmp(in, out, len) == 0,
	      "%s: the packet was changed", what);
	printf("%s: passed untouched\n", what);
}

static struct xdp_sport_random_bpf *load(int clear)
{
	struct xdp_sport_random_bpf *skel = xdp_sport_random_bpf__open();

	if (!skel)
		return NULL;
	skel->rodata->dport_min = DPORT;
	skel->rodata->dport_max = DPORT;
	skel->rodata->daddr4 = htonl(0x0a000001);
	skel->rodata->sport_min = SPORT_MIN;
	skel->rodata->sport_max = SPORT_MIN + SPORT_SPAN - 1;
	skel->rodata->clear_csum4 = clear;
	if (xdp_sport_random_bpf__load(skel)) {
		xdp_sport_random_bpf__destroy(skel);
		return NULL;
	}
	return skel;
}

int main(void)
{
	struct xdp_sport_random_bpf *skel = load(0), *clearing;
	uint8_t in[128], out[128];
	int prog;

	if (!skel) {
		printf("SKIP: loading the XDP program (needs root or CAP_BPF): %s\n", strerror(errno));
		return EXIT_SKIP;
	}
	prog = bpf_program__fd(skel->progs.sport_random);
	rewritten(prog, 0);
	rewritten(prog, 1);
	untouched(prog, "IPv4 to another port", 0, DPORT + 1, 1, 0, 0);
	untouched(prog, "IPv4 to another address", 0, DPORT, 1, 0, 9);
	untouched(prog, "IPv4 fragment", 0, DPORT, 1, 0x2000, 0);
	untouched(prog, "IPv6 to another port", 1, DPORT - 1, 1, 0, 0);

	/* No checksum in: none out, but the port still changes. */
	make_packet(in, 0, DPORT, 0, 0);
	CHECK(run(prog, in, 50, out) == 2 && out[40] == 0 && out[41] == 0,
	      "IPv4 without checksum: a checksum appeared");
	printf("IPv4 without checksum: stays without\n");

	clearing = load(1);
	CHECK(clearing != NULL, "loading with clear_csum4 failed");
	if (clearing) {
		make_packet(in, 0, DPORT, 1, 0);
		CHECK(run(bpf_program__fd(clearing->progs.sport_random), in, 50, out) == 2 &&
			      out[40] == 0 && out[41] == 0,
		      "clear_csum4: the checksum was not cleared");
		printf("IPv4 with clear_csum4: checksum cleared\n");
		xdp_sport_random_bpf__destroy(clearing);
	}
	xdp_sport_random_bpf__destroy(skel);
	printf("%s\n", failures ? "FAILED" : "ALL OK");
	return failures ? 1 : 0;
}
