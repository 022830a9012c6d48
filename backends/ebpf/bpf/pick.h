/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The two rules every pick of the socket programs and the packet path follows
 * (included after service.h, the program's maps and its ``slot_of(sv, hash)``, which
 * slot of the set a new pick takes: random, or Maglev on the packet path):
 *
 * - an endpoint is read from the set the service entry names; the set is written
 *   before the entry switches to it and deleted only after, so a miss means the entry
 *   switched meanwhile: read it again (pick_in);
 * - a remembered endpoint (affinity, a tracked flow) still counts only while it is
 *   in the service's current set (in_set, with a bpf_loop callback made by
 *   DEFINE_SCAN for the program's endpoint map).
 */
#ifndef SVCPROXY_PICK_H
#define SVCPROXY_PICK_H

/* An endpoint of the service's current set, into ``out`` (0), or -1. ``services``
 * and ``endpoints`` are the program's maps; ``sk`` the service's key (read again on
 * a miss). */
static __always_inline int pick_in(void *services, void *endpoints, const struct svc_key *sk,
				   struct svc_val *sv, __u32 hash, struct ep_val *out)
{
	for (int attempt = 0; attempt < 2; attempt++) {
		struct ep_key k;
		struct ep_val *ep;

		if (attempt) {
			struct svc_val *again = bpf_map_lookup_elem(services, sk);

			if (!again)
				return -1;
			*sv = *again;
		}
		if (!sv->count)
			return -1;
		k.set_id = sv->set_id;
		k.slot = slot_of(sv, hash);
		ep = bpf_map_lookup_elem(endpoints, &k);
		if (ep) {
			*out = *ep;
			return 0;
		}
	}
	return -1;
}

struct scan_ctx {
	__u32 set_id;
	const struct ep_val *want;
	struct ep_val found; /* as the set holds it (its flags included) */
	int hit;
};

/* A bpf_loop callback ``name``: does slot ``slot`` of the set in ``endpoints`` hold
 * the wanted endpoint? */
#define DEFINE_SCAN(name, endpoints)                                              \
	static long name(__u32 slot, void *data)                                  \
	{                                                                         \
		struct scan_ctx *sc = data;                                       \
		struct ep_key k = { .set_id = sc->set_id, .slot = slot };         \
		struct ep_val *ep = bpf_map_lookup_elem(&endpoints, &k);          \
                                                                                  \
		if (ep && same_ep(ep, sc->want)) {                                \
			sc->found = *ep;                                          \
			sc->hit = 1;                                              \
			return 1;                                                 \
		}                                                                 \
		return 0;                                                         \
	}

/* Is ``want`` one of the endpoints of ``sv``'s current set (``scan``: the program's
 * DEFINE_SCAN callback)? Found: 1, and ``found`` as the set holds it (may be NULL). */
static __always_inline int in_set(long (*scan)(__u32, void *), const struct svc_val *sv,
				  const struct ep_val *want, struct ep_val *found)
{
	struct scan_ctx sc = { .set_id = sv->set_id, .want = want };
	__u32 n = sv->count;

	if (n > MAX_AFFINITY_SCAN)
		n = MAX_AFFINITY_SCAN;
	bpf_loop(n, scan, &sc, 0);
	if (sc.hit && found)
		*found = sc.found;
	return sc.hit;
}

/* Is an affinity entry last used at ``last_ns`` still fresh for ``sv`` at ``now``? */
static __always_inline int affinity_fresh(const struct svc_val *sv, __u64 last_ns, __u64 now)
{
	return now - last_ns <= (__u64)sv->affinity_timeout * 1000000000ULL;
}

#endif
