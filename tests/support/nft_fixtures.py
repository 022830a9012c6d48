"""Node states for the nft backend's tests and benchmark (pure builders)."""

from __future__ import annotations

from svcproxy.model import (
    Endpoint,
    LoadBalancerIngress,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
)
from svcproxy.sdk import NodeState
from svcproxy.sdk.config import NodeConfig

CONFIG = NodeConfig(
    node_name="node1",
    cluster_cidrs=("10.244.0.0/16", "fd00:244::/48"),
    node_ips=("192.168.50.2", "fd00:50::2"),
    service_cidrs=("10.96.0.0/16", "fd00:96::/112"),
)


def key(name: str, port: str = "http", proto: Protocol = Protocol.TCP) -> ServicePortKey:
    return ServicePortKey("ns", name, port, proto)


def endpoint(ip: str, local: bool = False, port: int = 8080, **flags: bool) -> Endpoint:
    """An endpoint in every set (internal, external, cluster; local when on this node)
    unless flags say otherwise."""
    values = {"internal": True, "external": True, "cluster": True, "is_local": local,
              "local": local, **flags}
    return Endpoint(ip, port, **values)


def state_of(svc: ServicePort, *endpoints: Endpoint) -> ServicePortState:
    return ServicePortState(svc, {e.ip: e for e in endpoints})


def service(name: str, cip: str = "10.96.0.10", **fields: object) -> ServicePort:
    fields.setdefault("has_endpoints", True)
    fields.setdefault("port", 80)
    k = fields.pop("key", None) or key(name)
    return ServicePort(key=k, cluster_ips=(cip,), **fields)  # type: ignore[arg-type]


def node_state(*records: ServicePortState, revision: int = 1) -> NodeState:
    return NodeState("node1", revision, NodeInfo("node1"), {r.key: r for r in records})


def big_state(services: int, endpoints: int, revision: int = 1) -> NodeState:
    """``services`` ClusterIP+NodePort services with ``endpoints`` endpoints each."""
    records = []
    for i in range(services):
        svc = ServicePort(
            key=key(f"svc{i}"),
            type=ServiceType.NODE_PORT,
            cluster_ips=(f"10.96.{i // 250}.{i % 250 + 1}",),
            port=80,
            node_port=30000 + i % 2000 if i < 2000 else 0,
            has_endpoints=True,
        )
        eps = [endpoint(pod_ip(i * endpoints + j)) for j in range(endpoints)]
        records.append(state_of(svc, *eps))
    return node_state(*records, revision=revision)


def pod_ip(n: int) -> str:
    """The n-th of up to 1.5 M distinct pod IPs."""
    return f"10.{100 + n // 62500}.{n // 250 % 250}.{n % 250 + 1}"


def lb_service(name: str = "lb") -> ServicePort:
    return ServicePort(
        key=key(name),
        type=ServiceType.LOAD_BALANCER,
        cluster_ips=("10.96.0.20", "fd00:96::20"),
        port=80,
        node_port=30080,
        load_balancer_ingress=(LoadBalancerIngress("192.168.60.10"),),
        load_balancer_source_ranges=("192.168.50.0/24",),
        has_endpoints=True,
    )
