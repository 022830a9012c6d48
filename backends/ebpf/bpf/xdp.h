/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The XDP program of the packet path (--ebpf-xdp), included at the end of
 * svcproxy_tc.bpf.c: it shares the tc programs' maps and helpers and does the part of
 * their work that needs no socket buffer, before one is made (native mode) or as soon
 * as it is (generic mode):
 *
 * - a reply of a flow SNATed to this node: reverse-SNAT and reverse-DNAT, out to the
 *   client (XDP_TX on the device it came by, else a redirect);
 * - a packet of a tracked SNATed flow: DNAT + SNAT, out to the endpoint; of a routed one
 *   (local traffic to another node's endpoint, CT_ROUTE): DNAT, out to the endpoint;
 * - a new flow to a service address: the endpoint picked (random or Maglev) and the
 *   flow written in spp_ct as new_flow() in tc writes it; a SNATed or routed one is sent
 *   on here, the rest (a local endpoint's DNAT: delivery needs the stack; a neighbour
 *   to resolve) passes to tc, which finds the flow tracked and carries on, so each flow is
 *   picked once (a second pick in tc would skew the endpoints' shares);
 * - a packet of a DSR flow (--ebpf-dsr), new or tracked: DNATed and wrapped in Geneve
 *   here (dsr.h's headers), out to the endpoint's node; one too big for the route's
 *   MTU once wrapped passes to tc, which answers the client (dsr_too_big).
 *
 * Everything else passes to the stack unchanged and is served by the tc programs:
 * REJECT answers, drops, source ranges, affinity, IP options and extension headers.
 * Checksums are updated incrementally, so they must be whole in the packet (as a NIC
 * receives them; a veth whose peer offloads checksums delivers partial ones).
 */
#ifndef SVCPROXY_XDP_H
#define SVCPROXY_XDP_H

/* Per-CPU counters of what the XDP program did (svcproxy_ebpf_xdp_packets_total). */
#define XDP_STAT_REPLY 0    /* a reply reversed and sent to the client */
#define XDP_STAT_FORWARD 1  /* a tracked flow's packet sent to its endpoint */
#define XDP_STAT_NEW 2      /* a new flow to a remote endpoint */
#define XDP_STAT_PASS 3     /* left to the stack and the tc programs */
#define XDP_STAT_PICKED 4   /* a new flow picked and tracked here, carried on by tc */
#define XDP_STATS 5

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XDP_STATS);
	__type(key, __u32);
	__type(value, __u64);
} spp_xdp_stats SEC(".maps");

/* Where the headers are (packet pointers stay on the stack: a map may not hold them). */
struct xdp_pkt {
	struct pkt *p;
	struct iphdr *ip4;
	struct ipv6hdr *ip6;
	__u16 *ports; /* source and destination port */
	__u16 *l4sum; /* the L4 checksum (0 for an IPv4 UDP datagram without one) */
};

/* The rest of a packet's state, off the 512-byte stack. */
struct xdp_scratch {
	struct pkt p;
	struct ct_key k;
	struct ct_val fv;
	struct svc_key sk;
	struct svc_val sv;
	struct bpf_fib_lookup fib;
	__u32 from[9];
	__u32 to[9];
	__u32 snat[4];
	struct ct_val rv;
	__u8 native; /* run by the driver (spp_xdp_native): XDP_TX only */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xdp_scratch);
} spp_xdp_scratch SEC(".maps");

static __always_inline int xdp_count(__u32 what, int verdict)
{
	__u64 *n = bpf_map_lookup_elem(&spp_xdp_stats, &what);

	if (n)
		*n += 1;
	return verdict;
}

static __always_inline int xdp_parse(struct xdp_md *ctx, struct xdp_pkt *x)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct pkt *p = x->p;
	void *l4;

	if ((void *)(eth + 1) > end)
		return -1;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3fff)))
			return -1;
		p->saddr[0] = ip->saddr;
		p->daddr[0] = ip->daddr;
		p->family = 4;
		p->proto = ip->protocol;
		x->ip4 = ip;
		l4 = ip + 1;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return -1;
		__builtin_memcpy(p->saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->daddr, &ip6->daddr, 16);
		p->family = 6;
		p->proto = ip6->nexthdr;
		x->ip6 = ip6;
		l4 = ip6 + 1;
	} else {
		return -1;
	}
	if (p->proto == IPPROTO_TCP) {
		if (l4 + 20 > end)
			return -1;
		p->tcp_flags = *(__u8 *)(l4 + 13);
		x->l4sum = l4 + 16;
	} else if (p->proto == IPPROTO_UDP) {
		if (l4 + 8 > end)
			return -1;
		x->l4sum = l4 + 6;
	} else {
		return -1;
	}
	x->ports = l4;
	p->sport = x->ports[0];
	p->dport = x->ports[1];
	return 0;
}

/* Rewrite the packet to ``v`` (addresses and ports), its checksums updated. */
static __always_inline void xdp_rewrite(struct xdp_pkt *x, struct xdp_scratch *s,
					const struct ct_val *v)
{
	struct pkt *p = x->p;
	__u32 *from = s->from, *to = s->to;
	__s64 diff;

	if (p->family == 4 && x->ip4) {
		/* addresses, then the ports as one word, in the packet's byte order */
		from[0] = p->saddr[0];
		from[1] = p->daddr[0];
		from[2] = (__u32)p->sport | (__u32)p->dport << 16;
		to[0] = v->saddr[0];
		to[1] = v->daddr[0];
		to[2] = (__u32)v->sport | (__u32)v->dport << 16;
		diff = bpf_csum_diff(from, 8, to, 8, (__u16)~x->ip4->check);
		x->ip4->check = fold(diff);
		x->ip4->saddr = to[0];
		x->ip4->daddr = to[1];
		if (*x->l4sum || p->proto == IPPROTO_TCP) {
			diff = bpf_csum_diff(from, 12, to, 12, (__u16)~*x->l4sum);
			*x->l4sum = fold(diff) ?: (p->proto == IPPROTO_UDP ? 0xffff : 0);
		}
	} else if (x->ip6) {
		copy_addr(from, p->saddr);
		copy_addr(from + 4, p->daddr);
		from[8] = (__u32)p->sport | (__u32)p->dport << 16;
		copy_addr(to, v->saddr);
		copy_addr(to + 4, v->daddr);
		to[8] = (__u32)v->sport | (__u32)v->dport << 16;
		diff = bpf_csum_diff(from, 36, to, 36, (__u16)~*x->l4sum);
		*x->l4sum = fold(diff) ?: (p->proto == IPPROTO_UDP ? 0xffff : 0);
		__builtin_memcpy(&x->ip6->saddr, v->saddr, 16);
		__builtin_memcpy(&x->ip6->daddr, v->daddr, 16);
	}
	x->ports[0] = v->sport;
	x->ports[1] = v->dport;
}

/* The route to ``daddr`` from ``saddr`` in ``s->fib``: bpf_fib_lookup's result (only
 * BPF_FIB_LKUP_RET_SUCCESS gives the MACs; without a known neighbour tc resolves it). */
static __always_inline long xdp_route_len(struct xdp_md *ctx, struct xdp_scratch *s,
					  const __u32 *saddr, const __u32 *daddr, __u16 tot_len)
{
	struct bpf_fib_lookup *fib = &s->fib;

	__builtin_memset(fib, 0, sizeof(*fib));
	fib->l4_protocol = s->p.proto;
	fib->tot_len = tot_len; /* 0: no MTU check */
	fib->ifindex = ctx->ingress_ifindex;
	if (s->p.family == 4) {
		fib->family = AF_INET;
		fib->ipv4_src = saddr[0];
		fib->ipv4_dst = daddr[0];
	} else {
		fib->family = AF_INET6;
		copy_addr(fib->ipv6_src, saddr);
		copy_addr(fib->ipv6_dst, daddr);
	}
	return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
}

static __always_inline long xdp_route(struct xdp_md *ctx, struct xdp_scratch *s,
				      const __u32 *saddr, const __u32 *daddr)
{
	return xdp_route_len(ctx, s, saddr, daddr, 0);
}

/* The device the route to ``daddr`` leaves by (0: no route), as route_oif() in tc. */
static __always_inline __u32 xdp_oif(struct xdp_md *ctx, struct xdp_scratch *s,
				     const __u32 *daddr)
{
	long rc = xdp_route(ctx, s, s->p.saddr, daddr);

	return rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH ? s->fib.ifindex : 0;
}

/* Whether XDP may send out by the route in ``s->fib``: generic XDP anywhere; native only
 * back out of the device it came by (XDP_TX), as a redirect into a device without
 * ndo_xdp_xmit (a bridge) is dropped: tc sends the rest. */
static __always_inline int xdp_may_send(struct xdp_md *ctx, struct xdp_scratch *s)
{
	return !s->native || s->fib.ifindex == ctx->ingress_ifindex;
}

/* Rewrite to ``s->fv`` and send out by the route in ``s->fib``, counted as ``what``. */
static __always_inline int xdp_send(struct xdp_md *ctx, struct xdp_pkt *x,
				    struct xdp_scratch *s, __u32 what)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	xdp_rewrite(x, s, &s->fv);
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	__builtin_memcpy(eth->h_dest, s->fib.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, s->fib.smac, ETH_ALEN);
	if (s->fib.ifindex == ctx->ingress_ifindex)
		return xdp_count(what, XDP_TX);
	return xdp_count(what, bpf_redirect(s->fib.ifindex, 0));
}

/* A DSR flow's packet (``s->fv``: its forward entry) wrapped in Geneve here, as
 * dsr_forward() in tc does: DNATed, the outer headers from this node's address on the
 * route's device to the route's next hop toward the endpoint, sent on (counted as
 * ``what``). XDP_PASS, the packet untouched, when tc must do it: the route's
 * neighbour is unknown, its device has no address of ours, or the packet would not fit
 * the route's MTU in Geneve (tc answers the client, dsr_too_big). */
static __always_inline int xdp_dsr(struct xdp_md *ctx, struct xdp_pkt *x, struct xdp_scratch *s,
				   __u32 what)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct pkt *p = &s->p;
	__u32 zero = 0, overhead = dsr_overhead(p->family), inner, oif;
	struct dsr_scratch *d = bpf_map_lookup_elem(&spp_dsr_scratch, &zero);
	struct dev_val *dev;
	struct ethhdr *eth;

	if (!d || data + ETH_HLEN > end)
		return XDP_PASS;
	inner = end - data - ETH_HLEN;
	/* With the length in Geneve: bpf_fib_lookup checks it against the route's MTU. */
	if (xdp_route_len(ctx, s, p->saddr, s->fv.daddr, inner + overhead) !=
	    BPF_FIB_LKUP_RET_SUCCESS)
		return XDP_PASS;
	oif = s->fib.ifindex;
	if (!xdp_may_send(ctx, s))
		return XDP_PASS;
	dev = bpf_map_lookup_elem(&spp_devices, &oif);
	if (!dev)
		return XDP_PASS;
	copy_addr(d->svc, p->daddr);
	d->svc_port = p->dport;
	if (dsr_outer(d, p->family, dev, p->family == 4 ? &s->fib.ipv4_dst : s->fib.ipv6_dst,
		      bpf_htons(49152 | (flow_hash(p) & 0x3fff)), inner))
		return XDP_PASS;
	xdp_rewrite(x, s, &s->fv);
	if (bpf_xdp_adjust_head(ctx, -(int)overhead))
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	if (p->family == 4) {
		if (data + ETH_HLEN + sizeof(d->o4) > end)
			return XDP_DROP;
		__builtin_memcpy(data + ETH_HLEN, &d->o4, sizeof(d->o4));
		eth->h_proto = bpf_htons(ETH_P_IP);
	} else {
		if (data + ETH_HLEN + sizeof(d->o6) > end)
			return XDP_DROP;
		__builtin_memcpy(data + ETH_HLEN, &d->o6, sizeof(d->o6));
		eth->h_proto = bpf_htons(ETH_P_IPV6);
	}
	__builtin_memcpy(eth->h_dest, s->fib.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, s->fib.smac, ETH_ALEN);
	if (oif == ctx->ingress_ifindex)
		return xdp_count(what, XDP_TX);
	return xdp_count(what, bpf_redirect(oif, 0));
}

/* A new flow, picked and written in spp_ct as new_flow() in tc writes it (``s->fv``, the
 * forward entry). XDP_TX/XDP_REDIRECT when this program sends it on (SNATed, the route
 * known), XDP_PASS when tc carries on from the entries (a local endpoint's DNAT, DSR, a
 * neighbour to resolve: tc finds the flow tracked, so the one pick holds), -1 when tc
 * decides alone (REJECT, drop, affinity, source ranges: before any pick). */
static __always_inline int xdp_new_flow(struct xdp_md *ctx, struct xdp_pkt *x,
					struct xdp_scratch *s)
{
	struct pkt *p = &s->p;
	struct svc_val *sv = &s->sv;
	struct ct_val *fv = &s->fv;
	struct ct_key rk = {};
	struct ep_val ep;
	struct dev_val *dev;
	__u32 oif;
	__u64 now = bpf_ktime_get_ns();
	long rc;
	__u16 port;

	if (sv->flags & (F_REFUSE | F_AFFINITY | F_RANGES) || !sv->count)
		return -1;
	if (pick(&s->sk, sv, flow_hash(p), &ep) || ep.family != p->family)
		return -1;
	__builtin_memset(fv, 0, sizeof(*fv));
	copy_addr(fv->daddr, ep.addr);
	fv->dport = ep.port;
	fv->set_id = sv->set_id;
	copy_addr(fv->saddr, p->saddr);
	fv->sport = p->sport;
	fv->last_ns = now;
	rc = xdp_route(ctx, s, p->saddr, ep.addr);
	oif = rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH ? s->fib.ifindex : 0;
	dev = oif ? bpf_map_lookup_elem(&spp_devices, &oif) : 0;
	if (dnat_only(sv, p, &ep, dev, ctx->ingress_ifindex)) {
		struct ct_val *rv = &s->rv;

		__builtin_memset(rv, 0, sizeof(*rv));
		copy_addr(rv->saddr, p->daddr);
		rv->sport = p->dport;
		copy_addr(rv->daddr, p->saddr);
		rv->dport = p->sport;
		rv->last_ns = now;
		ct_tuple(&rk, ep.addr, p->saddr, ep.port, p->sport, p, CT_REPLY);
		bpf_map_update_elem(&spp_ct, &rk, rv, BPF_ANY);
		if (ep.flags & EP_LOCAL)
			rc = -1; /* the stack delivers it: tc DNATs it from the entry */
		else
			fv->flags = CT_ROUTE; /* DNATed, out to the endpoint's node (or tc's) */
	} else if (dsr_enabled && (sv->flags & F_MASQ) && !(ep.flags & EP_LOCAL) && dev &&
		   xdp_oif(ctx, s, p->saddr) == oif) {
		fv->flags = CT_DSR; /* in Geneve to the endpoint's node (xdp_dsr, or tc's) */
		bpf_map_update_elem(&spp_ct, &s->k, fv, BPF_ANY);
		return xdp_dsr(ctx, x, s, XDP_STAT_NEW);
	} else {
		copy_addr(s->snat, p->daddr);
		if (dev && p->family == 4 && dev->addr4)
			s->snat[0] = dev->addr4;
		else if (dev && p->family == 6 && (dev->addr6[0] | dev->addr6[1] |
						   dev->addr6[2] | dev->addr6[3]))
			copy_addr(s->snat, dev->addr6);
		if (nat_port(p, &ep, s->snat, now, &port))
			return XDP_DROP; /* as tc: no NAT port free */
		copy_addr(fv->saddr, s->snat);
		fv->sport = port;
		fv->flags = CT_SNAT;
		if (dsr_enabled && rc == BPF_FIB_LKUP_RET_SUCCESS)
			rc = xdp_route(ctx, s, p->saddr, ep.addr); /* the DSR check used s->fib */
	}
	bpf_map_update_elem(&spp_ct, &s->k, fv, BPF_ANY);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS || !xdp_may_send(ctx, s))
		return XDP_PASS;
	return xdp_send(ctx, x, s, XDP_STAT_NEW);
}

static __always_inline int xdp_main(struct xdp_md *ctx, __u8 native)
{
	__u32 zero = 0;
	struct xdp_scratch *s = bpf_map_lookup_elem(&spp_xdp_scratch, &zero);
	struct xdp_pkt x = {};
	struct ct_val *found;
	struct svc_val *svp;
	struct pkt *p;
	__u64 now;
	int verdict;

	if (!s)
		return XDP_PASS;
	__builtin_memset(&s->p, 0, sizeof(s->p));
	__builtin_memset(&s->k, 0, sizeof(s->k));
	__builtin_memset(&s->sk, 0, sizeof(s->sk));
	s->native = native;
	p = &s->p;
	x.p = p;
	if (xdp_parse(ctx, &x))
		return xdp_count(XDP_STAT_PASS, XDP_PASS);
	now = bpf_ktime_get_ns();
	ct_tuple(&s->k, p->saddr, p->daddr, p->sport, p->dport, p, CT_REPLY);
	found = bpf_map_lookup_elem(&spp_ct, &s->k);
	if (found && (found->flags & CT_SNAT)) {
		s->fv = *found;
		if (xdp_route(ctx, s, s->fv.saddr, s->fv.daddr) != BPF_FIB_LKUP_RET_SUCCESS ||
		    !xdp_may_send(ctx, s) || !ct_reply_seen(p, &s->fv, now, &s->k))
			return xdp_count(XDP_STAT_PASS, XDP_PASS);
		found->last_ns = now;
		return xdp_send(ctx, &x, s, XDP_STAT_REPLY);
	}
	copy_addr(s->sk.addr, p->daddr);
	s->sk.port = p->dport;
	s->sk.proto = p->proto;
	s->sk.family = p->family;
	svp = bpf_map_lookup_elem(&spp_services, &s->sk);
	if (!svp)
		return xdp_count(XDP_STAT_PASS, XDP_PASS);
	s->sv = *svp;
	ct_tuple(&s->k, p->saddr, p->daddr, p->sport, p->dport, p, CT_FORWARD);
	found = bpf_map_lookup_elem(&spp_ct, &s->k);
	if (found && ct_stale(found, p, now))
		found = 0;
	if (found && found->set_id != s->sv.set_id) {
		/* As in tc: a UDP flow or a SYN whose endpoint left starts again. */
		if (member(&s->sv, found, p->family))
			found->set_id = s->sv.set_id;
		else if (p->proto == IPPROTO_UDP || (p->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN)
			found = 0;
	}
	if (found && (found->flags & CT_DSR)) {
		ct_seen(found, p, 0, now);
		dsr_answered(p, found);
		s->fv = *found;
		verdict = xdp_dsr(ctx, &x, s, XDP_STAT_FORWARD);
		return verdict == XDP_PASS ? xdp_count(XDP_STAT_PASS, XDP_PASS) : verdict;
	}
	if (found) {
		if (!(found->flags & (CT_SNAT | CT_ROUTE)))
			return xdp_count(XDP_STAT_PASS, XDP_PASS); /* local: tc */
		s->fv = *found;
		if (xdp_route(ctx, s, s->fv.saddr, s->fv.daddr) != BPF_FIB_LKUP_RET_SUCCESS ||
		    !xdp_may_send(ctx, s))
			return xdp_count(XDP_STAT_PASS, XDP_PASS);
		ct_seen(found, p, 0, now);
		keep_reply(p, &s->fv, now);
		return xdp_send(ctx, &x, s, XDP_STAT_FORWARD);
	}
	verdict = xdp_new_flow(ctx, &x, s);
	if (verdict == XDP_PASS)
		return xdp_count(XDP_STAT_PICKED, XDP_PASS);
	if (verdict < 0)
		return xdp_count(XDP_STAT_PASS, XDP_PASS);
	return verdict;
}

/* Attached in generic mode (the kernel runs it on the socket buffer). */
SEC("xdp")
int spp_xdp(struct xdp_md *ctx)
{
	return xdp_main(ctx, 0);
}

/* Attached in native mode (the driver runs it). */
SEC("xdp")
int spp_xdp_native(struct xdp_md *ctx)
{
	return xdp_main(ctx, 1);
}

#endif
