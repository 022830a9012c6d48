"""Render one service port into kube-proxy's iptables rules (pure, no I/O).

The result is a ``ServiceRules`` fragment: the nat chains the service port owns
(KUBE-SVC/SVL/EXT/FW/SEP-*) and the lines it contributes to the shared
top-level chains. ``render_toplevel`` assembles the fragments; ``render_plan`` diffs them.
Rules follow pkg/proxy/iptables/proxier.go (syncProxyRules) line by line.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.names import quote
from svcproxy.backends.iptables.nfacct import LOCALHOST_NODEPORTS
from svcproxy.sdk import Endpoint, ServicePortState, ip_family, of_family

LARGE_CLUSTER_ENDPOINTS = 1000


@dataclass(frozen=True, slots=True)
class FamilyConfig:
    """Everything besides the service that shapes the rules of one IP family."""

    family: int = 4
    masquerade_mark: str = "0x4000"
    masquerade_all: bool = False
    # Local-traffic detection ("-s 10.0.0.0/8", "-i veth+"); "" = not implemented.
    if_local: str = ""
    if_not_local: str = ""
    # The node's primary IP of this family (LB source ranges that hold it allow the node).
    node_ip: str = ""
    # None: NodePorts on every local address; else only on these IPs.
    nodeport_ips: tuple[str, ...] | None = None
    localhost_nodeports: bool = False
    random_fully: bool = True
    drop_invalid: bool = True
    service_cidrs: tuple[str, ...] = ()
    # kube-proxy's nfacct counters exist: rules reference them (see nfacct).
    nfacct: bool = False


@dataclass(frozen=True, slots=True)
class ServiceRules:
    """What one service port contributes to one family's ruleset (text blocks end in \\n)."""

    chains: dict[str, str] = field(default_factory=dict)
    nat_services: str = ""
    nat_nodeports: str = ""
    filter_services: str = ""
    filter_external: str = ""
    filter_nodeports: str = ""
    filter_firewall: str = ""
    cluster_ip: str = ""
    no_local_internal: bool = False
    no_local_external: bool = False


@dataclass(frozen=True, slots=True)
class _Selection:
    """kube-proxy's categorized endpoints and the chains traffic goes to."""

    cluster: list[Endpoint]
    local: list[Endpoint]
    uses_cluster: bool
    uses_local: bool
    has_endpoints: bool
    has_internal: bool
    has_external: bool
    internal_local: bool
    external_local: bool
    externally_accessible: bool


def _select(state: ServicePortState, family: int, external_ips: list[str],
            lb_ips: list[str]) -> _Selection:
    svc = state.service
    mine = [e for _, e in sorted(state.endpoints.items()) if ip_family(e.ip) == family]
    accessible = bool(svc.node_port or external_ips or lb_ips)
    internal_local = svc.internal_policy_local
    external_local = accessible and svc.external_traffic_policy.value == "Local"
    # The frontend's categorisation, as sent: the cluster-wide and the local set.
    cluster = [e for e in mine if e.cluster]
    local = [e for e in mine if e.local]
    has = svc.has_endpoints and bool(cluster or local)
    return _Selection(
        cluster=cluster, local=local,
        uses_cluster=bool(cluster) and (not internal_local or accessible),
        uses_local=bool(local) and (internal_local or external_local),
        has_endpoints=has,
        has_internal=has and not (internal_local and not local),
        has_external=has and not (external_local and not local),
        internal_local=internal_local, external_local=external_local,
        externally_accessible=accessible,
    )


def probability(n: int) -> str:
    """kube-proxy's 1/n with ten decimals."""
    return f"{1.0 / n:0.10f}"


def render_service(state: ServicePortState, cfg: FamilyConfig,
                   large_cluster: bool = False) -> ServiceRules | None:
    """The rules of one service port in one family; None if it has no ClusterIP there."""
    svc = state.service
    cluster_ips = of_family(svc.cluster_ips, cfg.family)
    if not cluster_ips:
        return None
    return _Renderer(state, cfg, large_cluster, cluster_ips[0]).render()


class _Renderer:
    """One service port's rendering; a class only to share its many inputs."""

    def __init__(self, state: ServicePortState, cfg: FamilyConfig, large: bool,
                 cluster_ip: str) -> None:
        svc = state.service
        self.state, self.cfg, self.large, self.cluster_ip = state, cfg, large, cluster_ip
        self.svc = svc
        self.name = names.port_name(svc.key)
        self.proto = svc.key.protocol.value.lower()
        self.hash = names.service_hash(svc.key)
        self.external_ips = of_family(svc.external_ips, cfg.family)
        self.lb_ips = of_family(svc.vip_ingress_ips(), cfg.family)
        self.ranges = of_family(svc.load_balancer_source_ranges, cfg.family)
        self.sel = _select(state, cfg.family, self.external_ips, self.lb_ips)
        self.svc_chain = names.SVC_PREFIX + self.hash
        self.svl_chain = names.SVL_PREFIX + self.hash
        self.ext_chain = names.EXT_PREFIX + self.hash
        self.fw_chain = names.FW_PREFIX + self.hash
        self.svc_match = self._match(cluster_ip, svc.port)
        # Source ranges only of the other family still firewall this one (allowing nothing).
        self.uses_fw = (self.sel.has_endpoints and bool(self.lb_ips)
                        and bool(svc.load_balancer_source_ranges))
        text = self.name + self.proto
        used = ((self.sel.cluster if self.sel.uses_cluster else [])
                + (self.sel.local if self.sel.uses_local else []))
        self.seps = {e.ip: names.endpoint_chain_of(text, e) for e in used}
        self.chains: dict[str, list[str]] = {}
        self.blocks: dict[str, list[str]] = {
            "nat_services": [], "nat_nodeports": [], "filter_services": [],
            "filter_external": [], "filter_nodeports": [], "filter_firewall": [],
        }

    def _match(self, dest: str, port: int) -> str:
        return f"-m {self.proto} -p {self.proto} -d {dest} --dport {port}"

    def _comment(self, text: str) -> str:
        return f"-m comment --comment {quote(text)}"

    def render(self) -> ServiceRules:
        """Capture rules in the shared chains, then the service's own chains."""
        sel = self.sel
        self._capture_cluster_ip()
        self._capture_external_ips()
        self._capture_lb_ips()
        self._capture_node_port()
        self._capture_health_check()
        if sel.has_internal:
            self._internal_masquerade()
        if sel.has_endpoints and sel.externally_accessible:
            self._external_chain()
        if self.uses_fw:
            self._firewall_chain()
        if sel.uses_cluster:
            self._dispatch(self.svc_chain, sel.cluster)
        if sel.uses_local:
            self._dispatch(self.svl_chain, sel.local)
        self._endpoint_chains()
        b = self.blocks
        return ServiceRules(
            chains={c: _block(lines) for c, lines in self.chains.items()},
            nat_services=_block(b["nat_services"]),
            nat_nodeports=_block(b["nat_nodeports"]),
            filter_services=_block(b["filter_services"]),
            filter_external=_block(b["filter_external"]),
            filter_nodeports=_block(b["filter_nodeports"]),
            filter_firewall=_block(b["filter_firewall"]),
            cluster_ip=self.cluster_ip,
            no_local_internal=sel.has_endpoints and not sel.has_internal,
            no_local_external=sel.has_endpoints and not sel.has_external,
        )

    def _capture_cluster_ip(self) -> None:
        """ClusterIP: to the internal policy chain, or REJECT/DROP in filter."""
        if self.sel.has_internal:
            chain = self.svl_chain if self.sel.internal_local else self.svc_chain
            self.blocks["nat_services"].append(
                f"-A {names.SERVICES} {self._comment(self.name + ' cluster IP')} "
                f"{self.svc_match} -j {chain}")
        else:
            target, comment = self._no_endpoint_verdict()
            self.blocks["filter_services"].append(
                f"-A {names.SERVICES} {self._comment(comment)} {self.svc_match} -j {target}")

    def _reject_external(self, match: str) -> None:
        target, comment = self._no_endpoint_verdict()
        self.blocks["filter_external"].append(
            f"-A {names.EXTERNAL_SERVICES} {self._comment(comment)} {match} -j {target}")

    def _capture_external_ips(self) -> None:
        for ip in self.external_ips:
            match = self._match(ip, self.svc.port)
            if self.sel.has_endpoints:
                self.blocks["nat_services"].append(
                    f"-A {names.SERVICES} {self._comment(self.name + ' external IP')} "
                    f"{match} -j {self.ext_chain}")
            if not self.sel.has_external:
                self._reject_external(match)

    def _capture_lb_ips(self) -> None:
        """LB ingress: to KUBE-FW-* with source ranges (else KUBE-EXT-*)."""
        lb_chain = self.fw_chain if self.uses_fw else self.ext_chain
        for ip in self.lb_ips:
            match = self._match(ip, self.svc.port)
            if self.sel.has_endpoints:
                self.blocks["nat_services"].append(
                    f"-A {names.SERVICES} {self._comment(self.name + ' loadbalancer IP')} "
                    f"{match} -j {lb_chain}")
            if self.uses_fw:
                comment = f"{self.name} traffic not accepted by {self.fw_chain}"
                self.blocks["filter_firewall"].append(
                    f"-A {names.PROXY_FIREWALL} {self._comment(comment)} {match} -j DROP")
        if not self.sel.has_external:
            for ip in self.lb_ips:
                self._reject_external(self._match(ip, self.svc.port))

    def _capture_node_port(self) -> None:
        if not self.svc.node_port:
            return
        port_match = f"-m {self.proto} -p {self.proto} --dport {self.svc.node_port}"
        cfg = self.cfg
        if self.sel.has_endpoints and cfg.nfacct and cfg.family == 4 and cfg.localhost_nodeports:
            # Counted apart (kube-proxy's localhost_nps_accepted_pkts); then the rule below.
            self.blocks["nat_nodeports"].append(
                f"-A {names.NODEPORTS} {self._comment(self.name)} -d 127.0.0.0/8 {port_match} "
                f"-m nfacct --nfacct-name {LOCALHOST_NODEPORTS} -j {self.ext_chain}")
        if self.sel.has_endpoints:
            self.blocks["nat_nodeports"].append(
                f"-A {names.NODEPORTS} {self._comment(self.name)} {port_match} "
                f"-j {self.ext_chain}")
        if not self.sel.has_external:
            self._reject_external(f"-m addrtype --dst-type LOCAL {port_match}")

    def _capture_health_check(self) -> None:
        """healthCheckNodePort is accepted whether or not this node has endpoints."""
        if self.svc.health_check_node_port:
            self.blocks["filter_nodeports"].append(
                f"-A {names.NODEPORTS} "
                f"{self._comment(self.name + ' health check node port')} "
                f"-m tcp -p tcp --dport {self.svc.health_check_node_port} -j ACCEPT")

    def _no_endpoint_verdict(self) -> tuple[str, str]:
        """REJECT when the service has no endpoints, DROP when none serve this traffic."""
        if not self.sel.has_endpoints:
            return "REJECT", f"{self.name} has no endpoints"
        return "DROP", f"{self.name} has no local endpoints"

    def _chain(self, chain: str) -> list[str]:
        return self.chains.setdefault(chain, [])

    def _internal_masquerade(self) -> None:
        chain = self.svl_chain if self.sel.internal_local else self.svc_chain
        head = f"-A {chain} {self._comment(self.name + ' cluster IP')} {self.svc_match}"
        if self.cfg.masquerade_all:
            self._chain(chain).append(f"{head} -j {names.MARK_MASQ}")
        elif self.cfg.if_not_local:
            self._chain(chain).append(f"{head} {self.cfg.if_not_local} -j {names.MARK_MASQ}")

    def _external_chain(self) -> None:
        policy_chain = self.svl_chain if self.sel.external_local else self.svc_chain
        rules = self._chain(self.ext_chain)
        ext, name = self.ext_chain, self.name
        if not self.sel.external_local:
            comment = self._comment(f"masquerade traffic for {name} external destinations")
            rules.append(f"-A {ext} {comment} -j {names.MARK_MASQ}")
        else:
            if self.cfg.if_local:
                comment = self._comment(f"pod traffic for {name} external destinations")
                rules.append(f"-A {ext} {comment} {self.cfg.if_local} -j {self.svc_chain}")
            comment = self._comment(f"masquerade LOCAL traffic for {name} external destinations")
            rules.append(f"-A {ext} {comment} -m addrtype --src-type LOCAL -j {names.MARK_MASQ}")
            comment = self._comment(f"route LOCAL traffic for {name} external destinations")
            rules.append(f"-A {ext} {comment} -m addrtype --src-type LOCAL -j {self.svc_chain}")
        if self.sel.has_external:
            rules.append(f"-A {ext} -j {policy_chain}")

    def _firewall_chain(self) -> None:
        rules = self._chain(self.fw_chain)
        head = f"-A {self.fw_chain} {self._comment(self.name + ' loadbalancer IP')}"
        allow_node = False
        for cidr in self.ranges:
            rules.append(f"{head} -s {cidr} -j {self.ext_chain}")
            allow_node = allow_node or _contains(cidr, self.cfg.node_ip)
        if allow_node:
            rules.extend(f"{head} -s {ip} -j {self.ext_chain}" for ip in self.lb_ips)
        comment = f"other traffic to {self.name} will be dropped by KUBE-PROXY-FIREWALL"
        rules.append(f"-A {self.fw_chain} {self._comment(comment)}")

    def _ep_comment(self, text: str) -> str:
        return "" if self.large else f" {self._comment(text)}"

    def _dispatch(self, chain: str, endpoints: list[Endpoint]) -> None:
        rules = self._chain(chain)
        if self.svc.affinity:
            seconds = self.svc.session_affinity_timeout or 10800
            for ep in endpoints:
                sep = self.seps[ep.ip]
                comment = self._ep_comment(f"{self.name} -> {names.endpoint_string(ep)}")
                rules.append(f"-A {chain}{comment} -m recent --name {sep} --rcheck "
                             f"--seconds {seconds} --reap -j {sep}")
        count = len(endpoints)
        for i, ep in enumerate(endpoints):
            sep = self.seps[ep.ip]
            comment = self._ep_comment(f"{self.name} -> {names.endpoint_string(ep)}")
            left = count - i
            chance = (f" -m statistic --mode random --probability {probability(left)}"
                      if left > 1 else "")
            rules.append(f"-A {chain}{comment}{chance} -j {sep}")

    def _endpoint_chains(self) -> None:
        sel = self.sel
        reachable: dict[str, Endpoint] = {}
        if sel.uses_cluster:
            reachable.update((e.ip, e) for e in sel.cluster)
        if sel.uses_local:
            reachable.update((e.ip, e) for e in sel.local)
        comment = self._ep_comment(self.name)
        recent_flag = self.svc.affinity
        for ip in sorted(reachable):
            ep = reachable[ip]
            sep = self.seps[ip]
            recent = f" -m recent --name {sep} --set" if recent_flag else ""
            self.chains[sep] = [
                f"-A {sep}{comment} -s {ip} -j {names.MARK_MASQ}",
                f"-A {sep}{comment}{recent} -m {self.proto} -p {self.proto} "
                f"-j DNAT --to-destination {names.endpoint_string(ep)}",
            ]


def _block(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _contains(cidr: str, ip: str) -> bool:
    if not ip:
        return False
    try:
        return ipaddress.ip_address(ip) in ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return False
