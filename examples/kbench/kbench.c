// SPDX-License-Identifier: GPL-2.0
// Copyright (C) 2026 The moddeb developers
/*
 * kbench - micro-benchmark of the kernel's IPv4 FIB route lookup.
 *
 * Interface (all under /sys/kernel/kbench):
 *   loop_count       rw  number of fib_lookup() calls per run (1..1000000)
 *   flow_dst_ipaddr  rw  destination address of the looked-up flow (dotted quad)
 *   run              ro  reading it performs one benchmark run and returns
 *                        "min=N max=N count=N p95=N p90=N p50=N mad=N[ err=N]"
 *                        (all times in nanoseconds; err= is appended only when
 *                        at least one lookup failed, e.g. no route)
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/kobject.h>
#include <linux/sysfs.h>
#include <linux/mutex.h>
#include <linux/ktime.h>
#include <linux/sort.h>
#include <linux/slab.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/rcupdate.h>
#include <linux/string.h>
#include <linux/inet.h>
#include <net/flow.h>
#include <net/ip_fib.h>
#include <net/net_namespace.h>

#define KBENCH_LOOPS_DEFAULT	1000U
#define KBENCH_LOOPS_MIN	1U
#define KBENCH_LOOPS_MAX	1000000U
/* Let the scheduler in every this many iterations (outside the RCU section). */
#define KBENCH_RESCHED_EVERY	1024U

static DEFINE_MUTEX(kbench_lock);	/* protects the settings and serialises runs */
static unsigned int kbench_loops = KBENCH_LOOPS_DEFAULT;
static __be32 kbench_daddr;		/* set in kbench_init() */
static struct kobject *kbench_kobj;

static int kbench_cmp_u64(const void *a, const void *b)
{
	u64 x = *(const u64 *)a;
	u64 y = *(const u64 *)b;

	if (x < y)
		return -1;
	return x > y;
}

/* Nearest-rank percentile of an ascending array of n (> 0) samples. */
static u64 kbench_pct(const u64 *sorted, unsigned int n, unsigned int pct)
{
	unsigned long rank = DIV_ROUND_UP((unsigned long)n * pct, 100UL);

	if (rank == 0)
		rank = 1;
	return sorted[rank - 1];
}

static ssize_t loop_count_show(struct kobject *kobj,
			       struct kobj_attribute *attr, char *buf)
{
	unsigned int v;

	mutex_lock(&kbench_lock);
	v = kbench_loops;
	mutex_unlock(&kbench_lock);
	return sysfs_emit(buf, "%u\n", v);
}

static ssize_t loop_count_store(struct kobject *kobj,
				struct kobj_attribute *attr,
				const char *buf, size_t count)
{
	unsigned int v;
	int ret;

	ret = kstrtouint(buf, 0, &v);
	if (ret)
		return ret;
	if (v < KBENCH_LOOPS_MIN || v > KBENCH_LOOPS_MAX)
		return -ERANGE;

	ret = mutex_lock_interruptible(&kbench_lock);
	if (ret)
		return ret;
	kbench_loops = v;
	mutex_unlock(&kbench_lock);
	return count;
}

static ssize_t flow_dst_ipaddr_show(struct kobject *kobj,
				    struct kobj_attribute *attr, char *buf)
{
	__be32 a;

	mutex_lock(&kbench_lock);
	a = kbench_daddr;
	mutex_unlock(&kbench_lock);
	return sysfs_emit(buf, "%pI4\n", &a);
}

static ssize_t flow_dst_ipaddr_store(struct kobject *kobj,
				     struct kobj_attribute *attr,
				     const char *buf, size_t count)
{
	size_t len = count;
	const char *end;
	__be32 a;
	int ret;

	if (len && buf[len - 1] == '\n')
		len--;
	if (len == 0 || len > 15)	/* "255.255.255.255" */
		return -EINVAL;
	if (!in4_pton(buf, len, (u8 *)&a, -1, &end) || end != buf + len)
		return -EINVAL;

	ret = mutex_lock_interruptible(&kbench_lock);
	if (ret)
		return ret;
	kbench_daddr = a;
	mutex_unlock(&kbench_lock);
	return count;
}

static ssize_t run_show(struct kobject *kobj,
			struct kobj_attribute *attr, char *buf)
{
	unsigned int n, i, errors = 0;
	u64 min, max, p95, p90, p50, mad;
	struct fib_result res;
	struct flowi4 fl4;
	__be32 daddr;
	u64 *samples;
	ssize_t len;
	int ret;

	ret = mutex_lock_interruptible(&kbench_lock);
	if (ret)
		return ret;

	n = kbench_loops;
	daddr = kbench_daddr;

	samples = kvmalloc_array(n, sizeof(*samples), GFP_KERNEL);
	if (!samples) {
		ret = -ENOMEM;
		goto out_unlock;
	}

	for (i = 0; i < n; i++) {
		u64 t0, t1;
		int err;

		/* fib_lookup() may touch the key, so rebuild it every time. */
		memset(&fl4, 0, sizeof(fl4));
		fl4.daddr = daddr;
		fl4.flowi4_scope = RT_SCOPE_UNIVERSE;

		rcu_read_lock();
		t0 = ktime_get_ns();
		err = fib_lookup(&init_net, &fl4, &res, 0);
		t1 = ktime_get_ns();
		rcu_read_unlock();

		samples[i] = t1 - t0;
		if (err)
			errors++;

		if ((i + 1) % KBENCH_RESCHED_EVERY == 0)
			cond_resched();
	}

	sort(samples, n, sizeof(*samples), kbench_cmp_u64, NULL);
	min = samples[0];
	max = samples[n - 1];
	p95 = kbench_pct(samples, n, 95);
	p90 = kbench_pct(samples, n, 90);
	p50 = kbench_pct(samples, n, 50);

	/* Median absolute deviation: median of |x - median|. */
	for (i = 0; i < n; i++)
		samples[i] = samples[i] > p50 ? samples[i] - p50 : p50 - samples[i];
	sort(samples, n, sizeof(*samples), kbench_cmp_u64, NULL);
	mad = kbench_pct(samples, n, 50);

	kvfree(samples);

	len = sysfs_emit(buf, "min=%llu max=%llu count=%u p95=%llu p90=%llu p50=%llu mad=%llu",
			 min, max, n, p95, p90, p50, mad);
	if (errors)
		len += sysfs_emit_at(buf, len, " err=%u", errors);
	len += sysfs_emit_at(buf, len, "\n");
	mutex_unlock(&kbench_lock);
	return len;

out_unlock:
	mutex_unlock(&kbench_lock);
	return ret;
}

static struct kobj_attribute kbench_attr_loop_count = __ATTR_RW(loop_count);
static struct kobj_attribute kbench_attr_flow_dst_ipaddr = __ATTR_RW(flow_dst_ipaddr);
/* Root-only: a read burns CPU for up to KBENCH_LOOPS_MAX lookups. */
static struct kobj_attribute kbench_attr_run = __ATTR(run, 0400, run_show, NULL);

static struct attribute *kbench_attrs[] = {
	&kbench_attr_loop_count.attr,
	&kbench_attr_flow_dst_ipaddr.attr,
	&kbench_attr_run.attr,
	NULL,
};

static const struct attribute_group kbench_group = {
	.attrs = kbench_attrs,
};

static int __init kbench_init(void)
{
	int ret;

	/* 192.0.2.1 (TEST-NET-1): resolves via the default route, if any. */
	kbench_daddr = htonl(0xc0000201);

	kbench_kobj = kobject_create_and_add("kbench", kernel_kobj);
	if (!kbench_kobj)
		return -ENOMEM;

	ret = sysfs_create_group(kbench_kobj, &kbench_group);
	if (ret) {
		kobject_put(kbench_kobj);
		return ret;
	}

	pr_info("loaded, see /sys/kernel/kbench\n");
	return 0;
}

static void __exit kbench_exit(void)
{
	sysfs_remove_group(kbench_kobj, &kbench_group);
	kobject_put(kbench_kobj);
}

module_init(kbench_init);
module_exit(kbench_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Benchmark of IPv4 FIB route lookups (fib_lookup)");
MODULE_VERSION("0.1");
