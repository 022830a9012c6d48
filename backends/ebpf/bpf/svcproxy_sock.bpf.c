// SPDX-License-Identifier: Apache-2.0
/*
 * svcproxy socket-level load balancing: cgroup sock_addr programs that pick a
 * service endpoint once, when an application calls connect() or sendmsg(), so
 * established connections pay no per-packet translation.
 *
 * The maps are written by the Python backend (backends/ebpf); their layouts are
 * mirrored in backends/ebpf/layout.py and must change together.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ECONNREFUSED 111

#include "service.h"

struct aff_key {
	__u64 netns_cookie; /* the client: one pod is one network namespace */
	struct svc_key svc; /* the address and port zeroed when ``id`` is set */
	__u32 id;           /* the service port's service_id (affinity.h) */
};

#include "affinity.h"

struct aff_val {
	__u64 last_ns;
	struct ep_val ep;
	__u32 reserved;
};

struct rev_key {
	__u64 cookie; /* the socket */
	struct ep_val ep;
	__u32 reserved;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct svc_key);
	__type(value, struct svc_val);
} sp_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ep_key);
	__type(value, struct ep_val);
} sp_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct aff_key);
	__type(value, struct aff_val);
} sp_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct rev_key);
	__type(value, struct ep_val);
} sp_revnat SEC(".maps");

/* A datagram or connection to translate: the service it hit and where it goes. */
struct xlate {
	struct svc_key svc;
	struct ep_val ep;
};

/* A new pick takes a random slot (pick.h's pick_in). */
#define slot_of(sv, hash) (bpf_get_prandom_u32() % (sv)->count)

#include "pick.h"

DEFINE_SCAN(scan_one, sp_endpoints)

/* 1: translated (x->ep set), 0: not a service, -1: refuse. */
static __always_inline int lookup(void *ctx, struct xlate *x)
{
	struct svc_val *found = bpf_map_lookup_elem(&sp_services, &x->svc);
	struct svc_val sv;
	struct aff_key ak = {};
	struct aff_val *av;
	__u64 now;

	if (!found)
		return 0;
	sv = *found;
	if (sv.flags & F_REFUSE)
		return -1;
	if (!sv.count)
		return 0; /* nothing here to choose from: leave it to the packet path */
	if (!(sv.flags & F_AFFINITY))
		return pick_in(&sp_services, &sp_endpoints, &x->svc, &sv, 0, &x->ep) ? 0 : 1;

	ak.netns_cookie = bpf_get_netns_cookie(ctx);
	ak.svc = x->svc;
	affinity_scope(&ak.svc, &ak.id, &sv);
	now = bpf_ktime_get_ns();
	av = bpf_map_lookup_elem(&sp_affinity, &ak);
	if (av && affinity_fresh(&sv, av->last_ns, now) && in_set(scan_one, &sv, &av->ep, 0)) {
		x->ep = av->ep;
		av->last_ns = now;
		return 1;
	}
	if (pick_in(&sp_services, &sp_endpoints, &x->svc, &sv, 0, &x->ep))
		return 0;
	{
		struct aff_val nv = { .last_ns = now, .ep = x->ep };

		bpf_map_update_elem(&sp_affinity, &ak, &nv, BPF_ANY);
	}
	return 1;
}

static __always_inline void remember(void *ctx, const struct xlate *x)
{
	struct rev_key rk = {};
	struct ep_val vip = {};

	rk.cookie = bpf_get_socket_cookie(ctx);
	rk.ep = x->ep;
	__builtin_memcpy(vip.addr, x->svc.addr, sizeof(vip.addr));
	vip.port = x->svc.port;
	vip.family = x->svc.family;
	bpf_map_update_elem(&sp_revnat, &rk, &vip, BPF_ANY);
}

static __always_inline int ours(__u32 protocol)
{
	return protocol == IPPROTO_TCP || protocol == IPPROTO_UDP;
}

static __always_inline int refuse(void)
{
	bpf_set_retval(-ECONNREFUSED);
	return 0;
}

static __always_inline int forward4(struct bpf_sock_addr *ctx, int keep_reverse)
{
	struct xlate x = {};
	int verdict;

	if (!ours(ctx->protocol))
		return 1;
	x.svc.addr[0] = ctx->user_ip4;
	x.svc.port = (__u16)ctx->user_port;
	x.svc.proto = ctx->protocol;
	x.svc.family = 4;
	verdict = lookup(ctx, &x);
	if (verdict < 0)
		return refuse();
	if (verdict == 0 || x.ep.family != 4)
		return 1;
	ctx->user_ip4 = x.ep.addr[0];
	ctx->user_port = x.ep.port;
	if (keep_reverse)
		remember(ctx, &x);
	return 1;
}

/* An IPv4 address written as IPv6 (::ffff:a.b.c.d), as dual-stack sockets use. */
static __always_inline int v4_mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0x0000ffff);
}

static __always_inline void write_ip6(struct bpf_sock_addr *ctx, const __u32 *addr, int mapped)
{
	if (mapped) {
		ctx->user_ip6[0] = 0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = bpf_htonl(0x0000ffff);
		ctx->user_ip6[3] = addr[0];
		return;
	}
	ctx->user_ip6[0] = addr[0];
	ctx->user_ip6[1] = addr[1];
	ctx->user_ip6[2] = addr[2];
	ctx->user_ip6[3] = addr[3];
}

static __always_inline int forward6(struct bpf_sock_addr *ctx, int keep_reverse)
{
	struct xlate x = {};
	__u32 a[4];
	int verdict, mapped;

	if (!ours(ctx->protocol))
		return 1;
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	mapped = v4_mapped(a);
	if (mapped) {
		x.svc.addr[0] = a[3];
		x.svc.family = 4;
	} else {
		__builtin_memcpy(x.svc.addr, a, sizeof(a));
		x.svc.family = 6;
	}
	x.svc.port = (__u16)ctx->user_port;
	x.svc.proto = ctx->protocol;
	verdict = lookup(ctx, &x);
	if (verdict < 0)
		return refuse();
	if (verdict == 0 || x.ep.family != x.svc.family)
		return 1;
	write_ip6(ctx, x.ep.addr, mapped);
	ctx->user_port = x.ep.port;
	if (keep_reverse)
		remember(ctx, &x);
	return 1;
}

/* The peer an application sees (getpeername, recvfrom) is the service, not the endpoint. */
static __always_inline int reverse4(struct bpf_sock_addr *ctx)
{
	struct rev_key rk = {};
	struct ep_val *vip;

	rk.cookie = bpf_get_socket_cookie(ctx);
	rk.ep.addr[0] = ctx->user_ip4;
	rk.ep.port = (__u16)ctx->user_port;
	rk.ep.family = 4;
	vip = bpf_map_lookup_elem(&sp_revnat, &rk);
	if (vip) {
		ctx->user_ip4 = vip->addr[0];
		ctx->user_port = vip->port;
	}
	return 1;
}

static __always_inline int reverse6(struct bpf_sock_addr *ctx)
{
	struct rev_key rk = {};
	struct ep_val *vip;
	__u32 a[4];
	int mapped;

	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	mapped = v4_mapped(a);
	rk.cookie = bpf_get_socket_cookie(ctx);
	if (mapped) {
		rk.ep.addr[0] = a[3];
		rk.ep.family = 4;
	} else {
		__builtin_memcpy(rk.ep.addr, a, sizeof(a));
		rk.ep.family = 6;
	}
	rk.ep.port = (__u16)ctx->user_port;
	vip = bpf_map_lookup_elem(&sp_revnat, &rk);
	if (vip && vip->family == rk.ep.family) {
		write_ip6(ctx, vip->addr, mapped);
		ctx->user_port = vip->port;
	}
	return 1;
}

SEC("cgroup/connect4")
int sp_connect4(struct bpf_sock_addr *ctx)
{
	return forward4(ctx, 1);
}

SEC("cgroup/connect6")
int sp_connect6(struct bpf_sock_addr *ctx)
{
	return forward6(ctx, 1);
}

SEC("cgroup/sendmsg4")
int sp_sendmsg4(struct bpf_sock_addr *ctx)
{
	return forward4(ctx, 1);
}

SEC("cgroup/sendmsg6")
int sp_sendmsg6(struct bpf_sock_addr *ctx)
{
	return forward6(ctx, 1);
}

SEC("cgroup/recvmsg4")
int sp_recvmsg4(struct bpf_sock_addr *ctx)
{
	return reverse4(ctx);
}

SEC("cgroup/recvmsg6")
int sp_recvmsg6(struct bpf_sock_addr *ctx)
{
	return reverse6(ctx);
}

SEC("cgroup/getpeername4")
int sp_getpeername4(struct bpf_sock_addr *ctx)
{
	return reverse4(ctx);
}

SEC("cgroup/getpeername6")
int sp_getpeername6(struct bpf_sock_addr *ctx)
{
	return reverse6(ctx);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
