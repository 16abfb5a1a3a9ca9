/* SPDX-License-Identifier: GPL-2.0 */
// Copyright (C) 2026 The moddeb developers
#ifndef _VENDORNIC_H_
#define _VENDORNIC_H_

#include <linux/netdevice.h>
#include <linux/atomic.h>

#define VENDORNIC_NAME		"vendornic"
#define VENDORNIC_MAX_PORTS	4

/* Per-port private data, stored behind the net_device (netdev_priv()). */
struct vendornic_priv {
	unsigned int port;
	atomic64_t tx_packets;
	atomic64_t tx_bytes;
};

/* vendornic_util.c */
void vendornic_netdev_setup(struct net_device *netdev);
void vendornic_count_tx(struct vendornic_priv *priv, unsigned int len);

#endif /* _VENDORNIC_H_ */
