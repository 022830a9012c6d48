"""Render one service port into the chains, affinity sets and map elements of one family.

Pure: (ServicePortState, TableContext) -> ServiceObjects. The structure follows
kube-proxy's nftables mode: the ``service-ips`` / ``service-nodeports`` verdict
maps dispatch on address . protocol . port; services without usable endpoints
go to the ``no-endpoint-*`` maps (reject, or drop when only local endpoints
are missing); external traffic goes through a chain per service port that
applies the traffic policy, masquerading and short-circuits.

Unlike kube-proxy, ClusterIP traffic needs no chain of its own: every service
port with N endpoints jumps to the shared chain ``lb-N``, which DNATs through
the map ``endpoints-N`` keyed on address . protocol . port . (numgen random
mod N). ``nft`` reads every chain of the table before each transaction, so
with one chain per endpoint count instead of one per service and endpoint an
endpoint change at 10k services costs a few milliseconds, not hundreds.
Session affinity keeps kube-proxy's chain per endpoint (it needs a timed set
per endpoint); external traffic picks endpoints with a cascade of ``numgen``
rules DNATing inline. Hairpin traffic (a pod reaching itself) is found in
postrouting through the ``hairpin`` set of ``ip . ip`` pairs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from svcproxy.sdk import (
    DEFAULT_AFFINITY_TIMEOUT,
    Endpoint,
    ServicePort,
    ServicePortState,
    of_family,
)

from . import names
from .context import TableContext, anonymous_set

REJECT = "goto reject-chain"
DROP = "drop"
MARK_MASQ = "jump mark-for-masquerade"

# (container, key, value): an element of a set (value "") or of a map.
Element = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class ServiceObjects:
    """Everything one service port contributes to one family's table.

    ``chains`` are in dependency order (a chain only jumps to chains before it);
    ``lb_sizes`` are the shared ``lb-N`` chains / ``endpoints-N`` maps it uses.
    """

    chains: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    sets: Mapping[str, str] = field(default_factory=dict)
    elements: tuple[Element, ...] = ()
    lb_sizes: frozenset[int] = frozenset()


@dataclass(slots=True)
class _Builder:
    """Accumulates one service port's objects while rendering."""

    ctx: TableContext
    svc: ServicePort
    proto: str
    chains: dict[str, tuple[str, ...]] = field(default_factory=dict)
    sets: dict[str, str] = field(default_factory=dict)
    elements: list[Element] = field(default_factory=list)
    lb_chains: dict[tuple[str, ...], str] = field(default_factory=dict)
    lb_sizes: set[int] = field(default_factory=set)
    _base: str = ""

    @property
    def base(self) -> str:
        """The service port's base name (``names.service_base``), made when a chain or
        set of its own needs it: a ClusterIP port without affinity has none."""
        if not self._base:
            self._base = names.service_base(self.svc.key)
        return self._base

    @property
    def timeout(self) -> int:
        return self.svc.session_affinity_timeout or DEFAULT_AFFINITY_TIMEOUT

    def affinity_set(self, ep: Endpoint) -> str:
        return names.affinity_set(self.base, ep.ip, ep.port, self.timeout)

    def hairpin(self, endpoints: list[Endpoint]) -> None:
        self.elements += [("hairpin", f"{e.ip} . {e.ip}", "") for e in endpoints]

    def endpoint_chain(self, ep: Endpoint) -> str:
        """Add (once) the chain recording affinity and DNATing to ``ep``; return its name."""
        name = names.endpoint_chain(self.base, ep.ip, ep.port)
        if name in self.chains:
            return name
        aff = self.affinity_set(ep)
        self.sets[aff] = (
            f"type {self.ctx.addr_type}; flags dynamic,timeout; timeout {self.timeout}s;"
        )
        self.chains[name] = (
            f"update @{aff} {{ {self.ctx.ipx} saddr }}",
            f"meta l4proto {self.proto} dnat to {dnat_target(ep)}",
        )
        return name

    def lb_chain(self, name: str, endpoints: list[Endpoint], first: tuple[str, ...] = ()) -> str:
        """A chain choosing among ``endpoints``; reuses one with the same endpoints.

        Endpoint i is taken with probability 1/(n-i) if none before was (uniform
        overall); with affinity through per-endpoint chains, else DNATing inline.
        """
        ids = tuple(f"{e.ip}/{e.port}" for e in endpoints)
        if ids in self.lb_chains:
            return self.lb_chains[ids]
        rules = list(first)
        if self.svc.affinity:
            targets = [f"goto {self.endpoint_chain(e)}" for e in endpoints]
            rules += [
                f"{self.ctx.ipx} saddr @{self.affinity_set(e)} {t}"
                for e, t in zip(endpoints, targets, strict=True)
            ]
        else:
            targets = [f"meta l4proto {self.proto} dnat to {dnat_target(e)}" for e in endpoints]
        n = len(targets)
        rules += [f"numgen random mod {n - i} 0 {t}" for i, t in enumerate(targets[:-1])]
        rules.append(targets[-1])
        self.hairpin(endpoints)
        self.chains[name] = tuple(rules)
        self.lb_chains[ids] = name
        return name

    def shared_lb(self, key: str, endpoints: list[Endpoint]) -> str:
        """Use ``lb-N`` for ClusterIP traffic: one ``endpoints-N`` element per endpoint."""
        n = len(endpoints)
        self.lb_sizes.add(n)
        container = names.lb_map(n)
        self.elements += [
            (container, f"{key} . {i}", f"{e.ip} . {e.port}") for i, e in enumerate(endpoints)
        ]
        self.hairpin(endpoints)
        return names.lb_chain(n)

    def element(self, container: str, key: str, value: str = "") -> None:
        self.elements.append((container, key, value))


def dnat_target(ep: Endpoint) -> str:
    return f"[{ep.ip}]:{ep.port}" if ":" in ep.ip else f"{ep.ip}:{ep.port}"


def _masquerade_rule(ctx: TableContext, svc: ServicePort, cip: str, proto: str) -> str | None:
    """Mark off-cluster (or all, with --masquerade-all) traffic to the ClusterIP."""
    match = f"{ctx.ipx} daddr {cip} {proto} dport {svc.port}"
    if ctx.masquerade_all:
        return f"{match} {MARK_MASQ}"
    if ctx.nonlocal_match:
        return f"{match} {ctx.nonlocal_match} {MARK_MASQ}"
    return None


def _firewall_sources(ctx: TableContext, ranges: list[str], vips: list[str]) -> list[str]:
    """Allowed sources; LB IPs too when a range holds the node (VIP looped back locally)."""
    nets = [ipaddress.ip_network(r, strict=False) for r in ranges]
    from_node = any(ipaddress.ip_address(ip) in n for ip in ctx.node_ips for n in nets)
    return ranges + (vips if from_node else [])


def render_service(state: ServicePortState, ctx: TableContext) -> ServiceObjects | None:
    """The rules of one service port in one family; None if it has no ClusterIP there."""
    svc = state.service
    cips = of_family(svc.cluster_ips, ctx.family)
    if not cips:
        return None
    b = _Builder(ctx, svc, svc.key.protocol.lower())
    v6 = ctx.family == 6
    if len(state.endpoints) == 1:  # most service ports: nothing to sort
        eps = [e for e in state.endpoints.values() if (":" in e.ip) == v6]
    else:
        eps = [e for _, e in sorted(state.endpoints.items()) if (":" in e.ip) == v6]
    internal = [e for e in eps if e.internal]
    external = [e for e in eps if e.external]
    cluster = [e for e in eps if e.cluster]
    has_eps = svc.has_endpoints and bool(cluster or internal or external)
    no_eps_verdict = DROP if has_eps else REJECT
    # eTP Local without a local endpoint: the external chain short-circuits traffic from
    # pods and from the node to the cluster set and drops the rest itself.
    short_circuit = svc.external_policy_local and not external and bool(cluster)
    proto, port = b.proto, svc.port

    for cip in cips:
        b.element("cluster-ips", cip)
        key = f"{cip} . {proto} . {port}"
        if not internal:
            b.element("no-endpoint-services", key, no_eps_verdict)
        elif svc.affinity:
            masq = _masquerade_rule(ctx, svc, cip, proto)
            chain = b.lb_chain(names.service_chain(b.base), internal, (masq,) if masq else ())
            b.element("service-ips", key, f"goto {chain}")
        else:
            b.element("service-ips", key, f"goto {b.shared_lb(key, internal)}")

    ext_ips = of_family(svc.external_ips, ctx.family) if svc.external_ips else []
    vips = (of_family(svc.vip_ingress_ips(), ctx.family) if svc.load_balancer_ingress
            else [])
    ext_addrs = list(dict.fromkeys(ext_ips + vips)) if ext_ips or vips else []
    ext_chain = ""
    if has_eps and (ext_addrs or svc.node_port):
        ext_chain = _external_chain(b, external, cluster)
    for addr in ext_addrs:
        key = f"{addr} . {proto} . {port}"
        if ext_chain:
            b.element("service-ips", key, f"goto {ext_chain}")
        if not external and not (ext_chain and short_circuit):
            b.element("no-endpoint-services", key, no_eps_verdict)

    ranges = of_family(svc.load_balancer_source_ranges, ctx.family) if vips else []
    if vips and ranges:
        fw = names.firewall_chain(b.base)
        sources = anonymous_set(_firewall_sources(ctx, ranges, vips))
        b.chains[fw] = (f"{ctx.ipx} saddr != {sources} drop",)
        for vip in vips:
            b.element("firewall-ips", f"{vip} . {proto} . {port}", f"goto {fw}")

    if svc.node_port:
        key = f"{proto} . {svc.node_port}"
        if ext_chain:
            b.element("service-nodeports", key, f"goto {ext_chain}")
        if not external and not (ext_chain and short_circuit):
            b.element("no-endpoint-nodeports", key, no_eps_verdict)
    return ServiceObjects(b.chains, b.sets, tuple(b.elements), frozenset(b.lb_sizes))


def _external_chain(b: _Builder, external: list[Endpoint], cluster: list[Endpoint]) -> str:
    """The entry chain for external traffic (kube-proxy's EXT chain); with eTP Local and
    no local endpoint it drops what it does not short-circuit to ``cluster``."""
    svc, ctx = b.svc, b.ctx
    policy = ""
    if external:
        policy = b.lb_chain(names.external_policy_chain(b.base), external)
    rules: list[str] = []
    if not svc.external_policy_local:
        rules.append(MARK_MASQ)
    else:
        short = b.lb_chain(names.cluster_policy_chain(b.base), cluster) if cluster else ""
        if short and ctx.local_match:
            rules.append(f"{ctx.local_match} goto {short}")
        rules.append(f"fib saddr type local {MARK_MASQ}")
        if short:
            rules.append(f"fib saddr type local goto {short}")
    if policy:
        rules.append(f"goto {policy}")
    elif svc.external_policy_local:
        rules.append(DROP)
    name = names.external_chain(b.base)
    b.chains[name] = tuple(rules)
    return name
