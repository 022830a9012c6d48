"""The nftables backend (``svcproxy backend nft``).

One table per address family (``ip svcproxy`` and ``ip6 svcproxy``) that the
backend owns entirely; ``--cleanup`` deletes those two tables and nothing else.

Structure (kube-proxy's nftables mode, leaner where it pays):

* ``services`` (nat prerouting/output) dispatches through the verdict maps
  ``service-ips`` (address . protocol . port) and ``service-nodeports``
  (protocol . port, for the ``nodeport-ips`` set).
* ClusterIP traffic of a service port with N endpoints jumps to the shared
  chain ``lb-N``, which DNATs through ``endpoints-N`` keyed on address .
  protocol . port . ``numgen random mod N``. No chain per service or endpoint.
* External traffic (NodePort, ExternalIPs, LB IPs) enters a chain per service
  port applying the traffic policy (masquerade, short-circuit of pod and node
  traffic with externalTrafficPolicy Local) and picks an endpoint with a
  uniform cascade of ``numgen`` rules. ``firewall-ips`` applies
  loadBalancerSourceRanges before DNAT.
* ``no-endpoint-services`` / ``no-endpoint-nodeports`` reject (no endpoints at
  all) or drop (no local endpoints) in the filter hooks; ``cluster-ips-check``
  rejects wrong ports of ClusterIPs and drops unallocated ones.
* Session affinity keeps a chain and a timed set per endpoint, as kube-proxy; the
  clients a set learnt are kept through a rebuild (read back, each with its time left).
* Hairpin traffic is masqueraded in postrouting via the ``hairpin`` set.

Updates: render -> diff -> apply on the SDK's ``StagedBackend``. The first sync
(and any sync after a failure, or with a new node context) replaces the tables in
one transaction; later syncs send only the changed elements and chains, diffed
against what the last successful apply left (the SDK's ``Applied``; never a
kernel dump); a periodic resync is the same diff, so with nothing changed it
writes nothing and never holds a change back. Why fewer objects: nft reads every chain and set
of the table before each transaction, so the object count, not the change
size, bounds the cost of a small update. Small transactions go through
libnftables in-process (``--nft-api lib``), large ones through ``nft -f -``.
"""
