// SPDX-License-Identifier: GPL-2.0
// Copyright (C) 2026 The moddeb developers
/*
 * failinit - builds everywhere, but refuses to load: its init function
 * logs an error and returns -ENODEV, so insmod/modprobe fail.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/init.h>
#include <linux/errno.h>
#include <linux/printk.h>

static int __init failinit_init(void)
{
	pr_err("no supported device present, refusing to load\n");
	return -ENODEV;
}

/* Never called (init always fails); present so the module is unloadable in principle. */
static void __exit failinit_exit(void)
{
}

module_init(failinit_init);
module_exit(failinit_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Example module whose init always fails with -ENODEV");
MODULE_VERSION("0.2");
