/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the socket programs (svcproxy_sock.bpf.c) and the packet path
 * (svcproxy_tc.bpf.c) share about services: the layout of a service's entry and of
 * its endpoints (mirrored in backends/ebpf/layout.py) and the address helpers. How
 * an endpoint is picked from them is pick.h.
 */
#ifndef SVCPROXY_SERVICE_H
#define SVCPROXY_SERVICE_H

#define F_AFFINITY 1 /* sessionAffinity ClientIP: the same client gets the same endpoint */
#define F_REFUSE 2   /* no usable endpoint: refused (ECONNREFUSED, a RST, an ICMP error) */

#define MAX_AFFINITY_SCAN 4096 /* endpoints of a set a membership check reads, at most */

struct svc_key {
	__u32 addr[4]; /* IPv4 in addr[0], the rest zero */
	__u16 port;    /* network byte order */
	__u8 proto;    /* IPPROTO_TCP, IPPROTO_UDP (or IPPROTO_SCTP on the packet path) */
	__u8 family;   /* 4 or 6 */
};

struct svc_val {
	__u32 set_id;  /* endpoints live under (set_id, slot); a change writes a new set */
	__u16 count;   /* endpoints in the set */
	__u16 flags;   /* F_* (each program adds its own) */
	__u32 affinity_timeout; /* seconds */
	__u32 service_id; /* the service port: affinity across its addresses (affinity.h) */
};

struct ep_key {
	__u32 set_id;
	__u32 slot;
};

struct ep_val {
	__u32 addr[4];
	__u16 port; /* network byte order */
	__u8 family;
	__u8 flags; /* the packet path's EP_*; 0 for the socket programs */
};

static __always_inline int same_addr(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

static __always_inline void copy_addr(__u32 *to, const __u32 *from)
{
	to[0] = from[0];
	to[1] = from[1];
	to[2] = from[2];
	to[3] = from[3];
}

/* The same endpoint: address, port and family (its flags aside). */
static __always_inline int same_ep(const struct ep_val *a, const struct ep_val *b)
{
	return a->port == b->port && a->family == b->family && same_addr(a->addr, b->addr);
}

#endif
