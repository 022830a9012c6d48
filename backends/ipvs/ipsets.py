"""The ipsets of kube-proxy's IPVS mode and their ``ipset restore`` text (pure).

IPv4 sets are named as kube-proxy names them (KUBE-CLUSTER-IP, ...); IPv6 ones
carry a ``KUBE-6-`` prefix, as kube-proxy's IPv6 proxier does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from svcproxy.backends.ipvs import names as N


@dataclass(frozen=True, slots=True)
class SetKind:
    base: str
    type: str
    comment: str
    options: str = ""


KINDS = (
    SetKind(N.LOOP_BACK, "hash:ip,port,ip",
            "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
    SetKind(N.CLUSTER_IP, "hash:ip,port",
            "Kubernetes service cluster ip + port for masquerade purpose"),
    SetKind(N.EXTERNAL_IP, "hash:ip,port",
            "Kubernetes service external ip + port for masquerade and filter purpose"),
    SetKind(N.EXTERNAL_IP_LOCAL, "hash:ip,port",
            "Kubernetes service external ip + port with externalTrafficPolicy=local"),
    SetKind(N.LOAD_BALANCER, "hash:ip,port",
            "Kubernetes service lb portal"),
    SetKind(N.LOAD_BALANCER_LOCAL, "hash:ip,port",
            "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"),
    SetKind(N.LOAD_BALANCER_FW, "hash:ip,port",
            "Kubernetes service load balancer ip + port for load balancer with sourceRange"),
    SetKind(N.LOAD_BALANCER_SOURCE_IP, "hash:ip,port,ip",
            "Kubernetes service load balancer ip + port + source IP for packet filter purpose"),
    SetKind(N.LOAD_BALANCER_SOURCE_CIDR, "hash:ip,port,net",
            "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"),
    SetKind(N.NODE_PORT_TCP, "bitmap:port", "Kubernetes nodeport TCP port for masquerade purpose"),
    SetKind(N.NODE_PORT_LOCAL_TCP, "bitmap:port",
            "Kubernetes nodeport TCP port with externalTrafficPolicy=local"),
    SetKind(N.NODE_PORT_UDP, "bitmap:port", "Kubernetes nodeport UDP port for masquerade purpose"),
    SetKind(N.NODE_PORT_LOCAL_UDP, "bitmap:port",
            "Kubernetes nodeport UDP port with externalTrafficPolicy=local"),
    SetKind(N.NODE_PORT_SCTP, "hash:ip,port",
            "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"),
    SetKind(N.NODE_PORT_LOCAL_SCTP, "hash:ip,port",
            "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type "
            "'hash ip:port'"),
    SetKind(N.HEALTH_CHECK_NODE_PORT, "bitmap:port", "Kubernetes health check node port"),
    SetKind(N.IPVS_IPS, "hash:ip", "Kubernetes ipvs addresses"),
    SetKind(N.EXTERNAL_LOCAL_FWMARK, "hash:ip,port",
            "external ip + port with externalTrafficPolicy=local: the fwmark of the virtual "
            "server with every endpoint, for traffic from pods", "skbinfo"),
    SetKind(N.NO_LOCAL_ENDPOINTS, "hash:ip,port",
            "external ip + port with externalTrafficPolicy=local and no local endpoint: dropped"),
)
KIND_BY_BASE = {k.base: k for k in KINDS}


def all_set_names(families: Iterable[int] = (4, 6)) -> list[str]:
    """Every set this backend may create, the temporary ones of full syncs included."""
    return [N.set_name(k.base, f) for f in families for k in KINDS] + [
        N.temp_name(f, i) for f in families for i in range(len(KINDS))]


def _create_line(name: str, kind: SetKind, family: int) -> str:
    if kind.type.startswith("bitmap:"):
        options = "range 0-65535"
    else:
        options = f"family {'inet' if family == 4 else 'inet6'} hashsize 1024 maxelem 262144"
    extra = f" {kind.options}" if kind.options else ""
    return f"create {name} {kind.type} {options}{extra} -exist"


def full_restore(entries: Mapping[str, Iterable[str]], families: Iterable[int]) -> str:
    """Rewrite every set of ``families`` atomically: fill a temporary set and swap it in.

    The temporary sets are kept (flushed) rather than destroyed: destroying a set
    waits for RCU, which costs ~0.2 s per set in the emulated guest."""
    lines: list[str] = []
    for family in families:
        for index, kind in enumerate(KINDS):
            name = N.set_name(kind.base, family)
            tmp = N.temp_name(family, index)
            create = _create_line(name, kind, family)
            lines.append(create)
            lines.append(create.replace(f"create {name} ", f"create {tmp} ", 1))
            lines.append(f"flush {tmp}")
            lines.extend(f"add {tmp} {e} -exist" for e in sorted(entries.get(name, ())))
            lines.append(f"swap {tmp} {name}")
            lines.append(f"flush {tmp}")
    return "\n".join(lines) + "\n"


def delta_restore(added: Mapping[str, Iterable[str]], removed: Mapping[str, Iterable[str]]) -> str:
    """Add and delete single entries (sets already exist after a full restore).

    An entry may carry extensions after a space ("1.2.3.4,tcp:80 skbmark 0x10000");
    deletion names the element only."""
    lines: list[str] = []
    for name in sorted(removed):
        lines.extend(f"del {name} {e.split(' ')[0]} -exist" for e in sorted(removed[name]))
    for name in sorted(added):
        lines.extend(f"add {name} {e} -exist" for e in sorted(added[name]))
    return "\n".join(lines) + ("\n" if lines else "")


def destroy_restore(names: Iterable[str]) -> str:
    """Flush and destroy the named sets (every one must exist)."""
    return "".join(f"flush {n}\ndestroy {n}\n" for n in names)
