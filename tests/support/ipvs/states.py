"""Node states for the IPVS tests, built directly (the frontend's selection already done)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from svcproxy.model import (
    Endpoint,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    SessionAffinity,
)
from svcproxy.sdk.backend import Changes, NodeState


def endpoint(ip: str, port: int = 8080, **kw: Any) -> Endpoint:
    fields: dict[str, Any] = {"internal": True, "external": True, "cluster": True,
                              "is_local": True}
    fields.update(kw)
    fields.setdefault("local", fields["is_local"])
    return Endpoint(ip=ip, port=port, **fields)


def port_state(name: str, cluster_ip: str, endpoints: Sequence[Endpoint] = (),
               port: int = 80, protocol: Protocol = Protocol.TCP,
               annotations: Iterable[tuple[str, str]] = (), affinity_timeout: int = 0,
               **service: Any) -> ServicePortState:
    """One service port named ``default/<name>:http``."""
    key = ServicePortKey("default", name, "http", protocol)
    if affinity_timeout:
        service.update(session_affinity=SessionAffinity.CLIENT_IP,
                       session_affinity_timeout=affinity_timeout)
    svc = ServicePort(key=key, cluster_ips=(cluster_ip,), port=port,
                      has_endpoints=bool(endpoints), options=tuple(annotations), **service)
    return ServicePortState(svc, {e.ip: e for e in endpoints})


def node_state(ports: Iterable[ServicePortState], revision: int = 1,
               node: NodeInfo | None = None) -> NodeState:
    return NodeState("node1", revision, node or NodeInfo("node1"),
                     {p.key: p for p in ports})


def full(reason: str = "initial") -> Changes:
    return Changes(full=True, reason=reason)


def changed(*states: ServicePortState) -> Changes:
    return Changes(services=frozenset(s.key for s in states))
