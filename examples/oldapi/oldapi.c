// SPDX-License-Identifier: GPL-2.0
// Copyright (C) 2026 The moddeb developers
/*
 * oldapi - deliberately depends on strlcpy(), which was removed from the
 * kernel in Linux 6.8.  Builds against 6.1 headers, fails against >= 6.8.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/init.h>
#include <linux/printk.h>
#include <linux/string.h>

static char oldapi_greeting[16];

static int __init oldapi_init(void)
{
	size_t want;

	want = strlcpy(oldapi_greeting, "hello from an old API", sizeof(oldapi_greeting));
	pr_info("copied \"%s\" (source length %zu, buffer %zu)\n",
		oldapi_greeting, want, sizeof(oldapi_greeting));
	return 0;
}

static void __exit oldapi_exit(void)
{
	pr_info("unloaded\n");
}

module_init(oldapi_init);
module_exit(oldapi_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Example module using strlcpy(), an API removed in Linux 6.8");
MODULE_VERSION("0.3");
