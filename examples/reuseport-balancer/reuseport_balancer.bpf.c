// SPDX-License-Identifier: GPL-2.0-only
/*
 * reuseport_balancer: spread the datagrams of a SO_REUSEPORT group at random.
 *
 * The kernel picks a socket of a reuseport group by hashing the 4-tuple, so
 * every datagram of one flow lands on the same worker. Attached to the group
 * with SO_ATTACH_REUSEPORT_EBPF, this program instead picks a worker uniformly
 * at random from the sockets its loader stored in the `workers` map.
 *
 * The loader sets n_sockets through the skeleton's rodata before loading; the
 * verifier then knows it as a constant.
 *
 * Copyright (C) 2026 moddeb authors
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define MAX_WORKERS 256

/* How many sockets the loader puts in `workers` (slots 0 .. n_sockets-1). */
const volatile __u32 n_sockets = 0;

struct {
	__uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
	__uint(max_entries, MAX_WORKERS);
	__type(key, __u32);
	__type(value, __u64);
} workers SEC(".maps");

SEC("sk_reuseport")
int select_worker(struct sk_reuseport_md *reuse)
{
	__u32 n = n_sockets;
	__u32 slot;

	/* Unconfigured: let the kernel's own hash choose. */
	if (n == 0 || n > MAX_WORKERS)
		return SK_PASS;
	slot = bpf_get_prandom_u32() % n;
	/*
	 * On failure (an empty slot while a worker restarts) SK_PASS without a
	 * selection falls back to the hash, so no datagram is dropped.
	 */
	bpf_sk_select_reuseport(reuse, &workers, &slot, 0);
	return SK_PASS;
}

char LICENSE[] SEC("license") = "GPL";
