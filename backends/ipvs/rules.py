"""The fixed iptables rules of IPVS mode (pure).

The rules only reference ipsets, so their number depends on the flags, never
on the number of services: masquerade for traffic from outside the cluster,
hairpin, NodePort, LoadBalancer (externalTrafficPolicy Local, source ranges),
ExternalIPs, and a filter that rejects new connections to a service address on
a port no service uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from svcproxy.backends.ipvs import ipsets as S
from svcproxy.backends.ipvs import names as N


@dataclass(frozen=True, slots=True)
class LocalDetect:
    """How traffic from pods on this node is recognised (kube-proxy's --detect-local-mode)."""

    cidrs: tuple[str, ...] = ()
    interfaces: tuple[str, ...] = ()

    @property
    def implemented(self) -> bool:
        return bool(self.cidrs or self.interfaces)


@dataclass(frozen=True, slots=True)
class Jump:
    table: str
    chain: str
    target: str
    comment: str

    def rule(self) -> str:
        return f'-A {self.chain} -m comment --comment "{self.comment}" -j {self.target}'


JUMPS = (
    Jump("nat", "PREROUTING", "KUBE-SERVICES", "kubernetes service portals"),
    Jump("nat", "OUTPUT", "KUBE-SERVICES", "kubernetes service portals"),
    Jump("nat", "POSTROUTING", "KUBE-POSTROUTING", "kubernetes postrouting rules"),
    Jump("filter", "FORWARD", "KUBE-FORWARD", "kubernetes forwarding rules"),
    Jump("filter", "INPUT", "KUBE-NODE-PORT", "kubernetes health check rules"),
    Jump("filter", "INPUT", "KUBE-PROXY-FIREWALL", "kube-proxy firewall rules"),
    Jump("filter", "FORWARD", "KUBE-PROXY-FIREWALL", "kube-proxy firewall rules"),
    Jump("filter", "INPUT", "KUBE-IPVS-FILTER", "kubernetes ipvs access filter"),
    Jump("mangle", "PREROUTING", "KUBE-EXTERNAL-LOCAL",
         "externalTrafficPolicy=Local: pods reach every endpoint, no local endpoint drops"),
    Jump("mangle", "OUTPUT", "KUBE-EXTERNAL-LOCAL-NODE",
         "externalTrafficPolicy=Local: the node reaches every endpoint"),
)


def _set(base: str, family: int, match: str) -> str:
    kind = S.KIND_BY_BASE[base]
    return (f'-m comment --comment "{kind.comment}" '
            f"-m set --match-set {N.set_name(base, family)} {match}")


def nat_rules(family: int, masquerade_all: bool, local: LocalDetect) -> dict[str, list[str]]:
    """The nat table's chains and their rules, in order. A packet leaving with a service
    address as its source (the node talking to its own LB IP or ExternalIP picks that
    address) is masqueraded: no endpoint could answer it."""
    svc: list[str] = [f"{_set(N.LOAD_BALANCER, family, 'dst,dst')} -j KUBE-LOAD-BALANCER"]
    if masquerade_all:
        svc.append(f"{_set(N.CLUSTER_IP, family, 'dst,dst')} -j KUBE-MARK-MASQ")
    elif local.implemented:
        svc.append(f"{_set(N.CLUSTER_IP, family, 'dst,dst')} -j KUBE-MARK-NONLOCAL")
    else:
        svc.append(f"{_set(N.CLUSTER_IP, family, 'src,dst')} -j KUBE-MARK-MASQ")
    svc.append(f"{_set(N.EXTERNAL_IP, family, 'dst,dst')} -j KUBE-MARK-MASQ")
    for base in (N.EXTERNAL_IP, N.EXTERNAL_IP_LOCAL):
        svc.append(f"{_set(base, family, 'dst,dst')} -m addrtype ! --src-type LOCAL -j ACCEPT")
        svc.append(f"{_set(base, family, 'dst,dst')} -m addrtype --dst-type LOCAL -j ACCEPT")
    svc.append("-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT")

    node_port: list[str] = []
    for proto, local_base, base, match in (
        ("tcp", N.NODE_PORT_LOCAL_TCP, N.NODE_PORT_TCP, "dst"),
        ("udp", N.NODE_PORT_LOCAL_UDP, N.NODE_PORT_UDP, "dst"),
        ("sctp", N.NODE_PORT_LOCAL_SCTP, N.NODE_PORT_SCTP, "dst,dst"),
    ):
        node_port.append(f"-p {proto} {_set(local_base, family, match)} -j RETURN")
        node_port.append(f"-p {proto} {_set(base, family, match)} -j KUBE-MARK-MASQ")

    nonlocal_rules = [f"-s {c} -j RETURN" for c in local.cidrs]
    nonlocal_rules += [f"-i {i} -j RETURN" for i in local.interfaces]
    nonlocal_rules.append("-j KUBE-MARK-MASQ")
    return {
        "KUBE-SERVICES": svc,
        "KUBE-LOAD-BALANCER": [
            f"{_set(N.LOAD_BALANCER_LOCAL, family, 'dst,dst')} -j RETURN",
            "-j KUBE-MARK-MASQ",
        ],
        "KUBE-NODE-PORT": node_port,
        "KUBE-MARK-NONLOCAL": nonlocal_rules if local.implemented else [],
        "KUBE-POSTROUTING": [
            f"{_set(N.LOOP_BACK, family, 'dst,dst,src')} -j MASQUERADE",
            f"{_set(N.IPVS_IPS, family, 'src')} -j MASQUERADE",
            f"-m mark ! --mark {N.MASQ_MARK}/{N.MASQ_MARK} -j RETURN",
            f"-j MARK --xor-mark {N.MASQ_MARK}",
            '-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE',
        ],
        "KUBE-MARK-MASQ": [f"-j MARK --or-mark {N.MASQ_MARK}"],
    }


def filter_rules(family: int) -> dict[str, list[str]]:
    """The filter table's chains and their rules, in order."""
    return {
        "KUBE-FORWARD": [
            f'-m comment --comment "kubernetes forwarding rules" '
            f"-m mark --mark {N.MASQ_MARK}/{N.MASQ_MARK} -j ACCEPT",
            '-m comment --comment "kubernetes forwarding conntrack rule" '
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        ],
        "KUBE-NODE-PORT": [f"{_set(N.HEALTH_CHECK_NODE_PORT, family, 'dst')} -j ACCEPT"],
        "KUBE-PROXY-FIREWALL": [
            f"{_set(N.LOAD_BALANCER_FW, family, 'dst,dst')} -j KUBE-SOURCE-RANGES-FIREWALL",
        ],
        "KUBE-SOURCE-RANGES-FIREWALL": [
            f"{_set(N.LOAD_BALANCER_SOURCE_CIDR, family, 'dst,dst,src')} -j RETURN",
            f"{_set(N.LOAD_BALANCER_SOURCE_IP, family, 'dst,dst,src')} -j RETURN",
            "-j DROP",
        ],
        "KUBE-IPVS-FILTER": [
            f"{_set(N.LOAD_BALANCER, family, 'dst,dst')} -j RETURN",
            f"{_set(N.CLUSTER_IP, family, 'dst,dst')} -j RETURN",
            f"{_set(N.EXTERNAL_IP, family, 'dst,dst')} -j RETURN",
            f"{_set(N.EXTERNAL_IP_LOCAL, family, 'dst,dst')} -j RETURN",
            f"{_set(N.HEALTH_CHECK_NODE_PORT, family, 'dst')} -j RETURN",
            f"-m conntrack --ctstate NEW {_set(N.IPVS_IPS, family, 'dst')} -j REJECT",
        ],
    }


def mangle_rules(family: int, local: LocalDetect) -> dict[str, list[str]]:
    """externalTrafficPolicy Local: packets from pods and from the node itself to an
    external address get the firewall mark of the virtual server holding every endpoint
    (ipset skbinfo), and other packets to one without a local endpoint are dropped."""
    marked = _set(N.EXTERNAL_LOCAL_FWMARK, family, "dst,dst")
    mapping = (f"-j SET --map-set {N.set_name(N.EXTERNAL_LOCAL_FWMARK, family)} dst,dst "
               "--map-mark")
    rules = [f"-s {c} {marked} {mapping}" for c in local.cidrs]
    rules += [f"-i {i} {marked} {mapping}" for i in local.interfaces]
    rules.append(f"-m mark --mark 0x0/{N.FWMARK_MASK} "
                 f"{_set(N.NO_LOCAL_ENDPOINTS, family, 'dst,dst')} -j DROP")
    return {"KUBE-EXTERNAL-LOCAL": rules, "KUBE-EXTERNAL-LOCAL-NODE": [f"{marked} {mapping}"]}


def restore_text(tables: Mapping[str, Mapping[str, Sequence[str]]],
                 missing_jumps: Sequence[Jump]) -> str:
    """iptables-restore --noflush input: our chains rewritten, missing jumps inserted."""
    out: list[str] = []
    for table in N.TABLES:
        chains = tables.get(table, {})
        out.append(f"*{table}")
        out.extend(f":{chain} - [0:0]" for chain in chains)
        for chain, rules in chains.items():
            out.extend(f"-A {chain} {rule}" for rule in rules)
        for jump in missing_jumps:
            if jump.table == table:
                out.append(jump.rule().replace(f"-A {jump.chain} ", f"-I {jump.chain} ", 1))
        out.append("COMMIT")
    return "\n".join(out) + "\n"


def cleanup_text(present: Mapping[str, set[str]], jumps_present: Sequence[Jump]) -> str:
    """iptables-restore --noflush input removing our jumps and chains that exist."""
    out: list[str] = []
    for table in N.TABLES:
        chains = [c for c in N.CHAINS[table] if c in present.get(table, set())]
        jumps = [j for j in jumps_present if j.table == table]
        if not chains and not jumps:
            continue
        out.append(f"*{table}")
        out.extend(j.rule().replace(f"-A {j.chain} ", f"-D {j.chain} ", 1) for j in jumps)
        out.extend(f":{chain} - [0:0]" for chain in chains)
        out.extend(f"-X {chain}" for chain in chains)
        out.append("COMMIT")
    return "\n".join(out) + ("\n" if out else "")


def count_rules(save_output: str, chains: Sequence[str]) -> int:
    """Rules in ``chains`` (plus jumps into them) in iptables-save output."""
    wanted = set(chains)
    total = 0
    for line in save_output.splitlines():
        parts = line.split()
        if len(parts) > 1 and parts[0] == "-A":
            if parts[1] in wanted or (parts[-2:-1] == ["-j"] and parts[-1] in wanted):
                total += 1
    return total


def our_rules(save_output: str, table: str) -> tuple[str, ...]:
    """The chains of ours in ``table`` (their names), their rules and the jumps into them,
    as iptables-save prints them, in order: what the drift check compares with what it
    saw right after applying."""
    wanted = set(N.CHAINS[table])
    found: list[str] = []
    for line in save_output.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0].startswith(":") and parts[0][1:] in wanted:
            found.append(parts[0])  # the chain (its counters left out)
        elif parts[0] == "-A" and len(parts) > 1 and (
                parts[1] in wanted or parts[-2:-1] == ["-j"] and parts[-1] in wanted):
            found.append(line)
    return tuple(found)
