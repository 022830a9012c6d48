// SPDX-License-Identifier: Apache-2.0
/*
 * svcproxy packet path (--ebpf-packet-path bpf): tc programs on the node's devices
 * for traffic that arrives from outside. Ingress: a packet to a service address
 * (NodePort, externalIP, load-balancer VIP) is looked up in spp_services (a VIP with
 * source ranges lets only sources in spp_ranges through), an endpoint is picked
 * (random, Maglev, or the client's affinity) and remembered in the connection tracking
 * map spp_ct; an endpoint on this node gets the packet DNATed and handed to the stack,
 * an endpoint on another node gets it DNATed and SNATed to this node's address (a port
 * from spp_ct's reply entries) and redirected out after a FIB lookup; no endpoint at
 * all gets a RST or a port unreachable back. A local endpoint's flow is SNATed too
 * where kube-proxy masquerades: external traffic with externalTrafficPolicy Cluster,
 * --masquerade-all, and ClusterIP traffic that is not local (local_traffic.h); a remote
 * endpoint's flow is DNATed only (and redirected out) where kube-proxy does not
 * masquerade it: ClusterIP traffic the detector counts local. Replies are reversed:
 * SNATed ones on ingress (then redirected to the client), DNATed-only ones on egress.
 * IPv4 and IPv6 (without extension headers), TCP and UDP.
 *
 * The maps are written by the Python backend; the layouts are mirrored in
 * backends/ebpf/packet_layout.py and must change together.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "service.h"
#include "stats.h"
#include "sctp.h"

#define AF_INET 2
#define AF_INET6 10
#ifndef IPPROTO_ICMPV6
#define IPPROTO_ICMPV6 58
#endif
#define ICMP_DEST_UNREACH 3
#define ICMP_PORT_UNREACH 3
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PORT_UNREACH 4
#define ICMP_FRAG_NEEDED 4
#define ICMPV6_PKT_TOOBIG 2

#define F_MAGLEV 4
#define F_RANGES 8 /* loadBalancerSourceRanges: only sources in spp_ranges get through */
#define F_MASQ 16  /* traffic from outside with externalTrafficPolicy Cluster: SNATed */
#define F_MASQ_ALL 32 /* --masquerade-all, ClusterIPs from outside: SNATed, never DSR */
#define F_MASQ_NONLOCAL 64 /* a ClusterIP: SNATed unless local traffic (local_traffic.h) */

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

#define EP_LOCAL 1 /* the endpoint runs on this node: DNAT only */

#define CT_FORWARD 0
#define CT_REPLY 1
#define CT_SNAT 1 /* the flow is SNATed to this node's address */
#define CT_ROUTE 4 /* forward entry: DNATed only to another node's endpoint, redirected out */

#define NAT_TRIES 16

#define MAGLEV_MAX 65521

/* Set by the loader before the object is loaded (the verifier sees constants). */
volatile const __u32 maglev_size = 16381;
/* The NAT ports: those the node's own connections never take (nat_ports.py). */
volatile const __u32 nat_port_min = 32768;
volatile const __u32 nat_port_span = 32768;

struct ct_key {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u8 dir; /* CT_FORWARD: as it arrived from the client; CT_REPLY: as the endpoint sent it */
	__u8 pad;
};

/* What to rewrite a packet of the flow to, in this direction. */
struct ct_val {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 flags; /* CT_* */
	__u8 state; /* forward entries: CTS_* (ct.h) */
	__u8 pad[2];
	__u32 set_id; /* forward: the endpoint set the endpoint was in when last checked */
	__u32 pad2;
	__u64 last_ns;
};

struct dev_val {
	__u32 addr4; /* the device's IPv4 address, what remote endpoints are SNATed to */
	__u32 addr6[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct svc_key);
	__type(value, struct svc_val);
} spp_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ep_key);
	__type(value, struct ep_val);
} spp_endpoints SEC(".maps");

/* set id -> Maglev table: maglev_size u16 slot indexes (the value size is set at load). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 2 * 16381);
} spp_maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct ct_key);
	__type(value, struct ct_val);
} spp_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct dev_val);
} spp_devices SEC(".maps");

/* loadBalancerSourceRanges: (service address, source CIDR) longest-prefix entries. */
struct range_key {
	__u32 prefixlen; /* 160 (the service key) + the CIDR's length */
	struct svc_key svc;
	__u32 src[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct range_key);
	__type(value, __u8);
} spp_ranges SEC(".maps");

/* Every ClusterIP (address, family): a port no service has there is refused. */
struct cip_key {
	__u32 addr[4];
	__u32 family;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cip_key);
	__type(value, __u8);
} spp_cluster_ips SEC(".maps");

/* sessionAffinity ClientIP: the endpoint a client got from a service address, and when. */
struct aff_key {
	__u32 client[4];
	struct svc_key svc; /* the address and port zeroed when ``id`` is set */
	__u32 id;           /* the service port's service_id (affinity.h) */
};

#include "affinity.h"

struct aff_val {
	__u64 last_ns;
	struct ep_val ep;
	__u32 reserved;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct aff_key);
	__type(value, struct aff_val);
} spp_affinity SEC(".maps");

struct pkt {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family;   /* 4 or 6 */
	__u8 tcp_flags;
	__u32 l4;      /* offset of the L4 header */
	__u32 csum;    /* offset of the L4 checksum */
	__u64 l4flags; /* extra flags for bpf_l4_csum_replace */
};

static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	__u16 ports[2];
	__u8 proto;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
			return -1;
		if (ip.ihl < 5 || (ip.frag_off & bpf_htons(0x3fff)))
			return -1; /* fragments are left to the stack */
		p->saddr[0] = ip.saddr;
		p->daddr[0] = ip.daddr;
		p->family = 4;
		p->l4 = ETH_HLEN + ip.ihl * 4;
		proto = ip.protocol;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)))
			return -1;
		/* Extension headers (fragments included) are left to the stack. */
		__builtin_memcpy(p->saddr, &ip6.saddr, 16);
		__builtin_memcpy(p->daddr, &ip6.daddr, 16);
		p->family = 6;
		p->l4 = ETH_HLEN + sizeof(ip6);
		proto = ip6.nexthdr;
	} else {
		return -1;
	}
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP)
		return -1;
	if (bpf_skb_load_bytes(skb, p->l4, ports, sizeof(ports)))
		return -1;
	p->sport = ports[0];
	p->dport = ports[1];
	p->proto = proto;
	if (proto == IPPROTO_TCP && bpf_skb_load_bytes(skb, p->l4 + 13, &p->tcp_flags, 1))
		return -1;
	p->csum = p->l4 + (proto == IPPROTO_TCP ? 16 : proto == IPPROTO_UDP ? 6 : SCTP_CSUM_OFF);
	p->l4flags = proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	return 0;
}

#include "ct.h"
#include "local_traffic.h"

/* Is a new flow of this service to a local endpoint, arrived on ``ifindex``, SNATed
 * (when the device toward the endpoint carries the programs and so sees its replies)? */
static __always_inline int snat_local(const struct svc_val *sv, const struct pkt *p,
				      __u32 ifindex)
{
	if (sv->flags & (F_MASQ | F_MASQ_ALL))
		return 1;
	return (sv->flags & F_MASQ_NONLOCAL) && masq_nonlocal(p, ifindex);
}

/* Is a new flow of this service to an endpoint on another node, arrived on ``ifindex``,
 * DNATed only? ClusterIP traffic the detector counts local, without --masquerade-all:
 * kube-proxy does not masquerade it, and its replies come back through this node. */
static __always_inline int dnat_remote(const struct svc_val *sv, const struct pkt *p,
				       __u32 ifindex)
{
	return (sv->flags & F_MASQ_NONLOCAL) && is_local_traffic(p, ifindex);
}

/* Is a new flow of this service to ``ep`` DNATed only (the rest is SNATed or DSR)?
 * ``dev``: the device toward the endpoint, when it carries the programs. */
static __always_inline int dnat_only(const struct svc_val *sv, const struct pkt *p,
				     const struct ep_val *ep, const struct dev_val *dev,
				     __u32 ifindex)
{
	/* A client reaching itself through its service (hairpin) is SNATed, or its reply
	 * would never leave the pod; so is, with F_MASQ (kube-proxy's masquerade of
	 * external traffic with externalTrafficPolicy Cluster, and its rules for
	 * ClusterIPs: snat_local), a local endpoint behind a device carrying the
	 * programs, which then sees its replies. */
	if (ep->flags & EP_LOCAL)
		return !same_addr(ep->addr, p->saddr) && !(dev && snat_local(sv, p, ifindex));
	return dnat_remote(sv, p, ifindex);
}

/* Rewrite the source (daddr 0) or destination address, checksums included (SCTP's
 * covers no address: see sctp.h). */
static __always_inline void set_addr(struct __sk_buff *skb, struct pkt *p, int daddr,
				     const __u32 *new)
{
	__u32 *old = daddr ? p->daddr : p->saddr;
	__u32 want[4];

	copy_addr(want, new);
	if (same_addr(old, want))
		return;
	if (p->family == 4) {
		if (p->proto != IPPROTO_SCTP)
			bpf_l4_csum_replace(skb, p->csum, old[0], want[0],
					    BPF_F_PSEUDO_HDR | 4 | p->l4flags);
		bpf_l3_csum_replace(skb, ETH_HLEN + 10, old[0], want[0], 4);
		bpf_skb_store_bytes(skb, ETH_HLEN + (daddr ? 16 : 12), want, 4, 0);
	} else {
		__s64 diff = bpf_csum_diff(old, 16, want, 16, 0);

		if (p->proto != IPPROTO_SCTP)
			bpf_l4_csum_replace(skb, p->csum, 0, diff, BPF_F_PSEUDO_HDR | p->l4flags);
		bpf_skb_store_bytes(skb, ETH_HLEN + (daddr ? 24 : 8), want, 16, 0);
	}
	copy_addr(old, want);
}

static __always_inline void set_port(struct __sk_buff *skb, struct pkt *p, int dport, __u16 new)
{
	__u16 old = dport ? p->dport : p->sport;

	if (old == new)
		return;
	if (p->proto != IPPROTO_SCTP)
		bpf_l4_csum_replace(skb, p->csum, old, new, 2 | p->l4flags);
	bpf_skb_store_bytes(skb, p->l4 + (dport ? 2 : 0), &new, 2, 0);
	if (dport)
		p->dport = new;
	else
		p->sport = new;
}

static __always_inline void rewrite(struct __sk_buff *skb, struct pkt *p, const struct ct_val *v)
{
	int ports = p->sport != v->sport || p->dport != v->dport;

	set_addr(skb, p, 0, v->saddr);
	set_addr(skb, p, 1, v->daddr);
	set_port(skb, p, 0, v->sport);
	set_port(skb, p, 1, v->dport);
	if (ports && p->proto == IPPROTO_SCTP)
		sctp_csum(skb, p->l4); /* the ports are in SCTP's CRC32c */
}

static __always_inline void fib_params(struct bpf_fib_lookup *fib, struct __sk_buff *skb,
				       const struct pkt *p, const __u32 *daddr)
{
	fib->l4_protocol = p->proto;
	fib->sport = p->sport;
	fib->dport = p->dport;
	fib->ifindex = skb->ifindex;
	if (p->family == 4) {
		fib->family = AF_INET;
		fib->ipv4_src = p->saddr[0];
		fib->ipv4_dst = daddr[0];
	} else {
		fib->family = AF_INET6;
		copy_addr(fib->ipv6_src, p->saddr);
		copy_addr(fib->ipv6_dst, daddr);
	}
}

/* Send the (rewritten) packet out of the device the route to its destination uses. */
static __always_inline int fib_redirect(struct __sk_buff *skb, const struct pkt *p)
{
	struct bpf_fib_lookup fib = {};
	long rc;

	fib_params(&fib, skb, p, p->daddr);
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		bpf_skb_store_bytes(skb, 0, fib.dmac, ETH_ALEN, 0);
		bpf_skb_store_bytes(skb, ETH_ALEN, fib.smac, ETH_ALEN, 0);
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = { .nh_family = fib.family };

		if (p->family == 4)
			nh.ipv4_nh = fib.ipv4_dst;
		else
			copy_addr(nh.ipv6_nh, fib.ipv6_dst);
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	return TC_ACT_SHOT;
}

/* The egress device for ``daddr`` (0: no route). */
static __always_inline __u32 route_oif(struct __sk_buff *skb, const struct pkt *p,
				       const __u32 *daddr)
{
	struct bpf_fib_lookup fib = {};
	long rc;

	fib_params(&fib, skb, p, daddr);
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	return rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH ? fib.ifindex : 0;
}

static __always_inline __u32 mix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* maglev.flow_hash in Python: the same on every node (no per-boot seed). */
static __always_inline __u32 flow_hash(const struct pkt *p)
{
	__u32 h = 0x5eed5eed;

	h = mix(h ^ p->saddr[0]);
	h = mix(h ^ p->saddr[1]);
	h = mix(h ^ p->saddr[2]);
	h = mix(h ^ p->saddr[3]);
	h = mix(h ^ p->daddr[0]);
	h = mix(h ^ p->daddr[1]);
	h = mix(h ^ p->daddr[2]);
	h = mix(h ^ p->daddr[3]);
	h = mix(h ^ ((__u32)bpf_ntohs(p->sport) << 16 | bpf_ntohs(p->dport)));
	h = mix(h ^ p->proto);
	return h;
}

static __always_inline __u32 slot_of(const struct svc_val *sv, __u32 hash)
{
	if (sv->flags & F_MAGLEV) {
		__u32 set_id = sv->set_id;
		__u16 *table = bpf_map_lookup_elem(&spp_maglev, &set_id);
		__u32 size = maglev_size;

		if (table && size && size <= MAGLEV_MAX) {
			__u32 idx = hash % size;

			/* The verifier does not bound a modulo: compare after a barrier. */
			asm volatile("" : "+r"(idx));
			if (idx < size) {
				__u32 slot = table[idx];

				if (slot < sv->count)
					return slot;
			}
		}
		return hash % sv->count;
	}
	return bpf_get_prandom_u32() % sv->count;
}

#include "pick.h"

DEFINE_SCAN(scan_one, spp_endpoints)

/* An endpoint of the service's current set (pick.h). */
static __always_inline int pick(const struct svc_key *sk, struct svc_val *sv, __u32 hash,
				struct ep_val *out)
{
	return pick_in(&spp_services, &spp_endpoints, sk, sv, hash, out);
}

/* Is the flow's endpoint (its forward entry's destination) in the service's set? */
static __always_inline int member(const struct svc_val *sv, const struct ct_val *fv, __u8 family)
{
	struct ep_val want = { .port = fv->dport, .family = family };

	copy_addr(want.addr, fv->daddr);
	return in_set(scan_one, sv, &want, 0);
}

/* The client's remembered endpoint when it is still one of the set's and fresh. */
static __always_inline int affine(const struct aff_key *ak, const struct svc_val *sv,
				  __u64 now, struct ep_val *out)
{
	struct aff_val *av = bpf_map_lookup_elem(&spp_affinity, ak);

	/* ``out`` as the set holds it now (its on-this-node flag included). */
	if (!av || !affinity_fresh(sv, av->last_ns, now) || !in_set(scan_one, sv, &av->ep, out))
		return -1;
	av->last_ns = now;
	return 0;
}

static __always_inline void ct_tuple(struct ct_key *k, const __u32 *saddr, const __u32 *daddr,
				     __u16 sport, __u16 dport, const struct pkt *p, __u8 dir)
{
	copy_addr(k->saddr, saddr);
	copy_addr(k->daddr, daddr);
	k->sport = sport;
	k->dport = dport;
	k->proto = p->proto;
	k->family = p->family;
	k->dir = dir;
}

/* The reply entry of a flow SNATed to ``snat``: back to the client, from the service. */
static __always_inline void snat_reply(struct ct_val *rv, const struct pkt *p, __u64 now)
{
	copy_addr(rv->saddr, p->daddr);
	copy_addr(rv->daddr, p->saddr);
	rv->sport = p->dport;
	rv->dport = p->sport;
	rv->flags = CT_SNAT;
	rv->last_ns = now;
}

/* Reply entry of a flow to a remote endpoint: a NAT port free for (endpoint, node address). */
static __always_inline int nat_port(struct pkt *p, const struct ep_val *ep, const __u32 *snat,
				    __u64 now, __u16 *port)
{
	struct ct_val rv = {};

	snat_reply(&rv, p, now);
	for (int i = 0; i < NAT_TRIES; i++) {
		struct ct_key rk = {};
		__u16 candidate = bpf_ntohs(p->sport);

		if (i || candidate < nat_port_min || candidate - nat_port_min >= nat_port_span)
			candidate = nat_port_min + bpf_get_prandom_u32() % nat_port_span;
		ct_tuple(&rk, ep->addr, snat, ep->port, bpf_htons(candidate), p, CT_REPLY);
		if (!bpf_map_update_elem(&spp_ct, &rk, &rv, BPF_NOEXIST)) {
			*port = bpf_htons(candidate);
			return 0;
		}
	}
	stat_inc(STAT_NAT_EXHAUSTED);
	return -1;
}

/* The one's complement sum ``csum`` (bpf_csum_diff's) folded into a checksum. */
static __always_inline __u16 fold(__s64 csum)
{
	__u32 sum = (__u32)csum;

	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* An ICMP or ICMPv6 header of an error (type, code, checksum, 4 unused bytes). */
struct icmp_err {
	__u8 type;
	__u8 code;
	__u16 checksum;
	__u32 unused;
};

struct reject4 {
	struct iphdr ip;
	struct icmp_err icmp;
	struct iphdr orig;
	__u8 orig_l4[8];
};

struct reject6 {
	struct ipv6hdr ip;
	struct icmp_err icmp;
	struct ipv6hdr orig;
	__u8 orig_l4[8];
};

struct pseudo6 {
	__u32 saddr[4];
	__u32 daddr[4];
	__u32 len;
	__u8 zero[3];
	__u8 next;
};

struct tcp_min {
	__u16 source;
	__u16 dest;
	__u32 seq;
	__u32 ack_seq;
	__u8 doff;  /* data offset in the high nibble */
	__u8 flags; /* TCP_* */
	__u16 window;
	__u16 check;
	__u16 urg;
};


struct pseudo4 {
	__u32 saddr;
	__u32 daddr;
	__u8 zero;
	__u8 proto;
	__u16 len;
};

/* Room for building an answer (kept off the 512-byte stack). */
struct scratch {
	struct reject4 r4;
	struct reject6 r6;
	struct pseudo4 ph4;
	struct pseudo6 ph6;
	struct iphdr ip4;
	struct ipv6hdr ip6;
	struct tcp_min in;
	struct tcp_min out;
	struct ethhdr eth;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} spp_scratch SEC(".maps");

/* The RST answering this TCP segment (RFC 9293 3.10.7.1), in place: addresses and ports
 * swapped, options and data cut. */
static __always_inline int reset(struct __sk_buff *skb, const struct pkt *p, struct scratch *x)
{
	__u32 len, l3 = p->family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	struct tcp_min *in = &x->in, *out = &x->out;
	__s64 sum;

	if (p->l4 != ETH_HLEN + l3 || bpf_skb_load_bytes(skb, p->l4, in, sizeof(*in)))
		return TC_ACT_SHOT;
	if (in->flags & TCP_RST)
		return TC_ACT_SHOT;
	len = skb->len - p->l4 - (in->doff >> 4) * 4;
	out->source = in->dest;
	out->dest = in->source;
	out->doff = 5 << 4;
	if (in->flags & TCP_ACK) {
		out->seq = in->ack_seq;
		out->flags = TCP_RST;
	} else {
		len += (in->flags & TCP_SYN ? 1 : 0) + (in->flags & TCP_FIN ? 1 : 0);
		out->ack_seq = bpf_htonl(bpf_ntohl(in->seq) + len);
		out->flags = TCP_RST | TCP_ACK;
	}
	if (bpf_skb_change_tail(skb, p->l4 + sizeof(*out), 0))
		return TC_ACT_SHOT;
	if (p->family == 4) {
		struct iphdr *ip = &x->ip4;
		struct pseudo4 *ph = &x->ph4;

		ip->version = 4;
		ip->ihl = 5;
		ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(*out));
		ip->ttl = 64;
		ip->protocol = IPPROTO_TCP;
		ip->saddr = p->daddr[0];
		ip->daddr = p->saddr[0];
		ip->check = fold(bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(*ip), 0));
		ph->saddr = ip->saddr;
		ph->daddr = ip->daddr;
		ph->proto = IPPROTO_TCP;
		ph->len = bpf_htons(sizeof(*out));
		sum = bpf_csum_diff(0, 0, (__be32 *)ph, sizeof(*ph), 0);
		out->check = fold(bpf_csum_diff(0, 0, (__be32 *)out, sizeof(*out), sum));
		if (bpf_skb_store_bytes(skb, ETH_HLEN, ip, sizeof(*ip), 0))
			return TC_ACT_SHOT;
	} else {
		struct ipv6hdr *ip = &x->ip6;
		struct pseudo6 *ph = &x->ph6;

		ip->version = 6;
		ip->payload_len = bpf_htons(sizeof(*out));
		ip->nexthdr = IPPROTO_TCP;
		ip->hop_limit = 64;
		copy_addr(ph->saddr, p->daddr);
		copy_addr(ph->daddr, p->saddr);
		__builtin_memcpy(&ip->saddr, ph->saddr, 16);
		__builtin_memcpy(&ip->daddr, ph->daddr, 16);
		ph->len = bpf_htonl(sizeof(*out));
		ph->next = IPPROTO_TCP;
		sum = bpf_csum_diff(0, 0, (__be32 *)ph, sizeof(*ph), 0);
		out->check = fold(bpf_csum_diff(0, 0, (__be32 *)out, sizeof(*out), sum));
		if (bpf_skb_store_bytes(skb, ETH_HLEN, ip, sizeof(*ip), 0))
			return TC_ACT_SHOT;
	}
	if (bpf_skb_store_bytes(skb, p->l4, out, sizeof(*out), 0))
		return TC_ACT_SHOT;
	return 0;
}

/* An ICMP / ICMPv6 error quoting this packet, in its place: port unreachable, or with
 * ``mtu`` fragmentation needed / packet too big announcing it (RFC 1191, RFC 8201). */
static __always_inline int unreachable(struct __sk_buff *skb, const struct pkt *p, struct scratch *x,
				       __u32 mtu)
{
	if (p->family == 4) {
		struct reject4 *r = &x->r4;

		if (p->l4 != ETH_HLEN + sizeof(struct iphdr) ||
		    bpf_skb_load_bytes(skb, ETH_HLEN, &r->orig, sizeof(r->orig) + sizeof(r->orig_l4)))
			return TC_ACT_SHOT;
		if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(*r), 0))
			return TC_ACT_SHOT;
		r->ip.version = 4;
		r->ip.ihl = 5;
		r->ip.tot_len = bpf_htons(sizeof(*r));
		r->ip.ttl = 64;
		r->ip.protocol = IPPROTO_ICMP;
		r->ip.saddr = r->orig.daddr;
		r->ip.daddr = r->orig.saddr;
		r->ip.check = fold(bpf_csum_diff(0, 0, (__be32 *)&r->ip, sizeof(r->ip), 0));
		r->icmp.type = ICMP_DEST_UNREACH;
		r->icmp.code = mtu ? ICMP_FRAG_NEEDED : ICMP_PORT_UNREACH;
		r->icmp.unused = bpf_htonl(mtu & 0xffff); /* the next hop's MTU, low 16 bits */
		r->icmp.checksum = fold(bpf_csum_diff(0, 0, (__be32 *)&r->icmp,
						      sizeof(*r) - sizeof(r->ip), 0));
		if (bpf_skb_store_bytes(skb, ETH_HLEN, r, sizeof(*r), 0))
			return TC_ACT_SHOT;
	} else {
		struct reject6 *r = &x->r6;
		struct pseudo6 *ph = &x->ph6;
		__s64 sum;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &r->orig, sizeof(r->orig) + sizeof(r->orig_l4)))
			return TC_ACT_SHOT;
		if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(*r), 0))
			return TC_ACT_SHOT;
		r->ip.version = 6;
		r->ip.payload_len = bpf_htons(sizeof(*r) - sizeof(r->ip));
		r->ip.nexthdr = IPPROTO_ICMPV6;
		r->ip.hop_limit = 64;
		r->ip.saddr = r->orig.daddr;
		r->ip.daddr = r->orig.saddr;
		r->icmp.type = mtu ? ICMPV6_PKT_TOOBIG : ICMPV6_DEST_UNREACH;
		r->icmp.code = mtu ? 0 : ICMPV6_PORT_UNREACH;
		r->icmp.unused = bpf_htonl(mtu);
		copy_addr(ph->saddr, p->daddr);
		copy_addr(ph->daddr, p->saddr);
		ph->len = bpf_htonl(sizeof(*r) - sizeof(r->ip));
		ph->next = IPPROTO_ICMPV6;
		sum = bpf_csum_diff(0, 0, (__be32 *)ph, sizeof(*ph), 0);
		r->icmp.checksum = fold(bpf_csum_diff(0, 0, (__be32 *)&r->icmp,
						      sizeof(*r) - sizeof(r->ip), sum));
		if (bpf_skb_store_bytes(skb, ETH_HLEN, r, sizeof(*r), 0))
			return TC_ACT_SHOT;
	}
	return 0;
}

/* This packet becomes an answer and goes back where it came from. ``mtu`` 0: no
 * endpoint at all, refused as kube-proxy's REJECT does, as the client sees it
 * (ECONNREFUSED): a TCP segment gets a RST, anything else an ICMP port unreachable (a
 * RST also reaches a client whose socket is busy sending, which an ICMP error may not).
 * Else: too big for the path, ICMP fragmentation needed / ICMPv6 packet too big
 * announcing ``mtu`` (dsr.h). */
static __noinline int answer(struct __sk_buff *skb, const struct pkt *p, __u32 mtu)
{
	__u32 zero = 0;
	struct scratch *x = bpf_map_lookup_elem(&spp_scratch, &zero);

	if (!x)
		return TC_ACT_SHOT;
	__builtin_memset(x, 0, sizeof(*x));
	if (bpf_skb_load_bytes(skb, 0, &x->eth, sizeof(x->eth)))
		return TC_ACT_SHOT;
	if (!mtu && p->proto == IPPROTO_TCP ? reset(skb, p, x) : unreachable(skb, p, x, mtu))
		return TC_ACT_SHOT;
	/* Back to the sender: the MACs swapped. */
	if (bpf_skb_store_bytes(skb, 0, x->eth.h_source, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, x->eth.h_dest, ETH_ALEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

static __always_inline int reject(struct __sk_buff *skb, const struct pkt *p)
{
	return answer(skb, p, 0);
}

#include "dsr.h"

/* A new flow to a service: pick, remember both directions. 0, or the verdict. */
static __always_inline int new_flow(struct __sk_buff *skb, struct pkt *p, struct svc_val *sv,
			       struct ct_key *fk, struct ct_val *fv)
{
	struct ep_val ep;
	struct ct_key rk = {};
	struct svc_key svc = {}, *sk = &svc;
	__u64 now = bpf_ktime_get_ns();
	struct dev_val *dev;
	__u32 oif;

	copy_addr(svc.addr, p->daddr);
	svc.port = p->dport;
	svc.proto = p->proto;
	svc.family = p->family;
	if (sv->flags & F_REFUSE)
		return reject(skb, p);
	if (!sv->count)
		return TC_ACT_SHOT; /* endpoints, none for this traffic: dropped, as kube-proxy */
	if (sv->flags & F_AFFINITY) {
		struct aff_key ak = { .svc = *sk };

		copy_addr(ak.client, p->saddr);
		affinity_scope(&ak.svc, &ak.id, sv);
		if (affine(&ak, sv, now, &ep)) {
			struct aff_val av = { .last_ns = now };

			if (pick(sk, sv, flow_hash(p), &ep))
				return TC_ACT_SHOT;
			av.ep = ep;
			bpf_map_update_elem(&spp_affinity, &ak, &av, BPF_ANY);
		}
	} else if (pick(sk, sv, flow_hash(p), &ep)) {
		return TC_ACT_SHOT;
	}
	if (ep.family != p->family)
		return TC_ACT_SHOT;
	copy_addr(fv->daddr, ep.addr);
	fv->dport = ep.port;
	fv->set_id = sv->set_id;
	copy_addr(fv->saddr, p->saddr);
	fv->sport = p->sport;
	fv->last_ns = now;
	oif = route_oif(skb, p, ep.addr);
	dev = oif ? bpf_map_lookup_elem(&spp_devices, &oif) : 0;
	if (dnat_only(sv, p, &ep, dev, skb->ifindex)) {
		struct ct_val rv = {};

		/* The reply entry, reversed on the way to the client (spp_egress). */
		copy_addr(rv.saddr, p->daddr);
		rv.sport = p->dport;
		copy_addr(rv.daddr, p->saddr);
		rv.dport = p->sport;
		rv.last_ns = now;
		ct_tuple(&rk, ep.addr, p->saddr, ep.port, p->sport, p, CT_REPLY);
		bpf_map_update_elem(&spp_ct, &rk, &rv, BPF_ANY);
		if (!(ep.flags & EP_LOCAL))
			fv->flags = CT_ROUTE; /* out by the route to the endpoint's node */
	} else if ((sv->flags & F_MASQ) && dsr_applies(skb, p, &ep, dev, oif)) {
		fv->flags = CT_DSR; /* in Geneve to the endpoint's node, not SNATed (dsr.h) */
	} else {
		__u32 snat[4];
		__u16 port;

		copy_addr(snat, p->daddr);
		if (dev && p->family == 4 && dev->addr4)
			snat[0] = dev->addr4;
		else if (dev && p->family == 6 && (dev->addr6[0] || dev->addr6[1] ||
						   dev->addr6[2] || dev->addr6[3]))
			copy_addr(snat, dev->addr6);
		if (nat_port(p, &ep, snat, now, &port))
			return TC_ACT_SHOT;
		copy_addr(fv->saddr, snat);
		fv->sport = port;
		fv->flags = CT_SNAT;
	}
	bpf_map_update_elem(&spp_ct, fk, fv, BPF_ANY);
	return 0;
}

/* The reply entry of a SNATed or routed (CT_ROUTE) flow, put back if the LRU dropped it. */
static __always_inline void keep_reply(const struct pkt *p, const struct ct_val *fv, __u64 now)
{
	struct ct_key rk = {};
	struct ct_val rv = {};

	ct_tuple(&rk, fv->daddr, fv->saddr, fv->dport, fv->sport, p, CT_REPLY);
	if (bpf_map_lookup_elem(&spp_ct, &rk))
		return;
	snat_reply(&rv, p, now);
	rv.flags = fv->flags & CT_SNAT; /* a routed flow's reply is reversed on egress */
	bpf_map_update_elem(&spp_ct, &rk, &rv, BPF_ANY);
}

SEC("tc")
int spp_ingress(struct __sk_buff *skb)
{
	struct pkt p = {};
	struct ct_key k = {};
	struct ct_val *found, fv = {};
	struct svc_key sk = {};
	struct svc_val *svp, sv;
	int verdict = dsr_decap(skb);

	if (verdict >= 0)
		return verdict; /* a flow of another node's, in Geneve (--ebpf-dsr) */
	if (parse(skb, &p))
		return TC_ACT_OK;
	/* A reply of a flow SNATed to this node: back to the client, from the service. */
	ct_tuple(&k, p.saddr, p.daddr, p.sport, p.dport, &p, CT_REPLY);
	found = bpf_map_lookup_elem(&spp_ct, &k);
	if (found && (found->flags & CT_SNAT)) {
		__u64 now = bpf_ktime_get_ns();

		if (!ct_reply_seen(&p, found, now, &k))
			return TC_ACT_OK; /* not the flow's: to this node's own socket */
		found->last_ns = now;
		rewrite(skb, &p, found);
		return fib_redirect(skb, &p);
	}
	copy_addr(sk.addr, p.daddr);
	sk.port = p.dport;
	sk.proto = p.proto;
	sk.family = p.family;
	svp = bpf_map_lookup_elem(&spp_services, &sk);
	if (!svp) {
		struct cip_key ck = { .family = p.family };

		copy_addr(ck.addr, p.daddr);
		/* A ClusterIP on a port its services lack: refused, as kube-proxy does. */
		return bpf_map_lookup_elem(&spp_cluster_ips, &ck) ? reject(skb, &p) : TC_ACT_OK;
	}
	sv = *svp;
	if (sv.flags & F_RANGES) {
		struct range_key rk = { .prefixlen = 160 + (p.family == 4 ? 32 : 128), .svc = sk };

		copy_addr(rk.src, p.saddr);
		if (!bpf_map_lookup_elem(&spp_ranges, &rk))
			return TC_ACT_SHOT; /* not an allowed source: dropped, as kube-proxy */
	}
	ct_tuple(&k, p.saddr, p.daddr, p.sport, p.dport, &p, CT_FORWARD);
	found = bpf_map_lookup_elem(&spp_ct, &k);
	if (found && ct_stale(found, &p, bpf_ktime_get_ns()))
		found = 0; /* expired, or a SYN after a close: a new flow */
	if (found && found->set_id != sv.set_id) {
		/* The service changed since: is the flow's endpoint still one of it? A UDP
		 * flow whose endpoint left moves at once (kube-proxy's stale-UDP rule), and so
		 * does a new TCP connection reusing the tuple (a SYN); an open TCP connection
		 * keeps its endpoint, as kube-proxy leaves it to its own timeouts. */
		if (member(&sv, found, p.family))
			found->set_id = sv.set_id;
		else if (p.proto == IPPROTO_UDP || (p.tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN)
			found = 0;
	}
	if (found) {
		ct_seen(found, &p, 0, bpf_ktime_get_ns());
		fv = *found;
		if (fv.flags & (CT_SNAT | CT_ROUTE))
			keep_reply(&p, &fv, found->last_ns);
	} else {
		verdict = new_flow(skb, &p, &sv, &k, &fv);
		if (verdict)
			return verdict;
	}
	if (fv.flags & CT_DSR) {
		dsr_remember(&p, found);
		__u32 mtu = dsr_too_big(skb, &p, &fv);

		if (mtu)
			return answer(skb, &p, mtu); /* the client learns the path's MTU (dsr.h) */
	}
	rewrite(skb, &p, &fv);
	if (fv.flags & CT_DSR)
		return dsr_forward(skb, &p);
	if (fv.flags & (CT_SNAT | CT_ROUTE))
		return fib_redirect(skb, &p);
	return TC_ACT_OK;
}

SEC("tc")
int spp_egress(struct __sk_buff *skb)
{
	struct pkt p = {};
	struct ct_key k = {};
	struct ct_val *found;

	if (parse(skb, &p))
		return TC_ACT_OK;
	/* A reply of a flow DNATed only (a local endpoint's, a routed one's) on its way to
	 * the client: from the service again. */
	ct_tuple(&k, p.saddr, p.daddr, p.sport, p.dport, &p, CT_REPLY);
	found = bpf_map_lookup_elem(&spp_ct, &k);
	if (found && !(found->flags & CT_SNAT)) {
		struct ct_val v = *found;

		v.last_ns = bpf_ktime_get_ns(); /* now (the copy's time is not used) */
		if (ct_reply_seen(&p, &v, v.last_ns, &k)) {
			found->last_ns = v.last_ns;
			rewrite(skb, &p, &v);
		}
	}
	return TC_ACT_OK;
}

#include "xdp.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";
