// SPDX-License-Identifier: GPL-2.0
// Copyright (C) 2026 The moddeb developers
/*
 * vendornic - a fake NIC driver laid out like a vendor's out-of-tree
 * driver tarball.  On load it registers num_ports dummy Ethernet
 * interfaces (vnic0, vnic1, ...) that count and drop every frame.
 * No hardware is touched.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/init.h>
#include <linux/moduleparam.h>
#include <linux/netdevice.h>

#include "vendornic.h"

static unsigned int num_ports = 1;
module_param(num_ports, uint, 0444);
MODULE_PARM_DESC(num_ports, "Number of fake ports to create (0-4, default 1)");

static struct net_device *vendornic_ports[VENDORNIC_MAX_PORTS];

static void vendornic_remove_all(void)
{
	int i;

	for (i = VENDORNIC_MAX_PORTS - 1; i >= 0; i--) {
		if (!vendornic_ports[i])
			continue;
		unregister_netdev(vendornic_ports[i]);
		free_netdev(vendornic_ports[i]);
		vendornic_ports[i] = NULL;
	}
}

static int vendornic_add_port(unsigned int port)
{
	struct vendornic_priv *priv;
	struct net_device *netdev;
	int err;

	netdev = alloc_netdev(sizeof(*priv), "vnic%d", NET_NAME_ENUM,
			      vendornic_netdev_setup);
	if (!netdev)
		return -ENOMEM;

	priv = netdev_priv(netdev);
	priv->port = port;
	atomic64_set(&priv->tx_packets, 0);
	atomic64_set(&priv->tx_bytes, 0);

	err = register_netdev(netdev);
	if (err) {
		free_netdev(netdev);
		return err;
	}

	vendornic_ports[port] = netdev;
	netdev_info(netdev, "fake port %u registered\n", port);
	return 0;
}

static int __init vendornic_init(void)
{
	unsigned int i;
	int err;

	if (num_ports > VENDORNIC_MAX_PORTS) {
		pr_err("num_ports=%u out of range (max %d)\n",
		       num_ports, VENDORNIC_MAX_PORTS);
		return -EINVAL;
	}

	for (i = 0; i < num_ports; i++) {
		err = vendornic_add_port(i);
		if (err) {
			pr_err("failed to register port %u: %d\n", i, err);
			vendornic_remove_all();
			return err;
		}
	}

	pr_info("loaded with %u port(s)\n", num_ports);
	return 0;
}

static void __exit vendornic_exit(void)
{
	vendornic_remove_all();
	pr_info("unloaded\n");
}

module_init(vendornic_init);
module_exit(vendornic_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Fake vendor NIC driver (count-and-drop dummy Ethernet ports)");
