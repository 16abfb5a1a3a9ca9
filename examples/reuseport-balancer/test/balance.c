// SPDX-License-Identifier: GPL-2.0-only
/*
 * balance: attach reuseport_balancer to N UDP sockets on 127.0.0.1, send M
 * datagrams of ONE flow (one client socket) and count where they land.
 *
 * Without the program the kernel's 4-tuple hash sends all of them to one
 * socket; with it they should spread evenly. Prints the counts and Pearson's
 * chi-square statistic against the uniform distribution.
 *
 * Exit codes: 0 spread evenly, 1 not even, 2 usage or socket error,
 * 77 the kernel refused (no privilege, no BPF): skipped, with the reason.
 *
 * Build: cc -O2 -I<dir with reuseport_balancer.skel.h> balance.c -static -lbpf -lelf -lz
 * Usage: balance [N [M]]            with the BPF program
 *        balance --no-bpf [N [M]]   the kernel's hash alone, for comparison
 *
 * Copyright (C) 2026 moddeb authors
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "reuseport_balancer.skel.h"

#ifndef SO_ATTACH_REUSEPORT_EBPF
#define SO_ATTACH_REUSEPORT_EBPF 52
#endif

#define MAX_N 64
#define BATCH 64
#define EXIT_SKIP 77

/* chi-square critical values at p = 0.001 for 1..15 degrees of freedom */
static const double chi2_crit[] = {
	0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12,
	27.88, 29.59, 31.26, 32.91, 34.53, 36.12, 37.70,
};

static int drain(const int *socks, int n, long *counts)
{
	char buf[64];
	int got = 0;

	for (int i = 0; i < n; i++)
		while (recv(socks[i], buf, sizeof(buf), MSG_DONTWAIT) > 0) {
			counts[i]++;
			got++;
		}
	return got;
}

static int skip(const char *what, int err)
{
	printf("SKIP: %s: %s\n", what, strerror(err));
	return EXIT_SKIP;
}

int main(int argc, char **argv)
{
	struct reuseport_balancer_bpf *skel = NULL;
	struct sockaddr_in addr = { .sin_family = AF_INET };
	socklen_t alen = sizeof(addr);
	int socks[MAX_N], use_bpf = 1, n = 4, m = 20000, one = 1, client, sent = 0;
	long counts[MAX_N] = { 0 }, received = 0;
	double expected, chi2 = 0;

	if (argc > 1 && strcmp(argv[1], "--no-bpf") == 0) {
		use_bpf = 0;
		argc--, argv++;
	}
	if (argc > 1)
		n = atoi(argv[1]);
	if (argc > 2)
		m = atoi(argv[2]);
	if (n < 2 || n > MAX_N || m < n) {
		fprintf(stderr, "usage: balance [--no-bpf] [N (2..%d) [M >= N]]\n", MAX_N);
		return 2;
	}

	if (use_bpf) {
		skel = reuseport_balancer_bpf__open();
		if (!skel)
			return skip("opening the BPF object", errno);
		/* The read-only global: set before load, a constant to the verifier. */
		skel->rodata->n_sockets = n;
		if (reuseport_balancer_bpf__load(skel)) {
			int err = errno;
			reuseport_balancer_bpf__destroy(skel);
			return skip("loading the BPF program (needs root or CAP_BPF)", err);
		}
	}

	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (int i = 0; i < n; i++) {
		socks[i] = socket(AF_INET, SOCK_DGRAM, 0);
		if (socks[i] < 0 ||
		    setsockopt(socks[i], SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) ||
		    bind(socks[i], (struct sockaddr *)&addr, sizeof(addr))) {
			perror("worker socket");
			return 2;
		}
		if (i == 0 && getsockname(socks[0], (struct sockaddr *)&addr, &alen)) {
			perror("getsockname");
			return 2;
		}
		if (use_bpf) {
			__u32 slot = i;
			__u64 fd = socks[i];

			if (bpf_map__update_elem(skel->maps.workers, &slot, sizeof(slot), &fd,
						 sizeof(fd), BPF_ANY)) {
				perror("storing the socket in the workers map");
				return 2;
			}
		}
	}
	if (use_bpf) {
		int prog = bpf_program__fd(skel->progs.select_worker);

		if (setsockopt(socks[0], SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &prog,
			       sizeof(prog)))
			return skip("attaching to the reuseport group", errno);
	}

	client = socket(AF_INET, SOCK_DGRAM, 0);
	if (client < 0 || connect(client, (struct sockaddr *)&addr, sizeof(addr))) {
		perror("client socket");
		return 2;
	}
	/* Send in batches and drain in between, so no receive queue overflows. */
	while (sent < m) {
		for (int b = 0; b < BATCH && sent < m; b++, sent++)
			if (send(client, "moddeb", 6, 0) != 6) {
				perror("send");
				return 2;
			}
		received += drain(socks, n, counts);
	}
	for (int tries = 0; received < m && tries < 100; tries++) {
		usleep(1000);
		received += drain(socks, n, counts);
	}

	expected = (double)received / n;
	printf("%s: %d sockets, %d datagrams of one flow sent, %ld received\n",
	       use_bpf ? "reuseport_balancer" : "kernel hash", n, m, received);
	for (int i = 0; i < n; i++) {
		double d = counts[i] - expected;
		chi2 += d * d / expected;
		printf("  socket %2d: %6ld (%5.1f%%)\n", i, counts[i], 100.0 * counts[i] / received);
	}
	printf("chi-square %.2f with %d degrees of freedom", chi2, n - 1);
	if (n - 1 < (int)(sizeof(chi2_crit) / sizeof(chi2_crit[0]))) {
		int even = received == m && chi2 < chi2_crit[n - 1];

		printf(" (critical value at p=0.001: %.2f): %s\n", chi2_crit[n - 1],
		       even ? "EVEN" : "NOT EVEN");
		reuseport_balancer_bpf__destroy(skel);
		return even ? 0 : 1;
	}
	printf("\n");
	reuseport_balancer_bpf__destroy(skel);
	return received == m ? 0 : 1;
}
