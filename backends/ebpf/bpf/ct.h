// SPDX-License-Identifier: Apache-2.0
/*
 * Connection tracking state and timeouts of the tc packet path, included by
 * svcproxy_tc.bpf.c after its spp_ct map. A flow's forward entry holds its state
 * (what was seen in each direction) and when a packet of either direction last
 * passed; a flow idle longer than its state's lifetime is expired: its next packet is
 * a new flow (a fresh endpoint choice), and the userspace GC pass (ct_gc.py) deletes
 * it. The lifetimes (ct_timeouts) come from the --conntrack-* flags; the layout is
 * mirrored in packet_layout.py (CT_TIMEOUTS).
 */
#ifndef SVCPROXY_CT_H
#define SVCPROXY_CT_H

#define CTS_REPLIED 1 /* a packet of the reply direction was seen */
#define CTS_FIN_FWD 2 /* the client sent a FIN */
#define CTS_FIN_REV 4 /* the endpoint sent a FIN */
#define CTS_RST 8     /* either side sent a RST */

/* Seconds; set by the loader before the object is loaded (as maglev_size), from the
 * --conntrack-* flags; the initial values are kube-proxy's defaults (24 h, 1 h), for
 * UDP nf_conntrack's (30 s, 120 s), and Cilium's where kube-proxy has none. */
struct ct_timeouts {
	__u32 tcp_syn;         /* TCP, nothing seen back yet (Cilium's 60 s) */
	__u32 tcp_established; /* conntrack.tcpEstablishedTimeout */
	__u32 tcp_close_wait;  /* one side sent a FIN: conntrack.tcpCloseWaitTimeout */
	__u32 tcp_fin;         /* both sent a FIN, or a RST (Cilium's 10 s) */
	__u32 udp;             /* nothing seen back yet: conntrack.udpTimeout */
	__u32 udp_stream;      /* replied: conntrack.udpStreamTimeout */
};

/* In a section of its own, so that it sits at offset 0 of its map. */
volatile const struct ct_timeouts ct_timeouts SEC(".rodata.ct") = {
	.tcp_syn = 60, .tcp_established = 86400, .tcp_close_wait = 3600, .tcp_fin = 10,
	.udp = 30, .udp_stream = 120,
};

/* How long a flow in ``state`` may stay idle, in ns. */
static __always_inline __u64 ct_lifetime(__u8 proto, __u8 state)
{
	const volatile struct ct_timeouts *t = &ct_timeouts;
	__u32 secs;

	if (proto == IPPROTO_TCP) {
		if ((state & CTS_RST) || (state & (CTS_FIN_FWD | CTS_FIN_REV)) ==
		    (CTS_FIN_FWD | CTS_FIN_REV))
			secs = t->tcp_fin;
		else if (state & (CTS_FIN_FWD | CTS_FIN_REV))
			secs = t->tcp_close_wait;
		else if (state & CTS_REPLIED)
			secs = t->tcp_established;
		else
			secs = t->tcp_syn;
	} else {
		secs = state & CTS_REPLIED ? t->udp_stream : t->udp;
	}
	return (__u64)secs * 1000000000ULL;
}

/* Whether the flow of ``fv`` was idle past its state's lifetime. */
static __always_inline int ct_idle(const struct ct_val *fv, const struct pkt *p, __u64 now)
{
	return now > fv->last_ns && now - fv->last_ns > ct_lifetime(p->proto, fv->state);
}

/* Whether ``p`` opens a TCP connection (its SYN and ACK bits are ``opening``: SYN from
 * the client, SYN-ACK from the endpoint) on the tuple of a flow that closed. */
static __always_inline int ct_opens_after_close(const struct ct_val *fv, const struct pkt *p,
						__u8 opening)
{
	__u8 state = fv->state;

	return p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_SYN | TCP_ACK)) == opening &&
	       ((state & CTS_RST) || (state & (CTS_FIN_FWD | CTS_FIN_REV)) ==
					     (CTS_FIN_FWD | CTS_FIN_REV));
}

/* Whether the forward entry ``fv`` no longer holds the flow this packet belongs to:
 * idle past its lifetime, or a TCP connection that closed and a SYN opening a new one
 * on the same tuple. */
static __always_inline int ct_stale(const struct ct_val *fv, const struct pkt *p, __u64 now)
{
	return ct_idle(fv, p, now) || ct_opens_after_close(fv, p, TCP_SYN);
}

/* A packet of the flow passed (``reply``: from the endpoint): its state and time. */
static __always_inline void ct_seen(struct ct_val *fv, const struct pkt *p, int reply, __u64 now)
{
	__u8 state = fv->state | (reply ? CTS_REPLIED : 0);

	if (p->proto == IPPROTO_TCP) {
		if (p->tcp_flags & TCP_RST)
			state |= CTS_RST;
		if (p->tcp_flags & TCP_FIN)
			state |= reply ? CTS_FIN_REV : CTS_FIN_FWD;
	}
	if (state != fv->state)
		fv->state = state;
	fv->last_ns = now;
}

/* A reply through the reply entry ``rv``: whether it belongs to the flow, and if so the
 * flow's forward entry (whose key is the reply entry's rewrite, reversed) learns it. It
 * does not when that entry is gone or idle past its lifetime, or when the reply is a
 * SYN-ACK after the flow closed: another connection's, on the same tuple, that did not
 * come through here (a node's own, or one balanced at connect()), to pass unchanged.
 * ``fk`` is the caller's key, reused (the programs' stacks are near the verifier's 512
 * bytes). */
static __always_inline int ct_reply_seen(const struct pkt *p, const struct ct_val *rv,
					 __u64 now, struct ct_key *fk)
{
	struct ct_val *fv;

	copy_addr(fk->saddr, rv->daddr);
	copy_addr(fk->daddr, rv->saddr);
	fk->sport = rv->dport;
	fk->dport = rv->sport;
	fk->proto = p->proto;
	fk->family = p->family;
	fk->dir = CT_FORWARD;
	fk->pad = 0;
	fv = bpf_map_lookup_elem(&spp_ct, fk);
	if (!fv || ct_idle(fv, p, now) || ct_opens_after_close(fv, p, TCP_SYN | TCP_ACK))
		return 0;
	ct_seen(fv, p, 1, now);
	return 1;
}

#endif
