// SPDX-License-Identifier: Apache-2.0
/*
 * Session affinity ClientIP per service port, not per address: included by both
 * programs. kube-proxy keeps a client's endpoint per service port whichever of its
 * addresses (ClusterIP, NodePort, externalIPs, load-balancer VIPs) the client used;
 * every entry of a service port with affinity carries the same service_id (written by
 * the backend: a hash of namespace, name, port name and protocol), and the affinity
 * key names that id instead of the address and port. An entry without an id (0)
 * keeps per-address affinity. The remembered endpoint is still checked against the
 * set of the entry used (ClusterIPs and NodePorts may use different endpoints).
 */
#ifndef SVCPROXY_AFFINITY_H
#define SVCPROXY_AFFINITY_H

/* Make an affinity key's service part (svc, id) name the service port of ``sv``. */
static __always_inline void affinity_scope(struct svc_key *svc, __u32 *id,
					   const struct svc_val *sv)
{
	if (!sv->service_id)
		return;
	svc->addr[0] = 0;
	svc->addr[1] = 0;
	svc->addr[2] = 0;
	svc->addr[3] = 0;
	svc->port = 0;
	*id = sv->service_id;
}

#endif
