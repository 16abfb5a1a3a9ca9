// SPDX-License-Identifier: GPL-2.0
// Copyright (C) 2026 The moddeb developers
/*
 * vendornic - helper half of the fake NIC driver: net_device operations
 * and statistics.  A transmitted frame is counted and then dropped.
 */

#include <linux/etherdevice.h>
#include <linux/netdevice.h>
#include <linux/skbuff.h>

#include "vendornic.h"

void vendornic_count_tx(struct vendornic_priv *priv, unsigned int len)
{
	atomic64_inc(&priv->tx_packets);
	atomic64_add(len, &priv->tx_bytes);
}

static int vendornic_open(struct net_device *netdev)
{
	netif_carrier_on(netdev);
	netif_start_queue(netdev);
	return 0;
}

static int vendornic_stop(struct net_device *netdev)
{
	netif_stop_queue(netdev);
	netif_carrier_off(netdev);
	return 0;
}

static netdev_tx_t vendornic_xmit(struct sk_buff *skb, struct net_device *netdev)
{
	vendornic_count_tx(netdev_priv(netdev), skb->len);
	dev_kfree_skb_any(skb);
	return NETDEV_TX_OK;
}

static void vendornic_get_stats64(struct net_device *netdev,
				  struct rtnl_link_stats64 *stats)
{
	struct vendornic_priv *priv = netdev_priv(netdev);

	stats->tx_packets = atomic64_read(&priv->tx_packets);
	stats->tx_bytes = atomic64_read(&priv->tx_bytes);
	/* There is no wire: everything "sent" is in fact dropped. */
	stats->tx_dropped = stats->tx_packets;
}

static const struct net_device_ops vendornic_netdev_ops = {
	.ndo_open		= vendornic_open,
	.ndo_stop		= vendornic_stop,
	.ndo_start_xmit		= vendornic_xmit,
	.ndo_get_stats64	= vendornic_get_stats64,
	.ndo_set_mac_address	= eth_mac_addr,
	.ndo_validate_addr	= eth_validate_addr,
};

/* alloc_netdev() setup callback. */
void vendornic_netdev_setup(struct net_device *netdev)
{
	ether_setup(netdev);
	netdev->netdev_ops = &vendornic_netdev_ops;
	netdev->flags |= IFF_NOARP;
	eth_hw_addr_random(netdev);
}
