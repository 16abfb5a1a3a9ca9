// SPDX-License-Identifier: GPL-2.0
// Copyright (C) 2026 The moddeb developers
/* hello - the smallest useful loadable kernel module. */

#include <linux/module.h>
#include <linux/init.h>
#include <linux/printk.h>

static int __init hello_init(void)
{
	pr_info("hello: loaded\n");
	return 0;
}

static void __exit hello_exit(void)
{
	pr_info("hello: unloaded\n");
}

module_init(hello_init);
module_exit(hello_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Minimal hello-world module");
MODULE_VERSION("1.0");
