/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Direct server return (--ebpf-dsr), included by svcproxy_tc.bpf.c after its helpers.
 *
 * The ingress node sends a new external flow to an endpoint on another node
 * encapsulated in Geneve (outer IP + UDP port 6081 + Geneve header + one option that
 * carries the service's address and port), DNATed but not SNATed. The endpoint's node
 * takes the Geneve header off on its ingress, remembers the service in a reply entry of
 * spp_ct (the shape of a local endpoint's, so spp_egress rewrites the reply's source
 * to the service) and hands the client's packet to the stack: the pod sees the
 * client's address and its reply goes straight to the client.
 *
 * Why Geneve and not IPIP: the reply's source must be the service's address AND port
 * (a NodePort is a port of the ingress node), and an IPIP header has room for neither;
 * a Geneve option carries both, so the endpoint's node needs no state from the ingress
 * node (Cilium's Geneve DSR dispatch does the same). Encapsulation and decapsulation
 * are done in BPF (bpf_skb_adjust_room), so no tunnel device is made.
 */
#ifndef SVCPROXY_DSR_H
#define SVCPROXY_DSR_H

#include <linux/udp.h>

#define CT_DSR 2 /* forward entry: the flow is sent to its endpoint's node in Geneve */
#define DSR_PORT 6081 /* Geneve's IANA port */
#define DSR_CLASS 0xfff0 /* Geneve option class for experimental use (RFC 8926 section 8) */
#define DSR_TYPE 0x81 /* critical (high bit): a receiver that does not know it drops */
#define GENEVE_VER_OPTLEN (1 + 5) /* version 0; options: 6 words (the option's 24 bytes) */

/* Set by the loader (--ebpf-dsr): the verifier sees a constant. */
volatile const __u32 dsr_enabled = 0;

struct dsr_geneve {
	__u8 optlen;   /* version (2 high bits, 0) and options length in 4-byte words */
	__u8 flags;    /* O and C bits: 0 */
	__u16 proto;   /* the inner packet's EtherType */
	__u32 vni;     /* VNI (24 bits, 0) and reserved */
	__u16 cls;     /* DSR_CLASS */
	__u8 type;     /* DSR_TYPE */
	__u8 len;      /* the option's data in 4-byte words: 5 */
	__u32 addr[4]; /* the service's address (IPv4 in the first word) */
	__u16 port;    /* the service's port, network byte order */
	__u16 pad;
};

struct dsr_outer4 {
	struct iphdr ip;
	struct udphdr udp;
	struct dsr_geneve g;
};

struct dsr_outer6 {
	struct ipv6hdr ip;
	struct udphdr udp;
	struct dsr_geneve g;
};

/* Room for the outer headers and the route (kept off the 512-byte stack). */
struct dsr_scratch {
	struct bpf_fib_lookup fib;
	struct dsr_outer4 o4;
	struct dsr_outer6 o6;
	struct dsr_geneve g; /* decapsulation: what came, the flow inside, its reply entry */
	struct pkt in;
	struct ct_key rk;
	struct ct_val rv;
	struct udphdr udp;
	__u16 ports[2];
	struct bpf_redir_neigh nh; /* forwarding: the route, the service the client addressed */
	__u32 svc[4];
	__u16 svc_port;
	__u16 sport;
	__u32 oif;
	__u32 inner;
	long rc;
	__u64 now;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dsr_scratch);
} spp_dsr_scratch SEC(".maps");

/* Is a new flow of a service with F_MASQ to ``ep`` sent in Geneve? Only with --ebpf-dsr,
 * to an endpoint on another node behind a device carrying the programs (``dev``, the
 * route's ``oif``): the route's next hop is the endpoint's node, or the endpoint itself
 * when it is a node's address (host network), which takes the Geneve header off. And
 * only when the client is reached by the same device: a client behind this node (its
 * own pods) would get a reply from this node's address over another path, so it is
 * SNATed as without DSR. */
static __always_inline int dsr_applies(struct __sk_buff *skb, const struct pkt *p,
				       const struct ep_val *ep, const struct dev_val *dev,
				       __u32 oif)
{
	return dsr_enabled && !(ep->flags & EP_LOCAL) && dev && route_oif(skb, p, p->saddr) == oif;
}

/* The bytes Geneve adds in front of a packet of ``family``. */
static __always_inline __u32 dsr_overhead(__u8 family)
{
	return family == 4 ? sizeof(struct dsr_outer4) : sizeof(struct dsr_outer6);
}

/* Before a DSR flow's packet (``p``, as the client sent it) is DNATed to ``fv``: would
 * it, in Geneve, exceed the MTU of the route to its endpoint? Then it is not sent and
 * the client gets what Cilium's DSR answers (its ENABLE_DSR_ICMP_ERRORS): ICMP
 * fragmentation needed / ICMPv6 packet too big announcing the route's MTU minus the
 * Geneve overhead, quoting the packet as sent (answer()), so the client's path MTU
 * discovery sends smaller ones. A GSO packet is not checked: bpf_skb_adjust_room
 * shrinks its segments by the overhead. The MTU to announce, or 0 when it fits. */
static __noinline __u32 dsr_too_big(struct __sk_buff *skb, const struct pkt *p,
				    const struct ct_val *fv)
{
	__u32 zero = 0, overhead = dsr_overhead(p->family), mtu;
	struct dsr_scratch *x = bpf_map_lookup_elem(&spp_dsr_scratch, &zero);

	if (!x || skb->gso_segs > 1 || skb->len <= ETH_HLEN)
		return 0;
	__builtin_memset(&x->fib, 0, sizeof(x->fib));
	fib_params(&x->fib, skb, p, fv->daddr);
	x->fib.tot_len = skb->len - ETH_HLEN + overhead;
	if (bpf_fib_lookup(skb, &x->fib, sizeof(x->fib), 0) != BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return 0;
	mtu = x->fib.mtu_result;
	return mtu > overhead + 68 ? mtu - overhead : 68; /* 68: IPv4's least (RFC 791) */
}

/* The folded one's complement checksum of an IPv4 header. */
static __always_inline __u16 ip4_check(struct iphdr *ip)
{
	ip->check = 0;
	return fold(bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(*ip), 0));
}

/* The answers of a DSR flow never pass this node, so its forward entry (``found``,
 * none for a new flow) counts as answered from the client's second packet on (TCP:
 * anything but a bare SYN): the client keeps talking, it got them; its lifetime is
 * then an answered flow's. */
static __always_inline void dsr_answered(const struct pkt *p, struct ct_val *found)
{
	if (found && !(found->state & CTS_REPLIED) &&
	    (p->proto != IPPROTO_TCP || (p->tcp_flags & (TCP_SYN | TCP_ACK)) != TCP_SYN))
		found->state |= CTS_REPLIED;
}

/* Before a DSR flow's packet is DNATed: remember the service the client addressed
 * (for dsr_forward), and that the flow is answered (dsr_answered). */
static __always_inline void dsr_remember(const struct pkt *p, struct ct_val *found)
{
	__u32 zero = 0;
	struct dsr_scratch *x = bpf_map_lookup_elem(&spp_dsr_scratch, &zero);

	if (x) {
		copy_addr(x->svc, p->daddr);
		x->svc_port = p->dport;
	}
	dsr_answered(p, found);
}

/* The outer headers (x->o4 or x->o6, by ``family``) of a packet of ``inner`` bytes (from
 * its IP header on) in Geneve: from this node's address on the route's device
 * (``dev``) to the route's next hop ``nexthop``, UDP source port ``sport``, the option
 * carrying the service ``x->svc``:``x->svc_port``. 0, or -1 when the device has no
 * address of the family. */
static __always_inline int dsr_outer(struct dsr_scratch *x, __u8 family,
				     const struct dev_val *dev, const __u32 *nexthop,
				     __u16 sport, __u32 inner)
{
	struct dsr_geneve *g;
	struct udphdr *udp;

	if (family == 4) {
		struct dsr_outer4 *o = &x->o4;

		__builtin_memset(o, 0, sizeof(*o));
		if (!dev->addr4)
			return -1;
		o->ip.version = 4;
		o->ip.ihl = 5;
		o->ip.ttl = 64;
		o->ip.protocol = IPPROTO_UDP;
		o->ip.tot_len = bpf_htons(sizeof(*o) + inner);
		o->ip.saddr = dev->addr4;
		o->ip.daddr = nexthop[0];
		o->ip.check = ip4_check(&o->ip);
		o->udp.len = bpf_htons(sizeof(*o) - sizeof(o->ip) + inner);
		udp = &o->udp;
		g = &o->g;
		g->proto = bpf_htons(ETH_P_IP);
	} else {
		struct dsr_outer6 *o = &x->o6;

		__builtin_memset(o, 0, sizeof(*o));
		if (!(dev->addr6[0] | dev->addr6[1] | dev->addr6[2] | dev->addr6[3]))
			return -1;
		o->ip.version = 6;
		o->ip.hop_limit = 64;
		o->ip.nexthdr = IPPROTO_UDP;
		o->ip.payload_len = bpf_htons(sizeof(*o) - sizeof(o->ip) + inner);
		__builtin_memcpy(&o->ip.saddr, dev->addr6, 16);
		__builtin_memcpy(&o->ip.daddr, nexthop, 16);
		/* The UDP checksum stays 0: the receiver is our program (RFC 6935 allows it
		 * for tunnels), which takes the header off before UDP would check it. */
		o->udp.len = o->ip.payload_len;
		udp = &o->udp;
		g = &o->g;
		g->proto = bpf_htons(ETH_P_IPV6);
	}
	udp->source = sport;
	udp->dest = bpf_htons(DSR_PORT);
	g->optlen = GENEVE_VER_OPTLEN;
	g->cls = bpf_htons(DSR_CLASS);
	g->type = DSR_TYPE;
	g->len = 5;
	copy_addr(g->addr, x->svc);
	g->port = x->svc_port;
	return 0;
}

/* The (DNATed) packet of a flow in DSR: wrapped in Geneve to the node the route to its
 * endpoint leads to, from this node's address on that device, and sent there; the
 * option carries the service dsr_remember kept. (Everything lives in the scratch map:
 * the caller's frame leaves this one no room.) */
static __noinline int dsr_forward(struct __sk_buff *skb, const struct pkt *p)
{
	__u32 zero = 0;
	struct dsr_scratch *x = bpf_map_lookup_elem(&spp_dsr_scratch, &zero);
	struct dev_val *dev;

	if (!x)
		return TC_ACT_SHOT;
	__builtin_memset(&x->fib, 0, sizeof(x->fib));
	fib_params(&x->fib, skb, p, p->daddr);
	x->rc = bpf_fib_lookup(skb, &x->fib, sizeof(x->fib), 0);
	if (x->rc != BPF_FIB_LKUP_RET_SUCCESS && x->rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_ACT_SHOT;
	x->oif = x->fib.ifindex;
	dev = bpf_map_lookup_elem(&spp_devices, &x->oif);
	if (!dev)
		return TC_ACT_SHOT;
	x->inner = skb->len - ETH_HLEN;
	x->sport = bpf_htons(49152 | (flow_hash(p) & 0x3fff)); /* entropy for ECMP */
	if (p->family == 4) {
		if (dsr_outer(x, 4, dev, &x->fib.ipv4_dst, x->sport, x->inner) ||
		    bpf_skb_adjust_room(skb, sizeof(x->o4), BPF_ADJ_ROOM_MAC,
					BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP) ||
		    bpf_skb_store_bytes(skb, ETH_HLEN, &x->o4, sizeof(x->o4), 0))
			return TC_ACT_SHOT;
	} else {
		if (dsr_outer(x, 6, dev, x->fib.ipv6_dst, x->sport, x->inner) ||
		    bpf_skb_adjust_room(skb, sizeof(x->o6), BPF_ADJ_ROOM_MAC,
					BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP) ||
		    bpf_skb_store_bytes(skb, ETH_HLEN, &x->o6, sizeof(x->o6), 0))
			return TC_ACT_SHOT;
	}
	if (x->rc == BPF_FIB_LKUP_RET_SUCCESS) {
		bpf_skb_store_bytes(skb, 0, x->fib.dmac, ETH_ALEN, 0);
		bpf_skb_store_bytes(skb, ETH_ALEN, x->fib.smac, ETH_ALEN, 0);
		return bpf_redirect(x->oif, 0);
	}
	__builtin_memset(&x->nh, 0, sizeof(x->nh));
	x->nh.nh_family = x->fib.family;
	if (p->family == 4)
		x->nh.ipv4_nh = x->fib.ipv4_dst;
	else
		copy_addr(x->nh.ipv6_nh, x->fib.ipv6_dst);
	return bpf_redirect_neigh(x->oif, &x->nh, sizeof(x->nh), 0);
}

/* The flow's forward entry on the endpoint's node (client -> service, rewritten to the
 * endpoint: what a packet to the service here would get anyway), so that it has a state
 * and lifetimes like any flow: the client's packets (``l4``: where the inner L4 header
 * starts after the outer headers) and the endpoint's answers (ct_reply_seen in
 * spp_egress) keep it, and the GC judges the reply entry by it. */
static __always_inline void dsr_track(struct __sk_buff *skb, struct dsr_scratch *x, __u32 l4)
{
	struct pkt *in = &x->in;
	struct ct_val *fv;

	if (in->proto == IPPROTO_TCP &&
	    bpf_skb_load_bytes(skb, ETH_HLEN + l4 + 13, &in->tcp_flags, 1))
		return;
	in->sport = x->ports[0];
	in->dport = x->ports[1];
	__builtin_memset(&x->rk, 0, sizeof(x->rk));
	ct_tuple(&x->rk, in->saddr, x->g.addr, in->sport, x->g.port, in, CT_FORWARD);
	fv = bpf_map_lookup_elem(&spp_ct, &x->rk);
	if (fv) {
		ct_seen(fv, in, 0, x->now);
		return;
	}
	__builtin_memset(&x->rv, 0, sizeof(x->rv));
	copy_addr(x->rv.saddr, in->saddr);
	x->rv.sport = in->sport;
	copy_addr(x->rv.daddr, in->daddr);
	x->rv.dport = in->dport;
	x->rv.last_ns = x->now;
	ct_seen(&x->rv, in, 0, x->now);
	bpf_map_update_elem(&spp_ct, &x->rk, &x->rv, BPF_ANY);
}

/* A Geneve packet carrying our option: remember the service for the reply, take the
 * outer headers off and let the stack deliver the client's packet. The verdict, or -1
 * for any other packet. */
static __noinline int dsr_decap(struct __sk_buff *skb)
{
	__u32 zero = 0, outer, l3;
	struct dsr_scratch *x;
	struct dsr_geneve *g;
	struct pkt *in;

	if (!dsr_enabled)
		return -1;
	x = bpf_map_lookup_elem(&spp_dsr_scratch, &zero);
	if (!x)
		return -1;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = &x->o4.ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, ip, sizeof(*ip)) || ip->ihl != 5 ||
		    ip->protocol != IPPROTO_UDP || (ip->frag_off & bpf_htons(0x3fff)))
			return -1;
		outer = sizeof(struct dsr_outer4);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = &x->o6.ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, ip6, sizeof(*ip6)) ||
		    ip6->nexthdr != IPPROTO_UDP)
			return -1;
		outer = sizeof(struct dsr_outer6);
	} else {
		return -1;
	}
	g = &x->g;
	in = &x->in;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + outer - sizeof(*g) - sizeof(struct udphdr),
			       &x->udp, sizeof(x->udp)) ||
	    x->udp.dest != bpf_htons(DSR_PORT) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + outer - sizeof(*g), g, sizeof(*g)) ||
	    g->optlen != GENEVE_VER_OPTLEN || g->cls != bpf_htons(DSR_CLASS) ||
	    g->type != DSR_TYPE || g->len != 5 || g->proto != skb->protocol)
		return -1;
	__builtin_memset(in, 0, sizeof(*in));
	if (g->proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = &x->o4.ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN + outer, ip, sizeof(*ip)) || ip->ihl < 5)
			return TC_ACT_SHOT;
		in->saddr[0] = ip->saddr;
		in->daddr[0] = ip->daddr;
		in->family = 4;
		in->proto = ip->protocol;
		l3 = ip->ihl * 4;
	} else {
		struct ipv6hdr *ip6 = &x->o6.ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN + outer, ip6, sizeof(*ip6)))
			return TC_ACT_SHOT;
		__builtin_memcpy(in->saddr, &ip6->saddr, 16);
		__builtin_memcpy(in->daddr, &ip6->daddr, 16);
		in->family = 6;
		in->proto = ip6->nexthdr;
		l3 = sizeof(*ip6);
	}
	if ((in->proto != IPPROTO_TCP && in->proto != IPPROTO_UDP && in->proto != IPPROTO_SCTP) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + outer + l3, x->ports, sizeof(x->ports)))
		return TC_ACT_SHOT;
	/* The endpoint's reply, as it will leave: from the service, to the client. */
	__builtin_memset(&x->rk, 0, sizeof(x->rk));
	__builtin_memset(&x->rv, 0, sizeof(x->rv));
	ct_tuple(&x->rk, in->daddr, in->saddr, x->ports[1], x->ports[0], in, CT_REPLY);
	copy_addr(x->rv.saddr, g->addr);
	x->rv.sport = g->port;
	copy_addr(x->rv.daddr, in->saddr);
	x->rv.dport = x->ports[0];
	x->now = bpf_ktime_get_ns();
	x->rv.last_ns = x->now;
	bpf_map_update_elem(&spp_ct, &x->rk, &x->rv, BPF_ANY);
	dsr_track(skb, x, outer + l3);
	if (bpf_skb_adjust_room(skb, -(__s32)outer, BPF_ADJ_ROOM_MAC, 0))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

#endif
