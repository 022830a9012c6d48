"""The shared top-level chains of one family, assembled from service fragments (pure)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.nfacct import INVALID_DROPPED
from svcproxy.backends.iptables.render import FamilyConfig, ServiceRules

FILTER = "filter"
NAT = "nat"
MANGLE = "mangle"

FILTER_CHAINS = (names.SERVICES, names.EXTERNAL_SERVICES, names.FORWARD, names.NODEPORTS,
                 names.PROXY_FIREWALL)
NAT_CHAINS = (names.SERVICES, names.NODEPORTS, names.POSTROUTING, names.MARK_MASQ)

NODEPORTS_COMMENT = '"kubernetes service nodeports; NOTE: this must be the last rule in this chain"'
LOCALNET_RULE = (f'-A {names.KUBELET_FIREWALL} -m comment --comment '
                 '"block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 '
                 '-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n')


def uses_kubelet_firewall(cfg: FamilyConfig) -> bool:
    """KUBE-FIREWALL guards route_localnet, so it exists only with localhost NodePorts."""
    return cfg.family == 4 and cfg.localhost_nodeports


# Which fragment fields each shared chain is assembled from.
SOURCES: dict[tuple[str, str], tuple[str, ...]] = {
    (FILTER, names.SERVICES): ("filter_services", "cluster_ip"),
    (FILTER, names.EXTERNAL_SERVICES): ("filter_external",),
    (FILTER, names.NODEPORTS): ("filter_nodeports",),
    (FILTER, names.PROXY_FIREWALL): ("filter_firewall",),
    (NAT, names.SERVICES): ("nat_services",),
    (NAT, names.NODEPORTS): ("nat_nodeports",),
}
FIELDS = frozenset(f for fields in SOURCES.values() for f in fields)


def top_level(cfg: FamilyConfig, fragments: Iterable[ServiceRules],
              previous: dict[str, dict[str, str]] | None = None,
              dirty: frozenset[str] = FIELDS) -> dict[str, dict[str, str]]:
    """Text of every top-level chain by table, fixed rules included.

    With ``previous``, chains whose source fields are not ``dirty`` are reused
    as they are (a partial sync that changed only endpoints joins nothing).
    """
    frags = list(fragments) if dirty else []

    def build(table: str, chain: str, make: Callable[[], str]) -> str:
        if previous is not None and not dirty.intersection(SOURCES[(table, chain)]):
            return previous[table][chain]
        return make()

    tables = {
        FILTER: {
            names.SERVICES: build(FILTER, names.SERVICES, lambda: "".join(
                f.filter_services for f in frags) + _service_cidr_rules(cfg, frags)),
            names.EXTERNAL_SERVICES: build(FILTER, names.EXTERNAL_SERVICES, lambda: "".join(
                f.filter_external for f in frags)),
            names.FORWARD: _forward_rules(cfg),
            names.NODEPORTS: build(FILTER, names.NODEPORTS, lambda: "".join(
                f.filter_nodeports for f in frags)),
            names.PROXY_FIREWALL: build(FILTER, names.PROXY_FIREWALL, lambda: "".join(
                f.filter_firewall for f in frags)),
        },
        NAT: {
            names.SERVICES: build(NAT, names.SERVICES, lambda: "".join(
                f.nat_services for f in frags) + _nodeports_jump(cfg)),
            names.NODEPORTS: build(NAT, names.NODEPORTS, lambda: "".join(
                f.nat_nodeports for f in frags)),
            names.POSTROUTING: _postrouting_rules(cfg),
            names.MARK_MASQ: f"-A {names.MARK_MASQ} -j MARK --or-mark {cfg.masquerade_mark}\n",
        },
    }
    if uses_kubelet_firewall(cfg):
        tables[FILTER][names.KUBELET_FIREWALL] = LOCALNET_RULE
    return tables


def _postrouting_rules(cfg: FamilyConfig) -> str:
    mark = cfg.masquerade_mark
    masq = (f'-A {names.POSTROUTING} -m comment --comment '
            '"kubernetes service traffic requiring SNAT" -j MASQUERADE')
    if cfg.random_fully:
        masq += " --random-fully"
    return (f"-A {names.POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN\n"
            f"-A {names.POSTROUTING} -j MARK --xor-mark {mark}\n"
            f"{masq}\n")


def _forward_rules(cfg: FamilyConfig) -> str:
    mark = cfg.masquerade_mark
    counted = f"-m nfacct --nfacct-name {INVALID_DROPPED} " if cfg.nfacct else ""
    invalid = (f"-A {names.FORWARD} -m conntrack --ctstate INVALID {counted}-j DROP\n"
               if cfg.drop_invalid else "")
    return (invalid
            + f'-A {names.FORWARD} -m comment --comment "kubernetes forwarding rules" '
            f"-m mark --mark {mark}/{mark} -j ACCEPT\n"
            f'-A {names.FORWARD} -m comment --comment "kubernetes forwarding conntrack rule" '
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n")


def _nodeports_jump(cfg: FamilyConfig) -> str:
    """The last KUBE-SERVICES rule: NodePorts on local addresses, or on chosen IPs."""
    head = f"-A {names.SERVICES} -m comment --comment {NODEPORTS_COMMENT}"
    if cfg.nodeport_ips is None:
        if cfg.family == 6:
            dest = "-m addrtype --dst-type LOCAL ! -d ::1/128"
        elif cfg.localhost_nodeports:
            dest = "-m addrtype --dst-type LOCAL"
        else:
            dest = "-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8"
        return f"{head} {dest} -j {names.NODEPORTS}\n"
    lines = []
    for ip in cfg.nodeport_ips:
        if _is_loopback(ip) and (cfg.family == 6 or not cfg.localhost_nodeports):
            continue
        lines.append(f"{head} -d {ip} -j {names.NODEPORTS}\n")
    return "".join(lines)


def _is_loopback(ip: str) -> bool:
    return ip == "::1" or ip.startswith("127.")


def _service_cidr_rules(cfg: FamilyConfig, frags: list[ServiceRules]) -> str:
    """With --service-cidr: reject wrong ports of real ClusterIPs, drop unallocated ones.

    Not in kube-proxy's iptables mode; its nftables mode does this, and this
    backend keeps feature parity with ours. DNAT happened before the filter
    table, so traffic reaching these rules was not for a live service port.
    """
    if not cfg.service_cidrs:
        return ""
    ips = sorted({f.cluster_ip for f in frags if f.cluster_ip})
    lines = [f'-A {names.SERVICES} -m comment --comment "no such service port" '
             f"-d {ip} -j REJECT\n" for ip in ips]
    lines += [f'-A {names.SERVICES} -m comment --comment "unallocated service IP" '
              f"-d {cidr} -j DROP\n" for cidr in cfg.service_cidrs]
    return "".join(lines)
