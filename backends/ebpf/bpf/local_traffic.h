/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kube-proxy's local-traffic detector (--detect-local-mode) for the packet path,
 * included by svcproxy_tc.bpf.c after struct pkt: a new flow to a ClusterIP whose entry
 * carries F_MASQ_NONLOCAL is masqueraded unless it is local traffic, as kube-proxy
 * marks it. What "local" means is the node context's, written by the backend
 * (local_traffic.py, layouts in packet_layout.py):
 *
 * - spp_local, one entry: the current generation and, per family, how to tell
 *   (LOCAL_NONE: no detector, nothing is masqueraded by this rule, as kube-proxy
 *   leaves the rule out; LOCAL_BY_SOURCE: ClusterCIDR or NodeCIDR; LOCAL_BY_DEVICE:
 *   InterfaceNamePrefix or BridgeInterface);
 * - spp_local_cidrs: the local prefixes, an LPM trie keyed by (generation, family,
 *   address);
 * - spp_local_devices: the ifindexes of the devices local traffic arrives by, keyed by
 *   (generation, ifindex).
 *
 * A new set is written under a new generation, then spp_local switches to it in one
 * update, then the old generation's entries are deleted: no packet sees a half-written
 * set. A device of the current set that comes or goes is one element added or deleted.
 *
 * Local traffic to an endpoint on another node is DNATed only (kube-proxy does not
 * masquerade it): its answers come back through this node, the source node of a pod.
 * Without a detector that is not known, and such a flow stays SNATed.
 */
#ifndef SVCPROXY_LOCAL_TRAFFIC_H
#define SVCPROXY_LOCAL_TRAFFIC_H

#define LOCAL_NONE 0
#define LOCAL_BY_SOURCE 1
#define LOCAL_BY_DEVICE 2

struct local_cfg {
	__u32 gen;
	__u8 mode4; /* LOCAL_* for IPv4 */
	__u8 mode6; /* LOCAL_* for IPv6 */
	__u8 pad[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct local_cfg);
} spp_local SEC(".maps");

struct local_cidr_key {
	__u32 prefixlen; /* 64 (generation and family) + the prefix's length */
	__u32 gen;
	__u32 family;    /* 4 or 6 */
	__u32 addr[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct local_cidr_key);
	__type(value, __u8);
} spp_local_cidrs SEC(".maps");

struct local_dev_key {
	__u32 gen;
	__u32 ifindex;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct local_dev_key);
	__type(value, __u8);
} spp_local_devices SEC(".maps");

#define TRAFFIC_UNKNOWN 0   /* no detector: kube-proxy has no rule either way */
#define TRAFFIC_LOCAL 1     /* the detector counts it local */
#define TRAFFIC_NONLOCAL 2  /* the detector counts it not local */

/* What the detector says of a packet of ``p`` that arrived on ``ifindex``. */
static __always_inline int local_verdict(const struct pkt *p, __u32 ifindex)
{
	__u32 zero = 0;
	struct local_cfg *found = bpf_map_lookup_elem(&spp_local, &zero);
	struct local_cfg cfg;
	__u8 mode;

	if (!found)
		return TRAFFIC_UNKNOWN;
	cfg = *found; /* one generation and its modes, whatever an update does meanwhile */
	mode = p->family == 4 ? cfg.mode4 : cfg.mode6;
	if (mode == LOCAL_BY_SOURCE) {
		struct local_cidr_key k = {
			.prefixlen = 64 + (p->family == 4 ? 32 : 128),
			.gen = cfg.gen,
			.family = p->family,
		};

		copy_addr(k.addr, p->saddr);
		return bpf_map_lookup_elem(&spp_local_cidrs, &k) ? TRAFFIC_LOCAL : TRAFFIC_NONLOCAL;
	}
	if (mode == LOCAL_BY_DEVICE) {
		struct local_dev_key k = { .gen = cfg.gen, .ifindex = ifindex };

		return bpf_map_lookup_elem(&spp_local_devices, &k) ? TRAFFIC_LOCAL : TRAFFIC_NONLOCAL;
	}
	return TRAFFIC_UNKNOWN;
}

/* Is a packet of ``p`` that arrived on ``ifindex`` masqueraded by kube-proxy's rule for
 * traffic to a ClusterIP that is not local? Never without a detector. */
static __always_inline int masq_nonlocal(const struct pkt *p, __u32 ifindex)
{
	return local_verdict(p, ifindex) == TRAFFIC_NONLOCAL;
}

/* Is it local traffic, as the detector says? Never without a detector. */
static __always_inline int is_local_traffic(const struct pkt *p, __u32 ifindex)
{
	return local_verdict(p, ifindex) == TRAFFIC_LOCAL;
}

#endif
